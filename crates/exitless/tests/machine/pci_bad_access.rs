//! Config accesses a careful driver would not make: the VMM must answer as hardware does and
//! never fail.

use crate::common::{ECAM_MODES, at, run, values};
use exitless::contract::*;
use exitless::machine::{layout, ops};
use exitless::pci::EcamMode;
use exitless::pci::regs::*;

#[test]
fn absent_functions_read_all_ones_and_ignore_writes() {
    let absent = at(9, 3);
    for mode in ECAM_MODES {
        let r = run(
            Some(mode),
            vec![
                ops::cfg_write(METHOD_ECAM, absent, 0x10, 4, 0),
                ops::cfg_write(METHOD_PIO, absent, 0x04, 2, 0),
                ops::cfg_read(METHOD_ECAM, absent, 0x10, 4),
                ops::cfg_read(METHOD_PIO, absent, 0x04, 2),
                ops::cfg_read(METHOD_ECAM, absent, 0x800, 1),
            ],
        );
        assert_eq!(values(&r)[2..], [0xffff_ffff, 0xffff, 0xff], "{mode:?}");
    }
}

#[test]
fn read_only_fields_ignore_writes() {
    let f = at(1, 0);
    for method in [METHOD_PIO, METHOD_ECAM] {
        let r = run(
            Some(EcamMode::Shadow),
            vec![
                ops::cfg_write(method, f, 0x00, 4, 0),
                ops::cfg_write(method, f, 0x08, 4, 0xffff_ffff),
                ops::cfg_write(method, f, PCI_CAPABILITY_LIST, 1, 0x80),
                ops::cfg_read(method, f, 0x00, 4),
                ops::cfg_read(method, f, 0x08, 4),
                ops::cfg_read(method, f, PCI_CAPABILITY_LIST, 1),
            ],
        );
        assert_eq!(values(&r)[3..], [0x0001_7e57, 0xff00_0001, 0x40]);
    }
}

#[test]
fn odd_sized_and_unaligned_accesses() {
    let f = at(1, 0);
    let mut script = Vec::new();
    for reg in 0..8u16 {
        script.push(ops::cfg_read(METHOD_PIO, f, reg, 1));
        script.push(ops::cfg_read(METHOD_ECAM, f, reg, 1));
    }
    script.push(ops::cfg_read(METHOD_PIO, f, 0x02, 2)); // 16
    script.push(ops::cfg_read(METHOD_ECAM, f, 0x02, 2));
    script.push(ops::cfg_read(METHOD_PIO, f, 0x01, 2)); // 18: lanes 1-2 of the dword
    script.push(ops::cfg_read(METHOD_PIO, f, 0x03, 2)); // 19: lane 3, then past 0xCFF
    script.push(ops::cfg_read(METHOD_ECAM, f, 0x01, 4)); // 20: unaligned ECAM dword
    script.push(ops::mmio_read(layout::ECAM_BASE + 0x8000, 8)); // 21: 8-byte ECAM read
    script.push(ops::mmio_write(layout::ECAM_BASE + 0x8ffe, 4, 0xffff_ffff)); // straddles 01.0/01.1
    script.push(ops::cfg_read(METHOD_ECAM, at(1, 1), 0, 4)); // 23
    script.push(ops::cfg_read(METHOD_PIO, f, 0x03, 4)); // 24: dword at 0xCFF
    let mut seen = Vec::new();
    for mode in ECAM_MODES {
        let v = values(&run(Some(mode), script.clone()));
        for reg in 0..8 {
            assert_eq!(v[2 * reg], v[2 * reg + 1], "{mode:?}: byte {reg}");
        }
        assert_eq!(v[16], 0x0001);
        assert_eq!(v[17], 0x0001);
        assert_eq!(v[18], 0x017e, "bytes 1..=2");
        assert_eq!(v[19], 0xff00, "byte 3, then a port that is not config data");
        assert_eq!(
            v[20], 0x0300_017e,
            "bytes 1..=4 (command: memory and I/O decoding on)"
        );
        assert_eq!(v[21], 0x0010_0003_0001_7e57);
        assert_eq!(
            v[23], 0xffff_ffff,
            "the straddling write did not create 01.1"
        );
        assert_eq!(v[24], 0xffff_ff00);
        seen.push(v);
    }
    assert_eq!(seen[0], seen[1]);
}

#[test]
fn mechanism_one_cannot_reach_extended_space() {
    let f = at(1, 0);
    let r = exitless::machine::run_probe(&exitless::machine::ProbeConfig {
        ops: vec![
            ops::cfg_read(METHOD_PIO, f, 0x100, 4),
            ops::cfg_read(METHOD_ECAM, f, 0x100, 4),
        ],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        r.results[0].status, STATUS_UNSUPPORTED,
        "the guest refuses; offset bits do not fit CONFIG_ADDRESS"
    );
    assert_eq!(r.results[1].value, 0x0001_000b);
}

#[test]
fn unknown_ops_are_reported_not_fatal() {
    let r = exitless::machine::run_probe(&exitless::machine::ProbeConfig {
        ops: vec![
            Op {
                kind: 99,
                ..Default::default()
            },
            ops::cfg_read(METHOD_ECAM, at(0, 0), 0, 2),
        ],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(r.results[0].status, STATUS_BAD_OP);
    assert_eq!(r.results[1].value, 0x7e57);
}
