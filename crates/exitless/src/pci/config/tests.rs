//! Configuration space: header fields, BAR sizing, RW1C status bits, capability chains.

use super::*;

#[test]
fn touches_is_range_overlap_for_every_edge() {
    for (offset, len, start, size, want) in [
        (4, 2, 4, 2, true),
        (3, 1, 4, 2, false),
        (3, 2, 4, 2, true),
        (5, 4, 4, 2, true),
        (6, 4, 4, 2, false),
        (4, 0, 4, 2, false),
        (4, 2, 4, 0, false),
        (0, usize::MAX, u16::MAX, 1, true),
        (u16::MAX, usize::MAX, u16::MAX, usize::MAX, true),
        (u16::MAX, 1, 0, usize::from(u16::MAX), false),
    ] {
        assert_eq!(
            touches(offset, len, start, size),
            want,
            "{offset} {len} {start} {size}"
        );
        assert_eq!(touches(start, size, offset, len), want, "symmetric");
    }
}

fn space(layout: &FunctionLayout, addrs: &[u64]) -> ConfigSpace {
    let window = Arc::new(ConfigWindow::new(1).unwrap());
    ConfigSpace::new(window, 0x8000, layout, addrs).unwrap().0
}

fn read32(cs: &ConfigSpace, reg: u16) -> u32 {
    let mut b = [0; 4];
    cs.read(reg, &mut b);
    u32::from_le_bytes(b)
}

fn layout() -> FunctionLayout {
    crate::pci::function::TestDevice::layout(0x0001)
}

#[test]
fn header_fields_and_read_only_ids() {
    let cs = space(&layout(), &[]);
    assert_eq!(read32(&cs, 0), 0x0001_7e57);
    assert_eq!(read32(&cs, 8), 0xff00_0001);
    cs.write(0, &[0, 0, 0, 0]);
    cs.write(8, &0xffff_ffffu32.to_le_bytes());
    assert_eq!(read32(&cs, 0), 0x0001_7e57, "IDs are read-only");
    assert_eq!(read32(&cs, 8), 0xff00_0001, "class/revision are read-only");
}

#[test]
fn bar_sizing_reads_back_the_size_mask() {
    let cs = space(&layout(), &[0xc000_0000, 0xc040, 0x1_0000_0000]);
    assert_eq!(read32(&cs, 0x10), 0xc000_0000);
    assert_eq!(read32(&cs, 0x14), 0xc041);
    assert_eq!(read32(&cs, 0x18), 0x0000_000c);
    assert_eq!(read32(&cs, 0x1c), 0x1);
    for reg in [0x10, 0x14, 0x18, 0x1c, 0x20, 0x24] {
        cs.write(reg, &[0xff; 4]);
    }
    assert_eq!(read32(&cs, 0x10), 0xffff_f000, "4 KiB memory BAR");
    assert_eq!(
        read32(&cs, 0x14),
        0xffff_ffe1,
        "32-byte I/O BAR keeps its I/O bit"
    );
    assert_eq!(
        read32(&cs, 0x18),
        0xfff0_000c,
        "64-bit prefetchable keeps its type bits"
    );
    assert_eq!(read32(&cs, 0x1c), 0xffff_ffff);
    assert_eq!(read32(&cs, 0x20), 0, "unimplemented BAR");
    cs.write(0x10, &0xd000_0123u32.to_le_bytes());
    assert_eq!(read32(&cs, 0x10), 0xd000_0000);
}

#[test]
fn bar_address_follows_guest_writes() {
    let l = layout();
    let window = Arc::new(ConfigWindow::new(1).unwrap());
    let (cs, slots) =
        ConfigSpace::new(window, 0, &l, &[0xc000_0000, 0xc040, 0x2_0000_0000]).unwrap();
    assert_eq!(slots.iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(cs.bar_address(2, &slots[2].1), 0x2_0000_0000);
    cs.write(0x1c, &[0, 0, 0, 0]);
    cs.write(0x18, &0x0030_0000u32.to_le_bytes());
    assert_eq!(cs.bar_address(2, &slots[2].1), 0x30_0000);
}

#[test]
fn status_bits_are_rw1c_and_device_settable() {
    let cs = space(&layout(), &[]);
    cs.set_u16(
        PCI_STATUS,
        cs.get_u16(PCI_STATUS) | PCI_STATUS_SIG_TARGET_ABORT,
    );
    assert_eq!(cs.get_u16(PCI_STATUS), 0x0810);
    cs.write(PCI_STATUS, &0x0010u16.to_le_bytes()); // writing 0 to 0x800 keeps it
    assert_eq!(cs.get_u16(PCI_STATUS), 0x0810);
    cs.write(PCI_STATUS, &0xffffu16.to_le_bytes()); // 1 clears; CAP_LIST is read-only
    assert_eq!(cs.get_u16(PCI_STATUS), 0x0010);
}

#[test]
fn capability_chain_and_masks() {
    let cs = space(&layout(), &[]);
    assert_eq!(
        cs.get_u16(PCI_STATUS) & PCI_STATUS_CAP_LIST,
        PCI_STATUS_CAP_LIST
    );
    let mut b = [0; 1];
    cs.read(PCI_CAPABILITY_LIST, &mut b);
    assert_eq!(b[0], 0x40);
    assert_eq!(cs.get_u16(0x40), 0x4809, "vendor cap, next at 0x48");
    assert_eq!(cs.get_u16(0x48), 0x5001, "PM cap, next at 0x50");
    assert_eq!(cs.get_u16(0x50), 0x6005, "MSI cap, next at 0x60");
    assert_eq!(cs.get_u16(0x60), 0x0010, "PCI Express cap, end of list");
    assert_eq!(cs.get_u16(0x62), 0x0002, "version 2, Endpoint");
    assert_eq!(cs.find_capability(PCI_CAP_ID_EXP), Some(0x60));
    assert_eq!(cs.find_capability(PCI_CAP_ID_MSIX), None);
    cs.write(0x4c, &[0xff]); // PMCSR power state: only bits 1:0 writable
    assert_eq!(cs.get_u16(0x4c) & 0xff, 0x03);
    cs.write(0x42, &[0x55, 0x55]);
    assert_eq!(cs.get_u16(0x42), 0x0008, "vendor cap body is read-only");
    assert_eq!(cs.get_u32(0x100), 0x0001_000b);
    cs.write(0x104, &0x1234_5678u32.to_le_bytes());
    assert_eq!(cs.get_u32(0x104), 0x00c1_0001, "VSEC header is read-only");
    cs.write(0x108, &0x1234_5678u32.to_le_bytes());
    assert_eq!(cs.get_u32(0x108), 0x1234_5678);
}

#[test]
fn unaligned_and_odd_sized_accesses_are_bytewise() {
    let cs = space(&layout(), &[]);
    let mut b = [0; 4];
    cs.read(1, &mut b); // crosses into the device ID and the command register
    assert_eq!(b, [0x7e, 0x01, 0x00, 0x00]);
    cs.write(3, &[0xff, 0xff]); // device ID high byte (RO) and command low byte
    assert_eq!(
        cs.get_u16(PCI_COMMAND) & 0xff,
        (COMMAND_WMASK & 0xff) as u8 as u16
    );
    assert_eq!(cs.get_u16(PCI_DEVICE_ID), 1);
    let mut tail = [0; 4];
    cs.read(0xffe, &mut tail);
    assert_eq!(tail[2..], [0xff, 0xff], "past the 4 KiB reads all-ones");
    cs.write(0xffe, &[1, 2, 3, 4]); // must not spill into the next function
}

#[test]
fn bad_layouts_are_refused() {
    let window = Arc::new(ConfigWindow::new(1).unwrap());
    let mut l = layout();
    l.bars = vec![Bar::Memory32 {
        size: 0x1800,
        prefetchable: false,
    }];
    assert!(matches!(
        ConfigSpace::new(window.clone(), 0, &l, &[]),
        Err(ConfigError::BarSize { .. })
    ));
    l.bars = vec![
        Bar::Memory64 {
            size: 0x1000,
            prefetchable: false
        };
        4
    ];
    assert!(matches!(
        ConfigSpace::new(window.clone(), 0, &l, &[]),
        Err(ConfigError::TooManyBars)
    ));
    l.bars.clear();
    l.capabilities = vec![Capability {
        id: 9,
        body: vec![0; 200],
        body_wmask: vec![],
    }];
    assert!(matches!(
        ConfigSpace::new(window.clone(), 0, &l, &[]),
        Err(ConfigError::CapabilitiesOverflow)
    ));
    // Extended capabilities only on a PCI Express function (PCIe 4.0 §7.6).
    let mut l = layout();
    l.capabilities.retain(|c| c.id != PCI_CAP_ID_EXP);
    assert!(matches!(
        ConfigSpace::new(window, 0, &l, &[]),
        Err(ConfigError::ExtCapabilitiesWithoutPcie)
    ));
}
