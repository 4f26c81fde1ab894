//! Helpers shared by the tests that boot the probe guest.

use std::time::Duration;

use exitless::contract::{Op, OpResult, STATUS_OK};
use exitless::irq::CommitStrategy;
use exitless::machine::{ProbeConfig, ProbeRun, Transport, VirtioNetConfig, run_probe};
use exitless::pci::{EcamMode, PciAddress};
use exitless::virtio::notify::NotifyPath;

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

/// A probe with `ops` and one virtio-pci network function of `pairs` queue pairs (its MSI-X
/// vectors committed as `strategy` says), behind the IOMMU if `iommu`.
pub fn msix_config(strategy: CommitStrategy, pairs: u16, iommu: bool, ops: Vec<Op>) -> ProbeConfig {
    ProbeConfig {
        ops,
        virtio: vec![VirtioNetConfig {
            queue_pairs: pairs,
            ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
        }],
        gsi_commits: strategy,
        iommu,
        timeout: Duration::from_secs(300),
        ..Default::default()
    }
}

/// Boot [`msix_config`]'s probe.
pub fn run_msix(strategy: CommitStrategy, pairs: u16, iommu: bool, ops: Vec<Op>) -> ProbeRun {
    run_probe(&msix_config(strategy, pairs, iommu, ops))
        .unwrap_or_else(|e| panic!("probe run failed: {e}"))
}

/// Boot the probe as `config` says and check that every op succeeded.
pub fn run_all_ok(config: &ProbeConfig) -> ProbeRun {
    let run = run_probe(config).unwrap_or_else(|e| panic!("probe run failed: {e}"));
    for (i, r) in run.results.iter().enumerate() {
        assert_eq!(r.status, STATUS_OK, "op {i}: {r:?}\n{}", run.console);
    }
    run
}
