//! What both transports share: the environment a machine gives a transport
//! ([`TransportEnv`]), and the core every transport is built on ([`TransportCore`]): the
//! common registers, the device thread's handle, the device's DMA context, its interrupts,
//! its doorbells and its log, with the status writes and activation both carry out alike.

use std::sync::{Arc, Mutex};

use virtio_queue::Queue;
use vm_memory::GuestMemoryMmap;

use crate::dma::{AccessPlatform, DmaContext};
use crate::irq::InterruptRoutes;
use crate::logging::DeviceLog;
use crate::virtio::device::Notification;
use crate::virtio::engine::QueueEngine;
use crate::virtio::interrupt::Interrupts;
use crate::virtio::notify::{IoEventRegistrar, QueueEvents};
use crate::virtio::regs::VIRTIO_F_ACCESS_PLATFORM;
use crate::virtio::state::{StatusChange, VirtioState};
use crate::virtio::worker::{Command, Worker, WorkerHandle};
use crate::virtio::{DeviceWork, VirtioError, vhost_user};

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

/// What every transport holds alike, built by [`TransportCore::start`].
pub struct TransportCore {
    /// The device's log: its guest errors are counted there.
    pub log: Arc<DeviceLog>,
    /// The common registers (features, status, queues, configuration space).
    pub state: Mutex<VirtioState>,
    /// The device thread that serves the queues.
    pub worker: WorkerHandle,
    /// How the device reaches guest memory (through the IOMMU, for a virtio-pci function
    /// behind one).
    pub dma: DmaContext,
    /// The device's interrupts: its legacy line and MSI vectors, and the ISR status.
    pub interrupts: Arc<Interrupts>,
    /// The queues' doorbells.
    pub events: QueueEvents,
}

impl TransportCore {
    /// The core of a transport whose registers are `state`, with the thread that serves its
    /// queues (named `name`) started; the thread is the caller's to keep.
    pub fn start(
        name: String,
        state: VirtioState,
        work: DeviceWork,
        interrupts: Arc<Interrupts>,
        events: QueueEvents,
        dma: DmaContext,
        log: Arc<DeviceLog>,
    ) -> Result<(Self, Worker), VirtioError> {
        let worker = spawn_worker(name, &state, work, &interrupts, &events)?;
        let core = TransportCore {
            log,
            state: Mutex::new(state),
            worker: worker.handle(),
            dma,
            interrupts,
            events,
        };
        Ok((core, worker))
    }

    /// A driver's status write, as both transports carry it out: a reset first waits until the
    /// device thread has dropped the queues (so none of its work lands after the reset), and
    /// DRIVER_OK hands the configured queues to the device thread with the device's DMA context,
    /// translated only if the driver negotiated VIRTIO_F_ACCESS_PLATFORM (without it the driver
    /// gives guest-physical addresses, virtio 1.2 §6.1).
    pub fn write_status(&self, st: &mut VirtioState, value: u32) -> StatusChange {
        let (worker, dma, interrupts) = (&self.worker, &self.dma, &self.interrupts);
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

/// Hand `queues` to the device thread with the device's DMA context, translated only if the
/// driver negotiated VIRTIO_F_ACCESS_PLATFORM (without it the driver gives guest-physical
/// addresses, virtio 1.2 §6.1): at DRIVER_OK, or when a restored device resumes.
pub fn activate(st: &VirtioState, worker: &WorkerHandle, dma: &DmaContext, queues: Vec<Queue>) {
    let dma = if st.negotiated(VIRTIO_F_ACCESS_PLATFORM) {
        dma.clone()
    } else {
        dma.untranslated()
    };
    worker.send(Command::Activate(queues, dma, st.driver_features()));
}

/// Complete a reset whose acknowledgement came late (see `write_status`): true if it did now,
/// and the transport then resets its own interrupt state as after any reset.
pub fn finish_late_reset(st: &mut VirtioState) -> bool {
    st.pending_reset_arrived() && st.write_status(0) == StatusChange::Reset
}
