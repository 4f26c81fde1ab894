//! Pausing a VM from outside (the control socket's `vm.pause`): every vCPU leaves the guest at
//! an instruction boundary and parks on its thread until `vm.resume`, with memory and device
//! state kept, as Cloud Hypervisor's and QEMU's `stop` do. A paused machine is one a snapshot
//! can be taken of: no vCPU touches its registers or guest memory.
//!
//! The mechanics are S3's ([`crate::vm::sleep`]): a flag read before every guest entry, the VMM
//! thread kicking the vCPUs out of `KVM_RUN` until each has parked, the exit a vCPU was in
//! completed first (`immediate_exit`). Only who asks, and what happens at the end, differ: a
//! pause ends where it began, not at a waking vector.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

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
}

struct State {
    /// Paused, or being paused.
    requested: bool,
    /// vCPUs parked, out of `vcpus`.
    parked: u8,
    vcpus: u8,
    /// Counts the resumes, so a parked vCPU knows its pause ended.
    resumes: u64,
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

    /// Park the calling vCPU until the machine resumes or `stopping` says the run ends.
    pub fn park(&self, stopping: impl Fn() -> bool) {
        let mut state = self.lock();
        if !state.requested {
            return;
        }
        let resumes = state.resumes;
        state.parked += 1;
        self.changed.notify_all();
        while state.resumes == resumes && !stopping() {
            state = self
                .changed
                .wait_timeout(state, STOP_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.parked -= 1;
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
    use std::sync::Arc;

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
                std::thread::spawn(move || pause.park(|| false))
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
        pause.park(|| true);
        assert!(!pause.wait_parked(Duration::from_secs(60), || true));
    }
}
