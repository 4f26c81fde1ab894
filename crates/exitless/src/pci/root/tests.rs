//! Bus 0: BAR ranges following the guest's programming, conflicts, and lock-free
//! configuration reads.

use super::*;
use crate::bus::IoBuses;
use crate::pci::function::{TestDevice, test_regs};
use crate::pci::regs::PCI_COMMAND_MEMORY;

const NAME: &str = "pci-bars";

fn root(io: &mut IoBuses) -> PciRoot {
    let buses = BarBuses::on(io, NAME);
    let windows = BarWindows {
        mmio: (0xc000_0000, 0xe000_0000),
        io: (0xc000, 0x1_0000),
    };
    let root = PciRoot::new(windows, buses).unwrap();
    for (d, id) in [(1, 1), (2, 2)] {
        let at = PciAddress::new(0, d, 0).unwrap();
        root.add(at, &TestDevice::layout(id), Box::<TestDevice>::default())
            .unwrap();
    }
    root
}

fn scratch(io: &IoBuses, bar0: u64) -> u32 {
    let mut b = [0; 4];
    io.mmio.read(bar0 + test_regs::SCRATCH, &mut b);
    u32::from_le_bytes(b)
}

#[test]
fn each_decoded_bar_is_a_bus_range_that_follows_the_guest() {
    let mut io = IoBuses::default();
    let root = root(&mut io);
    let f = PciAddress::new(0, 1, 0).unwrap();
    let bars = io.id_for(NAME);
    // Placed at add: BAR 0 (4 KiB), BAR 1 (I/O), BAR 2 (64-bit, 1 MiB).
    assert_eq!(io.mmio.device_at(0xc000_0000), Some(bars));
    assert_eq!(io.pio.device_at(0xc000), Some(bars));
    io.mmio.write(0xc000_0000, &7u32.to_le_bytes());
    assert_eq!(scratch(&io, 0xc000_0000), 7);
    // Moved: the old place is free, the new one reaches the same function.
    root.config_write(f, PCI_BAR0, &0xd000_0000u32.to_le_bytes());
    assert_eq!(io.mmio.device_at(0xc000_0000), None);
    assert_eq!(scratch(&io, 0xd000_0000), 7);
    // Decoding off: gone; back on: back where the BAR says.
    root.config_write(f, PCI_COMMAND, &0u16.to_le_bytes());
    assert_eq!(io.mmio.device_at(0xd000_0000), None);
    assert_eq!(io.pio.device_at(0xc000), None);
    assert_eq!(scratch(&io, 0xd000_0000), 0xffff_ffff, "master abort");
    root.config_write(f, PCI_COMMAND, &PCI_COMMAND_MEMORY.to_le_bytes());
    assert_eq!(scratch(&io, 0xd000_0000), 7);
    assert_eq!(io.pio.device_at(0xc000), None, "I/O decoding still off");
}

#[test]
fn a_bar_moved_onto_another_range_decodes_once_its_range_is_free() {
    let mut io = IoBuses::default();
    let root = root(&mut io);
    let (f1, f2) = (
        PciAddress::new(0, 1, 0).unwrap(),
        PciAddress::new(0, 2, 0).unwrap(),
    );
    let mut f2_bar0 = [0; 4];
    root.config_read(f2, PCI_BAR0, &mut f2_bar0);
    let f2_bar0 = u64::from(u32::from_le_bytes(f2_bar0));
    io.mmio.write(f2_bar0, &2u32.to_le_bytes());
    io.mmio.write(0xc000_0000, &1u32.to_le_bytes());
    // 00:01.0 BAR 0 onto 00:02.0 BAR 0: refused (logged); 00:02.0 keeps decoding.
    root.config_write(f1, PCI_BAR0, &u32::try_from(f2_bar0).unwrap().to_le_bytes());
    assert_eq!(scratch(&io, f2_bar0), 2);
    assert_eq!(io.mmio.device_at(0xc000_0000), None);
    // An unrelated config write does not place it: the range is still taken.
    root.config_write(f1, PCI_COMMAND, &0x0006u16.to_le_bytes());
    assert_eq!(scratch(&io, f2_bar0), 2);
    // 00:02.0 moves off: 00:01.0 decodes where it was programmed, without a rewrite.
    root.config_write(f2, PCI_BAR0, &0xd100_0000u32.to_le_bytes());
    assert_eq!(scratch(&io, f2_bar0), 1);
    assert_eq!(scratch(&io, 0xd100_0000), 2);
    // Moved somewhere free: decoded again, same function state.
    root.config_write(f1, PCI_BAR0, &0xd000_0000u32.to_le_bytes());
    assert_eq!(scratch(&io, 0xd000_0000), 1);
    // A 64-bit BAR moved to the top of the address space, where it would wrap: no panic.
    root.config_write(f1, PCI_BAR0 + 8, &[0xff; 8]);
    root.config_write(f1, PCI_BAR0 + 8, &[0; 8]);
}

#[test]
fn config_reads_are_served_from_the_window() {
    let mut io = IoBuses::default();
    let root = root(&mut io);
    let mut b = [0; 4];
    root.config_read(PciAddress::new(0, 1, 0).unwrap(), 0, &mut b);
    assert_eq!(u32::from_le_bytes(b), 0x0001_7e57);
    root.config_read(PciAddress::new(0, 9, 0).unwrap(), 0, &mut b);
    assert_eq!(b, [0xff; 4], "absent function");
    root.config_read(PciAddress::new(1, 1, 0).unwrap(), 0, &mut b);
    assert_eq!(b, [0xff; 4], "no bus 1");
    root.config_read(PciAddress::new(0, 1, 0).unwrap(), 0xffe, &mut b);
    assert_eq!(b[2..], [0xff; 2], "past the function's 4 KiB");
}

#[test]
fn with_a_64_bit_window_64_bit_bars_go_above_ram_and_decode_in_either_window() {
    const HIGH: (u64, u64) = (0x1_8000_0000, 0x5_8000_0000);
    let mut io = IoBuses::default();
    let buses = BarBuses::on(&mut io, NAME);
    let windows = BarWindows {
        mmio: (0xc000_0000, 0xe000_0000),
        io: (0xc000, 0x1_0000),
    };
    let root = PciRoot::new(windows, buses)
        .unwrap()
        .with_mmio64(Some(HIGH));
    let f = PciAddress::new(0, 1, 0).unwrap();
    root.add(f, &TestDevice::layout(1), Box::<TestDevice>::default())
        .unwrap();
    let bars = io.id_for(NAME);
    let bar64 = |root: &PciRoot| {
        let (mut low, mut high) = ([0; 4], [0; 4]);
        root.config_read(f, PCI_BAR0 + 8, &mut low);
        root.config_read(f, PCI_BAR0 + 12, &mut high);
        u64::from(u32::from_le_bytes(high)) << 32 | u64::from(u32::from_le_bytes(low) & !0xf)
    };
    // BAR 0 (32-bit) in the 32-bit window, BAR 2 (64-bit, 1 MiB) in the one above RAM.
    assert_eq!(io.mmio.device_at(0xc000_0000), Some(bars));
    assert_eq!(bar64(&root), HIGH.0);
    assert_eq!(io.mmio.device_at(HIGH.0), Some(bars));
    // The guest may move it into the 32-bit window: it follows.
    root.config_write(f, PCI_BAR0 + 8, &0xd000_0000u32.to_le_bytes());
    root.config_write(f, PCI_BAR0 + 12, &0u32.to_le_bytes());
    assert_eq!(io.mmio.device_at(HIGH.0), None);
    assert_eq!(io.mmio.device_at(0xd000_0000), Some(bars));
    // Past both windows the host bridge forwards nothing.
    root.config_write(f, PCI_BAR0 + 12, &0x10u32.to_le_bytes());
    assert_eq!(bar64(&root), 0x10_d000_0000);
    assert_eq!(io.mmio.device_at(0xd000_0000), None);
    assert_eq!(io.mmio.device_at(0x10_d000_0000), None);
}
