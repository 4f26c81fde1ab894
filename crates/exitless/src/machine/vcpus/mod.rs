//! vCPU lifecycle: create the vCPUs, give the boot vCPU its entry state, run one thread each,
//! and stop them: the run ends, every thread is kicked out of `KVM_RUN` and joined.

use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::signal::Killable;

use crate::bus::IoBuses;
use crate::exits::ExitCounters;
use crate::machine::loader::{EntryState, Loader};
use crate::seccomp::{self, ThreadKind};
use crate::vm::cpuid::CpuTemplate;
use crate::vm::run_control::{RunControl, RunEvent, StopReason};
use crate::vm::state::VcpuState;
use crate::vm::vcpu::{self, Vcpu};
use crate::vm::{Vm, VmError};

/// The vCPUs of a machine, created but not yet running. vCPU 0 boots; the others start where
/// the loader says (the probe parks them in `hlt`) or wait for INIT/SIPI.
pub struct Vcpus(Vec<Vcpu>);

/// How a run ended.
#[derive(Debug)]
pub enum RunEnd {
    /// Something stopped the run (the guest, a vCPU).
    Stopped(StopReason),
    /// Nothing did within the time allowed.
    TimedOut,
}

impl Vcpus {
    /// Create `count` vCPUs (at least one) on `vm`, with the CPUID of `cpu`.
    pub fn create(vm: &Vm, count: u8, cpu: &CpuTemplate) -> Result<Self, VmError> {
        vcpu::install_kick_handler()?;
        let cpuid = Vcpu::machine_cpuid(vm, cpu)?;
        (0..count.max(1))
            .map(|i| Vcpu::new(vm, i, &cpuid))
            .collect::<Result<Vec<_>, _>>()
            .map(Vcpus)
    }

    /// How many there are.
    pub fn count(&self) -> u8 {
        u8::try_from(self.0.len()).expect("created from a u8 count")
    }

    /// The boot vCPU's TSC frequency in kHz, if KVM reports it.
    pub fn tsc_khz(&self) -> Option<u32> {
        self.0[0].tsc_khz()
    }

    /// Give the boot vCPU `boot`, the state `loader` loaded the guest for, and each other
    /// vCPU the state `loader` gives it, if any (without one it waits for INIT/SIPI).
    pub fn set_entries(&self, boot: &EntryState, loader: &dyn Loader) -> Result<(), VmError> {
        for (i, vcpu) in self.0.iter().enumerate() {
            let index = u8::try_from(i).expect("created from a u8 count");
            let entry = match index {
                0 => Some(*boot),
                _ => loader.secondary_entry(index),
            };
            if let Some(EntryState { mode, regs }) = entry {
                vcpu.set_entry(&regs, |current| mode.sregs(current))?;
            }
        }
        Ok(())
    }

    /// Give each vCPU, in index order, the state a snapshot saved of it (`Pause::save_vcpus`),
    /// in place of [`Vcpus::set_entries`]: a snapshot of another vCPU count is refused before
    /// any vCPU is touched.
    pub fn set_states(&self, states: &[VcpuState]) -> Result<(), VmError> {
        if states.len() != self.0.len() {
            return Err(VmError::StateMismatch(format!(
                "the snapshot has {} vCPUs, the machine {}",
                states.len(),
                self.0.len()
            )));
        }
        for (vcpu, state) in self.0.iter().zip(states) {
            vcpu.restore_state(state)?;
        }
        Ok(())
    }

    /// Run every vCPU on its own thread until `control` stops the run or `timeout` passes,
    /// then stop, kick and join them all. Fails only if a thread could not start (the ones
    /// that did are still stopped and joined).
    /// `memory` is guest RAM, read only for the report on a run that hung.
    pub fn run(
        self,
        io: &Arc<IoBuses>,
        counters: &Arc<ExitCounters>,
        control: &Arc<RunControl>,
        memory: &GuestMemoryMmap,
        timeout: Duration,
    ) -> Result<RunEnd, std::io::Error> {
        control.set_vcpus(self.count());
        let mut threads = Vec::new();
        let mut spawn_error = None;
        for v in self.0 {
            match spawn(v, io.clone(), counters.clone(), control.clone()) {
                Ok(t) => threads.push(t),
                Err(e) => {
                    spawn_error = Some(e);
                    control.stop(StopReason::VcpuFailed(
                        "a vCPU thread could not start".into(),
                    ));
                    break;
                }
            }
        }
        let reason = match wait_and_put_to_sleep(&threads, control, timeout) {
            Ended::Stopped(reason) => Some(reason),
            Ended::TimedOut => {
                report_where(&threads, control, memory, "at the timeout");
                None
            }
            Ended::Quit => {
                report_where(&threads, control, memory, "on SIGQUIT");
                Some(StopReason::Signal(libc::SIGQUIT))
            }
        };
        control.stop(StopReason::VcpuFailed("stopped by the VMM".into()));
        stop_and_join(threads);
        match (spawn_error, reason) {
            (Some(e), _) => Err(e),
            (None, Some(reason)) => Ok(RunEnd::Stopped(reason)),
            (None, None) => Ok(RunEnd::TimedOut),
        }
    }
}

/// How a run's wait ended.
enum Ended {
    Stopped(StopReason),
    TimedOut,
    /// SIGQUIT ([`RunEvent::Quit`]).
    Quit,
}

/// Wait for the run to stop, up to `timeout`; meanwhile, each time the guest asks for S3 or the
/// VMM's user for a pause, kick the vCPUs out of the guest until every one has parked (ACPI 6.5
/// §16.1.3: the machine sleeps; a paused one stays where it was).
fn wait_and_put_to_sleep(
    threads: &[JoinHandle<()>],
    control: &RunControl,
    timeout: Duration,
) -> Ended {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        let left = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        });
        match control.wait_or_sleep(left) {
            RunEvent::Stopped(reason) => return Ended::Stopped(reason),
            RunEvent::TimedOut => return Ended::TimedOut,
            RunEvent::Quit => return Ended::Quit,
            RunEvent::Parking => {
                kick_while(threads, None, || {
                    control.parking() && !control.is_stopping()
                });
            }
        }
    }
}

/// Kick the vCPU threads still going out of `KVM_RUN` while `going_on` holds, until
/// `deadline` if one is given. A kick can land before a thread re-enters the guest, hence
/// the retry.
fn kick_while(threads: &[JoinHandle<()>], deadline: Option<Instant>, going_on: impl Fn() -> bool) {
    while going_on() && deadline.is_none_or(|d| Instant::now() < d) {
        for t in threads.iter().filter(|t| !t.is_finished()) {
            let _ = t.kill(seccomp::kick_signal());
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// How long a timed-out run's vCPUs get to park, and then to give their state, for
/// [`report_where`].
const REPORT_DEADLINE: Duration = Duration::from_secs(2);

/// The run timed out, or SIGQUIT asked (`when` says which): log where each vCPU was, so a
/// guest that hangs (halted with nothing to wake it, or looping at one place) can be told from
/// a host whose KVM never gave a vCPU back (one that a kick does not bring out of `KVM_RUN`).
/// The vCPUs are paused for it, as for a snapshot; the run is ending, so nothing resumes them.
/// Where RIP and RSP are in guest memory, through the guest's page tables, comes with each: a
/// RIP on a page the guest unmapped tells a jump into freed memory from a fault never taken.
fn report_where(
    threads: &[JoinHandle<()>],
    control: &RunControl,
    memory: &GuestMemoryMmap,
    when: &str,
) {
    if control.sleep().asleep() || control.pause().request().is_err() {
        log::warn!("{when} the machine was asleep (S3) or paused");
        return;
    }
    let deadline = Instant::now() + REPORT_DEADLINE;
    kick_while(threads, Some(deadline), || {
        control.pause().entering() && !control.is_stopping()
    });
    if control.pause().entering() {
        log::warn!(
            "{when} a vCPU did not leave KVM_RUN within {REPORT_DEADLINE:?} of being kicked: \
             it is stuck in the host's KVM, not in the guest"
        );
        return;
    }
    match control.pause().save_vcpus(REPORT_DEADLINE) {
        Ok(states) => {
            for (i, state) in states.iter().enumerate() {
                log::warn!(
                    "{when} vCPU {i} was {} {}; {}",
                    mp_state_name(state.mp_state.mp_state),
                    state.summary(),
                    state.in_memory(memory),
                );
            }
        }
        Err(e) => log::warn!("{when} the vCPUs' state could not be read: {e}"),
    }
}

/// KVM's name for a vCPU's run state (api.rst, KVM_GET_MP_STATE).
fn mp_state_name(mp_state: u32) -> &'static str {
    match mp_state {
        kvm_bindings::KVM_MP_STATE_RUNNABLE => "runnable",
        kvm_bindings::KVM_MP_STATE_UNINITIALIZED => "waiting for INIT",
        kvm_bindings::KVM_MP_STATE_INIT_RECEIVED => "waiting for SIPI",
        kvm_bindings::KVM_MP_STATE_HALTED => "halted",
        kvm_bindings::KVM_MP_STATE_SIPI_RECEIVED => "starting (SIPI received)",
        _ => "in an unknown state",
    }
}

fn spawn(
    v: Vcpu,
    io: Arc<IoBuses>,
    counters: Arc<ExitCounters>,
    control: Arc<RunControl>,
) -> Result<JoinHandle<()>, std::io::Error> {
    seccomp::spawn(ThreadKind::Vcpu, "vcpu".into(), move || {
        v.run(&io, &counters, &control)
    })
}

/// Longest the VMM waits for the vCPU threads to stop. A thread still going then is stuck
/// outside the guest (in a device that never returns) where no kick reaches it.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// Kick every vCPU out of `KVM_RUN` until its thread ends, then join them. The run must be stopping already.
/// A thread that does not end within [`STOP_DEADLINE`] is reported and abandoned, so the run
/// (and the process) always ends.
fn stop_and_join(threads: Vec<JoinHandle<()>>) {
    let deadline = Instant::now() + STOP_DEADLINE;
    kick_while(&threads, Some(deadline), || {
        threads.iter().any(|t| !t.is_finished())
    });
    for (i, t) in threads.into_iter().enumerate() {
        if t.is_finished() {
            let _ = t.join();
        } else {
            log::error!(
                "vCPU {i} did not stop within {STOP_DEADLINE:?} (stuck in a device?); abandoned"
            );
        }
    }
}

#[cfg(test)]
mod tests;
