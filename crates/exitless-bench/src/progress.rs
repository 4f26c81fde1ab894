//! Progress on stderr while `exitless bench` runs: which scenario, which step of it (a variant,
//! a round: the caller names it), the time so far and an estimate of the time left.
//!
//! Drawn only when stderr is a terminal and the report is not JSON, as one line rewritten in
//! place (`\r`, then erase to the end of the line), on each call from the thread that measures:
//! no thread of its own and no terminal-size query, so under the main thread's seccomp filter it
//! needs `write(2)` alone. Whether stderr is a terminal (an ioctl) is asked once, in
//! [`start`], before the filter is applied. A hand-written line rather than `indicatif`: that
//! crate asks the terminal's size on every draw (`TIOCGWINSZ`, which the filter does not allow)
//! and, with a steady tick, draws from a thread of its own.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest line drawn, in characters: narrower than any terminal it is likely to meet, so
/// that a line never wraps (a wrapped line is not rewritten by `\r`).
const WIDTH: usize = 78;

/// Where the run is: scenario `scenario + 1` of `scenarios`, in it step `step + 1` of `of_steps`.
#[derive(Clone, Debug, PartialEq)]
pub struct Position {
    /// Index of the scenario running.
    pub scenario: usize,
    /// Scenarios in the run.
    pub scenarios: usize,
    /// Its name.
    pub name: String,
    /// What the step measures (a variant, a round), or empty.
    pub step_label: String,
    /// Index of the step running.
    pub step: usize,
    /// Steps in the scenario (at least 1).
    pub of_steps: usize,
}

impl Position {
    /// The share of the run done, 0 to 1: scenarios count alike, steps alike within one.
    pub fn done(&self) -> f64 {
        let of = self.of_steps.max(1) as f64;
        (self.scenario as f64 + self.step.min(self.of_steps) as f64 / of)
            / self.scenarios.max(1) as f64
    }
}

/// Minutes and seconds.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

/// The bytes that draw `at` after `elapsed`: back to the line's start, the line, erase the rest.
pub fn render(at: &Position, elapsed: Duration) -> String {
    let mut line = format!("bench [{}/{}] {}", at.scenario + 1, at.scenarios, at.name);
    if !at.step_label.is_empty() || at.of_steps > 1 {
        line += &format!(": {} ({}/{})", at.step_label, at.step + 1, at.of_steps);
    }
    line += &format!(", {} elapsed", clock(elapsed));
    let done = at.done();
    if done > 0.0 && done < 1.0 {
        let left = elapsed.as_secs_f64() * (1.0 - done) / done;
        line += &format!(", ~{} left", clock(Duration::from_secs_f64(left)));
    }
    let line: String = line.chars().take(WIDTH).collect();
    format!("\r{line}\x1b[K")
}

/// The bytes that clear the line once the run ends.
pub const CLEAR: &str = "\r\x1b[K";

/// The run's progress: its start, and where it is.
struct State {
    started: Instant,
    at: Position,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn draw(bytes: &str) {
    // A progress line that cannot be written is no error of the run.
    let _ = std::io::stderr().lock().write_all(bytes.as_bytes());
}

/// Start drawing progress for a run of `scenarios` scenarios, if stderr is a terminal and
/// `json` is off. Call before the main thread confines itself (the terminal check is an ioctl).
pub fn start(scenarios: usize, json: bool) {
    let enabled = !json && std::io::stderr().is_terminal();
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    *state = enabled.then(|| State {
        started: Instant::now(),
        at: Position {
            scenario: 0,
            scenarios,
            name: String::new(),
            step_label: String::new(),
            step: 0,
            of_steps: 1,
        },
    });
}

/// Scenario `index` (`name`) begins.
pub fn scenario(index: usize, name: &str) {
    update(|at| {
        at.scenario = index;
        at.name = name.to_owned();
        at.step_label.clear();
        at.step = 0;
        at.of_steps = 1;
    });
}

/// In the scenario `name`, step `step` (0-based) of `of_steps` begins, measuring `label` (a
/// variant, a round: whatever the scenario steps through).
pub fn step(name: &str, label: &str, step: usize, of_steps: usize) {
    update(|at| {
        at.name = name.to_owned();
        at.step_label = label.to_owned();
        at.step = step;
        at.of_steps = of_steps.max(1);
    });
}

fn update(change: impl FnOnce(&mut Position)) {
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = state.as_mut() {
        change(&mut s.at);
        draw(&render(&s.at, s.started.elapsed()));
    }
}

/// The run ended (or failed): clear the line, draw no more.
pub fn finish() {
    if STATE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .is_some()
    {
        draw(CLEAR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(scenario: usize, step_label: &str, step: usize, of_steps: usize) -> Position {
        Position {
            scenario,
            scenarios: 4,
            name: "rr".into(),
            step_label: step_label.into(),
            step,
            of_steps,
        }
    }

    #[test]
    fn draws_scenario_step_and_eta_in_place() {
        // Scenario 2 of 4, step 3 of 4: 1.5 of 4 done after 30 s, so 50 s left.
        let line = render(&at(1, "virtio-mmio", 2, 4), Duration::from_secs(30));
        assert_eq!(
            line,
            "\rbench [2/4] rr: virtio-mmio (3/4), 0:30 elapsed, ~0:50 left\x1b[K"
        );
    }

    #[test]
    fn no_eta_before_anything_is_done_and_no_step_without_steps() {
        let line = render(&at(0, "", 0, 1), Duration::from_secs(2));
        assert_eq!(line, "\rbench [1/4] rr, 0:02 elapsed\x1b[K");
    }

    #[test]
    fn a_long_line_is_cut_to_the_width() {
        let long = "x".repeat(200);
        let line = render(&at(1, &long, 0, 2), Duration::from_secs(1));
        assert_eq!(line.chars().count(), WIDTH + "\r\x1b[K".len());
    }

    #[test]
    fn done_counts_scenarios_alike() {
        assert_eq!(at(2, "", 0, 3).done(), 0.5);
        assert_eq!(at(3, "", 3, 3).done(), 1.0);
    }
}
