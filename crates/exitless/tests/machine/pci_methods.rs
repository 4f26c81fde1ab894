//! The three ways to config space (PIO, ECAM trapped, ECAM shadowed) must show the guest exactly
//! the same devices and values, and see each other's writes.

use crate::common::{ECAM_MODES, at, run, values};
use exitless::contract::*;
use exitless::machine::{names, ops};
use exitless::pci::EcamMode;
use exitless::pci::regs::*;

#[test]
fn all_methods_enumerate_the_same_functions() {
    let pio = run(Some(EcamMode::Trap), vec![ops::enumerate(METHOD_PIO)]).enum_records;
    let trap = run(Some(EcamMode::Trap), vec![ops::enumerate(METHOD_ECAM)]).enum_records;
    let shadow = run(Some(EcamMode::Shadow), vec![ops::enumerate(METHOD_ECAM)]).enum_records;

    let found: Vec<u64> = pio.iter().map(|r| r.address).collect();
    assert_eq!(
        found,
        vec![0x0, 0x8000, 0x10000, 0x11000],
        "00:00.0, 00:01.0, 00:02.0, 00:02.1"
    );
    assert_eq!(
        trap, shadow,
        "trapped and shadowed ECAM see identical functions"
    );
    for (p, e) in pio.iter().zip(&trap) {
        assert_eq!(p.address, e.address);
        assert_eq!(p.header, e.header, "headers of {:#x}", p.address);
        assert_eq!(p.bar_sizes, e.bar_sizes);
        // Standard capabilities match; ECAM alone reaches the extended ones.
        let std_caps = |r: &EnumRecord| {
            r.caps[..usize::try_from(r.cap_count).unwrap()]
                .iter()
                .copied()
                .filter(|c| c >> 16 == 0)
                .collect::<Vec<_>>()
        };
        assert_eq!(std_caps(p), std_caps(e));
    }
    let testdev = &shadow[1];
    assert_eq!(testdev.header[0], 0x0001_7e57);
    assert_eq!(testdev.bar_sizes, [0x1000, 0x20, 0x10_0000, 0, 0, 0]);
    assert_eq!(
        &testdev.caps[..usize::try_from(testdev.cap_count).unwrap()],
        &[0x09, 0x01, 0x05, 0x10, 0x1_000b]
    );
    assert_eq!(
        &pio[1].caps[..usize::try_from(pio[1].cap_count).unwrap()],
        &[0x09, 0x01, 0x05, 0x10]
    );
    assert_eq!(
        shadow[2].header[3] >> 16 & 0x80,
        0x80,
        "00:02.0 is multi-function"
    );
}

#[test]
fn every_register_reads_the_same_by_every_method() {
    for function in [at(0, 0), at(1, 0), at(2, 1), at(3, 0)] {
        let mut reads = Vec::new();
        for method in [METHOD_PIO, METHOD_ECAM] {
            reads.extend(
                (0..0x100)
                    .step_by(4)
                    .map(|reg| ops::cfg_read(method, function, reg, 4)),
            );
        }
        let ext: Vec<Op> = (0x100..0x140)
            .step_by(4)
            .map(|reg| ops::cfg_read(METHOD_ECAM, function, reg, 4))
            .collect();
        let mut seen = Vec::new();
        for mode in ECAM_MODES {
            let mut all = reads.clone();
            all.extend(ext.clone());
            let r = values(&run(Some(mode), all));
            assert_eq!(
                r[..64],
                r[64..128],
                "{function}: PIO and ECAM ({mode:?}) differ"
            );
            seen.push(r);
        }
        assert_eq!(
            seen[0], seen[1],
            "{function}: trapped and shadowed ECAM differ"
        );
        if function == at(3, 0) {
            assert!(
                seen[0].iter().all(|&v| v == 0xffff_ffff),
                "absent function reads all-ones"
            );
        }
    }
}

#[test]
fn shadow_reads_never_exit_and_trapped_reads_always_do() {
    let target = at(1, 0);
    let loop_ops = vec![
        ops::cfg_read_loop(METHOD_ECAM, target, 0, 500),
        ops::cfg_read(METHOD_ECAM, target, 0x100, 4),
    ];
    let shadow = run(Some(EcamMode::Shadow), loop_ops.clone());
    assert_eq!(shadow.exits(0).total(), 0);
    assert_eq!(shadow.exits(1).total(), 0);
    let trap = run(Some(EcamMode::Trap), loop_ops);
    assert_eq!(
        trap.exits_at(0, names::PCI_ECAM),
        501,
        "500 reads plus the warm-up"
    );
    let pio = run(None, vec![ops::cfg_read_loop(METHOD_PIO, target, 0, 100)]);
    assert_eq!(
        pio.exits_at(0, names::PCI_PIO),
        202,
        "CONFIG_ADDRESS write + data read each"
    );
}

#[test]
fn writes_by_any_method_are_seen_by_every_other() {
    let f = at(1, 0);
    // The MSI capability of the test device sits at 0x50: address low at 0x54, data at 0x5c.
    for mode in ECAM_MODES {
        for (writer, readers) in [
            (METHOD_PIO, [METHOD_ECAM, METHOD_PIO]),
            (METHOD_ECAM, [METHOD_PIO, METHOD_ECAM]),
        ] {
            let value = 0xfee0_1000 | writer << 4;
            let r = run(
                Some(mode),
                vec![
                    ops::cfg_write(writer, f, 0x54, 4, value),
                    ops::cfg_read(readers[0], f, 0x54, 4),
                    ops::cfg_read(readers[1], f, 0x54, 4),
                    ops::cfg_write(writer, f, 0x5c, 2, 0x4041),
                    ops::cfg_read(readers[0], f, 0x5c, 2),
                    ops::cfg_read(readers[1], f, 0x5d, 1),
                ],
            );
            assert_eq!(
                values(&r)[1..3],
                [value, value],
                "{mode:?}, writer {writer}"
            );
            assert_eq!(
                values(&r)[4..6],
                [0x4041, 0x40],
                "{mode:?}, writer {writer}"
            );
        }
    }
}

#[test]
fn bar_sizing_through_the_shadow() {
    let f = at(1, 0);
    let mut script = vec![ops::cfg_read(METHOD_ECAM, f, 0x10, 4)];
    for reg in [0x10u16, 0x14, 0x18, 0x1c] {
        script.push(ops::cfg_write(METHOD_ECAM, f, reg, 4, 0xffff_ffff));
        script.push(ops::cfg_read(METHOD_ECAM, f, reg, 4));
        script.push(ops::cfg_read(METHOD_PIO, f, reg, 4));
    }
    let r = run(Some(EcamMode::Shadow), script);
    let v = values(&r);
    assert_eq!(v[0] & 0xf, 0, "32-bit non-prefetchable memory BAR");
    assert_eq!(v[2..4], [0xffff_f000; 2], "4 KiB memory BAR");
    assert_eq!(v[5..7], [0xffff_ffe1; 2], "32-byte I/O BAR");
    assert_eq!(
        v[8..10],
        [0xfff0_000c; 2],
        "1 MiB 64-bit prefetchable, low half"
    );
    assert_eq!(v[11..13], [0xffff_ffff; 2], "high half");
    // Reads of the shadow after each write took no exit: the write's exit updated it first.
    for i in [2, 5, 8, 11] {
        assert_eq!(r.exits(i).total(), 0);
    }
}

#[test]
fn device_side_changes_reach_the_shadow_and_status_is_rw1c() {
    let f = at(1, 0);
    let bar0 = exitless::machine::layout::PCI_MMIO_WINDOW.0; // first memory BAR assigned
    let status = |m| ops::cfg_read(m, f, PCI_STATUS, 2);
    let r = run(
        Some(EcamMode::Shadow),
        vec![
            ops::cfg_read(METHOD_ECAM, f, 0x10, 4),
            status(METHOD_ECAM),
            ops::mmio_write(bar0 + 4, 4, 1), // device raises Signaled Target Abort
            status(METHOD_ECAM),
            status(METHOD_PIO),
            ops::cfg_write(METHOD_PIO, f, PCI_STATUS, 2, 0x0010), // 0 bits: no change
            status(METHOD_ECAM),
            ops::cfg_write(
                METHOD_PIO,
                f,
                PCI_STATUS,
                2,
                PCI_STATUS_SIG_TARGET_ABORT.into(),
            ),
            status(METHOD_ECAM),
            ops::mmio_write(bar0 + 8, 4, 0xdead_beef), // device writes its capability data
            ops::cfg_read(METHOD_ECAM, f, 0x44, 4),
            ops::mmio_write(bar0, 4, 0x1234_5678),
            ops::mmio_read(bar0, 4),
        ],
    );
    let v = values(&r);
    assert_eq!(v[0], bar0, "BAR 0 where the platform put it");
    assert_eq!(v[1], 0x0010, "capability list only");
    assert_eq!(v[3], 0x0810);
    assert_eq!(v[4], 0x0810);
    assert_eq!(v[6], 0x0810, "writing 0 leaves an RW1C bit set");
    assert_eq!(v[8], 0x0010, "writing 1 clears it");
    assert_eq!(v[10], 0xdead_beef);
    assert_eq!(v[12], 0x1234_5678);
    assert_eq!(
        r.exits(3).total() + r.exits(10).total(),
        0,
        "shadow reads took no exit"
    );
}

#[test]
fn decoding_off_hides_the_bar() {
    let f = at(1, 0);
    let bar0 = exitless::machine::layout::PCI_MMIO_WINDOW.0;
    let r = run(
        Some(EcamMode::Trap),
        vec![
            ops::mmio_write(bar0, 4, 0x55),
            ops::cfg_write(METHOD_ECAM, f, PCI_COMMAND, 2, 0),
            ops::mmio_read(bar0, 4),
            ops::cfg_write(METHOD_ECAM, f, PCI_COMMAND, 2, PCI_COMMAND_MEMORY.into()),
            ops::mmio_read(bar0, 4),
        ],
    );
    assert_eq!(
        values(&r)[2],
        0xffff_ffff,
        "memory decoding disabled: master abort"
    );
    assert_eq!(values(&r)[4], 0x55);
}

#[test]
fn auto_method_prefers_ecam_under_a_hypervisor_and_falls_back_to_pio() {
    let op = ops::cfg_read(METHOD_AUTO, at(0, 0), 0, 4);
    let with_ecam = run(Some(EcamMode::Shadow), vec![op]);
    assert_eq!(with_ecam.results[0].method_used, METHOD_ECAM);
    let without = run(None, vec![op]);
    assert_eq!(without.results[0].method_used, METHOD_PIO);
    assert_eq!(with_ecam.results[0].value, without.results[0].value);
}

#[test]
fn extra_vcpus_park_while_the_probe_runs() {
    let r = exitless::machine::run_probe(&exitless::machine::ProbeConfig {
        ops: vec![ops::cfg_read(METHOD_ECAM, at(0, 0), 0, 4)],
        vcpus: 2,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(r.results[0].value, 0x0000_7e57);
}
