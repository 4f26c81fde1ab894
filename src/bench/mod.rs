//! `exitless bench`: scenarios that reproduce each technique's seed figure on this host, every
//! variant side by side in one run, reported as ratios first.

pub mod against;
pub mod host;
pub mod host_tap;
pub mod iommu;
pub mod msix;
pub mod pci;
pub mod report;
pub mod rr;
pub mod soak;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::contract::STATUS_OK;
use crate::machine::{MachineError, ProbeConfig, ProbeRun, run_probe};
use crate::stats::ExitKind;

/// Everything one `exitless bench` run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The host the figures were taken on.
    pub host: String,
    /// One entry per scenario run.
    pub scenarios: Vec<ScenarioReport>,
}

/// One scenario's variants and target checks.
#[derive(Debug, Serialize)]
pub struct ScenarioReport {
    /// Scenario name (`pci`, ...).
    pub name: String,
    /// What it measures, one line.
    pub title: String,
    /// How time was measured.
    pub timing: String,
    /// The variants, side by side.
    pub variants: Vec<Variant>,
    /// The targets, checked against the figures (benchmark results, not test asserts).
    pub targets: Vec<TargetCheck>,
    /// What the figures show beyond the targets, one finding per line.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The hostile-guest soak's figures (`soak` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak: Option<soak::SoakFigures>,
}

/// One variant of a scenario.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    /// Variant name (`pio`, `ecam-shadow`, ...).
    pub name: String,
    /// Mean time per operation, from the guest's TSC.
    pub ns_per_op: f64,
    /// Mean exits to the VMM per operation.
    pub exits_per_op: f64,
    /// Exits per operation by kind.
    pub exits_by_kind: BTreeMap<&'static str, f64>,
    /// Operations timed.
    pub ops: u64,
    /// Host wall time per operation between the guest's phase marks (a cross-check of the TSC
    /// figure; it includes the marks' own exits, so it is larger for short phases).
    pub host_ns_per_op: f64,
    /// The variant this one is compared with.
    pub baseline: String,
    /// `ns_per_op / baseline ns_per_op`: below 1 is faster.
    pub time_ratio: f64,
    /// The same ratio in the seed's published figures, where it has one.
    pub seed_time_ratio: Option<f64>,
    /// Transactions per second (request/response scenarios).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trans_per_s: Option<f64>,
    /// The seed's published transactions per second for this kind of variant (lowest, highest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed_trans_per_s: Option<(f64, f64)>,
    /// Interrupts the guest took per operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub irqs_per_op: Option<f64>,
    /// How the device's interrupts reached KVM (`irqfd`, or `signal-msi` for direct MSI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<&'static str>,
    /// Guest errors the devices counted during the variant's ops, by device (none: omitted).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub guest_errors: BTreeMap<String, u64>,
    /// Routing bursts (`msix`): what the measured operation cost per device and in all.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingFigures>,
    /// Unmap strategies (`iommu`): the stream's and the transactions' figures.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub iommu: Option<iommu::IommuFigures>,
    /// The same guest operation under another VMM in the same run (`--against`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<PeerFigure>,
}

/// One variant's operation measured under another VMM: the same probe binary and ops, timed by
/// the same guest TSC loop. The peer's exits cannot be counted from outside it.
#[derive(Clone, Debug, Serialize)]
pub struct PeerFigure {
    /// The VMM (`qemu`).
    pub name: String,
    /// Its version, as it reports it.
    pub version: String,
    /// Its time per operation.
    pub ns_per_op: f64,
    /// Which of its paths was measured, where it differs from the variant's (QEMU has no ECAM
    /// shadow: its trapped ECAM is the counterpart of `ecam-shadow`).
    pub path: String,
}

impl Variant {
    /// `ns_per_op` over the peer's: below 1, exitless is faster.
    pub fn vs_peer(&self) -> Option<f64> {
        self.peer.as_ref().map(|p| self.ns_per_op / p.ns_per_op)
    }
}

/// What a burst of GSI routing changes cost, one entry per device, in device order.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoutingFigures {
    /// Sum of the per-device times, in milliseconds.
    pub total_ms: f64,
    /// Guest-measured time of each device's operation, in milliseconds.
    pub per_device_ms: Vec<f64>,
    /// `KVM_SET_GSI_ROUTING` calls during the operations, in all.
    pub commits: u64,
    /// Commits during each device's operation.
    pub per_device_commits: Vec<u64>,
    /// Time inside those calls, in milliseconds.
    pub commit_ms: f64,
    /// Time inside the commits of each device's operation, in milliseconds.
    pub per_device_commit_ms: Vec<f64>,
    /// The seed's per-device times for this strategy, in milliseconds (8 devices).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed_per_device_ms: Option<Vec<f64>>,
    /// The seed's total, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed_total_ms: Option<f64>,
    /// Writing every vector table entry beforehand, with MSI-X disabled: the same work for
    /// every strategy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_programming: Option<Box<RoutingFigures>>,
    /// The other burst: unmasking vectors one by one after MSI-X Enable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmask_one_by_one: Option<Box<RoutingFigures>>,
    /// The first interrupt of each function after every function's Enable (first-use commits
    /// at the first of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_after_enable: Option<Box<RoutingFigures>>,
    /// The seed's restore pattern: after every function's Enable, one interrupt per vector,
    /// each waited for (request through an exit, then the handler).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_interrupts: Option<Box<RoutingFigures>>,
    /// The first interrupt of a vector after the unmask burst (first-use commits here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_interrupt: Option<Box<RoutingFigures>>,
    /// Steady-state interrupts on that vector, [`STEADY_ROUNDS`](crate::bench::msix) of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady_interrupts: Option<Box<RoutingFigures>>,
}

/// A target from the issue, and whether this run met it.
#[derive(Debug, Serialize)]
pub struct TargetCheck {
    /// The target.
    pub target: String,
    /// What was measured.
    pub measured: String,
    /// Whether it was met.
    pub met: bool,
}

/// How op times are turned into nanoseconds.
pub(crate) struct Clock {
    /// The guest TSC rate, if KVM reported it.
    pub(crate) tsc_khz: Option<u32>,
}

impl Clock {
    /// The clock of `run`'s vCPU.
    pub(crate) fn of(run: &ProbeRun) -> Clock {
        Clock {
            tsc_khz: run.tsc_khz,
        }
    }

    /// Nanoseconds op `op` of `run` took.
    pub(crate) fn ns(&self, run: &ProbeRun, op: usize) -> f64 {
        match self.tsc_khz {
            Some(khz) => run.results[op].cycles as f64 * 1e6 / f64::from(khz),
            None => host_ns(run, op),
        }
    }

    /// One line on how time was measured.
    pub(crate) fn describe(&self) -> String {
        match self.tsc_khz {
            Some(khz) => format!(
                "guest rdtsc at CPL 3 around each op, TSC {:.1} MHz from KVM_GET_TSC_KHZ",
                f64::from(khz) / 1e3
            ),
            None => "host wall time between the guest's phase marks (KVM_GET_TSC_KHZ unavailable)"
                .into(),
        }
    }
}

/// Host wall time of op `op` between its phase marks.
pub(crate) fn host_ns(run: &ProbeRun, op: usize) -> f64 {
    run.phases
        .get(op)
        .cloned()
        .flatten()
        .map_or(f64::NAN, |p| p.host_time.as_nanos() as f64)
}

/// Measure a set of ops (repetitions of one variant) in `run`: median time, mean exits.
/// A variant from ops `op_indexes` of `run`, each doing `per_op` timed operations and
/// `accesses` operations' worth of exits.
pub(crate) fn variant(
    name: &str,
    run: &ProbeRun,
    clock: &Clock,
    op_indexes: &[usize],
    per_op: u64,
    accesses: u64,
) -> Variant {
    let mut times: Vec<f64> = op_indexes
        .iter()
        .map(|&i| clock.ns(run, i) / per_op as f64)
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let mut exits_by_kind = BTreeMap::new();
    let mut total = 0.0;
    for kind in ExitKind::ALL {
        let n: u64 = op_indexes.iter().map(|&i| run.exits(i).of_kind(kind)).sum();
        let per = n as f64 / (op_indexes.len() as u64 * accesses) as f64;
        total += per;
        exits_by_kind.insert(kind.name(), per);
    }
    let mut guest_errors = BTreeMap::new();
    for &i in op_indexes {
        for (device, n) in run.exits(i).guest_errors_by_name(&run.devices) {
            *guest_errors.entry(device).or_insert(0) += n;
        }
    }
    let host: f64 = op_indexes.iter().map(|&i| host_ns(run, i)).sum::<f64>()
        / (op_indexes.len() as u64 * per_op) as f64;
    Variant {
        name: name.into(),
        ns_per_op: median,
        exits_per_op: total,
        exits_by_kind,
        ops: op_indexes.len() as u64 * per_op,
        host_ns_per_op: host,
        baseline: String::new(),
        time_ratio: f64::NAN,
        seed_time_ratio: None,
        trans_per_s: None,
        seed_trans_per_s: None,
        irqs_per_op: None,
        delivery: None,
        guest_errors,
        routing: None,
        iommu: None,
        peer: None,
    }
}

/// Boot the probe with `cfg`; an error if the run or any of its ops failed.
pub(crate) fn run_ok(cfg: &ProbeConfig) -> Result<ProbeRun, MachineError> {
    let run = run_probe(cfg)?;
    match run.results.iter().position(|r| r.status != STATUS_OK) {
        Some(i) => Err(MachineError::GuestFailed(
            crate::vm::run_control::StopReason::VcpuFailed(format!(
                "probe op {i} returned status {}",
                run.results[i].status
            )),
            run.console.clone(),
        )),
        None => Ok(run),
    }
}

/// Make `baseline` the reference of `variants`' time ratios and attach the seed's ratios.
pub(crate) fn set_baseline(variants: &mut [Variant], baseline: &str, seed: &[(&str, f64)]) {
    let base = variants
        .iter()
        .find(|v| v.name == baseline)
        .map_or(f64::NAN, |v| v.ns_per_op);
    for v in variants {
        v.baseline = baseline.into();
        v.time_ratio = v.ns_per_op / base;
        v.seed_time_ratio = seed.iter().find(|(n, _)| *n == v.name).map(|&(_, r)| r);
    }
}
