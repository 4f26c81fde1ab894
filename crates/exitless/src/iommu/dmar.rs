//! The ACPI DMA Remapping table (DMAR, VT-d §8.1) that tells an ACPI guest (Linux) where the
//! unit is: one DRHD (§8.3) with INCLUDE_PCI_ALL, so every PCI function of segment 0 is behind
//! it, and, when the machine's IOAPIC is the VMM's (a split irqchip), an IOAPIC device scope
//! (§8.3.1) and the INTR_REMAP flag. The probe learns the unit's base from its boot info
//! instead.

/// DRHD flags bit 0: every PCI device of the segment not named by another DRHD is behind it.
const DRHD_INCLUDE_PCI_ALL: u8 = 1;
/// DMAR flags bit 0: the platform supports interrupt remapping (§8.1); bit 1 (x2APIC opt-out)
/// stays clear.
const DMAR_INTR_REMAP: u8 = 1;
/// Device scope type 3: an IOAPIC (§8.3.1).
const SCOPE_IOAPIC: u8 = 3;
/// Length of the ACPI table header (ACPI 6.5 §5.2.6).
const HEADER_LEN: usize = 36;
/// Offset of the checksum byte in the header.
const CHECKSUM_AT: usize = 9;

/// An IOAPIC in the unit's scope: its ID (the MADT's) and its source-id, bus in the high byte
/// and device:function in the low one, which the scope's start bus and one-element path say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoapicScope {
    /// The IOAPIC's ID (the scope's enumeration ID).
    pub id: u8,
    /// The source-id of its interrupt messages.
    pub source_id: u16,
}

/// The DMAR table for one unit at `base` on a platform with `phys_bits` bits of physical
/// address (the host address width field holds that minus one, §8.1): signature "DMAR",
/// revision 1, one DRHD of type 0, checksummed. With `ioapic`, the DRHD names it in a device
/// scope and INTR_REMAP is set: Linux enables remapping only when every IOAPIC is in some
/// unit's scope. Without it (KVM's in-kernel IOAPIC, which cannot be remapped) the flag stays
/// clear although the unit remaps MSIs (docs/iommu.md).
pub fn dmar_table(base: u64, phys_bits: u8, ioapic: Option<IoapicScope>) -> Vec<u8> {
    let mut t = Vec::with_capacity(HEADER_LEN + 12 + 24);
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
    t.push(if ioapic.is_some() { DMAR_INTR_REMAP } else { 0 });
    t.extend_from_slice(&[0; 10]); // reserved
    // DRHD: type 0, length, flags, size (0: one 4 KiB page of registers), segment 0, base.
    let scope_len: u16 = if ioapic.is_some() { 8 } else { 0 };
    t.extend_from_slice(&0u16.to_le_bytes());
    t.extend_from_slice(&(16 + scope_len).to_le_bytes());
    t.push(DRHD_INCLUDE_PCI_ALL);
    t.push(0);
    t.extend_from_slice(&0u16.to_le_bytes());
    t.extend_from_slice(&base.to_le_bytes());
    if let Some(scope) = ioapic {
        // Type, length, reserved, enumeration ID, start bus, then the path: (device, function).
        let [bus, devfn] = scope.source_id.to_be_bytes();
        t.extend_from_slice(&[SCOPE_IOAPIC, 8, 0, 0, scope.id, bus, devfn >> 3, devfn & 7]);
    }
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
        let t = dmar_table(0xfed9_0000, 39, None);
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

    #[test]
    fn an_ioapic_in_scope_sets_intr_remap() {
        let scope = IoapicScope {
            id: 0,
            source_id: 0xff00,
        };
        let t = dmar_table(0xfed9_0000, 39, Some(scope));
        assert_eq!(t.len(), 72);
        assert_eq!(t.iter().fold(0u8, |s, &b| s.wrapping_add(b)), 0);
        assert_eq!(
            t[37], DMAR_INTR_REMAP,
            "INTR_REMAP set, x2APIC opt-out clear"
        );
        let drhd = &t[48..];
        assert_eq!(u16::from_le_bytes([drhd[2], drhd[3]]), 24);
        assert_eq!(
            &drhd[16..],
            &[3, 8, 0, 0, 0, 0xff, 0, 0],
            "IOAPIC 0 at ff:00.0"
        );
    }
}
