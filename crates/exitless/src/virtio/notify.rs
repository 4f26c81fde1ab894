//! How a driver's queue notification (a doorbell write) reaches the device: through an exit to
//! the VMM, or an ioeventfd matched on data or on address alone (`exitless bench` compares
//! them, docs/benchmarks.md).

use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::guest_error;
use crate::logging::DeviceLog;

/// The path of a doorbell write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum NotifyPath {
    /// The write exits to the VMM, which wakes the device thread.
    Exit,
    /// An ioeventfd with datamatch (length 4, value = queue index) catches it in the kernel.
    Datamatch,
    /// An address-only ioeventfd (length 0, any value, "fast MMIO") on a per-queue doorbell.
    Address,
}

impl NotifyPath {
    /// Every path, in report order.
    pub const ALL: [NotifyPath; 3] = [NotifyPath::Exit, NotifyPath::Datamatch, NotifyPath::Address];

    /// Short name used in variant names.
    pub fn name(self) -> &'static str {
        match self {
            NotifyPath::Exit => "exit",
            NotifyPath::Datamatch => "datamatch",
            NotifyPath::Address => "addr",
        }
    }
}

/// The value a doorbell write must carry, with its width (the ioeventfd's length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datamatch {
    /// A 16-bit write of this value (virtio-pci: the queue index, virtio 1.2 §4.1.5.2).
    U16(u16),
    /// A 32-bit write of this value (virtio-mmio QueueNotify).
    U32(u32),
}

/// A doorbell registration: queue, address, and datamatch value if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Doorbell {
    /// The queue it notifies.
    pub queue: usize,
    /// Guest-physical address.
    pub address: u64,
    /// Value the write must carry, or `None` for address-only (length 0).
    pub datamatch: Option<Datamatch>,
}

/// Where doorbell ioeventfds are registered: KVM's `KVM_IOEVENTFD` for a VM (the impl for
/// `VmFd`), or [`crate::fakes::FakeIoEvents`], which records them, for tests and fuzzing.
pub trait IoEventRegistrar: Send + Sync {
    /// Make writes matching `doorbell` signal `fd` in the kernel, without an exit.
    fn register(&self, fd: &EventFd, doorbell: &Doorbell) -> Result<(), kvm_ioctls::Error>;
    /// Undo [`IoEventRegistrar::register`].
    fn unregister(&self, fd: &EventFd, doorbell: &Doorbell) -> Result<(), kvm_ioctls::Error>;
}

impl IoEventRegistrar for VmFd {
    fn register(&self, fd: &EventFd, d: &Doorbell) -> Result<(), kvm_ioctls::Error> {
        let addr = IoEventAddress::Mmio(d.address);
        match d.datamatch {
            Some(Datamatch::U16(v)) => self.register_ioevent(fd, &addr, v),
            Some(Datamatch::U32(v)) => self.register_ioevent(fd, &addr, v),
            None => self.register_ioevent(fd, &addr, NoDatamatch),
        }
    }

    fn unregister(&self, fd: &EventFd, d: &Doorbell) -> Result<(), kvm_ioctls::Error> {
        let addr = IoEventAddress::Mmio(d.address);
        match d.datamatch {
            Some(Datamatch::U16(v)) => self.unregister_ioevent(fd, &addr, v),
            Some(Datamatch::U32(v)) => self.unregister_ioevent(fd, &addr, v),
            None => self.unregister_ioevent(fd, &addr, NoDatamatch),
        }
    }
}

/// One eventfd per queue, and the ioeventfds that signal them.
pub struct QueueEvents {
    registrar: Arc<dyn IoEventRegistrar>,
    log: Arc<DeviceLog>,
    events: Vec<EventFd>,
    registered: Mutex<Vec<Doorbell>>,
}

impl QueueEvents {
    /// Eventfds for `queues` queues; no doorbell registered yet.
    pub fn new(
        registrar: Arc<dyn IoEventRegistrar>,
        queues: usize,
        log: Arc<DeviceLog>,
    ) -> std::io::Result<Self> {
        let events = (0..queues)
            .map(|_| EventFd::new(EFD_NONBLOCK))
            .collect::<Result<_, _>>()?;
        Ok(QueueEvents {
            registrar,
            log,
            events,
            registered: Mutex::new(Vec::new()),
        })
    }

    /// Clones of the eventfds, for the device thread.
    pub fn clones(&self) -> std::io::Result<Vec<EventFd>> {
        self.events.iter().map(EventFd::try_clone).collect()
    }

    /// A doorbell write that exited to the VMM: wake the device thread for `queue`.
    pub fn notify(&self, queue: usize) {
        match self.events.get(queue) {
            Some(e) => {
                let _ = e.write(1);
            }
            None => guest_error!(
                self.log,
                "notification for queue {queue}, which does not exist; ignored"
            ),
        }
    }

    /// Replace the registered doorbells with `doorbells`.
    pub fn register(&self, doorbells: &[Doorbell]) -> Result<(), kvm_ioctls::Error> {
        self.unregister_all();
        for &d in doorbells {
            let Some(fd) = self.events.get(d.queue) else {
                continue;
            };
            self.registrar.register(fd, &d)?;
            self.registered.lock().unwrap().push(d);
        }
        Ok(())
    }

    /// Remove every doorbell.
    pub fn unregister_all(&self) {
        for d in std::mem::take(&mut *self.registered.lock().unwrap()) {
            let _ = self.registrar.unregister(&self.events[d.queue], &d);
        }
    }

    /// The doorbells registered now.
    pub fn registered(&self) -> Vec<Doorbell> {
        self.registered.lock().unwrap().clone()
    }
}

impl Drop for QueueEvents {
    fn drop(&mut self) {
        self.unregister_all();
    }
}
