//! One restore of the snapshot with a strategy in force: a new machine built from it, its
//! state set, run on to the end of the probe's ops; what each phase took, which commits
//! carried which function's routes, and what the guest found.

use std::path::Path;
use std::time::{Duration, Instant};

use exitless::contract::{OpResult, RESULTS_ADDR};
use exitless::irq::routing::IOAPIC_PINS;
use exitless::irq::{CommitRecord, CommitStrategy};
use exitless::machine::probe::read_blocks;
use exitless::machine::snapshot::{Restorable, RestoreTimes};
use exitless::machine::vcpus::RunEnd;
use exitless::machine::{Machine, MachineError, ProbeError};
use exitless::vm::run_control::StopReason;

use super::board::{Marks, RestoreBoard};

/// What one restore measured.
#[derive(Debug)]
pub(super) struct Resumed {
    /// Reading and checking the snapshot, building the machine on its memory file (mapped
    /// privately), creating every device.
    pub build: Duration,
    /// The machine's steps ([`RestoreTimes`]).
    pub steps: RestoreTimes,
    /// When the vCPUs were about to run.
    pub resumed: Instant,
    /// When the restore began.
    pub start: Instant,
    /// Every commit from the machine's build to the end of the run.
    pub commits: Vec<CommitRecord>,
    /// The guest's phase marks.
    pub marks: Marks,
    /// One per op, the ops before the snapshot included (they are in the restored memory).
    pub results: Vec<OpResult>,
}

impl Resumed {
    /// The restore, from opening the snapshot to the vCPUs' start.
    pub fn total(&self) -> Duration {
        self.resumed - self.start
    }

    /// The commits made before the vCPUs ran: the restore's own.
    pub fn restore_commits(&self) -> impl Iterator<Item = &CommitRecord> {
        self.commits.iter().filter(|c| c.at <= self.resumed)
    }

    /// Time from the vCPUs' start to the end of op `op`, if it ended in this run.
    pub fn until_end_of(&self, op: usize) -> Option<Duration> {
        let end = self.marks.ends.get(&(op as u64))?;
        Some(end.saturating_duration_since(self.resumed))
    }
}

/// Restore the snapshot in `dir` with `strategy` and run it on until the probe is done.
pub(super) fn resume(
    dir: &Path,
    strategy: CommitStrategy,
    ops: usize,
    timeout: Duration,
) -> Result<Resumed, ProbeError> {
    let start = Instant::now();
    let Restorable {
        description,
        memory,
    } = Restorable::open(dir).map_err(MachineError::from)?;
    let mut cfg = description.config.clone();
    cfg.gsi_commits = strategy;
    let mut board = RestoreBoard::default();
    let machine = Machine::restore(&cfg, Some(&mut board), memory)?;
    let build = start.elapsed();
    let (vcpus, steps) = machine.restore_state_timed(description.state())?;
    let resumed = Instant::now();
    let ran = machine.run_vcpus(vcpus, timeout)?;
    let console = machine.console();
    match ran.end {
        RunEnd::Stopped(StopReason::GuestDone(0)) => {}
        RunEnd::Stopped(r) => return Err(ProbeError::GuestFailed(r, console)),
        RunEnd::TimedOut => return Err(ProbeError::Timeout(timeout, console)),
    }
    let results = read_blocks::<OpResult>(machine.memory(), RESULTS_ADDR, ops)?;
    let commits = board.commits();
    let marks = std::mem::take(&mut *board.marks.lock().unwrap());
    Ok(Resumed {
        build,
        steps,
        resumed,
        start,
        commits,
        marks,
        results,
    })
}

/// What carrying the functions' routes cost.
#[derive(Debug, Default)]
pub(super) struct FunctionCosts {
    /// Per function: commits carrying its routes, and their time (in KVM and binding irqfds;
    /// a commit carrying several functions' routes shared by their share of its routes).
    pub per: Vec<(u64, Duration)>,
    /// Distinct commits carrying any function's routes.
    pub commits: u64,
    /// Their time in KVM.
    pub kvm: Duration,
}

/// What `commits` cost each of `functions` functions: their MSI GSIs are handed out in
/// function order, `vectors` each, from the first GSI after the IOAPIC pins (any GSI above
/// is another device's: the traffic function's).
pub(super) fn per_function<'a>(
    commits: impl Iterator<Item = &'a CommitRecord>,
    functions: usize,
    vectors: u32,
) -> FunctionCosts {
    let mut out = FunctionCosts {
        per: vec![(0, Duration::ZERO); functions],
        ..Default::default()
    };
    for c in commits {
        let mut shares = vec![0u32; functions];
        for &gsi in &c.added {
            let f = (gsi.saturating_sub(IOAPIC_PINS) / vectors) as usize;
            if let Some(n) = shares.get_mut(f) {
                *n += 1;
            }
        }
        if shares.iter().all(|&n| n == 0) {
            continue;
        }
        let all = u32::try_from(c.added.len()).unwrap_or(u32::MAX);
        for (f, &n) in shares.iter().enumerate().filter(|(_, n)| **n > 0) {
            out.per[f].0 += 1;
            out.per[f].1 += (c.time + c.bind) * n / all;
        }
        out.commits += 1;
        out.kvm += c.time;
    }
    out
}
