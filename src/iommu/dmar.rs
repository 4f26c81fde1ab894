//! The ACPI DMA Remapping table (DMAR, VT-d §8.1) that tells an ACPI guest (Linux) where the
//! unit is: one DRHD (§8.3) with INCLUDE_PCI_ALL, so every PCI function of segment 0 is behind
//! it. Built here for the ACPI tables `exitless run` will add; the probe learns the unit's base
//! from its boot info instead.

/// DRHD flags bit 0: every PCI device of the segment not named by another DRHD is behind it.
const DRHD_INCLUDE_PCI_ALL: u8 = 1;
/// Length of the ACPI table header (ACPI 6.5 §5.2.6).
const HEADER_LEN: usize = 36;
/// Offset of the checksum byte in the header.
const CHECKSUM_AT: usize = 9;

/// The DMAR table for one unit at `base` on a platform with `phys_bits` bits of physical
/// address (the host address width field holds that minus one, §8.1): signature "DMAR",
/// revision 1, flags 0, one DRHD of type 0 and length 16, checksummed. INTR_REMAP (flags bit 0)
/// stays clear although the unit remaps MSIs: the in-kernel IOAPIC cannot be remapped, and
/// Linux enables remapping only with every IOAPIC in a unit's scope (docs/iommu.md).
pub fn dmar_table(base: u64, phys_bits: u8) -> Vec<u8> {
    let mut t = Vec::with_capacity(HEADER_LEN + 12 + 16);
    t.extend_from_slice(b"DMAR");
    t.extend_from_slice(&[0; 4]); // length, below
    t.push(1); // revision
    t.push(0); // checksum, below
    t.extend_from_slice(b"EXITLS"); // OEM ID
    t.extend_from_slice(b"EXITLESS"); // OEM table ID
    t.extend_from_slice(&1u32.to_le_bytes()); // OEM revision
    t.extend_from_slice(b"EXLS"); // creator ID
    t.extend_from_slice(&1u32.to_le_bytes()); // creator revision
    t.push(phys_bits.saturating_sub(1)); // host address width
    t.push(0); // flags
    t.extend_from_slice(&[0; 10]); // reserved
    // DRHD: type 0, length 16, flags, size (0: one 4 KiB page of registers), segment 0, base.
    t.extend_from_slice(&0u16.to_le_bytes());
    t.extend_from_slice(&16u16.to_le_bytes());
    t.push(DRHD_INCLUDE_PCI_ALL);
    t.push(0);
    t.extend_from_slice(&0u16.to_le_bytes());
    t.extend_from_slice(&base.to_le_bytes());
    let len = u32::try_from(t.len()).expect("a small table");
    t[4..8].copy_from_slice(&len.to_le_bytes());
    // The bytes of the whole table add up to 0 (ACPI 6.5 §5.2.6).
    let sum = t.iter().fold(0u8, |s, &b| s.wrapping_add(b));
    t[CHECKSUM_AT] = 0u8.wrapping_sub(sum);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_drhd_for_every_pci_device_and_a_checksum_of_zero() {
        let t = dmar_table(0xfed9_0000, 39);
        assert_eq!(&t[0..4], b"DMAR");
        assert_eq!(u32::from_le_bytes(t[4..8].try_into().unwrap()), 64);
        assert_eq!(t.len(), 64);
        assert_eq!(t[8], 1, "revision");
        assert_eq!(t.iter().fold(0u8, |s, &b| s.wrapping_add(b)), 0);
        assert_eq!((t[36], t[37]), (38, 0), "host address width, flags");
        let drhd = &t[48..];
        assert_eq!(u16::from_le_bytes([drhd[0], drhd[1]]), 0, "type DRHD");
        assert_eq!(u16::from_le_bytes([drhd[2], drhd[3]]), 16);
        assert_eq!(drhd[4], DRHD_INCLUDE_PCI_ALL);
        assert_eq!(u16::from_le_bytes([drhd[6], drhd[7]]), 0, "segment");
        assert_eq!(
            u64::from_le_bytes(drhd[8..16].try_into().unwrap()),
            0xfed9_0000
        );
    }
}
