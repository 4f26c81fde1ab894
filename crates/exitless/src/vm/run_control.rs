//! Why and when a run ends, shared by the vCPU threads, the devices and the VMM thread; and
//! the signals that end a run from outside (Ctrl-C, `kill`, a closed terminal, Ctrl-\).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::vm::pause::{Pause, PauseError};
use crate::vm::sleep::{Sleep, WakeEntry};

/// Why the guest stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The probe wrote this status to its done port.
    GuestDone(u64),
    /// The guest wrote this value to isa-debug-exit (QEMU's test exit).
    DebugExit(u64),
    /// The guest asked for an orderly power-off (ACPI S5).
    PowerOff,
    /// The guest reset the machine (keyboard controller or reset control register).
    Reset,
    /// The guest's kernel panicked and said so on the pvpanic port.
    GuestPanicked,
    /// The guest triple-faulted or otherwise shut down.
    Shutdown,
    /// A vCPU failed; the message says how.
    VcpuFailed(String),
    /// The process received this signal ([`stop_on_signals`]).
    Signal(libc::c_int),
    /// The VMM's user asked for it (the control socket's `vm.shutdown`).
    Requested,
    /// The machine went to another exitless (`vm.send-migration`).
    Migrated,
}

/// A one-shot stop signal: the first reason wins.
#[derive(Default)]
pub struct RunControl {
    stopping: AtomicBool,
    reason: Mutex<Option<StopReason>>,
    changed: Condvar,
    sleep: Sleep,
    pause: Pause,
}

/// What [`RunControl::wait_or_sleep`] ended with.
#[derive(Debug, PartialEq, Eq)]
pub enum RunEvent {
    /// The run stopped, for this reason.
    Stopped(StopReason),
    /// The guest asked for S3, or the VMM's user for a pause: the vCPUs are to be kicked out
    /// of the guest to park.
    Parking,
    /// Neither, within the time allowed.
    TimedOut,
    /// SIGQUIT: the VMM's user asks where the vCPUs are. The run says so, then stops for
    /// the signal ([`StopReason::Signal`]).
    Quit,
}

impl RunControl {
    /// Ask every vCPU to stop, for `reason` (ignored if a reason is already set).
    pub fn stop(&self, reason: StopReason) {
        let mut r = self.reason.lock().unwrap();
        if r.is_none() {
            *r = Some(reason);
        }
        self.stopping.store(true, Ordering::Release);
        self.changed.notify_all();
        drop(r);
        self.sleep.notify_stop();
        self.pause.notify_stop();
    }

    /// How many vCPUs the machine has: how many park before it sleeps or is paused.
    pub fn set_vcpus(&self, vcpus: u8) {
        self.sleep.set_vcpus(vcpus);
        self.pause.set_vcpus(vcpus);
    }

    /// The machine's pause state.
    pub fn pause(&self) -> &Pause {
        &self.pause
    }

    /// Whether some vCPU must still be kicked out of the guest to park (S3 or a pause). A
    /// paused machine whose guest had asked for S3 has nothing to kick: its vCPUs sleep after
    /// the resume.
    pub fn parking(&self) -> bool {
        self.pause.entering() || (self.sleep.entering() && !self.pause.paused())
    }

    /// Pause every vCPU: returns once each has parked at an instruction boundary. Refused while
    /// paused, in S3 or stopping; a vCPU that does not park within `timeout` takes the pause
    /// back.
    pub fn pause_vcpus(&self, timeout: Duration) -> Result<(), PauseError> {
        if self.sleep.entering() || self.sleep.asleep() {
            return Err(PauseError::Asleep);
        }
        if self.is_stopping() {
            return Err(PauseError::Stopping);
        }
        self.pause.request()?;
        self.wake_waiter();
        if self.pause.wait_parked(timeout, || self.is_stopping()) {
            return Ok(());
        }
        // Taken back, so the vCPUs that did park go on.
        let _ = self.pause.resume();
        Err(if self.is_stopping() {
            PauseError::Stopping
        } else {
            PauseError::TimedOut(timeout)
        })
    }

    /// Wake the VMM thread's [`RunControl::wait_or_sleep`], to kick the vCPUs.
    fn wake_waiter(&self) {
        let _r = self.reason.lock().unwrap();
        self.changed.notify_all();
    }

    /// The machine's S3 state.
    pub fn sleep(&self) -> &Sleep {
        &self.sleep
    }

    /// Ask for S3 ([`Sleep::suspend`]) and wake the VMM thread's [`RunControl::wait_or_sleep`]
    /// to kick the vCPUs.
    pub fn suspend(&self, entry: WakeEntry) {
        self.sleep.suspend(entry);
        self.wake_waiter();
    }

    /// Whether a stop was asked for; checked by vCPU threads before each entry.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Wait up to `timeout` for a stop; its reason, or `None` on timeout. A stop signal
    /// ([`stop_on_signals`]) that arrives meanwhile stops the run.
    pub fn wait(&self, timeout: Duration) -> Option<StopReason> {
        match self.wait_for(timeout, false) {
            RunEvent::Stopped(reason) => Some(reason),
            _ => None,
        }
    }

    /// [`RunControl::wait`], which also returns while the vCPUs are to park (S3, a pause).
    pub fn wait_or_sleep(&self, timeout: Duration) -> RunEvent {
        self.wait_for(timeout, true)
    }

    fn wait_for(&self, timeout: Duration, or_sleep: bool) -> RunEvent {
        let sleeping = || or_sleep && self.parking();
        let deadline = Instant::now().checked_add(timeout);
        WAITING.store(true, Ordering::SeqCst);
        let reason = loop {
            let signal = STOP_SIGNAL.load(Ordering::SeqCst);
            if signal == libc::SIGQUIT && or_sleep && !self.is_stopping() {
                break RunEvent::Quit;
            }
            if signal != 0 {
                self.stop(StopReason::Signal(signal));
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let slice = left.map_or(SIGNAL_POLL, |left| left.min(SIGNAL_POLL));
            let r = self.reason.lock().unwrap();
            let (r, _) = self
                .changed
                .wait_timeout_while(r, slice, |r| r.is_none() && !sleeping())
                .unwrap();
            if let Some(reason) = r.clone() {
                break RunEvent::Stopped(reason);
            }
            if sleeping() {
                break RunEvent::Parking;
            }
            if left.is_some_and(|left| left <= slice) {
                break RunEvent::TimedOut;
            }
        };
        WAITING.store(false, Ordering::SeqCst);
        reason
    }
}

/// The signals that stop a run: Ctrl-C, `kill`'s default, the terminal closing, and Ctrl-\
/// (SIGQUIT), after which the run first says where each vCPU was ([`RunEvent::Quit`]).
pub const STOP_SIGNALS: [libc::c_int; 4] =
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The first stop signal received (0: none).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Whether a [`RunControl::wait`] is under way to stop on it.
static WAITING: AtomicBool = AtomicBool::new(false);
/// How often a waiting run looks at [`STOP_SIGNAL`]: a signal handler may not take the lock a
/// condition variable needs (signal-safety(7)), so the handler cannot wake the waiter itself.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Make SIGINT, SIGTERM, SIGHUP and SIGQUIT stop a run ([`StopReason::Signal`]), so that it ends as
/// any other run does (devices stopped, files closed), then [`end_by_signal`]. Installed
/// whatever the process inherited: a job a script starts in the background inherits SIGINT
/// ignored (POSIX sh, "Asynchronous Lists"), and would otherwise run on deaf to Ctrl-C and
/// `kill -INT`. A signal with no run waiting, or a second one, ends the process at once, by
/// the signal's default action.
pub fn stop_on_signals() -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid start (no flags, empty mask); the handler only
    // touches atomics and calls raise(3), both async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SA_RESETHAND: once caught, the signal's default action is back, for the second
        // signal and for end_by_signal. SA_RESTART: other threads' blocking calls go on.
        action.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in STOP_SIGNALS {
            if libc::sigaction(signal, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
            libc::sigaddset(&mut set, signal);
        }
        // A blocked mask is inherited too.
        match libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) {
            0 => Ok(()),
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

/// Ignore SIGXFSZ, so that a write past the file size limit (`ulimit -f`, RLIMIT_FSIZE) fails
/// with EFBIG, which the disk reports to the guest or the snapshot to its client, instead of
/// killing the VM (the signal's default action).
pub fn write_past_file_size_limit_fails() -> io::Result<()> {
    // SAFETY: a zeroed sigaction with SIG_IGN installs no handler.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_IGN;
        if libc::sigaction(libc::SIGXFSZ, &action, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" fn on_stop_signal(signal: libc::c_int) {
    let first = STOP_SIGNAL
        .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok();
    if !first || !WAITING.load(Ordering::SeqCst) {
        // SAFETY: raise is async-signal-safe; SA_RESETHAND restored the default action, which
        // ends the process as soon as the handler returns (the signal is blocked until then).
        unsafe { libc::raise(signal) };
    }
}

/// End the process by `signal`'s default action, after a run it stopped has ended: a parent
/// sees what it would have without the handler (wait(2)'s WIFSIGNALED; a shell's 128 + n),
/// and a shell script stops on Ctrl-C as it does for any other program.
///
/// The handler's SA_RESETHAND has put the default action back, so no call beyond raise(3)
/// is needed (the main thread's seccomp filter allows no sigaction).
pub fn end_by_signal(signal: libc::c_int) -> ! {
    // SIGQUIT's default action dumps core; the run has given the report SIGQUIT asked for.
    if signal == libc::SIGQUIT {
        std::process::exit(128 + signal)
    }
    // SAFETY: raise only sends `signal` to this thread, whose default action ends the process.
    unsafe { libc::raise(signal) };
    // Not reached unless the signal is blocked; end as a shell would report it.
    std::process::exit(128 + signal)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: WakeEntry = WakeEntry::Real { cs: 0, ip: 0 };

    #[test]
    fn a_pause_no_vcpu_answers_is_taken_back() {
        let control = RunControl::default();
        let e = control.pause_vcpus(Duration::from_millis(10));
        assert_eq!(e, Err(PauseError::TimedOut(Duration::from_millis(10))));
        assert!(
            !control.pause().must_park() && !control.parking(),
            "taken back"
        );
    }

    #[test]
    fn a_pause_is_refused_while_the_guest_sleeps_or_the_run_stops() {
        let control = RunControl::default();
        control.suspend(ENTRY);
        assert_eq!(control.pause_vcpus(Duration::ZERO), Err(PauseError::Asleep));
        let control = RunControl::default();
        control.stop(StopReason::Requested);
        assert_eq!(
            control.pause_vcpus(Duration::ZERO),
            Err(PauseError::Stopping)
        );
    }

    #[test]
    fn a_guest_that_asked_for_s3_as_it_was_paused_sleeps_after_the_resume() {
        let control = std::sync::Arc::new(RunControl::default());
        let vcpu = {
            let control = control.clone();
            std::thread::spawn(move || {
                // The vCPU loop's order: a pause first, then S3.
                while !control.pause().must_park() {
                    std::thread::yield_now();
                }
                control.suspend(ENTRY);
                control
                    .pause()
                    .park(0, || false, || unreachable!("no state is asked for"));
                control.sleep().park(|| control.is_stopping())
            })
        };
        control.pause_vcpus(Duration::from_secs(60)).unwrap();
        assert!(control.sleep().entering(), "S3 asked for");
        assert!(!control.parking(), "nothing to kick while paused");
        control.pause().resume().unwrap();
        while !control.sleep().asleep() {
            std::thread::yield_now();
        }
        assert!(control.sleep().wake());
        assert_eq!(vcpu.join().unwrap(), Some(ENTRY));
    }
}
