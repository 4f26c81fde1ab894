//! Pausing a VM from outside (the control socket's `vm.pause`): every vCPU leaves the guest at
//! an instruction boundary and parks on its thread until `vm.resume`, with memory and device
//! state kept, as Cloud Hypervisor's and QEMU's `stop` do. A paused machine is one a snapshot
//! can be taken of: no vCPU touches its registers or guest memory.
//!
//! The mechanics are S3's ([`crate::vm::sleep`]): a flag read before every guest entry, the VMM
//! thread kicking the vCPUs out of `KVM_RUN` until each has parked, the exit a vCPU was in
//! completed first (`immediate_exit`). Only who asks, and what happens at the end, differ: a
//! pause ends where it began, not at a waking vector.
//!
//! A snapshot reads each vCPU's state while paused ([`Pause::save_vcpus`]): KVM's vCPU ioctls
//! belong on the vCPU's own thread (api.rst §1: "vcpu ioctls should be issued from the same
//! thread that was used to create the vcpu"), so each parked thread is asked to take its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::vm::VmError;
use crate::vm::state::VcpuState;

/// Why a pause or a resume was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PauseError {
    /// `vm.pause` on a paused machine.
    #[error("the VM is already paused")]
    AlreadyPaused,
    /// `vm.resume` on a running machine.
    #[error("the VM is not paused")]
    NotPaused,
    /// The guest is in S3, or entering it: its vCPUs are stopped already, and a wake event
    /// restarts them at the waking vector, which a pause must not race.
    #[error("the guest is asleep (ACPI S3); pause it once it wakes")]
    Asleep,
    /// Some vCPU did not park in time (stuck in a device): the pause was taken back.
    #[error("not every vCPU stopped within {0:?}; the VM runs on")]
    TimedOut(Duration),
    /// The run is ending.
    #[error("the VM is shutting down")]
    Stopping,
    /// A vCPU's state could not be read.
    #[error("vCPU {vcpu}'s state could not be read: {why}")]
    Capture {
        /// Which vCPU.
        vcpu: u8,
        /// KVM's reason.
        why: String,
    },
}

struct State {
    /// Paused, or being paused.
    requested: bool,
    /// vCPUs parked, out of `vcpus`.
    parked: u8,
    vcpus: u8,
    /// Counts the resumes, so a parked vCPU knows its pause ended.
    resumes: u64,
    /// Counts the requests for the vCPUs' states, so a parked vCPU knows to take its own.
    captures: u64,
    /// Each vCPU's answer to the latest request, by index.
    captured: Vec<Option<Result<VcpuState, String>>>,
}

/// The pause state shared by the control socket's thread (which asks), the vCPU threads
/// (which park) and the VMM thread (which kicks them out of the guest).
pub struct Pause {
    /// Whether a vCPU must park before it enters the guest again: read before every entry.
    parking: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
}

impl Default for Pause {
    fn default() -> Self {
        Pause {
            parking: AtomicBool::new(false),
            state: Mutex::new(State {
                requested: false,
                parked: 0,
                vcpus: 1,
                resumes: 0,
                captures: 0,
                captured: Vec::new(),
            }),
            changed: Condvar::new(),
        }
    }
}

/// How often a parked vCPU, or a waiting requester, looks whether the run is stopping (a stop
/// also notifies them; this bounds a missed notification).
const STOP_POLL: Duration = Duration::from_millis(50);

impl Pause {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many vCPUs must park before the machine is paused.
    pub fn set_vcpus(&self, vcpus: u8) {
        self.lock().vcpus = vcpus.max(1);
    }

    /// Ask every vCPU to park. Refused while paused or being paused.
    pub fn request(&self) -> Result<(), PauseError> {
        let mut state = self.lock();
        if state.requested {
            return Err(PauseError::AlreadyPaused);
        }
        state.requested = true;
        self.parking.store(true, Ordering::Release);
        Ok(())
    }

    /// Wait until every vCPU has parked (true), or `timeout` passes or `stopping` says the run
    /// ends (false).
    pub fn wait_parked(&self, timeout: Duration, stopping: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while state.parked < state.vcpus {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || stopping() {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, left.min(STOP_POLL))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Let every parked vCPU go on. Refused unless paused or being paused (a pause that did
    /// not complete is taken back this way).
    pub fn resume(&self) -> Result<(), PauseError> {
        let mut state = self.lock();
        if !state.requested {
            return Err(PauseError::NotPaused);
        }
        state.requested = false;
        state.resumes += 1;
        self.parking.store(false, Ordering::Release);
        self.changed.notify_all();
        Ok(())
    }

    /// Whether this vCPU must park ([`Pause::park`]) before it enters the guest again.
    pub fn must_park(&self) -> bool {
        self.parking.load(Ordering::Acquire)
    }

    /// Whether a pause is asked for and some vCPU still runs: the VMM thread kicks them.
    pub fn entering(&self) -> bool {
        let state = self.lock();
        state.requested && state.parked < state.vcpus
    }

    /// Whether every vCPU is parked.
    pub fn paused(&self) -> bool {
        let state = self.lock();
        state.requested && state.parked >= state.vcpus
    }

    /// Park the calling vCPU, number `index`, until the machine resumes or `stopping` says the
    /// run ends; meanwhile answer each [`Pause::save_vcpus`] with `capture`'s state, taken on
    /// this thread.
    pub fn park(
        &self,
        index: u8,
        stopping: impl Fn() -> bool,
        capture: impl Fn() -> Result<VcpuState, VmError>,
    ) {
        let mut state = self.lock();
        if !state.requested {
            return;
        }
        let resumes = state.resumes;
        let mut answered = state.captures;
        state.parked += 1;
        self.changed.notify_all();
        while state.resumes == resumes && !stopping() {
            if state.captures != answered {
                answered = state.captures;
                // The ioctls run unlocked: the other vCPUs take theirs meanwhile.
                drop(state);
                let taken = capture().map_err(|e| e.to_string());
                state = self.lock();
                let current = state.captures == answered;
                if let Some(slot) = state.captured.get_mut(usize::from(index))
                    && current
                {
                    *slot = Some(taken);
                    self.changed.notify_all();
                }
                continue;
            }
            state = self
                .changed
                .wait_timeout(state, STOP_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.parked -= 1;
    }

    /// Every vCPU's state, in index order, each taken on its own thread: the machine must be
    /// paused. Refused if a vCPU does not answer within `timeout` (the machine stays paused).
    pub fn save_vcpus(&self, timeout: Duration) -> Result<Vec<VcpuState>, PauseError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        if !state.requested || state.parked < state.vcpus {
            return Err(PauseError::NotPaused);
        }
        state.captures += 1;
        state.captured = (0..state.vcpus).map(|_| None).collect();
        self.changed.notify_all();
        while state.captured.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PauseError::TimedOut(timeout));
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        std::mem::take(&mut state.captured)
            .into_iter()
            .zip(0..)
            .map(|(answer, vcpu)| match answer {
                Some(Ok(s)) => Ok(s),
                Some(Err(why)) => Err(PauseError::Capture { vcpu, why }),
                None => unreachable!("every vCPU answered"),
            })
            .collect()
    }

    /// Wake every parked vCPU and waiting requester so they see the run stopping.
    pub fn notify_stop(&self) {
        let _state = self.lock();
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn pause_twice_and_resume_while_running_are_refused() {
        let pause = Pause::default();
        assert_eq!(pause.resume(), Err(PauseError::NotPaused));
        assert_eq!(pause.request(), Ok(()));
        assert_eq!(pause.request(), Err(PauseError::AlreadyPaused));
        assert_eq!(pause.resume(), Ok(()));
        assert_eq!(pause.resume(), Err(PauseError::NotPaused));
        assert!(!pause.must_park());
    }

    #[test]
    fn paused_once_every_vcpu_parks_and_a_resume_releases_them_all() {
        let pause = Arc::new(Pause::default());
        pause.set_vcpus(2);
        pause.request().unwrap();
        assert!(pause.must_park() && pause.entering() && !pause.paused());
        assert!(!pause.wait_parked(Duration::ZERO, || false), "none parked");
        let parked: Vec<_> = (0..2)
            .map(|_| {
                let pause = pause.clone();
                std::thread::spawn(move || pause.park(0, || false, || unreachable!()))
            })
            .collect();
        assert!(pause.wait_parked(Duration::from_secs(60), || false));
        assert!(pause.paused() && !pause.entering());
        pause.resume().unwrap();
        for p in parked {
            p.join().unwrap();
        }
        assert!(!pause.paused() && !pause.must_park());
    }

    #[test]
    fn a_stop_unparks_and_ends_the_wait() {
        let pause = Pause::default();
        pause.set_vcpus(2);
        pause.request().unwrap();
        pause.park(0, || true, || unreachable!());
        assert!(!pause.wait_parked(Duration::from_secs(60), || true));
    }

    #[test]
    fn a_vcpu_that_cannot_read_its_state_or_does_not_answer_fails_the_capture() {
        let pause = Arc::new(Pause::default());
        assert_eq!(
            pause.save_vcpus(Duration::ZERO).unwrap_err(),
            PauseError::NotPaused
        );
        pause.request().unwrap();
        // The vCPU's first capture hangs until released, its second fails.
        let (release, hang) = std::sync::mpsc::channel::<()>();
        let hang = Mutex::new(Some(hang));
        let vcpu = {
            let pause = pause.clone();
            std::thread::spawn(move || {
                pause.park(
                    0,
                    || false,
                    || {
                        if let Some(hang) = hang.lock().unwrap().take() {
                            let _ = hang.recv();
                        }
                        Err(VmError::MsrUnreadable(0x10))
                    },
                )
            })
        };
        assert!(pause.wait_parked(Duration::from_secs(60), || false));
        assert_eq!(
            pause.save_vcpus(Duration::from_millis(20)).unwrap_err(),
            PauseError::TimedOut(Duration::from_millis(20))
        );
        release.send(()).unwrap();
        assert_eq!(
            pause
                .save_vcpus(Duration::from_secs(60))
                .unwrap_err()
                .to_string(),
            "vCPU 0's state could not be read: KVM did not read MSR 0x10, which it read when the vCPU was created"
        );
        pause.resume().unwrap();
        vcpu.join().unwrap();
    }
}
