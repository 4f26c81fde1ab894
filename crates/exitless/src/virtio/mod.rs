//! Virtio devices and their transports (virtio 1.2): what every device and both its sides
//! share ([`device`]); the register side, with feature negotiation, status and reset
//! ([`state`]); the device thread ([`worker`]) and the queue work it runs on split virtqueues
//! (on virtio-queue) ([`engine`]); virtio-mmio with exitless's MSI and per-queue doorbell
//! extension ([`transport::mmio`]); modern virtio-pci with MSI-X ([`transport::pci`]); the notification paths
//! ([`notify`]); virtio-net ([`net`]); virtio-blk on a raw file ([`block`]).

pub mod block;
pub mod device;
pub mod engine;
#[cfg(test)]
mod hostile;
pub mod interrupt;
pub mod net;
pub mod notify;
pub mod queue;
pub mod state;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
pub mod transport;
pub mod vhost_user;
pub mod worker;

pub use exitless_contract::virtio as regs;

use std::sync::Arc;

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

use crate::dma::{AccessPlatform, DmaContext};
use crate::irq::{InterruptRoutes, IrqError, Signaller};
use crate::logging::DeviceLog;
use device::{Notification, QueueHandler, VirtioDevice};
use engine::QueueEngine;
use interrupt::Interrupts;
use notify::{IoEventRegistrar, QueueEvents};
use regs::VIRTIO_F_ACCESS_PLATFORM;
use state::{StatusChange, VirtioState};
use worker::{Command, Worker, WorkerHandle};

#[cfg(test)]
pub(crate) use testing::test_parts;

/// Errors building a virtio device.
#[derive(Debug, thiserror::Error)]
pub enum VirtioError {
    /// The interrupt routes (irqfds, MSI routes) could not be set up.
    #[error(transparent)]
    Irq(#[from] IrqError),
    /// A KVM call (an ioeventfd registration) failed.
    #[error("cannot {what}: {source}")]
    Kvm {
        /// What was being done.
        what: &'static str,
        /// What KVM returned.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Creating an eventfd or the device thread failed.
    #[error("virtio device setup: {0}{hint}", hint = crate::resource_hint(.0))]
    Io(#[source] std::io::Error),
}

impl VirtioError {
    fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Self {
        move |source| VirtioError::Kvm { what, source }
    }
}

/// What a transport needs from the machine it sits in: where its doorbells and interrupts are
/// registered (KVM, or the in-memory fakes), guest memory, the IOMMU if the machine has one,
/// and the device's log.
pub struct TransportEnv {
    /// Doorbell ioeventfd registration.
    pub ioevents: Arc<dyn IoEventRegistrar>,
    /// The interrupt routing owner.
    pub routes: Arc<dyn InterruptRoutes>,
    /// Guest memory: queues are checked against it, and untranslated DMA reaches it.
    pub mem: GuestMemoryMmap,
    /// The machine's IOMMU: a virtio-pci function's DMA goes through it when its driver
    /// negotiates VIRTIO_F_ACCESS_PLATFORM. virtio-mmio devices have no source-id and
    /// ignore it.
    pub iommu: Option<Arc<dyn AccessPlatform>>,
    /// The device's log: its guest errors are counted there.
    pub log: Arc<DeviceLog>,
}

/// A device type's two halves: the register side the transport keeps, and who serves the
/// queues.
pub struct DeviceParts {
    /// Identity, features, queues and configuration space.
    pub device: Box<dyn VirtioDevice>,
    /// The queue work.
    pub work: DeviceWork,
}

/// Who serves a device's queues.
pub enum DeviceWork {
    /// exitless's device thread, running this handler.
    InProcess(Box<dyn QueueHandler>),
    /// A vhost-user backend, which exitless's vhost-user thread configures.
    VhostUser(vhost_user::VhostUserWork),
}

impl DeviceWork {
    /// Who signals the device's MSI irqfds: a vhost-user backend needs routes whatever the
    /// commit strategy (`irq::msi`).
    pub fn signaller(&self) -> Signaller {
        match self {
            DeviceWork::InProcess(_) => Signaller::Vmm,
            DeviceWork::VhostUser(_) => Signaller::Outside,
        }
    }

    /// Whether the device's DMA may go through the IOMMU: a vhost-user backend maps guest RAM
    /// itself, and exitless does not implement the vhost-user IOTLB messages.
    pub fn translatable(&self) -> bool {
        matches!(self, DeviceWork::InProcess(_))
    }
}

/// Start the thread that serves the queues of a transport whose registers are `state`.
fn spawn_worker(
    name: String,
    state: &VirtioState,
    work: DeviceWork,
    interrupts: &Arc<Interrupts>,
    events: &QueueEvents,
) -> Result<Worker, VirtioError> {
    match work {
        DeviceWork::InProcess(queues) => {
            let engine = QueueEngine::new(queues, state.health().clone());
            Worker::spawn(
                name,
                engine,
                interrupts.clone(),
                events.clones().map_err(VirtioError::Io)?,
            )
        }
        DeviceWork::VhostUser(work) => vhost_user::spawn(name, state, work, interrupts, events),
    }
    .map_err(VirtioError::Io)
}

/// A driver's status write, as both transports carry it out: a reset first waits until the
/// device thread has dropped the queues (so none of its work lands after the reset), and
/// DRIVER_OK hands the configured queues to the device thread with the device's DMA context,
/// translated only if the driver negotiated VIRTIO_F_ACCESS_PLATFORM (without it the driver
/// gives guest-physical addresses, virtio 1.2 §6.1).
fn write_status(
    st: &mut VirtioState,
    worker: &WorkerHandle,
    dma: &DmaContext,
    interrupts: &Interrupts,
    value: u32,
) -> StatusChange {
    if value == 0
        && let Err(pending) = worker.reset()
    {
        // The device thread may still be using the rings: the reset is not done until it
        // says so (see `VirtioState::reset_pending`; `finish_reset` completes it).
        if st.reset_pending(pending) {
            interrupts.notify(Notification::Config);
        }
        return StatusChange::None;
    }
    let change = st.write_status(value);
    if change == StatusChange::Activate {
        activate(st, worker, dma, st.activation_queues());
    }
    change
}

/// Hand `queues` to the device thread with the device's DMA context, translated only if the
/// driver negotiated VIRTIO_F_ACCESS_PLATFORM (without it the driver gives guest-physical
/// addresses, virtio 1.2 §6.1): at DRIVER_OK, or when a restored device resumes.
fn activate(st: &VirtioState, worker: &WorkerHandle, dma: &DmaContext, queues: Vec<Queue>) {
    let dma = if st.negotiated(VIRTIO_F_ACCESS_PLATFORM) {
        dma.clone()
    } else {
        dma.untranslated()
    };
    worker.send(Command::Activate(queues, dma, st.driver_features()));
}

/// Complete a reset whose acknowledgement came late (see `write_status`): true if it did now,
/// and the transport then resets its own interrupt state as after any reset.
fn finish_late_reset(st: &mut VirtioState) -> bool {
    st.pending_reset_arrived() && st.write_status(0) == StatusChange::Reset
}

/// The three areas of a split virtqueue (virtio 1.2 §2.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    /// The descriptor table.
    Descriptors,
    /// The available ring ("driver area").
    Driver,
    /// The used ring ("device area").
    Device,
}
