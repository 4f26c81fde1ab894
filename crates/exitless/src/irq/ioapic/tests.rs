use std::sync::Arc;

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::*;
use crate::fakes::FakeRoutes;
use crate::irq::regs::IOAPIC_REDIR_LEVEL;

struct Bench {
    ioapic: Arc<Ioapic>,
    routes: Arc<FakeRoutes>,
    resample: EventFd,
}

fn bench() -> Bench {
    let routes = Arc::new(FakeRoutes::default());
    let inputs = Arc::new(PinInputs::new().unwrap());
    let (irqfd, resample) = (
        EventFd::new(EFD_NONBLOCK).unwrap(),
        EventFd::new(EFD_NONBLOCK).unwrap(),
    );
    inputs.bind(16, &irqfd, Some(&resample)).unwrap();
    let ioapic = Arc::new(Ioapic::new(
        routes.clone(),
        inputs,
        DeviceLog::new("ioapic-test"),
    ));
    Bench {
        ioapic,
        routes,
        resample,
    }
}

fn write_reg(ioapic: &Ioapic, reg: u8, value: u32) {
    ioapic.write(IOAPIC_REGSEL, &[reg]);
    ioapic.write(IOAPIC_WINDOW, &value.to_le_bytes());
}

fn read_reg(ioapic: &Ioapic, reg: u8) -> u32 {
    ioapic.write(IOAPIC_REGSEL, &[reg]);
    let mut data = [0; 4];
    ioapic.read(IOAPIC_WINDOW, &mut data);
    u32::from_le_bytes(data)
}

fn set_rte(ioapic: &Ioapic, pin: u8, low: u32, high: u32) {
    let reg = u8::try_from(IOAPIC_REDTBL).unwrap() + 2 * pin;
    write_reg(ioapic, reg + 1, high);
    write_reg(ioapic, reg, low);
}

#[test]
fn registers_read_as_an_82093aa_of_version_0x20() {
    let b = bench();
    assert_eq!(read_reg(&b.ioapic, 1), 0x0017_0020);
    write_reg(&b.ioapic, 0, 0xffff_ffff);
    assert_eq!(read_reg(&b.ioapic, 0), 0x0f00_0000);
    assert_eq!(read_reg(&b.ioapic, 2), 0x0f00_0000, "arbitration ID");
    assert_eq!(read_reg(&b.ioapic, 0x10), 0x1_0000, "masked at reset");
    set_rte(&b.ioapic, 23, 0x30, 0x0100_0000);
    assert_eq!(read_reg(&b.ioapic, 0x10 + 46), 0x30);
    assert_eq!(read_reg(&b.ioapic, 0x10 + 47), 0x0100_0000);
    assert_eq!(read_reg(&b.ioapic, 0x10 + 48), 0, "no 25th entry");
}

#[test]
fn an_edge_pin_sends_its_entry_unless_masked() {
    let b = bench();
    set_rte(&b.ioapic, 4, 0x1_0034, 0x0200_0000);
    b.ioapic.assert(4);
    assert!(b.routes.injected().is_empty(), "masked: the edge is lost");
    set_rte(&b.ioapic, 4, 0x34, 0x0200_0000);
    b.ioapic.assert(4);
    assert_eq!(b.routes.injected(), vec![(0xfee0_2000, 0x34)]);
    assert_eq!(
        b.routes.route(4),
        Some((0xfee0_2000, 0x34)),
        "routed on GSI 4"
    );
}

#[test]
fn a_level_line_waits_for_its_eoi_and_is_resampled_there() {
    let b = bench();
    let level = IOAPIC_REDIR_LEVEL;
    set_rte(&b.ioapic, 16, level | 0x1_0041, 0);
    b.ioapic.assert(16);
    assert!(b.routes.injected().is_empty(), "masked");
    set_rte(&b.ioapic, 16, level | 0x41, 0);
    assert_eq!(
        b.routes.injected(),
        vec![(0xfee0_0000, 0x8041)],
        "the line kept asserted while masked is sent at the unmask"
    );
    assert_ne!(read_reg(&b.ioapic, 0x30) & 0x4000, 0, "remote IRR");
    b.ioapic.assert(16);
    assert_eq!(b.routes.injected().len(), 1, "remote IRR holds it back");
    assert!(
        b.resample.read().is_err(),
        "no EOI yet: nothing to resample"
    );
    b.ioapic.eoi(0x42);
    assert_ne!(
        read_reg(&b.ioapic, 0x30) & 0x4000,
        0,
        "another vector's EOI"
    );
    b.ioapic.write(IOAPIC_EOI, &0x41u32.to_le_bytes());
    assert_eq!(read_reg(&b.ioapic, 0x30) & 0x4000, 0);
    assert_eq!(b.resample.read().unwrap(), 1, "the device is told");
    // The device still has work: it asserts the line again, and it is sent again.
    b.ioapic.assert(16);
    assert_eq!(b.routes.injected().len(), 2);
}

#[test]
fn the_watcher_thread_turns_a_device_eventfd_into_the_interrupt() {
    let routes = Arc::new(FakeRoutes::default());
    let inputs = Arc::new(PinInputs::new().unwrap());
    let irqfd = EventFd::new(EFD_NONBLOCK).unwrap();
    inputs.bind(4, &irqfd, None).unwrap();
    let ioapic = Arc::new(Ioapic::new(routes.clone(), inputs, DeviceLog::new("t")));
    set_rte(&ioapic, 4, 0x35, 0);
    let watcher = ioapic.spawn().unwrap();
    irqfd.write(1).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while routes.injected().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    drop(watcher);
    assert_eq!(routes.injected(), vec![(0xfee0_0000, 0x35)]);
}

#[test]
fn bad_accesses_are_logged_not_obeyed() {
    let b = bench();
    write_reg(&b.ioapic, 1, 0);
    assert_eq!(read_reg(&b.ioapic, 1), 0x0017_0020, "version is read-only");
    b.ioapic.write(IOAPIC_REGSEL, &[0x10]);
    b.ioapic.write(IOAPIC_WINDOW, &[0, 0]); // a 2-byte window write is dropped
    assert_eq!(read_reg(&b.ioapic, 0x10), 0x1_0000);
    b.ioapic.assert(99); // no such pin
    assert!(b.ioapic.log().guest_errors() >= 1);
}

#[test]
fn a_masked_entry_keeps_its_route_only_until_its_eoi() {
    let b = bench();
    let level = IOAPIC_REDIR_LEVEL;
    set_rte(&b.ioapic, 16, level | 0x41, 0);
    b.ioapic.assert(16);
    set_rte(&b.ioapic, 16, level | 0x1_0041, 0);
    assert!(b.routes.route(16).is_some(), "its EOI is still to come");
    b.ioapic.eoi(0x41);
    assert_eq!(b.routes.route(16), None, "masked and released: no route");
    set_rte(&b.ioapic, 4, 0x1_0030, 0);
    assert_eq!(b.routes.route(4), None, "a masked edge entry has none");
}

/// Every register the guest reads: ID, version, the 48 redirection halves.
fn registers(ioapic: &Ioapic) -> Vec<u32> {
    (0..0x10 + 2 * PINS).map(|r| read_reg(ioapic, r)).collect()
}

#[test]
fn a_restored_ioapic_reads_the_same_routes_its_entries_and_awaits_the_eoi() {
    use crate::persist::Persist;
    let b = bench();
    write_reg(&b.ioapic, 0, 0x0300_0000);
    set_rte(&b.ioapic, 4, 0x34, 0x0200_0000); // edge, unmasked
    set_rte(&b.ioapic, 16, IOAPIC_REDIR_LEVEL | 0x41, 0);
    b.ioapic.assert(16); // sent: remote IRR until the EOI of 0x41
    b.ioapic.write(IOAPIC_REGSEL, &[0x12]);
    let state = b.ioapic.save().unwrap();

    let fresh = bench();
    let commits = fresh.routes.commits();
    fresh.ioapic.restore(state).unwrap();
    assert_eq!(
        fresh.routes.commits(),
        commits + 1,
        "one commit for all entries"
    );
    let mut sel = [0];
    fresh.ioapic.read(IOAPIC_REGSEL, &mut sel);
    assert_eq!(sel, [0x12], "IOREGSEL");
    assert_eq!(registers(&fresh.ioapic), registers(&b.ioapic));
    assert_eq!(fresh.routes.route(4), Some((0xfee0_2000, 0x34)));
    assert_eq!(fresh.routes.route(16), Some((0xfee0_0000, 0x8041)));
    assert!(
        fresh.routes.injected().is_empty(),
        "awaiting the EOI: nothing resent"
    );
    fresh.ioapic.eoi(0x41);
    assert_eq!(
        fresh.resample.read().unwrap(),
        1,
        "the EOI reaches the device"
    );
    assert_eq!(read_reg(&fresh.ioapic, 0x30) & 0x4000, 0);
}

#[test]
fn a_restored_asserted_level_line_is_sent_once() {
    use crate::persist::Persist;
    let b = bench();
    set_rte(&b.ioapic, 16, IOAPIC_REDIR_LEVEL | 0x1_0041, 0); // masked
    b.ioapic.assert(16);
    let mut state = b.ioapic.save().unwrap();
    assert_eq!(state["asserted"], 1 << 16);
    state["rtes"][16] = (IOAPIC_REDIR_LEVEL | 0x41).into(); // as if unmasked at snapshot
    let fresh = bench();
    fresh.ioapic.restore(state).unwrap();
    assert_eq!(fresh.routes.injected(), vec![(0xfee0_0000, 0x8041)]);
}

#[test]
fn a_corrupted_ioapic_state_is_refused_naming_the_field() {
    use crate::persist::Persist;
    let b = bench();
    let good = b.ioapic.save().unwrap();
    let corrupt = |field: &str, at: Option<usize>, value: serde_json::Value| {
        let mut state = good.clone();
        match at {
            Some(i) => state[field][i] = value,
            None => state[field] = value,
        }
        b.ioapic.restore(state).unwrap_err().what
    };
    assert_eq!(corrupt("id", None, 1.into()), "ioapic.id");
    assert_eq!(corrupt("rtes", None, serde_json::json!([0])), "ioapic.rtes");
    assert_eq!(corrupt("rtes", Some(3), 0x1000.into()), "ioapic.rtes[3]");
    assert_eq!(corrupt("rtes", Some(5), 0x4000.into()), "ioapic.rtes[5]");
    assert_eq!(
        corrupt("asserted", None, (1u64 << 24).into()),
        "ioapic.asserted"
    );
    assert_eq!(
        read_reg(&b.ioapic, 0x10),
        0x1_0000,
        "a refused state changes nothing"
    );
}
