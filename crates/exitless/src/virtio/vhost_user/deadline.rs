//! A deadline on every exchange with a vhost-user backend.
//!
//! The socket's receive timeout alone ends no wait: the `vhost` crate takes the EAGAIN it gives
//! for a temporary error (`SocketRetry`) and receives again, for ever, so a backend that takes
//! the connection and never answers (one serving another VMM, a short reply, a backend gone
//! silent mid-run) would hold the thread waiting on it, and the vCPU or API thread waiting on
//! that, for good. So each device has a [`Watchdog`]: a thread that, when an exchange armed with
//! it runs past [`EXCHANGE_DEADLINE`], shuts the socket down (shutdown(2)). The crate's receive
//! then reads the end of the stream and fails, its send fails with EPIPE, and the exchange's
//! error is the caller's, who asks [`Watchdog::fired`] to say why in its one line. A socket
//! once shut down is dead: the caller drops the connection (at start: the run is refused; at
//! run time: DEVICE_NEEDS_RESET, and `reconnect=` or the driver's reset connects again).
//!
//! By hand: no crate of the tree puts a deadline on a blocking call it does not own.

use std::os::fd::RawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::seccomp::{self, ThreadKind};

/// How long one exchange may take: a hung backend cannot hold a vCPU (which waits for the
/// vhost-user thread at a reset or a mask) or the API (a snapshot's pause) longer than this.
pub(super) const EXCHANGE_DEADLINE: Duration = if cfg!(test) {
    Duration::from_secs(1)
} else {
    Duration::from_secs(5)
};

/// What the watchdog thread and the exchanges share.
#[derive(Default)]
struct Armed {
    /// The socket of the exchange under way and when it must be done.
    exchange: Option<(RawFd, Instant)>,
    /// The last exchange ran past its deadline and its socket was shut down.
    fired: bool,
    /// Every handle is gone: the thread ends.
    closed: bool,
}

#[derive(Default)]
struct Shared {
    armed: Mutex<Armed>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Armed> {
        // The lock guards plain values that no panic leaves half-written.
        self.armed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A device's watchdog; its thread ends when this is dropped.
pub(super) struct Watchdog(Arc<Shared>);

/// An exchange armed: disarmed when dropped.
pub(super) struct Exchange(Arc<Shared>);

impl Watchdog {
    /// Start the watchdog thread of the device called `name` (confined as a vhost-user thread).
    pub fn start(name: &str) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let thread = shared.clone();
        let name = format!("{name}-deadline");
        seccomp::spawn(ThreadKind::VhostUser, name, move || watch(&thread))?;
        Ok(Watchdog(shared))
    }

    /// Arm the deadline for an exchange on `socket`, from now; the fired flag of the one before
    /// is cleared.
    pub fn arm(&self, socket: RawFd) -> Exchange {
        let mut armed = self.0.lock();
        armed.exchange = Some((socket, Instant::now() + EXCHANGE_DEADLINE));
        armed.fired = false;
        drop(armed);
        self.0.changed.notify_all();
        Exchange(self.0.clone())
    }

    /// End the exchange under way, whoever armed it: its socket is about to be closed, and
    /// its number may be another file's next.
    pub fn disarm(&self) {
        self.0.lock().exchange = None;
    }

    /// Whether the last exchange armed ran past its deadline (its socket is shut down).
    pub fn fired(&self) -> bool {
        self.0.lock().fired
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.0.lock().exchange = None;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.changed.notify_all();
    }
}

/// The watchdog thread: wait for an exchange to be armed, then for it to end or its deadline
/// to pass, and shut its socket down then. Under the lock, so the socket is still the
/// exchange's (the exchange disarms before its connection can be dropped).
fn watch(shared: &Shared) {
    let mut armed = shared.lock();
    while !armed.closed {
        let Some((socket, deadline)) = armed.exchange else {
            armed = shared
                .changed
                .wait(armed)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // SAFETY: shutdown takes a descriptor the exchange holds open until it disarms,
            // which it cannot do while this thread holds the lock.
            unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
            armed.exchange = None;
            armed.fired = true;
            continue;
        }
        armed = shared
            .changed
            .wait_timeout(armed, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn an_exchange_past_its_deadline_has_its_socket_shut_down_and_one_in_time_does_not() {
        let watchdog = Watchdog::start("test").unwrap();
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        {
            let _exchange = watchdog.arm(ours.as_raw_fd());
        }
        std::thread::sleep(EXCHANGE_DEADLINE + Duration::from_millis(200));
        assert!(!watchdog.fired(), "disarmed in time");
        ours.set_nonblocking(true).unwrap();
        let mut byte = [0u8];
        assert!(ours.read(&mut byte).is_err(), "still open, nothing to read");
        ours.set_nonblocking(false).unwrap();
        // A silent peer: the read that would wait for ever ends at the deadline.
        let exchange = watchdog.arm(ours.as_raw_fd());
        assert_eq!(ours.read(&mut byte).unwrap(), 0, "the end of the stream");
        drop(exchange);
        assert!(watchdog.fired());
        drop(theirs);
    }
}
