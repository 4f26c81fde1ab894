//! `exitless run --migrate-from ADDRESS`: a machine received from another exitless while it
//! ran there (`machine::migration`), run on from where the source left it.

use std::time::Duration;

use crate::logging::stderr_line;
use crate::machine::config::{Console, Overflow};
use crate::machine::migration::{Incoming, Listener};
use crate::machine::pc::{RunError, RunOutcome, serve_and_run};
use crate::machine::{MachineError, MachineView};

/// Where to wait for the machine, and what of the run the command line decides: where the
/// console goes (a host's choice, not the machine's) and the timeout.
pub struct IncomingConfig {
    /// The bound socket the source connects to.
    pub listener: Listener,
    /// Where the serial console goes.
    pub console: Console,
    /// What the console does when its reader is behind.
    pub console_overflow: Overflow,
    /// Give up on a guest that has not ended after this long.
    pub timeout: Option<Duration>,
}

impl IncomingConfig {
    /// Receive the machine, and once the source hands it over run it until the guest ends
    /// the run, with `serve` given the machine's view before any vCPU runs. A stream that is
    /// refused ends here, nothing run.
    pub fn run_with<G>(
        &self,
        serve: impl FnOnce(MachineView) -> Result<G, MachineError>,
    ) -> Result<RunOutcome, RunError> {
        let mut incoming = Incoming::accept(&self.listener, |cfg| {
            (cfg.console, cfg.console_overflow) = (self.console.clone(), self.console_overflow);
        })?;
        incoming.wait_for_go()?;
        let Incoming {
            machine,
            vcpus,
            paused,
            arrival,
            ..
        } = incoming;
        stderr_line(format_args!(
            "exitless: the VM came in ({arrival}); it runs here"
        ));
        // Paused as the source's user left it.
        serve_and_run(&machine, paused, self.timeout, serve, |m, timeout| {
            m.run_vcpus(vcpus, timeout)
        })
    }
}
