//! Logging: the `log` facade everywhere (the binary installs `env_logger`, level `warn` unless
//! `RUST_LOG` says otherwise, so the rust-vmm crates' own `log` records are seen too), and a
//! per-device handle for what a guest can repeat as fast as it likes.
//!
//! # How a device gets its handle
//!
//! A device model creates its [`DeviceLog`] when it is built, named as on the bus
//! (`DeviceLog::new("serial")`), keeps the `Arc` and reports guest misbehaviour with
//! [`guest_error!`](crate::guest_error) (`guest_error!(self.log, "bad offset {offset:#x}")`).
//! The machine that wires the device passes the same `Arc` to
//! [`ExitCounters::attach_log`](crate::stats::ExitCounters::attach_log) with the device's bus id,
//! so the device's guest-error count appears in every exit snapshot beside its exits. Tests need
//! no logger: without one the `log` macros do nothing, and the counts are kept all the same.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The `log` target of guest-error records (`RUST_LOG=exitless::guest=off` silences them).
pub const GUEST_TARGET: &str = "exitless::guest";

/// Messages a device may print per [`RATE_INTERVAL`]; the Linux kernel's `printk_ratelimit`
/// defaults (`DEFAULT_RATELIMIT_BURST`, `DEFAULT_RATELIMIT_INTERVAL`).
pub const RATE_BURST: u32 = 10;
/// See [`RATE_BURST`].
pub const RATE_INTERVAL: Duration = Duration::from_secs(5);

/// A fixed-window rate limit, as the kernel's `___ratelimit`: `RATE_BURST` messages per window,
/// and the number suppressed reported when the next window opens.
struct Window {
    start: Option<Instant>,
    printed: u32,
    suppressed: u64,
}

impl Window {
    /// Whether a message may be printed now, and how many were suppressed before it.
    fn admit(&mut self, now: Instant) -> (bool, u64) {
        let expired = self
            .start
            .is_none_or(|s| now.duration_since(s) >= RATE_INTERVAL);
        let mut suppressed = 0;
        if expired {
            self.start = Some(now);
            self.printed = 0;
            suppressed = std::mem::take(&mut self.suppressed);
        }
        if self.printed < RATE_BURST {
            self.printed += 1;
            (true, suppressed)
        } else {
            self.suppressed += 1;
            (false, suppressed)
        }
    }
}

/// One device's log: warnings rate-limited per device (one noisy device cannot hide another's),
/// and a count of the guest errors it saw.
pub struct DeviceLog {
    name: String,
    window: Mutex<Window>,
    guest_errors: AtomicU64,
}

impl DeviceLog {
    /// The log of the device called `name`.
    pub fn new(name: impl Into<String>) -> Arc<Self> {
        Arc::new(DeviceLog {
            name: name.into(),
            window: Mutex::new(Window {
                start: None,
                printed: 0,
                suppressed: 0,
            }),
            guest_errors: AtomicU64::new(0),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Count one guest error (an access or ring entry the device rejects) and warn about it,
    /// rate-limited. Use [`guest_error!`](crate::guest_error).
    pub fn guest_error(&self, args: fmt::Arguments<'_>) {
        self.guest_errors.fetch_add(1, Ordering::Relaxed);
        self.warn(args);
    }

    /// Warn, rate-limited, without counting a guest error (a host-side condition).
    pub fn warn(&self, args: fmt::Arguments<'_>) {
        let (print, suppressed) = self
            .window
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(Instant::now());
        if suppressed > 0 {
            log::warn!(target: GUEST_TARGET, "{}: {suppressed} warnings suppressed", self.name);
        }
        if print {
            log::warn!(target: GUEST_TARGET, "{}: {args}", self.name);
        }
    }

    /// Guest errors counted so far.
    pub fn guest_errors(&self) -> u64 {
        self.guest_errors.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for DeviceLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceLog")
            .field("name", &self.name)
            .field("guest_errors", &self.guest_errors())
            .finish()
    }
}

/// Count a guest error on a [`DeviceLog`] and warn about it, rate-limited per device:
/// `guest_error!(log, "format", args...)`.
#[macro_export]
macro_rules! guest_error {
    ($log:expr, $($arg:tt)*) => {
        $log.guest_error(format_args!($($arg)*))
    };
}

/// Install the logger of the `exitless` binary: `env_logger`, level `warn` unless `RUST_LOG`
/// says otherwise, lines as `exitless: LEVEL: message` (other crates' records name their
/// module). A second call does nothing.
pub fn init() {
    use std::io::Write;
    let env = env_logger::Env::default().default_filter_or("warn");
    let _ = env_logger::Builder::from_env(env)
        .format(|buf, record| {
            let level = record.level().as_str().to_ascii_lowercase();
            match record.module_path() {
                Some(m) if !m.starts_with("exitless") => {
                    writeln!(buf, "exitless: {level}: {m}: {}", record.args())
                }
                _ => writeln!(buf, "exitless: {level}: {}", record.args()),
            }
        })
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_admits_a_burst_then_reports_what_it_suppressed() {
        let mut w = Window {
            start: None,
            printed: 0,
            suppressed: 0,
        };
        let t0 = Instant::now();
        for _ in 0..RATE_BURST {
            assert_eq!(w.admit(t0), (true, 0));
        }
        assert_eq!(w.admit(t0), (false, 0));
        assert_eq!(w.admit(t0 + RATE_INTERVAL / 2), (false, 0));
        assert_eq!(w.admit(t0 + RATE_INTERVAL), (true, 2));
    }

    #[test]
    fn devices_are_limited_and_counted_separately() {
        let (a, b) = (DeviceLog::new("a"), DeviceLog::new("b"));
        for i in 0..100 {
            guest_error!(a, "bad access {i}");
        }
        guest_error!(b, "bad access");
        assert_eq!((a.guest_errors(), b.guest_errors()), (100, 1));
        // `a` spent its burst; `b` still has its own.
        assert!(!a.window.lock().unwrap().admit(Instant::now()).0);
        assert!(b.window.lock().unwrap().admit(Instant::now()).0);
        b.warn(format_args!("host-side"));
        assert_eq!(b.guest_errors(), 1, "warn does not count a guest error");
    }
}
