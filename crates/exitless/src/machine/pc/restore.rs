//! `exitless run --restore DIR`: the machine a snapshot was taken of, built again from its
//! configuration, its state and memory restored, and run on from where it was.

use std::path::PathBuf;
use std::time::Duration;

use crate::machine::config::{Console, Overflow};
use crate::machine::pc::{RunError, RunOutcome, serve_and_run};
use crate::machine::snapshot::Restorable;
use crate::machine::{Machine, MachineError, MachineView};

/// What to restore, and what of the run the command line decides: where the console goes
/// (a host's choice, not the machine's), the timeout, and whether it starts paused.
#[derive(Clone, Debug)]
pub struct RestoreConfig {
    /// The snapshot's directory.
    pub dir: PathBuf,
    /// Where the serial console goes.
    pub console: Console,
    /// What the console does when its reader is behind.
    pub console_overflow: Overflow,
    /// Give up on a guest that has not ended after this long.
    pub timeout: Option<Duration>,
    /// Start with every vCPU parked, for `vm.resume`.
    pub paused: bool,
}

impl RestoreConfig {
    /// Restore the snapshot and run it until the guest ends the run, with `serve` given the
    /// machine's view before any vCPU runs (as [`super::RunConfig::run_with`]). Every check
    /// a snapshot can fail is made before anything is built.
    pub fn run_with<G>(
        &self,
        serve: impl FnOnce(MachineView) -> Result<G, MachineError>,
    ) -> Result<RunOutcome, RunError> {
        let Restorable {
            description,
            memory,
        } = Restorable::open(&self.dir)?;
        let mut cfg = description.config.clone();
        (cfg.console, cfg.console_overflow) = (self.console.clone(), self.console_overflow);
        let machine = Machine::restore(&cfg, None, memory)?;
        serve_and_run(&machine, self.paused, self.timeout, serve, |m, timeout| {
            m.run_restored(&description, timeout)
        })
    }
}
