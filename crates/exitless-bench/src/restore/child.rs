//! `exitless bench-restore-child DIR` (hidden): one restore of `bench restore`'s snapshot in a
//! process of its own, so that the bench times a restore as a user gets it, from the process's
//! start (issue 25: "whole restore, process start to first interrupt"). The child runs the same
//! [`resume`] as the bench's in-process restores (the same board, the same run to the probe's
//! end) and writes what it measured to stdout as one JSON line, every instant a reading of
//! CLOCK_MONOTONIC: the clock Rust's `Instant` reads on Linux, system-wide, so the bench can
//! set the child's instants against its own (an `Instant` cannot cross a process).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, IntoBytes};

use super::board::Marks;
use super::resume::{Resumed, resume};
use exitless::contract::OpResult;
use exitless::irq::{CommitRecord, CommitStrategy};
use exitless::machine::ProbeError;
use exitless::machine::snapshot::RestoreTimes;

/// The hidden subcommand's name.
pub const CHILD_COMMAND: &str = "bench-restore-child";

/// CLOCK_MONOTONIC now, as time since boot.
pub fn monotonic() -> Duration {
    // `cpu_time` reads any clock; this one is not a CPU clock but the system's monotonic one.
    exitless::exits::cpu_time(libc::CLOCK_MONOTONIC)
}

/// One moment read on both clocks: converts this process's `Instant`s to CLOCK_MONOTONIC
/// readings (any process's) and back.
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock {
    instant: Instant,
    monotonic: Duration,
}

impl Clock {
    /// Both clocks, now.
    pub fn now() -> Clock {
        Clock {
            instant: Instant::now(),
            monotonic: monotonic(),
        }
    }

    /// `at` as nanoseconds of CLOCK_MONOTONIC.
    pub fn ns(&self, at: Instant) -> u64 {
        let reading = match at.checked_duration_since(self.instant) {
            Some(after) => self.monotonic + after,
            None => self.monotonic.saturating_sub(self.instant - at),
        };
        nanos(reading)
    }

    /// The `Instant` of the CLOCK_MONOTONIC reading `ns` (a reading before this process could
    /// have one is clamped to `self`'s moment).
    pub fn instant(&self, ns: u64) -> Instant {
        let reading = Duration::from_nanos(ns);
        match reading.checked_sub(self.monotonic) {
            Some(after) => self.instant + after,
            None => (self.instant.checked_sub(self.monotonic - reading)).unwrap_or(self.instant),
        }
    }
}

/// `d` in whole nanoseconds (u64 holds 584 years).
pub(super) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One routing commit, as [`CommitRecord`] (instants as CLOCK_MONOTONIC nanoseconds).
#[derive(Debug, Serialize, Deserialize)]
struct Commit {
    at: u64,
    time: u64,
    bind: u64,
    added: Vec<u32>,
}

/// What the child measured: [`Resumed`], and when its `main` began. Instants are
/// CLOCK_MONOTONIC nanoseconds, durations nanoseconds.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ChildReport {
    /// When the child's `main` began (after exec, the loader and the runtime's start).
    pub entered: u64,
    start: u64,
    build: u64,
    vm: u64,
    vcpus: u64,
    devices: u64,
    resumed: u64,
    commits: Vec<Commit>,
    begins: BTreeMap<u64, u64>,
    ends: BTreeMap<u64, u64>,
    /// The probe's results, as the words of its `OpResult`s.
    results: Vec<u64>,
}

impl ChildReport {
    /// `r` (this process's), its `main` begun at `entered`.
    fn new(r: &Resumed, entered: Duration, clock: &Clock) -> ChildReport {
        let marks = |m: &BTreeMap<u64, Instant>| -> BTreeMap<u64, u64> {
            m.iter().map(|(&op, &t)| (op, clock.ns(t))).collect()
        };
        let words = r.results.as_bytes().chunks_exact(8);
        ChildReport {
            entered: nanos(entered),
            start: clock.ns(r.start),
            build: nanos(r.build),
            vm: nanos(r.steps.vm),
            vcpus: nanos(r.steps.vcpus),
            devices: nanos(r.steps.devices),
            resumed: clock.ns(r.resumed),
            commits: (r.commits.iter())
                .map(|c| Commit {
                    at: clock.ns(c.at),
                    time: nanos(c.time),
                    bind: nanos(c.bind),
                    added: c.added.clone(),
                })
                .collect(),
            begins: marks(&r.marks.begins),
            ends: marks(&r.marks.ends),
            results: words
                .map(|w| u64::from_le_bytes(w.try_into().expect("chunks of 8")))
                .collect(),
        }
    }

    /// The restore as the bench's own [`Resumed`], its instants on `clock`; `None` if the
    /// results are not whole `OpResult`s.
    pub fn resumed(&self, clock: &Clock) -> Option<Resumed> {
        let marks = |m: &BTreeMap<u64, u64>| -> BTreeMap<u64, Instant> {
            m.iter().map(|(&op, &t)| (op, clock.instant(t))).collect()
        };
        let words = self.results.as_bytes();
        let size = std::mem::size_of::<OpResult>();
        if !words.len().is_multiple_of(size) {
            return None;
        }
        let results = (words.chunks_exact(size))
            .map(|r| OpResult::read_from_bytes(r).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(Resumed {
            build: Duration::from_nanos(self.build),
            steps: RestoreTimes {
                vm: Duration::from_nanos(self.vm),
                vcpus: Duration::from_nanos(self.vcpus),
                devices: Duration::from_nanos(self.devices),
            },
            resumed: clock.instant(self.resumed),
            start: clock.instant(self.start),
            commits: (self.commits.iter())
                .map(|c| CommitRecord {
                    at: clock.instant(c.at),
                    time: Duration::from_nanos(c.time),
                    bind: Duration::from_nanos(c.bind),
                    added: c.added.clone(),
                })
                .collect(),
            marks: Marks {
                begins: marks(&self.begins),
                ends: marks(&self.ends),
            },
            results,
        })
    }
}

/// The child's work: restore the snapshot in `dir` with `strategy`, run the probe's `ops` to
/// their end, and return the JSON line of what it measured; `entered` is when `main` began.
pub fn restore_child(
    dir: &Path,
    strategy: CommitStrategy,
    ops: usize,
    timeout: Duration,
    entered: Duration,
) -> Result<String, ProbeError> {
    let r = resume(dir, strategy, ops, timeout)?;
    let report = ChildReport::new(&r, entered, &Clock::now());
    Ok(serde_json::to_string(&report).expect("plain numbers encode") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_goes_to_the_monotonic_clock_and_back() {
        let clock = Clock::now();
        let later = clock.instant + Duration::from_millis(5);
        let ns = clock.ns(later);
        assert_eq!(ns, nanos(clock.monotonic) + 5_000_000);
        assert_eq!(clock.instant(ns), later);
        let earlier = clock.instant(ns - 7_000_000);
        assert_eq!(clock.instant - earlier, Duration::from_millis(2));
        assert_eq!(clock.ns(earlier), ns - 7_000_000);
    }

    #[test]
    fn results_that_are_not_whole_op_results_are_refused() {
        let report = ChildReport {
            entered: 0,
            start: 0,
            build: 0,
            vm: 0,
            vcpus: 0,
            devices: 0,
            resumed: 0,
            commits: Vec::new(),
            begins: BTreeMap::new(),
            ends: BTreeMap::new(),
            results: vec![0; 3],
        };
        assert!(report.resumed(&Clock::now()).is_none());
        let whole = std::mem::size_of::<OpResult>() / 8;
        let report = ChildReport {
            results: vec![7; 2 * whole],
            ..report
        };
        let r = report.resumed(&Clock::now()).expect("two results");
        assert_eq!(r.results.len(), 2);
        assert_eq!(r.results[1].status, 7);
    }
}
