//! Helpers shared by the integration tests that boot the probe guest.
#![allow(dead_code)]

use exitless::contract::{Op, OpResult, STATUS_OK};
use exitless::machine::{ProbeConfig, ProbeRun, run_probe};
use exitless::pci::{EcamMode, PciAddress};

/// Boot the probe with `ops`, ECAM served as `ecam`, and check every op succeeded.
pub fn run(ecam: Option<EcamMode>, ops: Vec<Op>) -> ProbeRun {
    let run = run_probe(&ProbeConfig {
        ops,
        ecam,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("probe run failed: {e}"));
    for (i, r) in run.results.iter().enumerate() {
        assert_eq!(r.status, STATUS_OK, "op {i} failed: {r:?}");
    }
    run
}

/// Result values, in op order.
pub fn values(run: &ProbeRun) -> Vec<u64> {
    run.results.iter().map(|r: &OpResult| r.value).collect()
}

/// `dd:f` on bus 0.
pub fn at(device: u8, function: u8) -> PciAddress {
    PciAddress::new(0, device, function).unwrap()
}

/// Both ECAM modes.
pub const ECAM_MODES: [EcamMode; 2] = [EcamMode::Trap, EcamMode::Shadow];
