//! One redirection-table entry (82093AA datasheet §3.2.4) and the MSI message it stands for
//! under a split irqchip, in either of its formats: compatibility (destination in bits 63:56)
//! or remappable (VT-d 3.x §5.1.5.1: bit 48 set, the interrupt index in bits 63:49 and 11).

use super::super::regs::MSI_ADDRESS_BASE;

/// Bits 7:0: the vector (in remappable format, the IRTE's vector, for EOI matching).
const VECTOR: u64 = 0xff;
/// Bits 10:8: the delivery mode.
const DELIVERY_MODE: u64 = 0x700;
/// Bit 11: the destination mode (compatibility), or interrupt index bit 15 (remappable).
const DEST_MODE_OR_INDEX15: u64 = 1 << 11;
/// Bit 14: remote IRR, set while a level-triggered interrupt awaits its EOI (read-only).
pub const REMOTE_IRR: u64 = 1 << 14;
/// Bit 15: level-triggered.
const LEVEL: u64 = 1 << 15;
/// Bit 16: masked.
pub const MASKED: u64 = 1 << 16;
/// Bits the guest cannot write: delivery status (12) and remote IRR (14).
pub const READ_ONLY: u64 = (1 << 12) | REMOTE_IRR;
/// Bits 63:48 land at MSI address bits 19:4 (see [`Rte::message`]).
const ADDRESS_FIELD_SHIFT: u32 = 48;
/// Where bits 63:48 go in the MSI address.
const ADDRESS_FIELD_AT: u32 = 4;
/// Where bit 11 goes in the MSI address (destination mode, or handle bit 15: SDM §11.11.1,
/// VT-d §5.1.2.2).
const ADDRESS_BIT11_AT: u32 = 2;
/// MSI data bit 15: level trigger mode (SDM §11.11.2).
const DATA_LEVEL: u32 = 1 << 15;

/// A redirection-table entry, as the guest wrote it (remote IRR kept by the IOAPIC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rte(pub u64);

impl Rte {
    /// The power-on value: masked (82093AA §3.2.4).
    pub const RESET: Rte = Rte(MASKED);

    /// The vector the EOI of its interrupt names.
    pub fn vector(self) -> u8 {
        (self.0 & VECTOR) as u8
    }

    /// Whether the pin is masked.
    pub fn masked(self) -> bool {
        self.0 & MASKED != 0
    }

    /// Whether the pin is level-triggered.
    pub fn level(self) -> bool {
        self.0 & LEVEL != 0
    }

    /// Whether an interrupt awaits its EOI (level-triggered pins only).
    pub fn remote_irr(self) -> bool {
        self.0 & REMOTE_IRR != 0
    }

    /// The MSI the entry sends, as a split-irqchip IOAPIC sends it (QEMU's
    /// `ioapic_entry_parse` does the same). Bits 63:48 move to address bits 19:4 and bit 11 to
    /// address bit 2: in compatibility format that is the destination (bits 63:56 to 19:12,
    /// reserved bits 55:48 zero) and the destination mode; in remappable format, the format
    /// bit (48 to 4) and the interrupt index (63:49 to the handle's 19:5, 11 to 2), with SHV
    /// clear, which is the remappable MSI address of VT-d §5.1.2.2. The data carries the
    /// vector, the delivery mode and the trigger mode (SDM §11.11.2).
    pub fn message(self) -> (u64, u32) {
        let field = self.0 >> ADDRESS_FIELD_SHIFT;
        let bit11 = (self.0 & DEST_MODE_OR_INDEX15) >> 11;
        let address = MSI_ADDRESS_BASE | (field << ADDRESS_FIELD_AT) | (bit11 << ADDRESS_BIT11_AT);
        let mut data = (self.0 & (VECTOR | DELIVERY_MODE)) as u32;
        if self.level() {
            data |= DATA_LEVEL;
        }
        (address, data)
    }

    /// The entry after the guest writes `value` to its low (`high == false`) or high half;
    /// the read-only bits keep their value, and an edge-triggered entry has no remote IRR.
    pub fn written(self, high: bool, value: u32) -> Rte {
        let (shift, half) = if high {
            (32, 0xffff_ffff_0000_0000)
        } else {
            (0, 0xffff_ffff)
        };
        let wanted = (self.0 & !half) | (u64::from(value) << shift);
        let mut rte = (wanted & !READ_ONLY) | (self.0 & READ_ONLY);
        if rte & LEVEL == 0 {
            rte &= !REMOTE_IRR;
        }
        Rte(rte)
    }

    /// The half the guest reads at `high`.
    pub fn half(self, high: bool) -> u32 {
        if high {
            (self.0 >> 32) as u32
        } else {
            (self.0 & 0xffff_ffff) as u32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compatibility_entry_becomes_its_msi() {
        // Destination APIC 3, physical, fixed, vector 0x31, level-triggered.
        let rte = Rte((3u64 << 56) | LEVEL | 0x31);
        assert_eq!(rte.message(), (0xfee0_3000, 0x8031));
        // Logical destination mode, lowest priority, edge.
        let rte = Rte((0x0fu64 << 56) | (1 << 11) | (1 << 8) | 0x40);
        assert_eq!(rte.message(), (0xfee0_f004, 0x0140));
    }

    #[test]
    fn a_remappable_entry_becomes_a_remappable_msi_with_its_index() {
        // Index 0x8005: bits 14:0 in 63:49, bit 15 in bit 11; format bit 48; vector 0x41.
        let rte = Rte((5u64 << 49) | (1 << 48) | (1 << 11) | LEVEL | 0x41);
        let (address, data) = rte.message();
        assert_eq!(address & 0xfff0_0000, 0xfee0_0000);
        assert_eq!(address & (1 << 4), 1 << 4, "remappable format");
        assert_eq!((address >> 5) & 0x7fff, 5, "handle 14:0");
        assert_eq!((address >> 2) & 1, 1, "handle bit 15");
        assert_eq!(address & (1 << 3), 0, "no subhandle");
        assert_eq!(data, 0x8041);
    }

    #[test]
    fn writes_keep_the_read_only_bits_and_edge_entries_have_no_remote_irr() {
        let rte = Rte(LEVEL | REMOTE_IRR | 0x30);
        let written = rte.written(false, 0x9033); // level, delivery status, vector 0x33
        assert_eq!(written, Rte(LEVEL | REMOTE_IRR | 0x33));
        assert_eq!(written.written(true, 0x0200_0000).half(true), 0x0200_0000);
        assert!(
            !rte.written(false, 0x33).remote_irr(),
            "edge: no remote IRR"
        );
        assert!(Rte::RESET.masked());
    }
}
