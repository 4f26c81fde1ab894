//! `bench restore`'s restores in a new process: the same snapshot restored by a new exitless
//! (`bench-restore-child`, started by the [`Launcher`]), timed from the moment before the
//! process is spawned to the restored vCPUs' start and to each function's first interrupt:
//! the restore a user gets (`exitless run --restore`), set against QEMU's resume, which is
//! timed from its process's start too. The child's figures come back on CLOCK_MONOTONIC and
//! become a [`Resumed`] here, checked as the in-process restores are.

use std::path::Path;
use std::time::{Duration, Instant};

use super::child::{CHILD_COMMAND, ChildReport, Clock};
use super::launcher::Launcher;
use super::report::{ms, phases};
use super::resume::Resumed;
use super::{RestoreBench, Steps};
use crate::measure::set_baseline;
use crate::model::{ScenarioReport, TargetCheck, Variant};
use exitless::irq::CommitStrategy;
use exitless::machine::ProbeError;
use exitless::seccomp;
use exitless::vm::run_control::StopReason;

/// The suffix of a new-process restore's variant.
const NEW_PROCESS: &str = "-new-process";

/// A restore in a new process.
#[derive(Debug)]
pub(super) struct InNewProcess {
    /// Just before the process was spawned.
    pub spawned: Instant,
    /// When its `main` began.
    pub entered: Instant,
    /// The restore, as the child measured it.
    pub resumed: Resumed,
}

impl InNewProcess {
    /// From the process's spawn to the restored vCPUs' start.
    pub fn to_vcpus(&self) -> Duration {
        self.resumed.resumed.saturating_duration_since(self.spawned)
    }

    /// From the process's spawn to the end of op `op`, if it ended.
    fn to_end_of(&self, op: usize) -> Option<Duration> {
        let end = self.resumed.marks.ends.get(&(op as u64))?;
        Some(end.saturating_duration_since(self.spawned))
    }
}

impl RestoreBench {
    /// Restore the snapshot in `dir` with `s` in a new process started by `launcher`, and run
    /// its `ops` to their end; a child that fails is an error naming why.
    pub(super) fn resume_in_new_process(
        &self,
        launcher: &Launcher,
        dir: &Path,
        s: CommitStrategy,
        ops: usize,
    ) -> Result<InNewProcess, ProbeError> {
        let failed = |why: String| {
            let why = format!("the {} restore in a new process: {why}", s.name());
            ProbeError::GuestFailed(StopReason::VcpuFailed(why), String::new())
        };
        let dir = dir
            .to_str()
            .ok_or_else(|| failed("a folder not in UTF-8".into()))?;
        let mut args: Vec<String> = [CHILD_COMMAND, dir, "--strategy", s.name(), "--ops"]
            .map(String::from)
            .into();
        args.extend([ops.to_string(), "--timeout".into()]);
        args.push(self.timeout.as_secs().max(1).to_string());
        if !seccomp::enabled() {
            args.push("--no-seccomp".into());
        }
        let launched = launcher.launch(&args).map_err(failed)?;
        if launched.status != Some(0) {
            return Err(failed(launched.why()));
        }
        // What it logged (a guest's bad access, say), as an in-process restore's would be.
        for line in launched.stderr.lines() {
            exitless::logging::stderr_line(format_args!("{line}"));
        }
        let clock = Clock::now();
        let report: ChildReport = serde_json::from_str(&launched.stdout)
            .map_err(|e| failed(format!("its report: {e}")))?;
        let resumed = (report.resumed(&clock))
            .ok_or_else(|| failed("its results are not whole probe results".into()))?;
        Ok(InNewProcess {
            spawned: clock.instant(launched.spawned),
            entered: clock.instant(report.entered),
            resumed,
        })
    }

    /// The new-process restores `fresh` added to `report`: a variant each (time/op: process
    /// start to vCPUs running; baseline: per-vector's in a new process), its phases
    /// and first interrupts, and the whole restore's line; or why there are none.
    pub(super) fn add_new_process(
        &self,
        report: &mut ScenarioReport,
        fresh: Result<Vec<(CommitStrategy, InNewProcess)>, String>,
        steps: &Steps,
    ) {
        let fresh = match fresh {
            Ok(fresh) => fresh,
            Err(why) => {
                let why = format!("the restores in a new process did not run: {why}");
                return report.notes.push(why);
            }
        };
        let functions = format!("{} functions and the traffic function", self.devices);
        let mut variants: Vec<Variant> = (fresh.iter())
            .map(|(s, p)| {
                let ns = p.to_vcpus().as_secs_f64() * 1e9;
                Variant {
                    name: format!("{}{NEW_PROCESS}", s.name()),
                    ns_per_op: ns,
                    rounds: 1,
                    ci95: [ns, ns],
                    ops: 1,
                    host_ns_per_op: ns,
                    ..Default::default()
                }
            })
            .collect();
        let base = format!("{}{NEW_PROCESS}", CommitStrategy::PerVector.name());
        set_baseline(&mut variants, &base, &[]);
        report.variants.extend(variants);
        (report.notes).extend((fresh.iter()).map(|(s, p)| process_note(*s, p, steps, &functions)));
        if let Some((_, p)) = fresh.iter().find(|(s, _)| *s == CommitStrategy::Batched) {
            report.notes.push(whole_restore_note(p, steps));
        }
    }

    /// The whole-restore target against QEMU's resume (`qemu`: its process start to guest
    /// running), for `report` with its new-process restores: batched's process start to
    /// vCPUs running against it, like for like (both from a process's start; the first
    /// interrupts, which QEMU's probe cannot time, are `add_new_process`'s note). None
    /// without them. For `QemuRestore::attach`, which sets QEMU's figures beside ours.
    pub fn whole_restore_targets(report: &ScenarioReport, qemu: Duration) -> Vec<TargetCheck> {
        let name = format!("{}{NEW_PROCESS}", CommitStrategy::Batched.name());
        let Some(batched) = report.variants.iter().find(|v| v.name == name) else {
            return Vec::new();
        };
        let (ours, qemu) = (batched.ns_per_op / 1e6, ms(qemu));
        vec![TargetCheck {
            target: "whole restore <= QEMU's".into(),
            measured: format!(
                "batched {ours:.1} ms (a new exitless: process start to vCPUs running) vs QEMU \
                 {qemu:.1} ms (a new QEMU with -incoming: process start to guest running)"
            ),
            met: ours <= qemu,
            ..Default::default()
        }]
    }
}

/// A new-process restore's phases and first interrupts, with its machine's `functions`.
fn process_note(s: CommitStrategy, p: &InNewProcess, steps: &Steps, functions: &str) -> String {
    let r = &p.resumed;
    let firsts: Vec<String> = (steps.first.iter())
        .map(|&op| {
            p.to_end_of(op)
                .map_or("-".into(), |d| format!("{:.2}", ms(d)))
        })
        .collect();
    format!(
        "{}{NEW_PROCESS}: process start to vCPUs running {:.2} ms = exec to main {:.2} ms + \
         command line, seccomp filters and log {:.2} ms + {}; first interrupt of each \
         function, ms after the process started: {}",
        s.name(),
        ms(p.to_vcpus()),
        ms(p.entered.saturating_duration_since(p.spawned)),
        ms(r.start.saturating_duration_since(p.entered)),
        phases(r, functions),
        firsts.join(", "),
    )
}

/// The whole restore, process start to first interrupt, for batched's new process.
fn whole_restore_note(p: &InNewProcess, steps: &Steps) -> String {
    let at = |op: Option<&usize>| {
        op.and_then(|&op| p.to_end_of(op))
            .map_or("-".into(), |d| format!("{:.2} ms", ms(d)))
    };
    format!(
        "whole restore, batched in a new exitless (process start to first interrupt): vCPUs \
         running at {:.2} ms, first interrupt of function 1 at {}, of function {} at {} (after \
         the traffic in flight at the snapshot, which ended at {})",
        ms(p.to_vcpus()),
        at(steps.first.first()),
        steps.first.len(),
        at(steps.first.last()),
        at(Some(&steps.across)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(variants: &[(&str, f64)]) -> ScenarioReport {
        let variants = variants.iter().map(|&(name, ns_per_op)| Variant {
            name: name.into(),
            ns_per_op,
            ..Default::default()
        });
        ScenarioReport {
            variants: variants.collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_whole_restore_against_qemu_is_the_new_process_figure() {
        // The in-process batched restore (10 ms) is not the one set against QEMU's.
        let r = report(&[("batched", 10e6), ("batched-new-process", 60e6)]);
        let met = RestoreBench::whole_restore_targets(&r, Duration::from_millis(90));
        assert_eq!(met.len(), 1);
        assert_eq!(met[0].target, "whole restore <= QEMU's");
        assert!(met[0].met);
        assert!(
            met[0].measured.starts_with("batched 60.0 ms"),
            "{}",
            met[0].measured
        );
        assert!(
            met[0].measured.contains("QEMU 90.0 ms"),
            "{}",
            met[0].measured
        );
        let missed = RestoreBench::whole_restore_targets(&r, Duration::from_millis(30));
        assert!(!missed[0].met);
        let none = report(&[("batched", 10e6)]);
        assert!(RestoreBench::whole_restore_targets(&none, Duration::from_millis(90)).is_empty());
    }
}
