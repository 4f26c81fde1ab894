//! The VT-d unit in a snapshot: every architectural register (GSTS, RTADDR and the root table
//! SRTP latched, CCMD, IVA, the IOTLB register, the invalidation queue's IQH, IQT, IQA and
//! ICS, IRTA and the table SIRTP latched, FSTS and FRCD0, both event interrupts' registers
//! with their IP bit). The context cache, the IOTLB, the paging-structure cache and the
//! interrupt entry cache are not saved: a cache may not outlive a restore (VT-d §6.1: software
//! sees only what it invalidated), so a restored unit walks the guest's tables again, and
//! every device translates its rings again. At restore the doorbells are armed as the queue
//! now allows and every device's routes are remapped (restore the unit before the devices
//! whose interrupts it remaps, and the IOAPIC). Tails the doorbells caught and the unit had
//! not yet taken are run at pause, so the queue is saved at rest.

use serde::{Deserialize, Serialize};

use super::Iommu;
use super::event::EventInterrupt;
use super::fault::FaultRecord;
use super::interrupt_remapping::{IecScope, Table};
use super::iotlb::{ContextScope, IotlbScope};
use super::register_file::Registers;
use super::regs::*;
use super::tables::PAGE_SIZE;
use crate::dma::Access;
use crate::persist::{Persist, StateError, from_state, to_state};

const ID: &str = "iommu";
/// GSTS bits the unit sets (§10.4.5): TES, RTPS, QIES, IRES, IRTPS, CFIS.
const GSTS_BITS: u32 =
    VTD_GCMD_TE | VTD_GCMD_SRTP | VTD_GCMD_QIE | VTD_GCMD_IRE | VTD_GCMD_SIRTP | VTD_GCMD_CFI;
/// IRTA bits that are not reserved (§10.4.29).
const IRTA_BITS: u64 = !(PAGE_SIZE - 1) | VTD_IRTA_EIME | VTD_IRTA_S_MASK;

/// FRCD0 while F is set.
#[derive(Serialize, Deserialize)]
struct Record {
    source: u16,
    reason: u8,
    address: u64,
    /// FRCD.T: a read request.
    read: bool,
}

#[derive(Serialize, Deserialize)]
struct Saved {
    /// GSTS.
    status: u32,
    /// RTADDR as written, and the root table SRTP latched (0 until RTPS).
    root_table: u64,
    latched_root_table: u64,
    context_command: u64,
    invalidate_address: u64,
    iotlb_command: u64,
    queue_head: u64,
    queue_tail: u64,
    queue_address: u64,
    /// ICS.IWC.
    wait_completed: bool,
    invalidation_event: EventInterrupt,
    /// IRTA as written, and the IRTA SIRTP latched (none until IRTPS).
    irta: u64,
    latched_irta: Option<u64>,
    /// FRCD0; FSTS.PFO and IQE (PPF is the record's F).
    fault_record: Option<Record>,
    fault_overflow: bool,
    queue_error: bool,
    fault_event: EventInterrupt,
}

/// Every value the unit's registers could hold, or an error naming the first that is not.
fn check(s: &Saved) -> Result<(), StateError> {
    let page_offset = PAGE_SIZE - 1;
    let rtps = s.status & VTD_GCMD_SRTP != 0;
    let irtps = s.status & VTD_GCMD_SIRTP != 0;
    let irta_ok = |irta: u64| irta & !IRTA_BITS == 0;
    let event_ok = |e: &EventInterrupt| e.address & 3 == 0 && (!e.pending || e.masked);
    let failures = [
        (s.status & !GSTS_BITS != 0, "status", "bits GSTS lacks"),
        (
            s.root_table & page_offset != 0,
            "root_table",
            "not 4 KiB aligned",
        ),
        (
            s.latched_root_table & page_offset != 0 || (!rtps && s.latched_root_table != 0),
            "latched_root_table",
            "not 4 KiB aligned, or latched without RTPS",
        ),
        (
            s.context_command & VTD_CCMD_ICC != 0,
            "context_command",
            "ICC: invalidations complete at once",
        ),
        (
            s.iotlb_command & VTD_IOTLB_IVT != 0,
            "iotlb_command",
            "IVT: invalidations complete at once",
        ),
        (
            s.queue_head & !VTD_IQ_OFFSET_MASK != 0,
            "queue_head",
            "bits outside 18:4",
        ),
        (
            s.queue_tail & !VTD_IQ_OFFSET_MASK != 0,
            "queue_tail",
            "bits outside 18:4",
        ),
        (!irta_ok(s.irta), "irta", "reserved bits set"),
        (
            s.latched_irta.is_some_and(|l| !irta_ok(l)) || irtps != s.latched_irta.is_some(),
            "latched_irta",
            "reserved bits set, or latched exactly while IRTPS is not",
        ),
        (
            !event_ok(&s.fault_event),
            "fault_event",
            "unaligned address, or IP while unmasked",
        ),
        (
            !event_ok(&s.invalidation_event),
            "invalidation_event",
            "unaligned address, or IP while unmasked",
        ),
    ];
    match failures.into_iter().find(|(failed, ..)| *failed) {
        Some((_, field, why)) => Err(StateError::new(format!("{ID}.{field}"), why)),
        None => Ok(()),
    }
}

impl Iommu {
    fn saved(&self, regs: &Registers) -> Saved {
        let latched_root_table = self.remap.lock().unwrap().root_table;
        let (irta, latched_irta) = {
            let intr = self.intr.lock().unwrap();
            (intr.address, intr.table.irta())
        };
        let faults = self.faults.lock().unwrap();
        let record = faults.record.map(|f| Record {
            source: f.source,
            reason: f.reason,
            address: f.address,
            read: f.access == Access::Read,
        });
        Saved {
            status: regs.status,
            root_table: regs.root_table,
            latched_root_table,
            context_command: regs.context_command,
            invalidate_address: regs.invalidate_address,
            iotlb_command: regs.iotlb_command,
            queue_head: regs.queue.head,
            queue_tail: regs.queue.tail,
            queue_address: regs.queue.address,
            wait_completed: regs.queue.wait_completed,
            invalidation_event: regs.queue.event.clone(),
            irta,
            latched_irta,
            fault_record: record,
            fault_overflow: faults.overflow,
            queue_error: faults.queue_error,
            fault_event: faults.event.clone(),
        }
    }

    /// Take `s` (checked) into the registers, with every cache empty.
    fn load(&self, regs: &mut Registers, s: &Saved) {
        regs.status = s.status;
        regs.root_table = s.root_table;
        regs.context_command = s.context_command;
        regs.invalidate_address = s.invalidate_address;
        regs.iotlb_command = s.iotlb_command;
        regs.queue.head = s.queue_head;
        regs.queue.tail = s.queue_tail;
        regs.queue.address = s.queue_address;
        regs.queue.wait_completed = s.wait_completed;
        regs.queue.event = s.invalidation_event.clone();
        self.retranslate(|remap| {
            remap.enabled = s.status & VTD_GCMD_TE != 0;
            remap.root_table = s.latched_root_table;
            remap.caches.invalidate_contexts(ContextScope::Global);
            remap.caches.invalidate_iotlb(IotlbScope::Global);
        });
        {
            let mut intr = self.intr.lock().unwrap();
            intr.address = s.irta;
            intr.table = s.latched_irta.map_or_else(Table::default, Table::latched);
            intr.enabled = s.status & VTD_GCMD_IRE != 0;
            intr.compatibility = s.status & VTD_GCMD_CFI != 0;
            intr.cache.invalidate(IecScope::Global);
        }
        let mut faults = self.faults.lock().unwrap();
        faults.record = s.fault_record.as_ref().map(|r| FaultRecord {
            source: r.source,
            reason: r.reason,
            address: r.address,
            access: if r.read { Access::Read } else { Access::Write },
        });
        faults.overflow = s.fault_overflow;
        faults.queue_error = s.queue_error;
        faults.event = s.fault_event.clone();
    }
}

impl Persist for Iommu {
    /// Run the tails the doorbells caught: the queue is saved at rest.
    fn pause(&self) -> Result<(), StateError> {
        self.take_doorbells();
        Ok(())
    }

    fn save(&self) -> Result<serde_json::Value, StateError> {
        let regs = self.regs.lock().unwrap();
        to_state(ID, &self.saved(&regs))
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let saved: Saved = from_state(ID, state)?;
        check(&saved)?;
        let mut regs = self.regs.lock().unwrap();
        self.load(&mut regs, &saved);
        self.rearm_doorbells(&regs);
        self.refresh_interrupt_routes(&mut regs);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
