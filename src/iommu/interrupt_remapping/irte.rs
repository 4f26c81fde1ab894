//! The interrupt remapping table entry (VT-d §9.10, remapped mode) and the remappable-format
//! request that names it (§5.1.2.2): decoding both, checking the requester (SVT/SQ/SID,
//! §9.10), and the compatibility-format message a remapped interrupt becomes.

use super::super::regs::*;
use crate::irq::regs::{MSI_ADDRESS_BASE, MSI_ADDRESS_DEST_SHIFT, MSI_ADDRESS_MASK};
use crate::irq::remap::Message;

/// The interrupt index a remappable-format message names (§5.1.2.2): the handle in address
/// bits 19:5 and 2, plus data bits 15:0 when SHV is set. `Err` with fault reason 0x20 for a
/// request with reserved fields set (an upper address, or an address outside 0xFEEx_xxxx).
pub fn interrupt_index((address, data): Message) -> Result<u32, u8> {
    if address >> 32 != 0 || address & MSI_ADDRESS_MASK != MSI_ADDRESS_BASE {
        return Err(VTD_FR_IR_REQUEST_RESERVED);
    }
    let handle = (address >> VTD_MSI_HANDLE_SHIFT) & 0x7fff
        | u64::from(address & VTD_MSI_HANDLE_15 != 0) << 15;
    let subhandle = if address & VTD_MSI_SHV != 0 {
        data & 0xffff
    } else {
        0
    };
    Ok(handle as u32 + subhandle)
}

/// A present entry in remapped mode, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Irte {
    /// Destination mode (logical), redirection hint, trigger mode (level), delivery mode.
    pub logical: bool,
    /// Redirection hint.
    pub redirect: bool,
    /// Level-triggered.
    pub level: bool,
    /// Delivery mode (MSI data bits 10:8).
    pub delivery: u8,
    /// The vector.
    pub vector: u8,
    /// The destination APIC ID: 8 bits in xAPIC mode, 32 in x2APIC mode (EIME).
    pub destination: u32,
    /// Source validation: type, qualifier and source-id (§9.10).
    pub svt: u8,
    /// Source-id qualifier: how many low bits of the function number SVT 1 ignores.
    pub sq: u8,
    /// The source-id (SVT 1) or bus range (SVT 2) a requester must match.
    pub sid: u16,
}

/// Why an entry cannot be used: the fault reason, and whether the entry's FPD bit asks that
/// faults on it not be recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryFault {
    /// `VTD_FR_IR_*`.
    pub reason: u8,
    /// FPD: the fault is not recorded (§7.1.1).
    pub quiet: bool,
}

impl Irte {
    /// Decode an entry (`low`, `high`); `extended` is IRTA.EIME (32-bit destinations).
    pub fn decode(low: u64, high: u64, extended: bool) -> Result<Irte, EntryFault> {
        let quiet = low & VTD_IRTE_FPD != 0;
        let fault = |reason| EntryFault { reason, quiet };
        if low & VTD_IRTE_P == 0 {
            return Err(fault(VTD_FR_IR_NOT_PRESENT));
        }
        let delivery = ((low >> VTD_IRTE_DLM_SHIFT) & 7) as u8;
        let svt = ((high >> VTD_IRTE_SVT_SHIFT) & 3) as u8;
        let dst = (low >> VTD_IRTE_DST_SHIFT) as u32;
        // xAPIC mode: the APIC ID is DST 15:8; bits 7:0 and 31:16 are reserved (§9.10).
        let dst_reserved = !extended && dst & 0xffff_00ff != 0;
        // Delivery modes 3 and 6 are reserved; posted mode (IM) is not offered (ECAP.PI = 0).
        if low & (VTD_IRTE_RESERVED | VTD_IRTE_IM) != 0
            || high >> 20 != 0
            || svt == 3
            || matches!(delivery, 3 | 6)
            || dst_reserved
        {
            return Err(fault(VTD_FR_IR_ENTRY_RESERVED));
        }
        Ok(Irte {
            logical: low & VTD_IRTE_DM != 0,
            redirect: low & VTD_IRTE_RH != 0,
            level: low & VTD_IRTE_TM != 0,
            delivery,
            vector: (low >> VTD_IRTE_VECTOR_SHIFT) as u8,
            destination: if extended { dst } else { dst >> 8 },
            svt,
            sq: ((high >> VTD_IRTE_SQ_SHIFT) & 3) as u8,
            sid: high as u16,
        })
    }

    /// Whether requester `source` may use this entry (§9.10, SVT): SVT 0 any; SVT 1 its
    /// source-id equals SID but for the function bits SQ masks (1: bit 2, 2: bits 2:1,
    /// 3: bits 2:0); SVT 2 its bus lies in SID's range (start bus 15:8, end bus 7:0).
    pub fn admits(&self, source: u16) -> bool {
        match u64::from(self.svt) {
            VTD_IRTE_SVT_SID => {
                let ignored: u16 = match self.sq {
                    0 => 0,
                    1 => 0b100,
                    2 => 0b110,
                    _ => 0b111,
                };
                source & !ignored == self.sid & !ignored
            }
            VTD_IRTE_SVT_BUS => {
                let bus = source >> 8;
                (self.sid >> 8..=self.sid & 0xff).contains(&bus)
            }
            _ => true,
        }
    }

    /// The compatibility-format message the entry turns an interrupt into (Intel SDM vol. 3
    /// §11.11): destination, redirection hint and destination mode in the address; vector,
    /// delivery mode and trigger mode in the data. An x2APIC destination beyond 8 bits (but
    /// broadcast) goes in address bits 63:40, KVM's extended form, which this machine's
    /// routes refuse: no vCPU has such an APIC ID.
    pub fn message(&self) -> Message {
        let destination = u64::from(match self.destination {
            u32::MAX => 0xff,
            d => d,
        });
        let address = MSI_ADDRESS_BASE
            | (destination & 0xff) << MSI_ADDRESS_DEST_SHIFT
            | (destination >> 8) << 40
            | u64::from(self.redirect) << 3
            | u64::from(self.logical) << 2;
        let data =
            u32::from(self.vector) | u32::from(self.delivery) << 8 | u32::from(self.level) << 15;
        (address, data)
    }
}
