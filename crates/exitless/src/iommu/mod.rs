//! A virtual Intel VT-d remapping unit (the legacy-mode subset that Linux's intel-iommu driver
//! and the probe's driver use; see docs/iommu.md): its register page on the MMIO bus, DMA
//! translation for the devices behind it, and the invalidations that keep the two consistent.
//! Devices see it only as their [`AccessPlatform`](crate::dma::AccessPlatform).
//!
//! - [`regs`]: offsets, bits and structure fields, shared with the probe guest;
//! - `register_file`: the register page, CAP and ECAP;
//! - `translation`: DMA translation for devices and their rings, faults recorded;
//! - `invalidation`: register-based and queued invalidations, carried out strictly;
//! - [`tables`]: root, context and page tables walked from guest memory;
//! - [`iotlb`]: the context cache, the IOTLB and the paging-structure cache, bounded;
//! - [`queue`]: the invalidation queue and its descriptors;
//! - [`doorbell`]: the IQT write caught by ioeventfds, the queue run on the unit's thread;
//! - [`interrupt_remapping`]: remappable-format MSIs through the IRTE table, and its cache;
//! - [`fault`] and [`event`]: fault recording and the two event interrupts;
//! - [`dmar`]: the ACPI DMAR table that describes the unit.
//!
//! # Strictness
//!
//! A device thread translates and copies a round of queue work (one `QueueEngine::process`
//! call: its chains' buffers and its ring accesses) under a read guard of `rounds`
//! ([`Iommu::dma_round`]). An invalidation drops cache entries at once (the IOTLB's and,
//! where `iotlb` says, the paging-structure cache's upper-level entries), then a wait
//! descriptor (or a register-based invalidation, before its busy bit reads 0) takes `rounds`
//! for writing: it returns only once every round that began before it has ended, and rounds
//! that begin after it find the caches invalidated (they walk the tables again, where the
//! guest's unmap is visible) and their rings marked stale. So when the guest sees the wait's
//! status, no device thread can still use a translation it dropped: strict is strict.

// Register, entry and descriptor fields are cut to their width, as the hardware cuts them.
#![allow(clippy::cast_possible_truncation)]

pub mod dmar;
pub mod doorbell;
pub mod event;
pub mod fault;
pub mod interrupt_remapping;
mod invalidation;
pub mod iotlb;
mod persist;
pub mod queue;
mod register_file;
pub mod tables;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
mod translation;

pub use exitless_contract::iommu as regs;

use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, Weak};

use crate::guest_error;
use crate::irq::msi::is_valid_message;
use crate::irq::{InterruptRoutes, RemappedRoutes};
use crate::logging::DeviceLog;
use event::Message;
use fault::Faults;
use interrupt_remapping::{InterruptRemapping, InterruptStats};
use iotlb::CacheCounts;
use register_file::Registers;
pub use register_file::{CAP, ECAP};
use translation::Remapping;
pub use translation::TranslationError;
use vm_memory::GuestMemoryMmap;

/// What the unit did, for benchmarks: read with [`Iommu::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IommuStats {
    /// IQT writes (each runs the queue up to the new tail).
    pub tail_writes: u64,
    /// Invalidation descriptors carried out (over `tail_writes`: descriptors per IQT write).
    pub descriptors: u64,
    /// Wait descriptors completed.
    pub waits: u64,
    /// Context-cache invalidations, queued or through CCMD.
    pub context_invalidations: u64,
    /// Global IOTLB invalidations, queued or through the IOTLB register.
    pub iotlb_global: u64,
    /// Domain-selective IOTLB invalidations.
    pub iotlb_domain: u64,
    /// Page-selective IOTLB invalidations.
    pub iotlb_page: u64,
    /// IOTLB entries the invalidations dropped.
    pub iotlb_dropped: u64,
    /// Of those, entries whose page the guest had already unmapped (or remapped) by then:
    /// translations a device could still use after the unmap, the exposure deferral creates.
    pub iotlb_dropped_stale: u64,
    /// IOTLB hits, misses and evictions.
    pub iotlb: CacheCounts,
    /// Context-cache hits, misses and evictions.
    pub context_cache: CacheCounts,
    /// Paging-structure-cache hits, misses and evictions (on IOTLB misses: a hit reads one
    /// last-level entry, a miss all four levels).
    pub paging_cache: CacheCounts,
    /// Page-table walks (IOTLB misses that reached the tables).
    pub walks: u64,
    /// DMA requests blocked (recorded or lost to a full record).
    pub faults: u64,
    /// Interrupt remapping: messages remapped and blocked, cache invalidations, routes.
    pub interrupts: InterruptStats,
}

/// The remapping unit.
///
/// Lock order: `regs` (vCPU side: the register file and the queue) before `remap` (translation
/// state and caches) and `faults`; interrupt remapping's `intr` comes between `regs` and
/// `faults` (its order with the devices' routes: `interrupt_remapping`); `remap` and `faults` are never held together. Device
/// threads take `remap` and `faults` only, never `regs`. `rounds` is written (an
/// invalidation's completion) with `regs` held but neither `remap` nor `faults`; a device's
/// round of DMA reads it first and takes `remap` and `faults` inside. The doorbell thread
/// takes `regs` as a vCPU does (it is the vCPU side, off the vCPU); the doorbells' own lock
/// comes after `regs`.
pub struct Iommu {
    mem: GuestMemoryMmap,
    routes: Arc<dyn InterruptRoutes>,
    log: Arc<DeviceLog>,
    regs: Mutex<Registers>,
    remap: Mutex<Remapping>,
    faults: Mutex<Faults>,
    /// Device rounds of DMA read it; invalidations wait them out by writing it.
    rounds: RwLock<()>,
    /// Interrupt remapping: IRTA, what SIRTP latched, IRES and CFIS, the entry cache.
    intr: Mutex<InterruptRemapping>,
    /// The devices' routes through the unit, remapped again when its entries change.
    remapped: Mutex<Vec<Weak<RemappedRoutes>>>,
    /// The IQT doorbells, once attached (a machine's unit; not a bare one in tests).
    doorbells: OnceLock<doorbell::Doorbells>,
}

impl std::fmt::Debug for Iommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iommu").finish_non_exhaustive()
    }
}

impl Iommu {
    /// A unit at reset (translation and queued invalidation off, events masked) over guest
    /// memory `mem`, sending its event interrupts through `routes`; guest errors go to `log`.
    pub fn new(
        mem: GuestMemoryMmap,
        routes: Arc<dyn InterruptRoutes>,
        log: Arc<DeviceLog>,
    ) -> Self {
        Iommu {
            mem,
            routes,
            log,
            regs: Mutex::default(),
            remap: Mutex::default(),
            faults: Mutex::default(),
            rounds: RwLock::new(()),
            intr: Mutex::default(),
            remapped: Mutex::default(),
            doorbells: OnceLock::new(),
        }
    }

    /// The unit's log.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    /// What the unit did so far.
    pub fn stats(&self) -> IommuStats {
        let mut stats = self.regs.lock().unwrap().stats;
        {
            let remap = self.remap.lock().unwrap();
            stats.iotlb = remap.caches.iotlb_counts();
            stats.context_cache = remap.caches.context_counts();
            stats.paging_cache = remap.caches.directory_counts();
            stats.walks = remap.walks;
        }
        stats.faults = self.faults.lock().unwrap().count();
        self.interrupt_stats(&mut stats.interrupts);
        stats
    }

    /// A round of device DMA: hold it while translating and copying (see the module
    /// comment); an invalidation's completion waits until it is dropped.
    pub fn dma_round(&self) -> RwLockReadGuard<'_, ()> {
        self.rounds.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Send an event interrupt's message, if one is due.
    fn send(&self, event: &str, due: Option<Message>) {
        let Some((address, data)) = due else {
            return;
        };
        if !is_valid_message(address, data) {
            guest_error!(
                self.log,
                "{event} event message ({address:#x}, {data:#x}) is not a valid MSI; dropped"
            );
        } else if let Err(e) = self.routes.signal_msi(address, data) {
            self.log
                .warn(format_args!("cannot send the {event} event interrupt: {e}"));
        }
    }

    /// Wait until no device round that began before now is in flight.
    fn drain(&self) {
        drop(self.rounds.write().unwrap_or_else(|e| e.into_inner()));
    }
}
