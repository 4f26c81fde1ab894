//! How op times and exit counts of a probe run become a [`Variant`]: the clock, the median over
//! repetitions, and the baseline each variant's time ratio is taken against.

use std::collections::BTreeMap;

use crate::bench::model::Variant;
use crate::contract::STATUS_OK;
use crate::machine::{MachineError, ProbeConfig, ProbeRun, run_probe};
use crate::stats::ExitKind;

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
        ci95: None,
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
