//! Why and when a run ends, shared by the vCPU threads, the devices and the VMM thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

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
    /// The guest triple-faulted or otherwise shut down.
    Shutdown,
    /// A vCPU failed; the message says how.
    VcpuFailed(String),
}

/// A one-shot stop signal: the first reason wins.
#[derive(Default)]
pub struct RunControl {
    stopping: AtomicBool,
    reason: Mutex<Option<StopReason>>,
    changed: Condvar,
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
    }

    /// Whether a stop was asked for; checked by vCPU threads before each entry.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Wait up to `timeout` for a stop; its reason, or `None` on timeout.
    pub fn wait(&self, timeout: Duration) -> Option<StopReason> {
        let r = self.reason.lock().unwrap();
        let (r, _) = self
            .changed
            .wait_timeout_while(r, timeout, |r| r.is_none())
            .unwrap();
        r.clone()
    }
}
