//! Interrupt remapping (VT-d §5.1): with GSTS.IRES set, a remappable-format message (address
//! bit 4) names an entry of the interrupt remapping table in guest memory (IRTA, latched by
//! GCMD.SIRTP), which says what the interrupt becomes and which requester may send it; a
//! compatibility-format message is blocked unless GCMD.CFI lets it through (§5.1.4.1; only in
//! xAPIC mode, IRTA.EIME clear). A bad
//! request or entry is blocked and recorded as a fault (reasons 0x20-0x26, §7.1.3) with the
//! interrupt index in FRCD 63:48, unless the entry's FPD bit says not to.
//!
//! Devices meet it through `irq::RemappedRoutes` (see `crate::irq::remap`): a direct message
//! is remapped as it is sent, a routed one when its route is set, and every route again when
//! the unit's entries may have changed (IEC invalidation, SIRTP, IRE, CFI), with one routing
//! commit for all the routes that changed. The unit's own event interrupts are compatibility
//! format and are never remapped.
//!
//! Lock order: `regs`, then each `RemappedRoutes`' routes, then `intr`, then `faults`; the
//! vector tables call in holding their own state, above all of these.

mod cache;
pub mod irte;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Weak};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::Iommu;
use super::fault::FaultRecord;
use super::register_file::Registers;
use super::regs::*;
use super::tables::PAGE_SIZE;
use crate::dma::Access;
use crate::guest_error;
use crate::irq::msi::is_valid_message;
use crate::irq::regs::{MSI_ADDRESS_BASE, MSI_ADDRESS_MASK};
use crate::irq::remap::Message;
use crate::irq::{InterruptRoutes, MessageRemapper, RemappedRoutes};
use cache::EntryCache;
pub use cache::IecScope;
use irte::{EntryFault, Irte, interrupt_index};

/// The table as SIRTP latched it (§10.4.29).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Table {
    base: u64,
    /// 2^(S + 1) entries.
    entries: u32,
    /// EIME: 32-bit (x2APIC) destinations.
    extended: bool,
}

/// A message the unit blocks: why, and the interrupt index it named (0 for a
/// compatibility-format one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blocked {
    fault: EntryFault,
    index: u32,
}

/// The unit's interrupt remapping state: IRTA, what SIRTP latched, IRES and CFIS, the cache.
#[derive(Debug, Default)]
pub(super) struct InterruptRemapping {
    /// IRTA as written.
    pub(super) address: u64,
    pub(super) table: Table,
    /// GSTS.IRES.
    pub(super) enabled: bool,
    /// GSTS.CFIS.
    pub(super) compatibility: bool,
    pub(super) cache: EntryCache,
    remapped: u64,
    blocked: u64,
}

impl Table {
    /// The table IRTA `irta` names: its base, 2^(S + 1) entries, EIME.
    pub(super) fn latched(irta: u64) -> Table {
        Table {
            base: irta & !(PAGE_SIZE - 1),
            entries: 2 << (irta & VTD_IRTA_S_MASK),
            extended: irta & VTD_IRTA_EIME != 0,
        }
    }

    /// The IRTA value it was latched from, none if SIRTP never latched one.
    pub(super) fn irta(&self) -> Option<u64> {
        let s = u64::from(self.entries.checked_ilog2()?.checked_sub(1)?);
        let eime = if self.extended { VTD_IRTA_EIME } else { 0 };
        Some(self.base | eime | s)
    }
}

impl InterruptRemapping {
    /// Software writes IRTA: the table in 63:12, EIME, S; the other bits are reserved.
    pub(super) fn set_address(&mut self, value: u64) {
        self.address = value & (!(PAGE_SIZE - 1) | VTD_IRTA_EIME | VTD_IRTA_S_MASK);
    }

    /// What `message` from `source` becomes, or why it is blocked.
    fn translate(
        &mut self,
        mem: &GuestMemoryMmap,
        source: u16,
        message: Message,
    ) -> Result<Message, Blocked> {
        let blocked = |reason, index, quiet| Blocked {
            fault: EntryFault { reason, quiet },
            index,
        };
        // IR off: every message is compatibility format, as it is (the routes check it).
        if !self.enabled {
            return Ok(message);
        }
        if message.0 & VTD_MSI_REMAPPABLE == 0 {
            // CFI is effective only in xAPIC mode: with EIME, compatibility format is always
            // blocked (§10.4.4).
            return match self.compatibility && !self.table.extended {
                true => Ok(message),
                false => Err(blocked(VTD_FR_IR_COMPATIBILITY, 0, false)),
            };
        }
        let index = interrupt_index(message).map_err(|reason| blocked(reason, 0, false))?;
        if index >= self.table.entries {
            return Err(blocked(VTD_FR_IR_INDEX, index, false));
        }
        let entry = match self.cache.get(index) {
            Some(entry) => entry,
            None => {
                let entry = self
                    .read_entry(mem, index)
                    .map_err(|fault| Blocked { fault, index })?;
                self.cache.insert(index, entry);
                entry
            }
        };
        if !entry.admits(source) {
            return Err(blocked(VTD_FR_IR_SOURCE, index, entry.quiet));
        }
        self.remapped += 1;
        Ok(entry.message())
    }

    /// Read and decode entry `index` of the latched table.
    fn read_entry(&self, mem: &GuestMemoryMmap, index: u32) -> Result<Irte, EntryFault> {
        let unreadable = EntryFault {
            reason: VTD_FR_IR_TABLE,
            quiet: false,
        };
        // A table at the top of the address space may end past it.
        let at = self
            .table
            .base
            .checked_add(u64::from(index) * VTD_IRTE_SIZE)
            .ok_or(unreadable)?;
        let mut bytes = [0u8; VTD_IRTE_SIZE as usize];
        mem.read_slice(&mut bytes, GuestAddress(at))
            .map_err(|_| unreadable)?;
        let (low, high) = bytes.split_at(8);
        let qword = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        Irte::decode(qword(low), qword(high), self.table.extended)
    }
}

/// The figures of [`super::IommuStats`] that interrupt remapping adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct InterruptStats {
    /// Remappings through an IRTE: one per direct message, one per route set or re-evaluated
    /// (after an invalidation, SIRTP, IRE or CFI).
    pub remapped: u64,
    /// Remappings that blocked the message (compatibility format included), counted likewise.
    pub blocked: u64,
    /// Interrupt entry cache invalidations.
    pub invalidations: u64,
    /// Routes remapped again and changed by them (committed once per invalidation).
    pub route_updates: u64,
    /// The interrupt entry cache's hits, misses and evictions.
    pub cache: super::iotlb::CacheCounts,
}

impl Iommu {
    /// The VM's routes for the messages of requester `source`, through this unit.
    pub fn interrupt_routes(self: &Arc<Self>, source: u16) -> Arc<dyn InterruptRoutes> {
        let routes = Arc::new(RemappedRoutes::new(
            self.routes.clone(),
            self.clone() as Arc<dyn MessageRemapper>,
            source,
        ));
        let mut remapped = self.remapped.lock().unwrap();
        remapped.retain(|r| r.strong_count() > 0);
        remapped.push(Arc::downgrade(&routes));
        routes
    }

    /// Interrupt remapping's figures kept with the remapping state, added to `stats`.
    pub(super) fn interrupt_stats(&self, stats: &mut InterruptStats) {
        let intr = self.intr.lock().unwrap();
        stats.remapped = intr.remapped;
        stats.blocked = intr.blocked;
        stats.cache = intr.cache.counts();
    }

    /// GCMD's interrupt remapping bits (§10.4.4): SIRTP latches IRTA whenever set; IRE and CFI
    /// act on the difference from GSTS, as TE does. Routes are remapped again afterwards.
    pub(super) fn interrupt_command(&self, regs: &mut Registers, value: u32) {
        let changed = (value ^ regs.status) & (VTD_GCMD_IRE | VTD_GCMD_CFI);
        if value & VTD_GCMD_SIRTP == 0 && changed == 0 {
            return;
        }
        {
            let mut intr = self.intr.lock().unwrap();
            if value & VTD_GCMD_SIRTP != 0 {
                // The cache keeps what it holds: software invalidates it after SIRTP (§6.5.2.7).
                intr.table = Table::latched(intr.address);
                regs.status |= VTD_GCMD_SIRTP;
            }
            regs.status ^= changed;
            intr.enabled = regs.status & VTD_GCMD_IRE != 0;
            intr.compatibility = regs.status & VTD_GCMD_CFI != 0;
        }
        self.refresh_interrupt_routes(regs);
    }

    /// An interrupt entry cache invalidation (§6.5.2.7): drop the entries, then remap every
    /// route so none keeps a message from a dropped entry.
    pub(super) fn invalidate_interrupt_entries(&self, regs: &mut Registers, scope: IecScope) {
        self.intr.lock().unwrap().cache.invalidate(scope);
        regs.stats.interrupts.invalidations += 1;
        self.refresh_interrupt_routes(regs);
    }

    /// Remap every device's routes and commit the ones that changed, once for all.
    pub(super) fn refresh_interrupt_routes(&self, regs: &mut Registers) {
        let live: Vec<Arc<RemappedRoutes>> = self
            .remapped
            .lock()
            .unwrap()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let changed: usize = live.iter().map(|r| r.refresh()).sum();
        if changed == 0 {
            return;
        }
        regs.stats.interrupts.route_updates += changed as u64;
        if let Err(e) = self.routes.commit() {
            self.log
                .warn(format_args!("cannot commit remapped interrupt routes: {e}"));
        }
    }

    /// Record a blocked message as a fault (§7.1.3) unless its entry says not to.
    fn report_blocked(&self, source: u16, blocked: Blocked) {
        guest_error!(
            self.log,
            "interrupt from {source:#06x} (index {}) blocked, fault reason {:#x}",
            blocked.index,
            blocked.fault.reason
        );
        if blocked.fault.quiet {
            return;
        }
        let due = self.faults.lock().unwrap().record(FaultRecord {
            source,
            reason: blocked.fault.reason,
            address: u64::from(blocked.index) << VTD_FRCD_IR_INDEX_SHIFT,
            // An interrupt request is a write (FRCD.T is defined for DMA faults only).
            access: Access::Write,
        });
        self.send("fault", due);
    }
}

impl MessageRemapper for Iommu {
    fn is_remappable(&self, address: u64) -> bool {
        address & MSI_ADDRESS_MASK == MSI_ADDRESS_BASE && address & VTD_MSI_REMAPPABLE != 0
    }

    fn remap(&self, source: u16, message: Message, report: bool) -> Option<Message> {
        let result = {
            let mut intr = self.intr.lock().unwrap();
            let result = intr.translate(&self.mem, source, message);
            intr.blocked += u64::from(result.is_err());
            result
        };
        match result {
            Ok((address, data)) => {
                if !is_valid_message(address, data) {
                    guest_error!(
                        self.log,
                        "interrupt from {source:#06x} became ({address:#x}, {data:#x}), not a \
                         message this machine's APICs take; dropped"
                    );
                }
                Some((address, data))
            }
            Err(blocked) => {
                if report {
                    self.report_blocked(source, blocked);
                }
                None
            }
        }
    }
}
