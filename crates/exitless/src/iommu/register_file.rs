//! The unit's register page (VT-d chapter 10): how accesses decode into qwords, what each
//! register reads, and what a write to it does. CAP and ECAP say what the unit offers.

use super::Iommu;
use super::event::{EVENT_ADDRESS, EVENT_CONTROL, EventInterrupt, Message};
use super::queue::InvalidationQueue;
use super::regs::*;
use super::tables::PAGE_SIZE;
use crate::bus::BusDevice;
use crate::guest_error;

/// CAP (§10.4.2): 16-bit domain IDs, 4-level tables only, 2 MiB pages, 48-bit MGAW, FRCD0 at
/// `VTD_FRCD_REG` and one record, page-selective invalidation up to 2^MAMV pages. CM = 0
/// (not-present entries are never cached, so a map needs no invalidation) and RWBF = 0.
pub const CAP: u64 = VTD_CAP_ND_16BIT
    | VTD_CAP_SAGAW_4LEVEL
    | (VTD_ADDRESS_WIDTH - 1) << VTD_CAP_MGAW_SHIFT
    | (VTD_FRCD_REG / 16) << VTD_CAP_FRO_SHIFT
    | VTD_CAP_SLLPS_2M
    | VTD_CAP_PSI
    | VTD_MAMV << VTD_CAP_MAMV_SHIFT;
/// ECAP (§10.4.3): coherent walks, queued invalidation, interrupt remapping with extended
/// (x2APIC) mode, IVA at `VTD_IVA_REG`; no pass-through, device-TLBs, posted interrupts or
/// scalable mode.
pub const ECAP: u64 = VTD_ECAP_C
    | VTD_ECAP_QI
    | VTD_ECAP_IR
    | VTD_ECAP_EIM
    | (VTD_IVA_REG / 16) << VTD_ECAP_IRO_SHIFT;

/// The qwords that hold a 32-bit register in their high half.
const FSTS_QWORD: u64 = VTD_FSTS_REG & !7;
const ICS_QWORD: u64 = VTD_ICS_REG & !7;
/// FRCD0's high qword.
const FRCD_HIGH: u64 = VTD_FRCD_REG + 8;

/// The vCPU side: the register file and the invalidation queue.
#[derive(Debug, Default)]
pub(super) struct Registers {
    /// GSTS: TES, RTPS, QIES, IRES, IRTPS, CFIS (the GCMD bits of the same positions).
    pub(super) status: u32,
    /// RTADDR as written (63:12).
    pub(super) root_table: u64,
    /// CCMD (§10.4.7) as written, ICC and CAIG as the last invalidation left them.
    pub(super) context_command: u64,
    pub(super) queue: InvalidationQueue,
    /// IVA (§10.4.8.2): the pages of a page-selective register-based invalidation.
    pub(super) invalidate_address: u64,
    /// The IOTLB register (§10.4.8.1) as written, IVT and IAIG as the last invalidation left
    /// them.
    pub(super) iotlb_command: u64,
    /// The queue and invalidation figures of [`super::IommuStats`].
    pub(super) stats: super::IommuStats,
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
    /// What the qword at `qword` reads; undefined offsets read 0 (§10.4).
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
            VTD_IRTA_REG => self.intr.lock().unwrap().address,
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
            VTD_IQT_REG if low => self.take_tail(&mut regs, value, 1),
            VTD_IQA_REG => {
                let iqa = merge(regs.queue.address());
                regs.queue.set_address(iqa);
                self.rearm_doorbells(&regs);
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
            VTD_IRTA_REG => {
                let mut intr = self.intr.lock().unwrap();
                let irta = merge(intr.address);
                intr.set_address(irta);
            }
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

    /// IQT takes `tail` (`writes` writes of it: an exit's one, or what a doorbell counted)
    /// and the queue runs up to it.
    pub(super) fn take_tail(&self, regs: &mut Registers, tail: u64, writes: u64) {
        regs.queue.set_tail(tail);
        regs.stats.tail_writes += writes;
        self.run_queue(regs);
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
            self.rearm_doorbells(regs);
        }
        // WBF: nothing is buffered (CAP.RWBF = 0), so WBFS is never left set.
        self.interrupt_command(regs, value);
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
