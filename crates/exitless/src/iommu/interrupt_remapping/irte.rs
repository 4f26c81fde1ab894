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
    /// FPD: faults on this entry (a requester it does not admit) are not recorded.
    pub quiet: bool,
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
            quiet,
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

#[cfg(test)]
mod tests {
    use super::*;

    const PRESENT_TO_3: u64 = VTD_IRTE_P | 0x41 << VTD_IRTE_VECTOR_SHIFT | 3 << 40;

    #[test]
    fn an_entry_decodes_into_the_message_it_delivers() {
        let low = PRESENT_TO_3 | VTD_IRTE_DM | VTD_IRTE_RH | VTD_IRTE_TM | 1 << VTD_IRTE_DLM_SHIFT;
        let e = Irte::decode(low, 0, false).unwrap();
        assert_eq!(e.destination, 3);
        assert_eq!(e.message(), (0xfee0_300c, 0x8141));
        // x2APIC mode: 32-bit destinations; 255 and below fit the 8-bit APIC IDs, broadcast
        // stays broadcast, the others take KVM's extended form (no such vCPU here).
        let x2 = |dst: u64| Irte::decode(VTD_IRTE_P | 0x41 << 16 | dst << 32, 0, true).unwrap();
        assert_eq!(x2(0x12).message().0, 0xfee1_2000);
        assert_eq!(x2(0xffff_ffff).message().0, 0xfeef_f000);
        assert_eq!(x2(0x1_0002).message().0, 0x1_0000_fee0_2000);
    }

    #[test]
    fn absent_reserved_and_posted_entries_are_refused_with_their_reason() {
        let reason = |low, high, extended| Irte::decode(low, high, extended).map_err(|f| f.reason);
        assert_eq!(reason(0, 0, false), Err(VTD_FR_IR_NOT_PRESENT));
        let quiet = Irte::decode(VTD_IRTE_FPD, 0, false).unwrap_err();
        assert!(quiet.quiet, "FPD: not recorded");
        for (low, high) in [
            (PRESENT_TO_3 | VTD_IRTE_IM, 0),             // posted
            (PRESENT_TO_3 | 1 << 12, 0),                 // reserved 14:12
            (PRESENT_TO_3 | 3 << VTD_IRTE_DLM_SHIFT, 0), // reserved delivery mode
            (PRESENT_TO_3 | 1 << 32, 0),                 // xAPIC: DST 7:0 reserved
            (PRESENT_TO_3, 3 << VTD_IRTE_SVT_SHIFT),     // SVT 3
            (PRESENT_TO_3, 1 << 20),                     // high reserved
        ] {
            assert_eq!(
                reason(low, high, false),
                Err(VTD_FR_IR_ENTRY_RESERVED),
                "{low:#x} {high:#x}"
            );
        }
        assert!(
            Irte::decode(PRESENT_TO_3 | 1 << 32, 0, true).is_ok(),
            "x2APIC: 32 bits"
        );
    }

    #[test]
    fn source_validation_by_id_under_the_qualifier_or_by_bus_range() {
        let entry = |high| Irte::decode(PRESENT_TO_3, high, false).unwrap();
        let by_id = |sq: u64| entry(VTD_IRTE_SVT_SID << VTD_IRTE_SVT_SHIFT | sq << 16 | 0x0118);
        assert!(by_id(0).admits(0x0118));
        assert!(!by_id(0).admits(0x011c));
        assert!(by_id(1).admits(0x011c), "SQ 1 ignores function bit 2");
        assert!(!by_id(1).admits(0x011a));
        assert!(by_id(2).admits(0x011e));
        assert!(by_id(3).admits(0x011f));
        assert!(!by_id(3).admits(0x0120));
        let buses = entry(VTD_IRTE_SVT_BUS << VTD_IRTE_SVT_SHIFT | 0x0203);
        assert!(buses.admits(0x0200) && buses.admits(0x03ff));
        assert!(!buses.admits(0x0100) && !buses.admits(0x0400));
        assert!(entry(0).admits(0xffff), "SVT 0: anyone");
    }

    #[test]
    fn the_index_is_the_handle_plus_the_subhandle_when_shv_is_set() {
        let address = |handle: u64| {
            0xfee0_0000 | VTD_MSI_REMAPPABLE | (handle & 0x7fff) << 5 | (handle >> 15) << 2
        };
        assert_eq!(interrupt_index((address(0x1234), 0x55)), Ok(0x1234));
        assert_eq!(interrupt_index((address(0x8001), 0)), Ok(0x8001));
        assert_eq!(
            interrupt_index((address(0x10) | VTD_MSI_SHV, 0xffff_0005)),
            Ok(0x15)
        );
        assert_eq!(
            interrupt_index((address(1) | 1 << 32, 0)),
            Err(VTD_FR_IR_REQUEST_RESERVED)
        );
    }
}
