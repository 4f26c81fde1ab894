//! The seam where an interrupt remapping unit (VT-d §5.1) meets MSI delivery: a device's
//! messages pass through a [`MessageRemapper`] on their way to a route or to `KVM_SIGNAL_MSI`.
//!
//! irq sits below the IOMMU, so it defines the trait and the IOMMU implements it, as
//! `dma::AccessPlatform` is defined below the unit for DMA. [`RemappedRoutes`] wraps the VM's
//! [`InterruptRoutes`] for one source-id: a direct message is remapped as it is sent; a routed
//! one is remapped when its route is set, so the route KVM holds carries the remapped message,
//! and [`RemappedRoutes::refresh`] remaps every route again when the unit's entries change (an
//! interrupt entry cache invalidation), staging only the routes that changed, for the unit to
//! commit once. A blocked routed message has no route, and [`InterruptRoutes::delivers`] tells
//! the vector table above ([`super::MsiVectors`]) not to write its irqfd; otherwise the tables
//! never see the difference. (A message sent while an invalidation blocks its route may still
//! leave a count on the irqfd, delivered once the route comes back: an interrupt in flight
//! across the invalidation.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::EventFd;

use super::msi::is_valid_message;
use super::routing::MsiGsi;
use super::{CommitStrategy, InterruptRoutes, IrqError};

/// An MSI message: (address, data).
pub type Message = (u64, u32);

/// What a remapping unit does with the messages of one requester.
pub trait MessageRemapper: Send + Sync {
    /// Whether `address` is a message the unit decodes (remappable format, VT-d §5.1.2.2):
    /// such a message need not be a valid compatibility-format MSI.
    fn is_remappable(&self, address: u64) -> bool;
    /// The message to deliver for `message` from requester `source`, or `None` when the unit
    /// blocks it. `report` says whether a blocked message is recorded as a fault (a message
    /// remapped again only because the unit's entries changed is reported once, not at each
    /// change).
    fn remap(&self, source: u16, message: Message, report: bool) -> Option<Message>;
}

/// One route as the device set it and as KVM holds it.
#[derive(Clone, Copy)]
struct Route {
    /// The message the device's vector table holds.
    requested: Message,
    /// What the remapper made of it, and what the route carries (`None`: no route).
    installed: Option<Message>,
}

/// The VM's routes for the messages of one requester, remapped.
pub struct RemappedRoutes {
    inner: Arc<dyn InterruptRoutes>,
    remapper: Arc<dyn MessageRemapper>,
    source: u16,
    routes: Mutex<BTreeMap<u32, Route>>,
}

impl RemappedRoutes {
    /// `inner`'s routes for requester `source`, its messages remapped by `remapper`.
    pub fn new(
        inner: Arc<dyn InterruptRoutes>,
        remapper: Arc<dyn MessageRemapper>,
        source: u16,
    ) -> Self {
        RemappedRoutes {
            inner,
            remapper,
            source,
            routes: Mutex::default(),
        }
    }

    /// What to deliver for `message`: remapped, and a valid MSI (anything else goes nowhere,
    /// as on a real bus).
    fn resolve(&self, message: Message, report: bool) -> Option<Message> {
        self.remapper
            .remap(self.source, message, report)
            .filter(|&(address, data)| is_valid_message(address, data))
    }

    /// Install `installed` as `gsi`'s route (or remove it), staged in the inner table.
    fn install(&self, gsi: u32, installed: Option<Message>) -> Result<(), IrqError> {
        match installed {
            Some((address, data)) => self.inner.set_msi(gsi, address, data),
            None => self.inner.clear(gsi),
        }
    }

    /// Remap every route again (the unit's entries changed) and stage those whose message
    /// changed; returns how many did. The caller commits the inner table once for all of them.
    pub fn refresh(&self) -> usize {
        let mut routes = self.routes.lock().unwrap();
        let mut changed = 0;
        for (&gsi, route) in routes.iter_mut() {
            // A message that was delivered and is now blocked is reported; one that stays
            // blocked was reported already.
            let now = self.resolve(route.requested, route.installed.is_some());
            if now == route.installed {
                continue;
            }
            route.installed = now;
            changed += 1;
            // The inner table refuses only what it refused at set time; the unit logs nothing
            // new for it, the next commit reports it.
            let _ = self.install(gsi, now);
        }
        changed
    }
}

impl InterruptRoutes for RemappedRoutes {
    fn strategy(&self) -> CommitStrategy {
        self.inner.strategy()
    }

    fn accepts(&self, address: u64, data: u32) -> bool {
        self.remapper.is_remappable(address) || is_valid_message(address, data)
    }

    fn delivers(&self, gsi: u32) -> bool {
        let routes = self.routes.lock().unwrap();
        routes.get(&gsi).is_some_and(|r| r.installed.is_some())
    }

    fn signal_msi(&self, address: u64, data: u32) -> Result<(), IrqError> {
        match self.resolve((address, data), true) {
            Some((address, data)) => self.inner.signal_msi(address, data),
            None => Ok(()),
        }
    }

    fn bind_pin(
        &self,
        gsi: u32,
        irqfd: &EventFd,
        resample: Option<&EventFd>,
    ) -> Result<(), IrqError> {
        self.inner.bind_pin(gsi, irqfd, resample)
    }

    fn allocate_msi(&self) -> Result<MsiGsi, IrqError> {
        self.inner.allocate_msi()
    }

    fn release(&self, gsi: u32) -> Result<(), IrqError> {
        self.routes.lock().unwrap().remove(&gsi);
        self.inner.release(gsi)
    }

    fn set_msi(&self, gsi: u32, address: u64, data: u32) -> Result<(), IrqError> {
        let mut routes = self.routes.lock().unwrap();
        let installed = self.resolve((address, data), true);
        routes.insert(
            gsi,
            Route {
                requested: (address, data),
                installed,
            },
        );
        self.install(gsi, installed)
    }

    fn clear(&self, gsi: u32) -> Result<(), IrqError> {
        self.routes.lock().unwrap().remove(&gsi);
        self.inner.clear(gsi)
    }

    fn commit(&self) -> Result<(), IrqError> {
        self.inner.commit()
    }
}

#[cfg(test)]
mod tests;
