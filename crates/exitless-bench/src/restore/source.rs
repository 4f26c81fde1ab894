//! The machine a snapshot is taken of: the probe booted with every vector live and traffic
//! running, paused in the middle of the traffic, saved into a directory, then stopped.

use std::path::Path;
use std::time::{Duration, Instant};

use exitless::machine::probe::{ProbeConfig, ProbeLoader, loader};
use exitless::machine::{Machine, MachineError, ProbeError};
use exitless::vm::run_control::StopReason;

use super::board::RestoreBoard;

/// Longest the vCPUs may take to park for the snapshot.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// What taking the snapshot cost.
#[derive(Clone, Copy, Debug)]
pub(super) struct Taken {
    /// From the pause request to every vCPU parked.
    pub pause: Duration,
    /// `Machine::snapshot`: every device paused, states, memory, description.
    pub save: Duration,
}

/// Boot `cfg`, pause once op `within` (traffic) has begun, save the machine into `dir` and
/// stop it.
pub(super) fn snapshot(cfg: &ProbeConfig, within: usize, dir: &Path) -> Result<Taken, ProbeError> {
    loader::check_ram(cfg.ram_size).map_err(MachineError::from)?;
    let mut board = RestoreBoard::default();
    let machine = Machine::new(&cfg.machine(), Some(&mut board))?;
    let control = machine.view().control;
    std::thread::scope(|s| {
        let run = s.spawn(|| machine.run(&ProbeLoader { ops: &cfg.ops }, cfg.timeout));
        let deadline = Instant::now() + cfg.timeout;
        while !board.began(within) && !run.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        let taken = take(&machine, within, &board, dir);
        control.stop(StopReason::Requested);
        let ran = run.join().expect("the run thread does not panic");
        let taken = taken?;
        ran?;
        Ok(taken)
    })
}

/// Pause the running machine and save it into `dir`.
fn take(
    machine: &Machine,
    within: usize,
    board: &RestoreBoard,
    dir: &Path,
) -> Result<Taken, ProbeError> {
    let failed =
        |why: String| ProbeError::GuestFailed(StopReason::VcpuFailed(why), machine.console());
    if !board.began(within) {
        return Err(failed(format!(
            "the probe never reached op {within}, where the snapshot is taken"
        )));
    }
    let start = Instant::now();
    let control = machine.view().control;
    control
        .pause_vcpus(PAUSE_TIMEOUT)
        .map_err(|e| failed(format!("cannot pause for the snapshot: {e}")))?;
    let paused = Instant::now();
    machine.snapshot(dir).map_err(MachineError::from)?;
    Ok(Taken {
        pause: paused - start,
        save: paused.elapsed(),
    })
}
