//! How op times and exit counts of a probe run become a [`Variant`]: the clock, the median over
//! repetitions, the rounds combined into one variant with its interval, the baseline each
//! variant's time ratio is taken against, and targets checked on ratios with their intervals.

use std::collections::BTreeMap;

use crate::model::{RoutingFigures, TargetCheck, Variant};
use crate::stats::{Verdict, median, median_ci, ratio_ci, rotation};
use exitless::contract::STATUS_OK;
use exitless::exits::ExitKind;
use exitless::machine::{ProbeConfig, ProbeError, ProbeRun, run_probe};

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
        rounds: 1,
        ci95: [median, median],
        ci95_coverage: 0.0,
        counts_vary: false,
        round_figures: Vec::new(),
        exits_per_op: total,
        exits_by_kind,
        ops: op_indexes.len() as u64 * per_op,
        host_ns_per_op: host,
        baseline: String::new(),
        time_ratio: f64::NAN,
        time_ratio_ci95: [f64::NAN, f64::NAN],
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
pub(crate) fn run_ok(cfg: &ProbeConfig) -> Result<ProbeRun, ProbeError> {
    let run = run_probe(cfg)?;
    match run.results.iter().position(|r| r.status != STATUS_OK) {
        Some(i) => Err(ProbeError::GuestFailed(
            exitless::vm::run_control::StopReason::VcpuFailed(format!(
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
    let base_rounds = variants
        .iter()
        .find(|v| v.name == baseline)
        .map(|v| v.each_round(|r| r.ns_per_op))
        .unwrap_or_default();
    for v in variants {
        v.baseline = baseline.into();
        v.time_ratio = v.ns_per_op / base;
        let (lo, hi) = ratio_ci(&v.each_round(|r| r.ns_per_op), &base_rounds);
        v.time_ratio_ci95 = [lo, hi];
        v.seed_time_ratio = seed.iter().find(|(n, _)| *n == v.name).map(|&(_, r)| r);
    }
}

/// Make `twin` the baseline of `v` alone (the ratio, its interval, paired by round).
pub(crate) fn set_twin(v: &mut Variant, twin: &Variant) {
    v.baseline = twin.name.clone();
    v.time_ratio = v.ns_per_op / twin.ns_per_op;
    let (lo, hi) = ratio_ci(
        &v.each_round(|r| r.ns_per_op),
        &twin.each_round(|r| r.ns_per_op),
    );
    v.time_ratio_ci95 = [lo, hi];
}

/// Run `rounds` rounds of `boots` boots, round `r` in the order [`rotation`] gives, and
/// return each boot's results in boot order, one entry per round:
/// `results[boot][round]`. A failed boot ends the run.
pub(crate) fn in_rounds<T, E>(
    rounds: usize,
    boots: usize,
    mut boot: impl FnMut(usize) -> Result<T, E>,
) -> Result<Vec<Vec<T>>, E> {
    let mut results: Vec<Vec<T>> = (0..boots).map(|_| Vec::new()).collect();
    for round in 0..rounds.max(1) {
        for b in rotation(boots, round) {
            results[b].push(boot(b)?);
        }
    }
    Ok(results)
}

/// One line for a scenario's timing: the rounds and their boots.
pub(crate) fn rounds_line(rounds: usize, boots: &str) -> String {
    format!(
        "{rounds} rounds, each with boots of its own ({boots}), the boots' order rotated round \
         by round; time/op is the median over rounds, ± half its interval (order statistics, \
         {:.1}% coverage at {rounds} rounds)",
        100.0 * median_ci(&vec![0.0; rounds.max(1)]).coverage
    )
}

/// What must not change between rounds: exits by kind, interrupts, routing commits (per op:
/// the same counts over the same ops give the same bits).
fn counts(v: &Variant) -> (Vec<u64>, Option<u64>, Vec<u64>) {
    let exits = v.exits_by_kind.values().map(|x| x.to_bits()).collect();
    let irqs = v.irqs_per_op.map(f64::to_bits);
    let commits = v.routing.as_ref().map_or_else(Vec::new, routing_commits);
    (exits, irqs, commits)
}

fn routing_commits(r: &RoutingFigures) -> Vec<u64> {
    let mut all = r.per_device_commits.clone();
    for part in [
        &r.table_programming,
        &r.unmask_one_by_one,
        &r.first_after_enable,
        &r.restore_interrupts,
        &r.first_interrupt,
        &r.steady_interrupts,
    ]
    .into_iter()
    .flatten()
    {
        all.extend(routing_commits(part));
    }
    all
}

/// One variant from its rounds (in round order): the median round's figures (the round
/// nearest the median time: with an odd count, the median itself) for everything but time,
/// the median time with its interval, and whether the counts varied.
pub(crate) fn combine(rounds: Vec<Variant>) -> Variant {
    let times: Vec<f64> = rounds.iter().map(|v| v.ns_per_op).collect();
    let mid = median(&times);
    let nearest = (0..rounds.len())
        .min_by(|&a, &b| (times[a] - mid).abs().total_cmp(&(times[b] - mid).abs()))
        .expect("at least one round");
    let mut v = rounds[nearest].clone();
    let ci = median_ci(&times);
    v.ns_per_op = mid;
    v.rounds = rounds.len();
    v.ci95 = [ci.lo, ci.hi];
    v.ci95_coverage = ci.coverage;
    v.host_ns_per_op = median(&rounds.iter().map(|r| r.host_ns_per_op).collect::<Vec<_>>());
    if v.trans_per_s.is_some() {
        v.trans_per_s = Some(1e9 / mid);
    }
    v.counts_vary = rounds.iter().any(|r| counts(r) != counts(&rounds[0]));
    v.round_figures = rounds;
    v
}

/// Variants from the rounds of several boots: `rounds[round]` holds every variant that round
/// measured; the result keeps the first round's order.
pub(crate) fn combine_rounds(rounds: Vec<Vec<Variant>>) -> Vec<Variant> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    let names: Vec<String> = first.iter().map(|v| v.name.clone()).collect();
    names
        .iter()
        .map(|name| {
            combine(
                rounds
                    .iter()
                    .filter_map(|r| r.iter().find(|v| &v.name == name).cloned())
                    .collect(),
            )
        })
        .collect()
}

/// A target on a ratio: `num / den` (medians over rounds) at most (`at_most`) or at least
/// `threshold`, its interval bootstrapped over paired rounds, the verdict from the interval.
/// `measured` describes the figures; the interval is appended to it.
pub(crate) fn ratio_target(
    target: String,
    measured: String,
    (num, den): (&[f64], &[f64]),
    threshold: f64,
    at_most: bool,
) -> TargetCheck {
    let point = median(num) / median(den);
    let (lo, hi) = ratio_ci(num, den);
    let met = if at_most {
        point <= threshold
    } else {
        point >= threshold
    };
    TargetCheck {
        target,
        measured: format!(
            "{measured}; 95% interval {}x",
            crate::format::ratio_interval([lo, hi])
        ),
        met,
        verdict: Some(Verdict::of_interval((lo, hi), threshold, at_most)),
        ratio_ci95: Some([lo, hi]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(ns: f64, mmio_writes: f64) -> Variant {
        Variant {
            name: "v".into(),
            ns_per_op: ns,
            rounds: 1,
            ci95: [ns, ns],
            ci95_coverage: 0.0,
            counts_vary: false,
            round_figures: Vec::new(),
            exits_per_op: mmio_writes,
            exits_by_kind: BTreeMap::from([("mmio-write", mmio_writes)]),
            ops: 10,
            host_ns_per_op: ns,
            baseline: String::new(),
            time_ratio: f64::NAN,
            time_ratio_ci95: [f64::NAN; 2],
            seed_time_ratio: None,
            trans_per_s: Some(1e9 / ns),
            seed_trans_per_s: None,
            irqs_per_op: None,
            delivery: None,
            guest_errors: BTreeMap::new(),
            routing: None,
            iommu: None,
            peer: None,
        }
    }

    #[test]
    fn rounds_run_boots_in_rotated_order_and_keep_them_by_boot() {
        let mut order = Vec::new();
        let by_boot = in_rounds(3, 3, |b| {
            order.push(b);
            Ok::<_, ()>(b * 10 + order.len())
        })
        .unwrap();
        assert_eq!(order, [0, 1, 2, 1, 2, 0, 2, 0, 1]);
        assert_eq!(by_boot[1], [12, 14, 19]);
    }

    #[test]
    fn combined_rounds_give_the_median_its_interval_and_flag_varying_counts() {
        let v = combine(vec![round(30.0, 1.0), round(10.0, 1.0), round(20.0, 1.0)]);
        assert_eq!((v.ns_per_op, v.rounds, v.ci95), (20.0, 3, [10.0, 30.0]));
        assert_eq!(v.trans_per_s, Some(1e9 / 20.0));
        assert!(!v.counts_vary);
        let v = combine(vec![round(30.0, 1.0), round(10.0, 1.1), round(20.0, 1.0)]);
        assert!(v.counts_vary);
        let mut vs = vec![v, {
            let mut b = combine(vec![round(60.0, 1.0), round(20.0, 1.0), round(40.0, 1.0)]);
            b.name = "base".into();
            b
        }];
        set_baseline(&mut vs, "base", &[]);
        // Paired rounds: every round's ratio is 0.5, so is the interval.
        assert_eq!((vs[0].time_ratio, vs[0].time_ratio_ci95), (0.5, [0.5, 0.5]));
        let json = serde_json::to_string(&vs[0]).unwrap();
        for field in [
            "\"rounds\":3",
            "\"ci95\":[10.0,30.0]",
            "\"time_ratio_ci95\":[0.5,0.5]",
            "\"counts_vary\":true",
        ] {
            assert!(json.contains(field), "{field} in {json}");
        }
    }

    #[test]
    fn a_ratio_target_spanning_its_threshold_is_not_established() {
        let wide = ratio_target(
            "a >= b".into(),
            "figures".into(),
            (&[0.8, 0.945, 1.05, 1.1, 0.9], &[1.0; 5]),
            1.0,
            false,
        );
        assert!(!wide.met);
        let json = serde_json::to_string(&wide).unwrap();
        assert!(json.contains("\"verdict\":\"not established\""), "{json}");
        assert!(json.contains("\"ratio_ci95\":["), "{json}");
        let plain = TargetCheck {
            met: true,
            ..Default::default()
        };
        let json = serde_json::to_string(&plain).unwrap();
        assert!(json.contains("\"verdict\":\"met\""), "{json}");
    }
}
