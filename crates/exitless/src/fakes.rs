//! In-memory stand-ins for the KVM facilities devices use: interrupt routing and doorbell
//! registration. They record what a device asked for, so transports and interrupt sources can
//! be unit-tested and fuzzed without /dev/kvm. The irqfds and eventfds they hand out are real
//! eventfds: a test reads them to see what a device signalled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::irq::{CommitStrategy, InterruptRoutes, IrqError, MsiGsi};
use crate::virtio::notify::{Doorbell, IoEventRegistrar};

/// First GSI handed out for MSI vectors: after the 24 IOAPIC pins, as on KVM.
const FIRST_MSI_GSI: u32 = 24;

#[derive(Default)]
struct Routes {
    next_gsi: u32,
    free: Vec<u32>,
    staged: BTreeMap<u32, (u64, u32)>,
    committed: BTreeMap<u32, (u64, u32)>,
    irqfds: BTreeMap<u32, Arc<EventFd>>,
    pins: Vec<u32>,
    commits: u64,
    injected: Vec<(u64, u32)>,
    refuse_commits: bool,
}

/// A routing table in memory: routes are staged until [`InterruptRoutes::commit`] installs them.
#[derive(Default)]
pub struct FakeRoutes {
    strategy: CommitStrategy,
    routes: Mutex<Routes>,
}

impl FakeRoutes {
    /// A table whose owners follow `strategy`.
    pub fn with_strategy(strategy: CommitStrategy) -> Self {
        FakeRoutes {
            strategy,
            routes: Mutex::default(),
        }
    }

    /// Make commits fail (as KVM may refuse a table), or succeed again.
    pub fn refuse_commits(&self, refuse: bool) {
        self.routes.lock().unwrap().refuse_commits = refuse;
    }

    /// The messages injected directly (`KVM_SIGNAL_MSI`), in order.
    pub fn injected(&self) -> Vec<(u64, u32)> {
        self.routes.lock().unwrap().injected.clone()
    }

    /// The committed route of `gsi`: its MSI message.
    pub fn route(&self, gsi: u32) -> Option<(u64, u32)> {
        self.routes.lock().unwrap().committed.get(&gsi).copied()
    }

    /// The committed route of the GSI `irqfd` belongs to: the message a signal on it delivers
    /// now. None when its GSI's route is not committed (only staged, or none), or the irqfd is
    /// not one of this table's.
    pub fn committed_route_of(&self, irqfd: &Arc<EventFd>) -> Option<(u64, u32)> {
        let r = self.routes.lock().unwrap();
        let (gsi, _) = r.irqfds.iter().find(|(_, fd)| Arc::ptr_eq(fd, irqfd))?;
        r.committed.get(gsi).copied()
    }

    /// How many commits were made.
    pub fn commits(&self) -> u64 {
        self.routes.lock().unwrap().commits
    }

    /// What reached the guest since the last call, directly or through an irqfd, in no
    /// particular order: each irqfd signal is delivered as its committed route's message, or
    /// `None` when its GSI had no committed route (an interrupt lost).
    pub fn take_delivered(&self) -> Vec<Option<(u64, u32)>> {
        let mut r = self.routes.lock().unwrap();
        let mut out: Vec<_> = r.injected.drain(..).map(Some).collect();
        for (gsi, irqfd) in &r.irqfds {
            // A non-blocking eventfd reads its count, or fails when it is 0.
            if let Ok(count) = irqfd.read() {
                let route = r.committed.get(gsi).copied();
                out.extend((0..count).map(|_| route));
            }
        }
        out
    }

    /// The IOAPIC pins bound so far.
    pub fn pins(&self) -> Vec<u32> {
        self.routes.lock().unwrap().pins.clone()
    }
}

impl InterruptRoutes for FakeRoutes {
    fn strategy(&self) -> CommitStrategy {
        self.strategy
    }

    fn signal_msi(&self, address: u64, data: u32) -> Result<(), IrqError> {
        self.routes.lock().unwrap().injected.push((address, data));
        Ok(())
    }

    fn bind_pin(
        &self,
        gsi: u32,
        _irqfd: &EventFd,
        _resample: Option<&EventFd>,
    ) -> Result<(), IrqError> {
        self.routes.lock().unwrap().pins.push(gsi);
        Ok(())
    }

    fn allocate_msi(&self) -> Result<MsiGsi, IrqError> {
        let irqfd = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(IrqError::EventFd)?);
        let mut r = self.routes.lock().unwrap();
        let gsi = r.free.pop().unwrap_or_else(|| {
            r.next_gsi += 1;
            FIRST_MSI_GSI + r.next_gsi - 1
        });
        r.irqfds.insert(gsi, irqfd.clone());
        Ok(MsiGsi { gsi, irqfd })
    }

    fn release(&self, gsi: u32) -> Result<(), IrqError> {
        let mut r = self.routes.lock().unwrap();
        if r.irqfds.remove(&gsi).is_some() {
            r.free.push(gsi);
            r.staged.remove(&gsi);
        }
        Ok(())
    }

    fn set_msi(&self, gsi: u32, address: u64, data: u32) -> Result<(), IrqError> {
        self.routes
            .lock()
            .unwrap()
            .staged
            .insert(gsi, (address, data));
        Ok(())
    }

    fn clear(&self, gsi: u32) -> Result<(), IrqError> {
        self.routes.lock().unwrap().staged.remove(&gsi);
        Ok(())
    }

    fn commit(&self) -> Result<(), IrqError> {
        let mut r = self.routes.lock().unwrap();
        if r.refuse_commits {
            return Err(IrqError::EventFd(std::io::Error::other("commit refused")));
        }
        if r.committed != r.staged {
            r.committed = r.staged.clone();
            r.commits += 1;
        }
        Ok(())
    }
}

/// Doorbell registrations in memory.
#[derive(Default)]
pub struct FakeIoEvents {
    registered: Mutex<Vec<Doorbell>>,
}

impl FakeIoEvents {
    /// The doorbells registered now.
    pub fn registered(&self) -> Vec<Doorbell> {
        self.registered.lock().unwrap().clone()
    }
}

impl IoEventRegistrar for FakeIoEvents {
    fn register(&self, _fd: &EventFd, doorbell: &Doorbell) -> Result<(), kvm_ioctls::Error> {
        self.registered.lock().unwrap().push(*doorbell);
        Ok(())
    }

    fn unregister(&self, _fd: &EventFd, doorbell: &Doorbell) -> Result<(), kvm_ioctls::Error> {
        self.registered.lock().unwrap().retain(|d| d != doorbell);
        Ok(())
    }
}
