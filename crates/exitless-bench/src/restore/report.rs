//! `bench restore`'s report: one variant per strategy (time: the whole restore), the seed's
//! per-function table, the targets, and the phases and first interrupts as notes.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use super::resume::{Resumed, per_function};
use super::source::Taken;
use super::{RR_ACROSS, RR_AFTER, RestoreBench, Steps};
use crate::measure::{ratio_target, set_baseline};
use crate::model::{RoutingFigures, ScenarioReport, TargetCheck, Variant};
use crate::msix::{
    SEED_BATCHED_MS, SEED_BATCHED_TOTAL_MS, SEED_PER_VECTOR_MS, SEED_PER_VECTOR_TOTAL_MS,
};
use exitless::irq::CommitStrategy;
use exitless::machine::snapshot::memory_path;

/// The memory file's length and the bytes it takes on disk (it is sparse).
pub(super) fn disk_use(dir: &Path) -> Option<(u64, u64)> {
    let meta = std::fs::metadata(memory_path(dir).ok()?).ok()?;
    Some((meta.len(), meta.blocks() * 512))
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl RestoreBench {
    /// The report of the snapshot `taken` and the restores `runs`.
    pub(super) fn report(
        &self,
        taken: Taken,
        runs: &[(CommitStrategy, Resumed)],
        steps: &Steps,
        on_disk: Option<(u64, u64)>,
    ) -> ScenarioReport {
        let mut variants: Vec<Variant> = runs.iter().map(|(s, r)| self.variant(*s, r)).collect();
        let seed_ratio = SEED_BATCHED_TOTAL_MS / SEED_PER_VECTOR_TOTAL_MS;
        set_baseline(
            &mut variants,
            CommitStrategy::PerVector.name(),
            &[(CommitStrategy::Batched.name(), seed_ratio)],
        );
        let mut notes = vec![snapshot_note(taken, runs, steps, on_disk)];
        let functions = format!("{} functions and the traffic function", self.devices);
        notes.extend(
            runs.iter()
                .map(|(s, r)| phases_note(s.name(), r, &functions)),
        );
        notes.extend(runs.iter().map(|(s, r)| first_note(*s, r, steps)));
        notes.push(format!(
            "checked after every restore: the {RR_ACROSS} transactions in flight at the snapshot \
             and {RR_AFTER} more finished, every response byte-exact (the guest checks each); \
             each of the {} functions' {} vectors asked for once and delivered exactly once, \
             then an MSI-X check of every function with no stray interrupt",
            self.devices,
            self.vectors()
        ));
        ScenarioReport {
            name: "restore".into(),
            title: format!(
                "Resuming a snapshot with every MSI-X vector live (issue 25, seed 002): {} \
                 virtio-net functions × {} vectors and a function carrying traffic, restored once \
                 per strategy in this process and in a new one; time/op is the whole restore \
                 (snapshot opened to vCPUs started; `*-new-process`: a new exitless, from the \
                 moment before its process was spawned to its vCPUs started)",
                self.devices,
                self.vectors()
            ),
            timing: "host wall time (Instant; a new process's instants on CLOCK_MONOTONIC, the \
                     same clock, read by the launcher just before the spawn and by the child); \
                     per-function cost is host time inside \
                     KVM_SET_GSI_ROUTING and binding irqfds for the commits carrying that \
                     function's routes (first-use: at the first message after the restore, which \
                     commits every staged route at once); \
                     one snapshot, one restore per strategy, one round"
                .into(),
            targets: targets(&variants),
            notes,
            variants,
            soak: None,
        }
    }

    pub(super) fn variant(&self, s: CommitStrategy, r: &Resumed) -> Variant {
        let total_ns = r.total().as_secs_f64() * 1e9;
        let vectors = u32::try_from(self.vectors()).expect("validated: at most 129");
        let costs = per_function(r.commits.iter(), self.devices, vectors);
        let per_device_ms: Vec<f64> = costs.per.iter().map(|&(_, t)| ms(t)).collect();
        let seed_8 = self.devices == 8 && self.queue_pairs == 32;
        let seed = match s {
            CommitStrategy::PerVector => Some((SEED_PER_VECTOR_MS, SEED_PER_VECTOR_TOTAL_MS)),
            CommitStrategy::Batched => Some((SEED_BATCHED_MS, SEED_BATCHED_TOTAL_MS)),
            CommitStrategy::FirstUse | CommitStrategy::Direct => None,
        }
        .filter(|_| seed_8);
        let routing = RoutingFigures {
            total_ms: per_device_ms.iter().fold(0.0, |sum, x| sum + x),
            per_device_ms,
            commits: costs.commits,
            per_device_commits: costs.per.iter().map(|&(c, _)| c).collect(),
            commit_ms: ms(costs.kvm),
            seed_per_device_ms: seed.map(|(per, _)| per.to_vec()),
            seed_total_ms: seed.map(|(_, total)| total),
            ..Default::default()
        };
        Variant {
            name: s.name().into(),
            ns_per_op: total_ns,
            rounds: 1,
            ci95: [total_ns, total_ns],
            ops: 1,
            host_ns_per_op: total_ns,
            routing: Some(routing),
            ..Default::default()
        }
    }
}

/// The routing figures of `s`'s variant.
fn routing(variants: &[Variant], s: CommitStrategy) -> &RoutingFigures {
    variants
        .iter()
        .find(|v| v.name == s.name())
        .and_then(|v| v.routing.as_ref())
        .expect("every strategy restored, with routing figures")
}

/// The targets: batched against per-vector, flat per function; and the commits each
/// strategy must make at restore.
fn targets(variants: &[Variant]) -> Vec<TargetCheck> {
    let (per_vector, batched) = (
        routing(variants, CommitStrategy::PerVector),
        routing(variants, CommitStrategy::Batched),
    );
    let first = batched.per_device_ms.first().copied().unwrap_or(f64::NAN);
    let last = batched.per_device_ms.last().copied().unwrap_or(f64::NAN);
    let functions = batched.per_device_ms.len() as u64;
    let restore_commits = |s| routing(variants, s).commits;
    vec![
        ratio_target(
            format!("batched restore of the {functions} functions' routes <= 0.1x per-vector"),
            format!(
                "{:.3} ms vs {:.3} ms ({:.3}x; seed {:.3}x)",
                batched.total_ms,
                per_vector.total_ms,
                batched.total_ms / per_vector.total_ms,
                SEED_BATCHED_TOTAL_MS / SEED_PER_VECTOR_TOTAL_MS
            ),
            (&[batched.total_ms], &[per_vector.total_ms]),
            0.1,
            true,
        ),
        ratio_target(
            "batched flat per function: last <= 1.5x first".into(),
            format!(
                "first {first:.3} ms, last {last:.3} ms ({:.2}x)",
                last / first
            ),
            (&[last], &[first]),
            1.5,
            true,
        ),
        TargetCheck {
            target: "batched: one commit for the whole restore".into(),
            measured: format!(
                "{} commits for {functions} functions ({} per-vector)",
                restore_commits(CommitStrategy::Batched),
                restore_commits(CommitStrategy::PerVector)
            ),
            met: restore_commits(CommitStrategy::Batched) == 1,
            ..Default::default()
        },
        TargetCheck {
            target: "direct: no commit".into(),
            measured: format!("{} commits", restore_commits(CommitStrategy::Direct)),
            met: restore_commits(CommitStrategy::Direct) == 0,
            ..Default::default()
        },
    ]
}

/// How the snapshot was taken and what it holds.
fn snapshot_note(
    taken: Taken,
    runs: &[(CommitStrategy, Resumed)],
    steps: &Steps,
    on_disk: Option<(u64, u64)>,
) -> String {
    // The traffic op's begin mark was made before the snapshot, its end after the restore.
    let across = steps.across as u64;
    let mid = runs
        .iter()
        .all(|(_, r)| r.marks.ends.contains_key(&across) && !r.marks.begins.contains_key(&across));
    let disk = on_disk.map_or("its memory file unread".into(), |(len, used)| {
        format!(
            "memory file {:.1} MiB long, {:.1} MiB on disk",
            len as f64 / 1048576.0,
            used as f64 / 1048576.0
        )
    });
    format!(
        "snapshot: pause {:.2} ms, save {:.2} ms (devices paused, states, memory, description); \
         {disk}; taken {} the request/response traffic",
        ms(taken.pause),
        ms(taken.save),
        if mid {
            "in the middle of"
        } else {
            "NOT in the middle of"
        }
    )
}

/// The restore's phases of the variant `name`, whose machine had `functions`.
pub(super) fn phases_note(name: &str, r: &Resumed, functions: &str) -> String {
    format!("{name}: {}", phases(r, functions))
}

/// The restore's phases, its machine having `functions`.
pub(super) fn phases(r: &Resumed, functions: &str) -> String {
    let routes: Duration = r.restore_commits().map(|c| c.time + c.bind).sum();
    let commits = r.restore_commits().count();
    format!(
        "restore {:.2} ms = build on the memory file (mapped, devices created) {:.2} ms + \
         VM state {:.2} ms + vCPUs {:.2} ms + devices {:.2} ms (of which routes+irqfds {:.2} ms \
         in {commits} commits for {functions})",
        ms(r.total()),
        ms(r.build),
        ms(r.steps.vm),
        ms(r.steps.vcpus),
        ms(r.steps.devices),
        ms(routes),
    )
}

/// Time from the vCPUs' start to each function's first interrupt, for strategy `s`.
fn first_note(s: CommitStrategy, r: &Resumed, steps: &Steps) -> String {
    let at = |op: usize| {
        r.until_end_of(op)
            .map_or("-".into(), |d| format!("{:.2}", ms(d)))
    };
    let firsts: Vec<String> = steps.first.iter().map(|&op| at(op)).collect();
    format!(
        "{}: first interrupt of each function, ms after the vCPUs started: {} (the rest of the \
         traffic in flight at the snapshot came first: it ended at {} ms)",
        s.name(),
        firsts.join(", "),
        at(steps.across)
    )
}
