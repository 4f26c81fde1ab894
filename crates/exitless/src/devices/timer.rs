//! A device's timer thread and what it shares with the device's port accesses: the chip's
//! state behind one lock, and a condition variable the thread sleeps on until the chip's next
//! deadline, or until an access, a restore or the device's end wakes it. The RTC and the PIT
//! are built on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::seccomp::{self, ThreadKind};

/// Longest the timer sleeps with no deadline to come: an access wakes it sooner.
pub const IDLE: Duration = Duration::from_secs(3600);

/// A chip's state `S`, shared by its timer thread and its accesses.
pub struct Timed<S> {
    state: Mutex<S>,
    /// Signalled when the next deadline may have moved, and at stop.
    changed: Condvar,
    stop: AtomicBool,
    /// A snapshot is being taken: the timer raises nothing until it is over.
    paused: AtomicBool,
}

impl<S> Timed<S> {
    /// `state`, with the thread to come neither paused nor stopped.
    pub fn new(state: S) -> Self {
        Timed {
            state: Mutex::new(state),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
        }
    }

    /// The state, for an access (a poisoned lock is taken as it is: the state is plain data).
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An access or a restore may have moved the next deadline: the thread looks again.
    pub fn wake(&self) {
        self.changed.notify_all();
    }

    /// Hold the thread until [`Timed::resume`]: it raises nothing meanwhile. Taking the lock
    /// waits out a delivery in progress, so none falls after this returns.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Release);
        drop(self.lock());
    }

    /// Let the thread go on, once `then` has brought the state up to the resume.
    pub fn resume(&self, then: impl FnOnce(&mut S)) {
        self.paused.store(false, Ordering::Release);
        then(&mut self.lock());
        self.wake();
    }

    /// The thread's loop until stopped: `step` (never while paused) raises what is due and
    /// says how long until the next deadline.
    fn run(&self, mut step: impl FnMut(&mut S) -> Duration) {
        let mut state = self.lock();
        while !self.stop.load(Ordering::Acquire) {
            let wait = if self.paused.load(Ordering::Acquire) {
                IDLE
            } else {
                step(&mut state)
            };
            state = self
                .changed
                .wait_timeout(state, wait)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        // Under the lock: the thread is either before its check of `stop` or asleep.
        drop(self.lock());
        self.wake();
    }
}

/// A device's timer thread, stopped and joined on drop.
pub struct TimerThread {
    stop: Box<dyn Fn() + Send + Sync>,
    thread: Option<JoinHandle<()>>,
}

impl TimerThread {
    /// Start the thread `name` of the device whose shared part is `shared`: it runs
    /// `step(shared, state)` on the [`Timed`] state `timed` picks out of it.
    pub fn spawn<T, S>(
        name: &str,
        shared: &Arc<T>,
        timed: fn(&T) -> &Timed<S>,
        step: fn(&T, &mut S) -> Duration,
    ) -> std::io::Result<Self>
    where
        T: Send + Sync + 'static,
        S: 'static,
    {
        let thread_shared = shared.clone();
        let thread = seccomp::spawn(ThreadKind::Timer, name.into(), move || {
            let shared = &*thread_shared;
            timed(shared).run(|state| step(shared, state));
        })?;
        let stop_shared = shared.clone();
        Ok(TimerThread {
            stop: Box::new(move || timed(&stop_shared).stop()),
            thread: Some(thread),
        })
    }
}

impl Drop for TimerThread {
    fn drop(&mut self) {
        (self.stop)();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
