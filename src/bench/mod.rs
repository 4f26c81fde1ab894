//! `exitless bench`: scenarios that reproduce each technique's seed figure on this host, every
//! variant side by side in one run, reported as ratios first.

pub mod host;
pub mod pci;
pub mod report;

use std::collections::BTreeMap;

use serde::Serialize;

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
