//! A virtual Intel VT-d remapping unit (the legacy-mode subset that Linux's intel-iommu driver
//! and the probe's driver use; see ../shared/design/T5-IOMMU.md): its register page on the
//! MMIO bus, DMA translation for the devices behind it, and the invalidations that keep the
//! two consistent.
//!
//! - [`regs`]: offsets, bits and structure fields, shared with the probe guest;
//! - [`tables`]: root, context and page tables walked from guest memory;
//! - [`iotlb`]: the context cache and the IOTLB, bounded;
//! - [`queue`]: queued invalidation, run inside the IQT write;
//! - [`fault`] and [`event`]: fault recording and the two event interrupts;
//! - [`dmar`]: the ACPI DMAR table that describes the unit.
//!
//! # Locks and strictness
//!
//! Lock order: `regs` (vCPU side: the register file and the queue) before `remap` (translation
//! state and caches) and `faults`; `remap` and `faults` are never held together. Device
//! threads take `remap` and `faults` only, never `regs`.
//!
//! A device thread translates and copies a round of queue work (one `QueueEngine::process`
//! call: its chains' buffers and its ring accesses) under a read guard of `rounds`
//! ([`Iommu::dma_round`]). An invalidation drops cache entries at once, then a wait
//! descriptor (or a register-based invalidation, before its busy bit reads 0) takes `rounds`
//! for writing: it returns only once every round that began before it has ended, and rounds
//! that begin after it find the caches invalidated (they walk the tables again, where the
//! guest's unmap is visible) and their rings marked stale. So when the guest sees the wait's
//! status, no device thread can still use a translation it dropped: strict is strict.

// Register, entry and descriptor fields are cut to their width, as the hardware cuts them.
#![allow(clippy::cast_possible_truncation)]

pub mod dmar;
pub mod event;
pub mod fault;
pub mod iotlb;
pub mod queue;
pub mod tables;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

#[allow(missing_docs)] // each constant is documented in the shared file
pub mod regs {
    //! Intel VT-d facts shared with the probe guest (see the file's header).
    include!("regs.rs");
}

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, Weak};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::bus::BusDevice;
use crate::dma::DmaError;
use crate::guest_error;
use crate::irq::InterruptRoutes;
use crate::irq::msi::is_valid_message;
use crate::logging::DeviceLog;
use event::{EVENT_ADDRESS, EVENT_CONTROL, EventInterrupt, Message};
use fault::{FaultRecord, Faults};
use iotlb::{CacheCounts, Cached, Caches, ContextScope, IotlbScope};
use queue::{Descriptor, InvalidationQueue, QueueError};
use regs::*;
pub use tables::Access;
use tables::{Leaf, PAGE_SHIFT, PAGE_SIZE};

/// CAP (§10.4.2): 16-bit domain IDs, 4-level tables only, 48-bit MGAW, FRCD0 at
/// `VTD_FRCD_REG` and one record, page-selective invalidation up to 2^MAMV pages. CM = 0
/// (not-present entries are never cached, so a map needs no invalidation) and RWBF = 0.
pub const CAP: u64 = VTD_CAP_ND_16BIT
    | VTD_CAP_SAGAW_4LEVEL
    | (VTD_ADDRESS_WIDTH - 1) << VTD_CAP_MGAW_SHIFT
    | (VTD_FRCD_REG / 16) << VTD_CAP_FRO_SHIFT
    | VTD_CAP_PSI
    | VTD_MAMV << VTD_CAP_MAMV_SHIFT;
/// ECAP (§10.4.3): coherent walks, queued invalidation, IVA at `VTD_IVA_REG`; no
/// pass-through, device-TLBs, interrupt remapping or scalable mode.
pub const ECAP: u64 = VTD_ECAP_C | VTD_ECAP_QI | (VTD_IVA_REG / 16) << VTD_ECAP_IRO_SHIFT;

/// The qwords that hold a 32-bit register in their high half.
const FSTS_QWORD: u64 = VTD_FSTS_REG & !7;
const ICS_QWORD: u64 = VTD_ICS_REG & !7;
/// FRCD0's high qword.
const FRCD_HIGH: u64 = VTD_FRCD_REG + 8;

/// Where a ring is for the device, to be translated as one guest-physical range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingArea {
    /// Bus address (IOVA).
    pub address: u64,
    /// Length in bytes.
    pub len: u64,
    /// What the device does with it.
    pub access: Access,
}

/// The rings of one device as the unit last translated them: an invalidation that covers
/// one of their pages, or a change of translation altogether, marks them stale, and the
/// device translates them again ([`Iommu::map_rings`]) before it next touches them.
#[derive(Debug)]
pub struct RingWatch {
    stale: AtomicBool,
}

impl Default for RingWatch {
    /// Stale: nothing translated yet.
    fn default() -> Self {
        RingWatch {
            stale: AtomicBool::new(true),
        }
    }
}

impl RingWatch {
    /// Whether the rings must be translated (again).
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }
}

/// The pages a [`RingWatch`] stands for.
#[derive(Debug)]
struct Watched {
    watch: Weak<RingWatch>,
    source: u16,
    /// `None` while translation is off.
    domain: Option<u16>,
    /// IOVA page numbers.
    pages: Vec<u64>,
}

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
    /// Page-table walks (IOTLB misses that reached the tables).
    pub walks: u64,
    /// DMA requests blocked (recorded or lost to a full record).
    pub faults: u64,
}

/// The vCPU side: the register file and the invalidation queue.
#[derive(Debug, Default)]
struct Registers {
    /// GSTS: TES, RTPS, QIES (the GCMD bits of the same positions).
    status: u32,
    /// RTADDR as written (63:12).
    root_table: u64,
    /// CCMD.
    context_command: u64,
    queue: InvalidationQueue,
    /// IVA.
    invalidate_address: u64,
    /// The IOTLB register.
    iotlb_command: u64,
    /// The queue and invalidation figures of [`IommuStats`].
    stats: IommuStats,
}

/// What device threads share: translation state, caches, ring watches.
#[derive(Debug, Default)]
struct Remapping {
    /// GSTS.TES.
    enabled: bool,
    /// The root table latched by SRTP.
    root_table: u64,
    caches: Caches,
    walks: u64,
    watched: Vec<Watched>,
}

impl Remapping {
    /// The context of `source` and the translation of `iova`'s page, from the caches or the
    /// tables (then cached).
    fn lookup(
        &mut self,
        mem: &GuestMemoryMmap,
        source: u16,
        iova: u64,
        access: Access,
    ) -> Result<(u16, Leaf), u8> {
        let context = match self.caches.context(source) {
            Some(c) => c,
            None => {
                let c = tables::context(mem, self.root_table, source)?;
                self.caches.insert_context(source, c);
                c
            }
        };
        let page = iova >> PAGE_SHIFT;
        if let Some(c) = self.caches.translation(context.domain, page) {
            return Ok((context.domain, c.leaf));
        }
        self.walks += 1;
        let leaf = tables::walk(mem, &context, iova, access)?;
        let cached = Cached {
            leaf,
            page_table: context.page_table,
        };
        self.caches.insert_translation(context.domain, page, cached);
        Ok((context.domain, leaf))
    }

    /// Mark stale the ring watches `covers` picks; forget the watches whose device is gone.
    fn mark_stale(&mut self, covers: impl Fn(&Watched) -> bool) {
        self.watched.retain(|w| match w.watch.upgrade() {
            Some(watch) => {
                if covers(w) {
                    watch.stale.store(true, Ordering::Release);
                }
                true
            }
            None => false,
        });
    }
}

/// The remapping unit.
pub struct Iommu {
    mem: GuestMemoryMmap,
    routes: Arc<dyn InterruptRoutes>,
    log: Arc<DeviceLog>,
    regs: Mutex<Registers>,
    remap: Mutex<Remapping>,
    faults: Mutex<Faults>,
    /// Device rounds of DMA read it; invalidations wait them out by writing it.
    rounds: RwLock<()>,
}

impl std::fmt::Debug for Iommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iommu").finish_non_exhaustive()
    }
}

/// Registers are accessed as aligned dwords or qwords (§10.2): the qword an access falls in
/// and its shift there.
fn register_access(offset: u64, len: usize) -> Option<(u64, u32)> {
    match len {
        4 if offset.is_multiple_of(4) => Some((offset & !7, if offset & 4 != 0 { 32 } else { 0 })),
        8 if offset.is_multiple_of(8) => Some((offset, 0)),
        _ => None,
    }
}

fn dwords(low: u32, high: u32) -> u64 {
    u64::from(low) | u64::from(high) << 32
}

/// An event's two dwords in the qword at `first` (`EVENT_CONTROL` or `EVENT_ADDRESS`).
fn event_qword(event: &EventInterrupt, first: usize) -> u64 {
    dwords(event.read(first), event.read(first + 1))
}

/// Write an event's dwords in the qword at `first` that `mask` covers.
fn write_event(event: &mut EventInterrupt, first: usize, value: u64, mask: u64) -> Option<Message> {
    let mut due = None;
    if mask & 0xffff_ffff != 0 {
        due = event.write(first, value as u32);
    }
    if mask >> 32 != 0 {
        due = due.or(event.write(first + 1, (value >> 32) as u32));
    }
    due
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
            stats.walks = remap.walks;
        }
        stats.faults = self.faults.lock().unwrap().count();
        stats
    }

    /// A round of device DMA: hold it while translating and copying (see the module
    /// comment); an invalidation's completion waits until it is dropped.
    pub fn dma_round(&self) -> RwLockReadGuard<'_, ()> {
        self.rounds.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The guest-physical address of `iova` for a request of `source`, or the fault (then
    /// recorded, and signalled if the fault event is unmasked). Untranslated while
    /// translation is off.
    pub fn translate(&self, source: u16, iova: u64, access: Access) -> Result<u64, DmaError> {
        let result = {
            let mut remap = self.remap.lock().unwrap();
            if !remap.enabled {
                return Ok(iova);
            }
            remap
                .lookup(&self.mem, source, iova, access)
                .and_then(|(_, leaf)| leaf.allows(iova, access))
        };
        result.map_err(|reason| self.fault(source, iova, access, reason))
    }

    /// The guest-physical addresses of `rings` for `source`, each a physically contiguous
    /// range of guest RAM (virtio-queue walks rings by guest-physical address), and `watch`
    /// set to stand for their pages. Faults are recorded as for [`Iommu::translate`].
    pub fn map_rings(
        &self,
        source: u16,
        watch: &Arc<RingWatch>,
        rings: &[RingArea],
    ) -> Result<Vec<u64>, DmaError> {
        let mut remap = self.remap.lock().unwrap();
        let mut watched = Watched {
            watch: Arc::downgrade(watch),
            source,
            domain: None,
            pages: Vec::new(),
        };
        let mut found = Vec::with_capacity(rings.len());
        for ring in rings {
            let outside = DmaError::OutsideMemory {
                addr: ring.address,
                len: usize::try_from(ring.len).unwrap_or(usize::MAX),
            };
            let end = ring.address.checked_add(ring.len).ok_or(outside.clone())?;
            let mut start = None;
            let mut page = ring.address & !(PAGE_SIZE - 1);
            while page < end {
                let at = page.max(ring.address);
                let gpa = if remap.enabled {
                    let translated = remap.lookup(&self.mem, source, at, ring.access).and_then(
                        |(domain, leaf)| {
                            watched.domain = Some(domain);
                            leaf.allows(at, ring.access)
                        },
                    );
                    match translated {
                        Ok(gpa) => gpa,
                        Err(reason) => {
                            drop(remap);
                            return Err(self.fault(source, at, ring.access, reason));
                        }
                    }
                } else {
                    at
                };
                watched.pages.push(page >> PAGE_SHIFT);
                let first = *start.get_or_insert(gpa);
                if gpa != first.wrapping_add(at - ring.address) {
                    return Err(DmaError::Discontiguous {
                        addr: ring.address,
                        len: ring.len,
                    });
                }
                page = page.saturating_add(PAGE_SIZE);
            }
            let gpa = start.unwrap_or(ring.address);
            if !self.mem.check_range(
                GuestAddress(gpa),
                usize::try_from(ring.len).unwrap_or(usize::MAX),
            ) {
                return Err(outside);
            }
            found.push(gpa);
        }
        // One entry per live watch: a device reset many times leaves none behind.
        remap
            .watched
            .retain(|w| w.watch.strong_count() > 0 && !w.watch.ptr_eq(&watched.watch));
        remap.watched.push(watched);
        watch.stale.store(false, Ordering::Release);
        Ok(found)
    }

    /// Record a fault and send the fault event if due; the error for the device.
    fn fault(&self, source: u16, address: u64, access: Access, reason: u8) -> DmaError {
        let due = self.faults.lock().unwrap().record(FaultRecord {
            source,
            reason,
            address,
            access,
        });
        self.send("fault", due);
        DmaError::Fault {
            addr: address,
            reason,
        }
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

    fn read_qword(&self, qword: u64) -> u64 {
        match qword {
            VTD_VER_REG => VTD_VER_VALUE.into(),
            VTD_CAP_REG => CAP,
            VTD_ECAP_REG => ECAP,
            // GCMD is write-only and reads 0; GSTS is its high dword.
            VTD_GCMD_REG => dwords(0, self.regs.lock().unwrap().status),
            VTD_RTADDR_REG => self.regs.lock().unwrap().root_table,
            VTD_CCMD_REG => self.regs.lock().unwrap().context_command,
            FSTS_QWORD => dwords(0, self.faults.lock().unwrap().status()),
            VTD_FECTL_REG => event_qword(&self.faults.lock().unwrap().event, EVENT_CONTROL),
            VTD_FEADDR_REG => event_qword(&self.faults.lock().unwrap().event, EVENT_ADDRESS),
            VTD_IQH_REG => self.regs.lock().unwrap().queue.head(),
            VTD_IQT_REG => self.regs.lock().unwrap().queue.tail(),
            VTD_IQA_REG => self.regs.lock().unwrap().queue.address(),
            ICS_QWORD => dwords(0, self.regs.lock().unwrap().queue.status()),
            VTD_IECTL_REG => event_qword(&self.regs.lock().unwrap().queue.event, EVENT_CONTROL),
            VTD_IEADDR_REG => event_qword(&self.regs.lock().unwrap().queue.event, EVENT_ADDRESS),
            VTD_IVA_REG => self.regs.lock().unwrap().invalidate_address,
            VTD_IOTLB_REG => self.regs.lock().unwrap().iotlb_command,
            VTD_FRCD_REG => self.faults.lock().unwrap().record_qwords()[0],
            FRCD_HIGH => self.faults.lock().unwrap().record_qwords()[1],
            _ => 0,
        }
    }

    /// Write the bytes `mask` covers of `value` into the qword at `qword`.
    fn write_qword(&self, qword: u64, value: u64, mask: u64) {
        let merge = |old: u64| old & !mask | value & mask;
        let (low, high) = (mask & 0xffff_ffff != 0, mask >> 32 != 0);
        let mut regs = self.regs.lock().unwrap();
        match qword {
            VTD_GCMD_REG if low => self.command(&mut regs, value as u32),
            VTD_RTADDR_REG => regs.root_table = merge(regs.root_table) & !(PAGE_SIZE - 1),
            VTD_CCMD_REG => {
                regs.context_command = merge(regs.context_command);
                if high && regs.context_command & VTD_CCMD_ICC != 0 {
                    self.context_command(&mut regs);
                }
            }
            FSTS_QWORD if high => {
                let resume = self
                    .faults
                    .lock()
                    .unwrap()
                    .write_status((value >> 32) as u32);
                if resume {
                    self.run_queue(&mut regs);
                }
            }
            VTD_FECTL_REG | VTD_FEADDR_REG => {
                let first = if qword == VTD_FECTL_REG {
                    EVENT_CONTROL
                } else {
                    EVENT_ADDRESS
                };
                let due = write_event(&mut self.faults.lock().unwrap().event, first, value, mask);
                self.send("fault", due);
            }
            VTD_IQT_REG if low => {
                regs.queue.set_tail(value);
                regs.stats.tail_writes += 1;
                self.run_queue(&mut regs);
            }
            VTD_IQA_REG => {
                let iqa = merge(regs.queue.address());
                regs.queue.set_address(iqa);
            }
            ICS_QWORD if high => regs.queue.write_status((value >> 32) as u32),
            VTD_IECTL_REG | VTD_IEADDR_REG => {
                let first = if qword == VTD_IECTL_REG {
                    EVENT_CONTROL
                } else {
                    EVENT_ADDRESS
                };
                let due = write_event(&mut regs.queue.event, first, value, mask);
                self.send("invalidation", due);
            }
            VTD_IVA_REG => regs.invalidate_address = merge(regs.invalidate_address),
            VTD_IOTLB_REG => {
                regs.iotlb_command = merge(regs.iotlb_command);
                if high && regs.iotlb_command & VTD_IOTLB_IVT != 0 {
                    self.iotlb_command(&mut regs);
                }
            }
            FRCD_HIGH if high => self.faults.lock().unwrap().write_record_high(value),
            _ => guest_error!(
                self.log,
                "write to {qword:#x} (mask {mask:#x}), not a writable register; ignored"
            ),
        }
    }

    /// GCMD (§10.4.4). Linux writes the bits it keeps on (TE, QIE) with the one it acts on,
    /// so TE and QIE act on the difference from GSTS; SRTP and WBF act whenever set.
    fn command(&self, regs: &mut Registers, value: u32) {
        let changed = value ^ regs.status;
        if value & VTD_GCMD_SRTP != 0 {
            // The caches keep what they hold: software invalidates them after SRTP (§6.5).
            let root = regs.root_table;
            self.retranslate(|r| r.root_table = root);
            regs.status |= VTD_GCMD_SRTP;
        }
        if changed & VTD_GCMD_TE != 0 {
            let enabled = value & VTD_GCMD_TE != 0;
            self.retranslate(|r| r.enabled = enabled);
            regs.status ^= VTD_GCMD_TE;
        }
        if changed & VTD_GCMD_QIE != 0 {
            regs.status ^= VTD_GCMD_QIE;
            if value & VTD_GCMD_QIE != 0 {
                self.run_queue(regs);
            } else {
                regs.queue.disable();
            }
        }
        // WBF: nothing is buffered (CAP.RWBF = 0), so WBFS is never left set.
    }

    /// Change how DMA is translated; when the status reads back, no device round still uses
    /// the old way and every device translates its rings again.
    fn retranslate(&self, change: impl FnOnce(&mut Remapping)) {
        {
            let mut remap = self.remap.lock().unwrap();
            change(&mut remap);
            remap.mark_stale(|_| true);
        }
        self.drain();
    }

    /// CCMD with ICC set: a register-based context-cache invalidation (§6.5.1.1).
    fn context_command(&self, regs: &mut Registers) {
        let command = regs.context_command;
        let granularity = (command >> VTD_CCMD_CIRG_SHIFT) & 3;
        let scope = match granularity {
            VTD_GRAN_GLOBAL => Some(ContextScope::Global),
            VTD_GRAN_DOMAIN => Some(ContextScope::Domain(command as u16)),
            VTD_GRAN_DEVICE => Some(ContextScope::device(
                (command >> VTD_CCMD_SID_SHIFT) as u16,
                command >> VTD_CCMD_FM_SHIFT,
            )),
            _ => None,
        };
        // CAIG reports the granularity performed, 0 for a request not carried out.
        let mut performed = 0;
        match scope {
            Some(scope) => {
                self.invalidate_contexts(regs, scope);
                self.drain();
                performed = granularity;
            }
            None => guest_error!(self.log, "CCMD with reserved granularity 0; ignored"),
        }
        regs.context_command = command & !VTD_CCMD_ICC & !(3 << VTD_CCMD_CAIG_SHIFT)
            | performed << VTD_CCMD_CAIG_SHIFT;
    }

    /// The IOTLB register with IVT set: a register-based IOTLB invalidation (§6.5.1.2), of
    /// the pages IVA names for page-selective requests.
    fn iotlb_command(&self, regs: &mut Registers) {
        let command = regs.iotlb_command;
        let granularity = (command >> VTD_IOTLB_IIRG_SHIFT) & 3;
        let domain = (command >> VTD_IOTLB_DID_SHIFT) as u16;
        let mut performed = 0;
        match queue::iotlb_scope(granularity, domain, regs.invalidate_address) {
            Ok(scope) => {
                self.invalidate_iotlb(regs, scope);
                self.drain();
                performed = granularity;
            }
            Err(e) => guest_error!(self.log, "IOTLB register: {e}; ignored"),
        }
        regs.iotlb_command = command & !VTD_IOTLB_IVT & !(3 << VTD_IOTLB_IAIG_SHIFT)
            | performed << VTD_IOTLB_IAIG_SHIFT;
    }

    fn invalidate_contexts(&self, regs: &mut Registers, scope: ContextScope) {
        let mut remap = self.remap.lock().unwrap();
        remap.caches.invalidate_contexts(scope);
        remap.mark_stale(|w| scope.covers(w.source, w.domain));
        regs.stats.context_invalidations += 1;
    }

    fn invalidate_iotlb(&self, regs: &mut Registers, scope: IotlbScope) {
        let mut remap = self.remap.lock().unwrap();
        let dropped = remap.caches.invalidate_iotlb(scope);
        remap.mark_stale(|w| w.pages.iter().any(|&page| scope.covers(w.domain, page)));
        drop(remap);
        let stats = &mut regs.stats;
        *match scope {
            IotlbScope::Global => &mut stats.iotlb_global,
            IotlbScope::Domain(_) => &mut stats.iotlb_domain,
            IotlbScope::Pages { .. } => &mut stats.iotlb_page,
        } += 1;
        stats.iotlb_dropped += dropped.len() as u64;
        // Walk again, uncached and uncounted, to tell whether the guest had unmapped it.
        stats.iotlb_dropped_stale += dropped
            .iter()
            .filter(|(domain, page, cached)| {
                let context = tables::Context {
                    domain: *domain,
                    page_table: cached.page_table,
                };
                tables::walk(&self.mem, &context, page << PAGE_SHIFT, Access::Read)
                    != Ok(cached.leaf)
            })
            .count() as u64;
    }

    /// Run the queue from IQH to IQT, if queued invalidation is on and no error stopped it.
    fn run_queue(&self, regs: &mut Registers) {
        if regs.status & VTD_GCMD_QIE == 0 || self.faults.lock().unwrap().queue_stopped() {
            return;
        }
        loop {
            let done = match regs.queue.next(&self.mem) {
                Ok(None) => return,
                Ok(Some(descriptor)) => self.carry_out(regs, descriptor),
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                guest_error!(
                    self.log,
                    "{e}; the queue stops at IQH {:#x}",
                    regs.queue.head()
                );
                let due = self.faults.lock().unwrap().queue_error();
                self.send("fault", due);
                return;
            }
            regs.queue.advance();
            regs.stats.descriptors += 1;
        }
    }

    fn carry_out(&self, regs: &mut Registers, descriptor: Descriptor) -> Result<(), QueueError> {
        match descriptor {
            Descriptor::Context(scope) => self.invalidate_contexts(regs, scope),
            Descriptor::Iotlb(scope) => self.invalidate_iotlb(regs, scope),
            Descriptor::Wait { status, interrupt } => {
                // Strict: see the module comment.
                self.drain();
                if let Some((address, data)) = status {
                    self.mem
                        .store(data, GuestAddress(address), Ordering::Release)
                        .map_err(|_| QueueError::Status(address))?;
                }
                if interrupt {
                    let due = regs.queue.wait_completed();
                    self.send("invalidation", due);
                }
                regs.stats.waits += 1;
            }
        }
        Ok(())
    }
}

impl BusDevice for Iommu {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match register_access(offset, data.len()) {
            Some((qword, shift)) => {
                let value = self.read_qword(qword) >> shift;
                data.copy_from_slice(&value.to_le_bytes()[..data.len()]);
            }
            None => guest_error!(
                self.log,
                "{}-byte read at {offset:#x}: registers take aligned dwords or qwords",
                data.len()
            ),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let Some((qword, shift)) = register_access(offset, data.len()) else {
            guest_error!(
                self.log,
                "{}-byte write at {offset:#x}: registers take aligned dwords or qwords",
                data.len()
            );
            return;
        };
        let mut bytes = [0u8; 8];
        bytes[..data.len()].copy_from_slice(data);
        let width = if data.len() == 8 {
            u64::MAX
        } else {
            0xffff_ffff
        };
        self.write_qword(qword, u64::from_le_bytes(bytes) << shift, width << shift);
    }
}
