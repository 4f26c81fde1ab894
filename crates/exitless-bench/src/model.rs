//! What `exitless bench` reports: the data model every scenario fills in and the report renders
//! (tables, JSON, SVG). It sits below every scenario and imports none of them, so scenarios,
//! the comparison with another VMM and the report all build on it in one direction.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::stats::Verdict;
use exitless::iommu::IommuStats;

/// Everything one `exitless bench` run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The host the figures were taken on.
    pub host: String,
    /// Whether the host was busy before measuring: the figures will be noisy
    /// ([`host::is_busy`](crate::host::is_busy) has the thresholds).
    pub host_busy: bool,
    /// The figures that decision rests on (`null` where /proc did not tell).
    pub host_load: Option<HostLoad>,
    /// One entry per scenario run.
    pub scenarios: Vec<ScenarioReport>,
}

/// How busy the host was just before measuring.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostLoad {
    /// The 1-minute load average (the whole host's).
    pub loadavg1: f64,
    /// CPU time other processes took over the window on the CPUs exitless may use, in percent
    /// of one CPU.
    pub others_cpu_percent: f64,
    /// CPUs online.
    pub cpus_online: usize,
    /// CPUs exitless may use, whose time was watched.
    pub cpus_watched: usize,
    /// The window's length, in milliseconds.
    pub window_ms: u64,
}

/// One scenario's variants and target checks.
#[derive(Debug, Default, Serialize)]
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
    pub soak: Option<SoakFigures>,
}

/// One variant of a scenario.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Variant {
    /// Variant name (`pio`, `ecam-shadow`, ...).
    pub name: String,
    /// Time per operation, from the guest's TSC: the median over rounds of each round's
    /// figure.
    pub ns_per_op: f64,
    /// Rounds measured (`--rounds`), each in boots of its own.
    pub rounds: usize,
    /// Interval of the median `ns_per_op`, same unit: the order-statistic (binomial) interval,
    /// 95% from 6 rounds on, min..max below that (coverage in `ci95_coverage`).
    pub ci95: [f64; 2],
    /// The probability `ci95` holds the true median (`1 - 2/2^n` for min..max).
    pub ci95_coverage: f64,
    /// Whether exit, interrupt or commit counts differed between rounds (they are counts, not
    /// samples: identical rounds are expected unless the device's behaviour depends on timing).
    pub counts_vary: bool,
    /// Each round's figures, the variant as that round measured it (not serialized; targets
    /// take their per-round ratios from it). Empty for a variant of one measurement.
    #[serde(skip)]
    pub round_figures: Vec<Variant>,
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
    /// 95% interval of `time_ratio`: percentile bootstrap over paired rounds, fixed seed.
    pub time_ratio_ci95: [f64; 2],
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
    pub iommu: Option<IommuFigures>,
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
    /// `ci95`, where the variant was measured in more than one round: one round's "interval"
    /// is its one figure, which says nothing of the noise.
    pub fn interval(&self) -> Option<[f64; 2]> {
        (self.rounds >= 2).then_some(self.ci95)
    }

    /// The variant as each round measured it: its rounds, or itself when it has none.
    pub fn per_round(&self) -> &[Variant] {
        if self.round_figures.is_empty() {
            std::slice::from_ref(self)
        } else {
            &self.round_figures
        }
    }

    /// `f` of each round, in round order.
    pub fn each_round(&self, f: impl Fn(&Variant) -> f64) -> Vec<f64> {
        self.per_round().iter().map(f).collect()
    }

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
    /// Steady-state interrupts on that vector,
    /// [`STEADY_ROUNDS`](crate::msix::STEADY_ROUNDS) of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady_interrupts: Option<Box<RoutingFigures>>,
}

/// A target from the issue, and whether this run met it.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(into = "TargetJson")]
pub struct TargetCheck {
    /// The target as the issue sets it, e.g. `batched total <= 0.1x per-vector total`.
    pub target: String,
    /// The figures it was checked against, with their units.
    pub measured: String,
    /// Whether the point estimate (medians over rounds) meets it (a benchmark result: a
    /// missed target fails nothing).
    pub met: bool,
    /// The verdict from the ratio's interval; none: a check without one, met or missed as
    /// `met` says.
    pub verdict: Option<Verdict>,
    /// The 95% interval of the ratio checked, where the target is a ratio.
    pub ratio_ci95: Option<[f64; 2]>,
}

impl TargetCheck {
    /// The verdict: from the interval where there is one, else from `met`.
    pub fn verdict(&self) -> Verdict {
        self.verdict.unwrap_or(Verdict::of(self.met))
    }
}

/// How a [`TargetCheck`] is written: its verdict always present.
#[derive(Serialize)]
struct TargetJson {
    target: String,
    measured: String,
    met: bool,
    verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_ci95: Option<[f64; 2]>,
}

impl From<TargetCheck> for TargetJson {
    fn from(t: TargetCheck) -> TargetJson {
        TargetJson {
            verdict: t.verdict(),
            target: t.target,
            measured: t.measured,
            met: t.met,
            ratio_ci95: t.ratio_ci95,
        }
    }
}

/// The IOMMU figures of one variant.
#[derive(Clone, Debug, Default, Serialize)]
pub struct IommuFigures {
    /// Payload bytes of each streamed frame.
    pub payload_bytes: u64,
    /// Streamed frames the sink found with a wrong payload: 0, or the variant fails.
    pub bad_frames: u64,
    /// Streamed frames per second.
    pub packets_per_s: f64,
    /// `packets_per_s` over `none`'s.
    pub packets_ratio: f64,
    /// The seed's ratio for this kind of variant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed_packets_ratio: Option<f64>,
    /// Guest TSC cycles per streamed frame.
    pub guest_cycles_per_packet: f64,
    /// CPU time of the stream device's thread per frame, in nanoseconds: translation and
    /// the frame's handling (the seed's service demand, on the host side).
    pub device_cpu_ns_per_packet: f64,
    /// CPU time of the whole VMM process per frame, in nanoseconds: the device thread, the
    /// vCPU (guest time included) and every other thread.
    pub host_cpu_ns_per_packet: f64,
    /// Exits at the remapping unit per streamed frame.
    pub iommu_exits_per_packet: f64,
    /// Invalidation-queue tail writes per frame (each a flush: one exit).
    pub iqt_writes_per_packet: f64,
    /// Invalidation descriptors per frame, waits included.
    pub descriptors_per_packet: f64,
    /// Pages unmapped during the stream.
    pub pages_unmapped: u64,
    /// Most pages pending invalidation at once.
    pub max_pending_pages: u64,
    /// Per unmapped page, microseconds from its unmap to the completed invalidation covering
    /// it (how long a stale IOTLB entry could still reach the page): the longest.
    pub exposure_max_us: f64,
    /// The same span's mean over the unmapped pages, in microseconds.
    pub exposure_mean_us: f64,
    /// The same span's 99th percentile, in microseconds: the upper bound of the power-of-two
    /// bucket it falls in.
    pub exposure_p99_us: f64,
    /// Request/response transactions per second, both buffers mapped per transaction.
    pub rr_trans_per_s: f64,
    /// `rr_trans_per_s` over `none`'s.
    pub rr_ratio: f64,
    /// The unit's counters over the whole boot (stream and transactions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<IommuStats>,
}

/// The soak's figures, beside the scenario's variant.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SoakFigures {
    /// Seed of the first burst (rerun with `--seed` to reproduce).
    pub seed: u64,
    /// Boots of the probe, one process.
    pub boots: u64,
    /// Hostile bursts run.
    pub bursts: u64,
    /// Random accesses the guest made.
    pub accesses: u64,
    /// Wall time of all boots, in seconds.
    pub seconds: f64,
    /// Devices the guest reset inside the bursts (status 0 with requests in flight among them).
    pub resets_in_bursts: u64,
    /// Devices brought up again after a burst.
    pub reinitialised: u64,
    /// Request/response transactions after the bursts that returned the right bytes.
    pub transactions_ok: u64,
    /// Those that did not, or whose device would not come up.
    pub transactions_failed: u64,
    /// The first failures, described.
    pub failures: Vec<String>,
    /// Interrupts the guest took during the bursts.
    pub interrupts: u64,
    /// Exits to the VMM, all boots.
    pub exits: u64,
    /// Guest errors the devices counted (and logged, rate-limited).
    pub guest_errors: u64,
    /// VMM resident memory before the first boot, in KiB.
    pub rss_before_kib: u64,
    /// After the warm-up boots.
    pub rss_after_warmup_kib: u64,
    /// After the last boot.
    pub rss_after_kib: u64,
    /// Threads that panicked meanwhile.
    pub panics: u64,
}
