//! MSI-X through a function's configuration space and table: capability registers, enable,
//! and qword table accesses.

use super::*;
use crate::fakes::FakeRoutes;
use crate::pci::config::{ConfigWindow, FunctionLayout};

const TABLE: MsixLocation = MsixLocation {
    bir: 0,
    offset: 0x2000,
};
const PBA: MsixLocation = MsixLocation {
    bir: 0,
    offset: 0x3000,
};

fn parts(entries: usize) -> (Msix, ConfigSpace, Arc<FakeRoutes>) {
    let routes = Arc::new(FakeRoutes::with_strategy(
        crate::irq::CommitStrategy::Batched,
    ));
    let vectors = Arc::new(
        MsiVectors::new(
            routes.clone(),
            entries,
            crate::logging::DeviceLog::new("test"),
            crate::irq::Signaller::Vmm,
        )
        .unwrap(),
    );
    let layout = FunctionLayout {
        capabilities: vec![Msix::capability(entries, TABLE, PBA)],
        ..Default::default()
    };
    let window = Arc::new(ConfigWindow::new(1).unwrap());
    let config = ConfigSpace::new(window, 0, &layout, &[]).unwrap().0;
    let mut msix = Msix::new(vectors);
    msix.attached(&config);
    (msix, config, routes)
}

fn entry(i: u64, field: u32) -> u64 {
    i * u64::from(PCI_MSIX_ENTRY_SIZE) + u64::from(field)
}

fn write_control(msix: &mut Msix, config: &ConfigSpace, control: u16) {
    let reg = msix.cap.unwrap() + PCI_MSIX_FLAGS;
    config.write(reg, &control.to_le_bytes());
    assert!(msix.config_written(config, reg, 2));
}

#[test]
fn capability_registers_hold_size_and_locations() {
    let (msix, config, _routes) = parts(5);
    let cap = msix.cap.expect("found");
    assert_eq!(config.get_u16(cap + PCI_MSIX_FLAGS), 4, "table size N - 1");
    assert_eq!(config.get_u32(cap + PCI_MSIX_TABLE), 0x2000);
    assert_eq!(config.get_u32(cap + PCI_MSIX_PBA), 0x3000);
    config.write(cap + PCI_MSIX_FLAGS, &0xffffu16.to_le_bytes());
    assert_eq!(
        config.get_u16(cap + PCI_MSIX_FLAGS),
        PCI_MSIX_FLAGS_ENABLE | PCI_MSIX_FLAGS_MASKALL | 4,
        "only Enable and Function Mask are writable"
    );
}

#[test]
fn enable_takes_every_unmasked_entry_in_one_commit() {
    let (mut msix, config, routes) = parts(4);
    for i in 0..4 {
        msix.table_write(
            entry(i, PCI_MSIX_ENTRY_LOWER_ADDR),
            &0xfee0_0000u32.to_le_bytes(),
        );
        let data = 0x40 + u32::try_from(i).unwrap();
        msix.table_write(entry(i, PCI_MSIX_ENTRY_DATA), &data.to_le_bytes());
        if i != 3 {
            msix.table_write(entry(i, PCI_MSIX_ENTRY_VECTOR_CTRL), &0u32.to_le_bytes());
        }
    }
    assert_eq!(
        routes.commits(),
        0,
        "nothing is routed while MSI-X is disabled"
    );
    write_control(&mut msix, &config, PCI_MSIX_FLAGS_ENABLE);
    assert!(msix.is_enabled());
    assert_eq!(routes.commits(), 1);
    assert_eq!(msix.vectors().message(2), Some((0xfee0_0000, 0x42)));
    assert!(msix.vectors().is_masked(3));
    // The fake hands out GSIs 24.. in vector order. The masked entry's message has not
    // taken effect (it does at unmask), so it has no route.
    for gsi in 24..27 {
        assert_eq!(routes.route(gsi), Some((0xfee0_0000, 0x40 + gsi - 24)));
    }
    assert_eq!(routes.route(27), None);
}

#[test]
fn enable_hands_over_what_changed_while_disabled_and_nothing_else() {
    let (mut msix, config, routes) = parts(2);
    for i in 0..2 {
        msix.table_write(
            entry(i, PCI_MSIX_ENTRY_LOWER_ADDR),
            &0xfee0_0000u32.to_le_bytes(),
        );
        msix.table_write(entry(i, PCI_MSIX_ENTRY_DATA), &0x40u32.to_le_bytes());
        msix.table_write(entry(i, PCI_MSIX_ENTRY_VECTOR_CTRL), &0u32.to_le_bytes());
    }
    write_control(&mut msix, &config, PCI_MSIX_FLAGS_ENABLE);
    write_control(&mut msix, &config, 0);
    // Disabled, entry 1 unmasked: the new data only lands in the table...
    msix.table_write(entry(1, PCI_MSIX_ENTRY_DATA), &0x51u32.to_le_bytes());
    assert_eq!(msix.vectors().message(1), Some((0xfee0_0000, 0x40)));
    // ...and takes effect at the next Enable, beside entry 0's unchanged message.
    write_control(&mut msix, &config, PCI_MSIX_FLAGS_ENABLE);
    assert_eq!(msix.vectors().message(0), Some((0xfee0_0000, 0x40)));
    assert_eq!(msix.vectors().message(1), Some((0xfee0_0000, 0x51)));
    assert_eq!(routes.route(25), Some((0xfee0_0000, 0x51)));
}

#[test]
fn qword_accesses_are_two_fields_and_one_update() {
    let (mut msix, config, routes) = parts(2);
    write_control(&mut msix, &config, PCI_MSIX_FLAGS_ENABLE);
    msix.table_write(entry(1, 0), &0xfee0_1000u64.to_le_bytes());
    assert_eq!(
        routes.commits(),
        0,
        "data 0 is not a valid message: not routed"
    );
    // Data and vector control (unmask) in one QWORD: one update, one commit.
    msix.table_write(entry(1, 8), &0x51u64.to_le_bytes());
    assert_eq!(routes.commits(), 1);
    assert_eq!(routes.route(25), Some((0xfee0_1000, 0x51)));
    assert_eq!(msix.vectors().message(1), Some((0xfee0_1000, 0x51)));
    assert!(!msix.vectors().is_masked(1));
    let mut q = [0u8; 8];
    msix.table_read(entry(1, 0), &mut q);
    assert_eq!(u64::from_le_bytes(q), 0xfee0_1000);
    msix.table_read(entry(0, 8), &mut q);
    assert_eq!(u64::from_le_bytes(q), 1 << 32, "entry 0: data 0, masked");
    // Misaligned, odd-sized and out-of-table accesses: zero, ignored, no panic.
    msix.table_read(entry(1, 4), &mut q);
    assert_eq!(q, [0; 8]);
    msix.table_write(entry(1, 4), &[0xff; 8]);
    msix.table_write(entry(1, 8), &[0; 2]);
    msix.table_write(u64::MAX - 7, &[0; 8]);
    msix.table_read(u64::MAX - 7, &mut q);
    assert_eq!(msix.vectors().message(1), Some((0xfee0_1000, 0x51)));
    // One per rejected access, two for the QWORD past the table (one per dword).
    assert_eq!(msix.vectors().log().guest_errors(), 5);
    msix.vectors().trigger(0);
    msix.pba_read(0, &mut q);
    assert_eq!(u64::from_le_bytes(q), 1, "entry 0 masked: pending");
    msix.pba_read(u64::MAX, &mut q[..1]);
    assert_eq!(q[0], 0);
}
