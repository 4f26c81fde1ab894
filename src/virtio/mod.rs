//! Virtio devices and their transports (virtio 1.2): split virtqueues (on virtio-queue),
//! feature negotiation, status and reset ([`device`]); virtio-mmio with exitless's MSI and
//! per-queue doorbell extension ([`mmio`]); modern virtio-pci with MSI-X ([`pci`]); the
//! notification paths ([`notify`]) and the device thread ([`worker`]); virtio-net ([`net`]);
//! virtio-blk on a raw file ([`block`]).

pub mod block;
pub mod chain;
pub mod device;
#[cfg(test)]
mod hostile;
pub mod interrupt;
pub mod mmio;
pub mod net;
pub mod notify;
pub mod pci;
pub mod rings;
pub mod worker;

#[allow(missing_docs)] // each constant is documented in the shared file
pub mod regs {
    //! Virtio facts shared with the probe guest (see the file's header).
    include!("regs.rs");
}

use std::sync::Arc;

use vm_memory::GuestMemoryMmap;

use crate::dma::{AccessPlatform, DmaContext};
use crate::irq::{InterruptRoutes, IrqError};
use crate::logging::DeviceLog;
use device::{Notification, QueueEngine, QueueHandler, StatusChange, VirtioDevice, VirtioState};
use interrupt::Interrupts;
use notify::{IoEventRegistrar, QueueEvents};
use regs::VIRTIO_F_ACCESS_PLATFORM;
use worker::{Command, Worker, WorkerHandle};

/// Errors building a virtio device.
#[derive(Debug, thiserror::Error)]
pub enum VirtioError {
    /// Interrupt routing.
    #[error(transparent)]
    Irq(#[from] IrqError),
    /// A KVM call.
    #[error("cannot {what}: {source}")]
    Kvm {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Eventfds, threads.
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
    /// Guest memory.
    pub mem: GuestMemoryMmap,
    /// The machine's IOMMU: a virtio-pci function's DMA goes through it when its driver
    /// negotiates VIRTIO_F_ACCESS_PLATFORM. virtio-mmio devices have no source-id and
    /// ignore it.
    pub iommu: Option<Arc<dyn AccessPlatform>>,
    /// The device's log: its guest errors are counted there.
    pub log: Arc<DeviceLog>,
}

/// A device type's two halves: the register side the transport keeps, and the queue work the
/// device thread runs.
pub struct DeviceParts {
    /// Identity, features, queues and configuration space.
    pub device: Box<dyn VirtioDevice>,
    /// The queue work.
    pub queues: Box<dyn QueueHandler>,
}

/// Start the device thread of a transport whose registers are `state`.
fn spawn_worker(
    name: String,
    state: &VirtioState,
    queues: Box<dyn QueueHandler>,
    interrupts: &Arc<Interrupts>,
    events: &QueueEvents,
) -> Result<Worker, VirtioError> {
    let engine = QueueEngine::new(queues, state.health().clone());
    Worker::spawn(
        name,
        engine,
        interrupts.clone(),
        events.clones().map_err(VirtioError::Io)?,
    )
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
        let dma = if st.negotiated(VIRTIO_F_ACCESS_PLATFORM) {
            dma.clone()
        } else {
            dma.untranslated()
        };
        worker.send(Command::Activate(st.activation_queues(), dma));
    }
    change
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

/// What the transport tests share: in-memory KVM stand-ins (no /dev/kvm needed), the
/// environment built on them, and a virtio-net device.
#[cfg(test)]
pub(crate) struct TestParts {
    pub ioevents: Arc<crate::fakes::FakeIoEvents>,
    pub routes: Arc<crate::fakes::FakeRoutes>,
    pub env: TransportEnv,
    pub net: DeviceParts,
}

#[cfg(test)]
pub(crate) fn test_parts() -> TestParts {
    let ioevents = Arc::new(crate::fakes::FakeIoEvents::default());
    let routes = Arc::new(crate::fakes::FakeRoutes::default());
    TestParts {
        env: TransportEnv {
            ioevents: ioevents.clone(),
            routes: routes.clone(),
            mem: GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)]).unwrap(),
            iommu: None,
            log: DeviceLog::new("test"),
        },
        ioevents,
        routes,
        net: net::VirtioNet::parts([0; 6], vec![Box::new(net::RequestResponse::new(8))]),
    }
}

#[cfg(test)]
mod tests {
    use super::regs::*;
    use virtio_bindings::virtio_mmio as std_mmio;

    #[test]
    fn shared_mmio_offsets_match_the_standard_bindings() {
        let pairs = [
            (VIRTIO_MMIO_MAGIC_VALUE, std_mmio::VIRTIO_MMIO_MAGIC_VALUE),
            (VIRTIO_MMIO_VERSION, std_mmio::VIRTIO_MMIO_VERSION),
            (VIRTIO_MMIO_DEVICE_ID, std_mmio::VIRTIO_MMIO_DEVICE_ID),
            (VIRTIO_MMIO_VENDOR_ID, std_mmio::VIRTIO_MMIO_VENDOR_ID),
            (
                VIRTIO_MMIO_DEVICE_FEATURES,
                std_mmio::VIRTIO_MMIO_DEVICE_FEATURES,
            ),
            (
                VIRTIO_MMIO_DEVICE_FEATURES_SEL,
                std_mmio::VIRTIO_MMIO_DEVICE_FEATURES_SEL,
            ),
            (
                VIRTIO_MMIO_DRIVER_FEATURES,
                std_mmio::VIRTIO_MMIO_DRIVER_FEATURES,
            ),
            (
                VIRTIO_MMIO_DRIVER_FEATURES_SEL,
                std_mmio::VIRTIO_MMIO_DRIVER_FEATURES_SEL,
            ),
            (VIRTIO_MMIO_QUEUE_SEL, std_mmio::VIRTIO_MMIO_QUEUE_SEL),
            (
                VIRTIO_MMIO_QUEUE_NUM_MAX,
                std_mmio::VIRTIO_MMIO_QUEUE_NUM_MAX,
            ),
            (VIRTIO_MMIO_QUEUE_NUM, std_mmio::VIRTIO_MMIO_QUEUE_NUM),
            (VIRTIO_MMIO_QUEUE_READY, std_mmio::VIRTIO_MMIO_QUEUE_READY),
            (VIRTIO_MMIO_QUEUE_NOTIFY, std_mmio::VIRTIO_MMIO_QUEUE_NOTIFY),
            (
                VIRTIO_MMIO_INTERRUPT_STATUS,
                std_mmio::VIRTIO_MMIO_INTERRUPT_STATUS,
            ),
            (
                VIRTIO_MMIO_INTERRUPT_ACK,
                std_mmio::VIRTIO_MMIO_INTERRUPT_ACK,
            ),
            (VIRTIO_MMIO_STATUS, std_mmio::VIRTIO_MMIO_STATUS),
            (
                VIRTIO_MMIO_QUEUE_DESC_LOW,
                std_mmio::VIRTIO_MMIO_QUEUE_DESC_LOW,
            ),
            (
                VIRTIO_MMIO_QUEUE_DESC_HIGH,
                std_mmio::VIRTIO_MMIO_QUEUE_DESC_HIGH,
            ),
            (
                VIRTIO_MMIO_QUEUE_AVAIL_LOW,
                std_mmio::VIRTIO_MMIO_QUEUE_AVAIL_LOW,
            ),
            (
                VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
                std_mmio::VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
            ),
            (
                VIRTIO_MMIO_QUEUE_USED_LOW,
                std_mmio::VIRTIO_MMIO_QUEUE_USED_LOW,
            ),
            (
                VIRTIO_MMIO_QUEUE_USED_HIGH,
                std_mmio::VIRTIO_MMIO_QUEUE_USED_HIGH,
            ),
            (
                VIRTIO_MMIO_CONFIG_GENERATION,
                std_mmio::VIRTIO_MMIO_CONFIG_GENERATION,
            ),
            (VIRTIO_MMIO_CONFIG, std_mmio::VIRTIO_MMIO_CONFIG),
            (VIRTIO_MMIO_INT_VRING, std_mmio::VIRTIO_MMIO_INT_VRING),
            (VIRTIO_MMIO_INT_CONFIG, std_mmio::VIRTIO_MMIO_INT_CONFIG),
        ];
        for (ours, standard) in pairs {
            assert_eq!(ours, standard);
        }
        assert_eq!(
            VIRTIO_NET_F_MAC,
            virtio_bindings::virtio_net::VIRTIO_NET_F_MAC
        );
        // The extension must not collide with a standard register.
        let standard_regs = [0xac, 0xb0, 0xb4, 0xb8, 0xbc, 0xc0];
        for reg in VIRTIO_MMIO_MSI_VEC_NUM..=VIRTIO_MMIO_QUEUE_NOTIFY_OFF {
            assert!(!standard_regs.contains(&reg) && reg < VIRTIO_MMIO_CONFIG_GENERATION);
        }
    }
}
