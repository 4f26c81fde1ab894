//! Bus 0 saved and restored into a freshly built one: BARs decode where the guest had moved
//! them (two that traded places included), each function's own state comes back, and
//! snapshots of another bus or with a BAR outside the windows are refused naming what.

use super::*;
use crate::bus::IoBuses;
use crate::pci::PciAddress;
use crate::pci::function::{TestDevice, test_regs};
use crate::pci::regs::PCI_BAR0;
use crate::pci::root::{BarBuses, BarWindows};

fn root(io: &mut IoBuses, second_id: u16) -> PciRoot {
    let windows = BarWindows {
        mmio: (0xc000_0000, 0xe000_0000),
        io: (0xc000, 0x1_0000),
    };
    let root = PciRoot::new(windows, BarBuses::on(io, "pci-bars")).unwrap();
    for (d, id) in [(1, 1), (2, second_id)] {
        let at = PciAddress::new(0, d, 0).unwrap();
        root.add(at, &TestDevice::layout(id), Box::<TestDevice>::default())
            .unwrap();
    }
    root
}

fn at(d: u8) -> PciAddress {
    PciAddress::new(0, d, 0).unwrap()
}

fn bar0(root: &PciRoot, d: u8) -> u32 {
    let mut b = [0; 4];
    root.config_read(at(d), PCI_BAR0, &mut b);
    u32::from_le_bytes(b)
}

fn scratch(io: &IoBuses, base: u32) -> u32 {
    let mut b = [0; 4];
    io.mmio.read(u64::from(base) + test_regs::SCRATCH, &mut b);
    u32::from_le_bytes(b)
}

/// A bus whose two functions' BAR 0s traded places, each with its scratch register set.
fn saved() -> (serde_json::Value, [u32; 2]) {
    let mut io = IoBuses::default();
    let root = root(&mut io, 2);
    let (one, two) = (bar0(&root, 1), bar0(&root, 2));
    root.config_write(at(1), PCI_BAR0, &two.to_le_bytes());
    root.config_write(at(2), PCI_BAR0, &one.to_le_bytes());
    io.mmio.write(
        u64::from(two) + test_regs::SCRATCH,
        &0x1111u32.to_le_bytes(),
    );
    io.mmio.write(
        u64::from(one) + test_regs::SCRATCH,
        &0x2222u32.to_le_bytes(),
    );
    Persist::pause(&root).unwrap();
    (Persist::save(&root).unwrap(), [one, two])
}

#[test]
fn bars_decode_where_the_guest_moved_them_and_functions_keep_their_state() {
    let (state, [one, two]) = saved();
    let mut io = IoBuses::default();
    let fresh = root(&mut io, 2);
    Persist::restore(&fresh, state).unwrap();
    Persist::resume(&fresh);
    assert_eq!(
        (bar0(&fresh, 1), bar0(&fresh, 2)),
        (two, one),
        "as programmed"
    );
    assert_eq!(
        scratch(&io, two),
        0x1111,
        "00:01.0 decodes at its new place"
    );
    assert_eq!(scratch(&io, one), 0x2222, "and 00:02.0 at its");
}

#[test]
fn another_bus_or_a_bar_outside_the_windows_is_refused() {
    let (state, _) = saved();
    let mut io = IoBuses::default();
    let other = root(&mut io, 7);
    let err = Persist::restore(&other, state.clone()).unwrap_err();
    assert_eq!(err.what, "pci.00:02.0.config.device_id", "{err}");

    let mut outside = state.clone();
    for (i, b) in 0x1000u32.to_le_bytes().into_iter().enumerate() {
        outside["00:01.0"]["config"][usize::from(PCI_BAR0) + i] = b.into();
    }
    let fresh = root(&mut io, 2);
    let err = Persist::restore(&fresh, outside).unwrap_err();
    assert_eq!(err.what, "pci.00:01.0.bar[0]", "{err}");

    let mut missing = state;
    missing.as_object_mut().unwrap().remove("00:02.0");
    let err = Persist::restore(&fresh, missing).unwrap_err();
    assert_eq!(err.what, "pci.00:02.0", "{err}");
}

/// A snapshot taken while a BAR move waits for its range (00:01.0's BAR 0 programmed onto
/// 00:02.0's): restored, the range is still 00:02.0's, and the waiting BAR decodes once
/// 00:02.0 moves off, as on the machine the snapshot was taken of.
#[test]
fn a_bar_move_waiting_for_its_range_still_waits_after_a_restore() {
    let mut io = IoBuses::default();
    let taken = root(&mut io, 2);
    let (one, two) = (bar0(&taken, 1), bar0(&taken, 2));
    taken.config_write(at(1), PCI_BAR0, &two.to_le_bytes());
    io.mmio.write(
        u64::from(two) + test_regs::SCRATCH,
        &0x2222u32.to_le_bytes(),
    );
    Persist::pause(&taken).unwrap();
    let state = Persist::save(&taken).unwrap();

    let mut io = IoBuses::default();
    let fresh = root(&mut io, 2);
    Persist::restore(&fresh, state).unwrap();
    Persist::resume(&fresh);
    assert_eq!(scratch(&io, two), 0x2222, "00:02.0 keeps its range");
    assert_eq!(
        scratch(&io, one),
        u32::MAX,
        "nothing decodes at 00:01.0's old place"
    );
    fresh.config_write(at(2), PCI_BAR0, &one.to_le_bytes());
    assert_eq!(scratch(&io, one), 0x2222, "00:02.0 moved");
    assert_eq!(scratch(&io, two), 0, "00:01.0's move completes");
}
