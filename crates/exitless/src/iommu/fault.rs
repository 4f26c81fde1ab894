//! Fault reporting (VT-d chapter 7): primary fault logging into the one fault recording
//! register FRCD0 (CAP.NFR = 0), the fault status register FSTS and the fault event.
//!
//! A fault is recorded in FRCD0 when it is free (F clear), setting PPF; when it is not, FSTS.PFO
//! (overflow) is set and the fault is lost (§7.2.1). An invalidation-queue error sets FSTS.IQE.
//! Each status that goes from clear to set raises the fault event (§7.3.1); software clearing
//! every status (F, PFO, IQE are write-1-to-clear) clears a pending one.

use super::event::{EventInterrupt, Message};
use super::regs::*;
use super::tables::PAGE_SIZE;
use crate::dma::Access;

/// One fault, as FRCD0 records it (§10.4.14).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    /// The requester's source-id.
    pub source: u16,
    /// Why it was blocked (`VTD_FR_*`).
    pub reason: u8,
    /// The address it asked for (the record keeps its page).
    pub address: u64,
    /// Read or write.
    pub access: Access,
}

/// FSTS, FRCD0 and the fault event.
#[derive(Debug, Default)]
pub struct Faults {
    /// FRCD0, if F is set.
    pub(super) record: Option<FaultRecord>,
    /// FSTS.PFO.
    pub(super) overflow: bool,
    /// FSTS.IQE.
    pub(super) queue_error: bool,
    /// FECTL..FEUADDR.
    pub event: EventInterrupt,
    /// Faults the unit took, recorded or lost to an overflow.
    count: u64,
}

impl Faults {
    /// A request faulted: record it if FRCD0 is free, else set PFO.
    pub fn record(&mut self, fault: FaultRecord) -> Option<Message> {
        self.count += 1;
        if self.record.is_none() {
            self.record = Some(fault);
            return self.event.raise();
        }
        if !std::mem::replace(&mut self.overflow, true) {
            return self.event.raise();
        }
        None
    }

    /// The invalidation queue stopped on an error (FSTS.IQE).
    pub fn queue_error(&mut self) -> Option<Message> {
        if std::mem::replace(&mut self.queue_error, true) {
            return None;
        }
        self.event.raise()
    }

    /// Whether FSTS.IQE is set: the queue does not run until software clears it.
    pub fn queue_stopped(&self) -> bool {
        self.queue_error
    }

    /// FSTS (§10.4.9): FRI is always 0, the only record.
    pub fn status(&self) -> u32 {
        let mut s = 0;
        if self.overflow {
            s |= VTD_FSTS_PFO;
        }
        if self.record.is_some() {
            s |= VTD_FSTS_PPF;
        }
        if self.queue_error {
            s |= VTD_FSTS_IQE;
        }
        s
    }

    /// Software writes FSTS: PFO and IQE are write-1-to-clear. Returns whether IQE was
    /// cleared (the queue may run again).
    pub fn write_status(&mut self, value: u32) -> bool {
        if value & VTD_FSTS_PFO != 0 {
            self.overflow = false;
        }
        let resume = value & VTD_FSTS_IQE != 0 && std::mem::take(&mut self.queue_error);
        self.settle();
        resume
    }

    /// FRCD0's two qwords (§10.4.14): the faulting page; then source-id, reason, type, F.
    pub fn record_qwords(&self) -> [u64; 2] {
        let Some(f) = self.record else {
            return [0, 0];
        };
        let read = if f.access == Access::Read {
            VTD_FRCD_T
        } else {
            0
        };
        [
            f.address & !(PAGE_SIZE - 1),
            VTD_FRCD_F | read | u64::from(f.reason) << VTD_FRCD_FR_SHIFT | u64::from(f.source),
        ]
    }

    /// Software writes FRCD0's high qword: F is write-1-to-clear, freeing the record.
    pub fn write_record_high(&mut self, value: u64) {
        if value & VTD_FRCD_F != 0 {
            self.record = None;
            self.settle();
        }
    }

    /// Faults taken so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// No status left set: no event pending either (§10.4.10, IP).
    fn settle(&mut self) {
        if self.status() == 0 {
            self.event.clear_pending();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iommu::event::{EVENT_ADDRESS, EVENT_CONTROL, EVENT_DATA};

    fn fault(reason: u8) -> FaultRecord {
        FaultRecord {
            source: 0x18,
            reason,
            address: 0x1234_5678,
            access: Access::Read,
        }
    }

    fn unmasked() -> Faults {
        let mut f = Faults::default();
        f.event.write(EVENT_DATA, 0x45);
        f.event.write(EVENT_ADDRESS, 0xfee0_0000);
        f.event.write(EVENT_CONTROL, 0);
        f
    }

    #[test]
    fn the_first_fault_fills_frcd0_and_the_next_ones_overflow() {
        let mut f = unmasked();
        assert_eq!(f.record(fault(VTD_FR_READ)), Some((0xfee0_0000, 0x45)));
        assert_eq!(f.status(), VTD_FSTS_PPF);
        let [low, high] = f.record_qwords();
        assert_eq!(low, 0x1234_5000);
        assert_eq!(high & 0xffff, 0x18);
        assert_eq!((high >> VTD_FRCD_FR_SHIFT) & 0xff, u64::from(VTD_FR_READ));
        assert_ne!(high & VTD_FRCD_T, 0, "a read request");
        assert_ne!(high & VTD_FRCD_F, 0);
        // Full: PFO, one event for it, and the record keeps the first fault.
        assert!(f.record(fault(VTD_FR_WRITE)).is_some());
        assert!(
            f.record(fault(VTD_FR_WRITE)).is_none(),
            "PFO was already set"
        );
        assert_eq!(f.status(), VTD_FSTS_PPF | VTD_FSTS_PFO);
        assert_eq!(
            f.record_qwords()[1] >> VTD_FRCD_FR_SHIFT & 0xff,
            u64::from(VTD_FR_READ)
        );
        f.write_record_high(VTD_FRCD_F);
        f.write_status(VTD_FSTS_PFO);
        assert_eq!(f.status(), 0);
        assert_eq!(f.count(), 3);
        let write = FaultRecord {
            access: Access::Write,
            ..fault(VTD_FR_WRITE)
        };
        f.record(write);
        assert_eq!(f.record_qwords()[1] & VTD_FRCD_T, 0, "a write request");
    }

    #[test]
    fn masked_events_pend_until_unmasked_or_serviced() {
        let mut f = Faults::default();
        f.event.write(EVENT_DATA, 0x45);
        f.event.write(EVENT_ADDRESS, 0xfee0_0000);
        assert_eq!(f.record(fault(VTD_FR_PTE)), None);
        assert_eq!(f.event.write(EVENT_CONTROL, 0), Some((0xfee0_0000, 0x45)));
        // Masked again, an IQE pends; servicing every status drops it.
        f.event.write(EVENT_CONTROL, VTD_EVENT_IM);
        assert_eq!(f.queue_error(), None);
        assert!(f.queue_stopped());
        assert!(f.write_status(VTD_FSTS_IQE), "the queue may run again");
        f.write_record_high(VTD_FRCD_F);
        assert_eq!(f.event.write(EVENT_CONTROL, 0), None);
    }
}
