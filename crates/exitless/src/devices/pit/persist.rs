//! The PIT in a snapshot: each counter's programming, count, latches and gate, with how long it
//! has counted (not when it started: the clock is the process's own, and a restore is another
//! process), and the speaker's data bit. Channel 0's edges are raised from the restore on.

use serde::{Deserialize, Serialize};

use super::Pit;
use super::counter::{Counter, FULL_COUNT, RW_LSB};
use crate::persist::{Persist, StateError, from_state, to_state};

const ID: &str = "pit";

#[derive(Serialize, Deserialize)]
struct Saved {
    /// The three counters, `started_at` replaced by the ticks they have counted.
    counters: Vec<Counter>,
    speaker_data: bool,
}

fn check(counters: &[Counter]) -> Result<(), StateError> {
    if counters.len() != 3 {
        return Err(StateError::new(
            format!("{ID}.counters"),
            format!("{} counters, not 3", counters.len()),
        ));
    }
    for (i, c) in counters.iter().enumerate() {
        let bad = |field: &str, why: String| {
            Err(StateError::new(format!("{ID}.counters[{i}].{field}"), why))
        };
        if c.mode > 5 {
            return bad("mode", format!("{} is past mode 5", c.mode));
        }
        if !(RW_LSB..=3).contains(&c.access) {
            return bad("access", format!("{} is no RW mode", c.access));
        }
        if c.count.is_some_and(|n| n == 0 || n > FULL_COUNT) {
            return bad("count", format!("{:?} is outside 1..=65536", c.count));
        }
    }
    Ok(())
}

/// The ticks counter `c` has counted, reduced to what its count and OUT depend on (at most
/// two periods), so a counter restored in a new process, whose clock starts again, starts
/// within it: a periodic mode's phase in its period; a one-shot past its terminal count, that
/// and the count's place in its 16-bit wrap; none for a counter with no count.
fn counted(c: &Counter, ticks: u64) -> u64 {
    let Some(count) = c.count.map(u64::from) else {
        return 0;
    };
    let full = u64::from(FULL_COUNT);
    match c.mode {
        2 | 3 => ticks % count,
        _ if ticks > count => count + 1 + (ticks - count - 1) % full,
        _ => ticks,
    }
}

impl Persist for Pit {
    /// Hold the timer thread, so no IRQ 0 edge falls between the irqchip's state and this.
    fn pause(&self) -> Result<(), StateError> {
        self.shared.chip.pause();
        Ok(())
    }

    fn resume(&self) {
        let now = self.shared.now();
        self.shared.chip.resume(|chip| chip.irq_checked = now);
    }

    fn save(&self) -> Result<serde_json::Value, StateError> {
        let now = self.shared.now();
        let chip = self.shared.lock();
        let counters = chip
            .counters
            .iter()
            .map(|c| Counter {
                started_at: counted(c, now.saturating_sub(c.started_at)),
                ..c.clone()
            })
            .collect();
        to_state(
            ID,
            &Saved {
                counters,
                speaker_data: chip.speaker_data,
            },
        )
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let saved: Saved = from_state(ID, state)?;
        check(&saved.counters)?;
        let now = self.shared.now();
        let mut chip = self.shared.lock();
        for (into, from) in chip.counters.iter_mut().zip(saved.counters) {
            *into = Counter {
                started_at: now.saturating_sub(counted(&from, from.started_at)),
                ..from
            };
        }
        chip.speaker_data = saved.speaker_data;
        chip.irq_checked = now;
        drop(chip);
        self.shared.chip.wake();
        Ok(())
    }
}
