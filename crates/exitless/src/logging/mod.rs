//! Logging: the `log` facade everywhere (the binary installs `env_logger`, level `warn` unless
//! `RUST_LOG` says otherwise, so the rust-vmm crates' own `log` records are seen too), and a
//! per-device handle for what a guest can repeat as fast as it likes.
//!
//! # Logging never waits on stderr
//!
//! vCPUs and device threads log while holding device locks, so a stderr that stops draining
//! (a full pipe, a suspended terminal) must not stall them. The binary's logger hands each
//! record to a bounded [`LogQueue`]; one "log writer" thread writes the queue to stderr. When
//! the queue is full the record is dropped and counted, and the writer reports how many were
//! dropped once it catches up. [`flush`] waits, for a bounded time, until the queue is written:
//! `main` calls it before exiting.
//!
//! # How a device gets its handle
//!
//! A device model creates its [`DeviceLog`] when it is built, named as on the bus
//! (`DeviceLog::new("serial")`), keeps the `Arc` and reports guest misbehaviour with
//! [`guest_error!`](crate::guest_error) (`guest_error!(self.log, "bad offset {offset:#x}")`).
//! The machine that wires the device passes the same `Arc` to
//! [`ExitCounters::attach_log`](crate::exits::ExitCounters::attach_log) with the device's bus id,
//! so the device's guest-error count appears in every exit snapshot beside its exits. Tests need
//! no logger: without one the `log` macros do nothing, and the counts are kept all the same.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::seccomp::{self, ThreadKind};

mod queues;

pub use queues::{Cause, ErrorTotals, QueueCounters, QueueTotals, Tally};

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
    /// CPU time the device's own thread has spent, in nanoseconds.
    thread_cpu_ns: AtomicU64,
    /// Frames a checking backend (the sink) found with a wrong payload.
    bad_frames: AtomicU64,
    /// The I/O counters of each queue the device thread serves, by queue index (grown as
    /// queues are first served).
    queues: Mutex<Vec<Arc<QueueCounters>>>,
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
            thread_cpu_ns: AtomicU64::new(0),
            bad_frames: AtomicU64::new(0),
            queues: Mutex::new(Vec::new()),
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

    /// Count CPU time the device's thread spent.
    pub fn add_thread_cpu(&self, spent: Duration) {
        let ns = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.thread_cpu_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// CPU time the device's thread has spent so far, in nanoseconds.
    pub fn thread_cpu_ns(&self) -> u64 {
        self.thread_cpu_ns.load(Ordering::Relaxed)
    }

    /// Count `n` frames whose payload a checking backend found wrong (not a guest error: the
    /// data, not the device's interface, is what is wrong).
    pub fn add_bad_frames(&self, n: u64) {
        self.bad_frames.fetch_add(n, Ordering::Relaxed);
    }

    /// Frames with a wrong payload counted so far.
    pub fn bad_frames(&self) -> u64 {
        self.bad_frames.load(Ordering::Relaxed)
    }

    /// The counters of queue `index`, for the device thread to add to (the same ones each
    /// time the queue is served again, after a reset or a restore).
    pub fn queue_counters(&self, index: usize) -> Arc<QueueCounters> {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        if queues.len() <= index {
            queues.resize_with(index + 1, Default::default);
        }
        Arc::clone(&queues[index])
    }

    /// Each served queue's counters now, by queue index (none for a device whose queues
    /// another process serves, a vhost-user backend).
    pub fn queue_totals(&self) -> Vec<QueueTotals> {
        let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        queues.iter().map(|q| q.totals()).collect()
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

/// Records the queue holds before it drops new ones: enough for a burst of every device's
/// rate-limited warnings, small enough that a stalled stderr costs little memory.
pub const QUEUE_RECORDS: usize = 1024;
/// How long [`flush`] waits for the writer at most.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct QueueState {
    records: VecDeque<Vec<u8>>,
    /// Records dropped because the queue was full, not yet reported.
    dropped: u64,
    /// The writer holds records it took and has not finished writing.
    writing: bool,
}

/// A bounded queue of formatted log records between the threads that log, which never wait
/// on it for more than a short critical section, and the one writer thread that does the I/O.
pub struct LogQueue {
    capacity: usize,
    state: Mutex<QueueState>,
    /// Signalled when a record arrives or is dropped.
    ready: Condvar,
    /// Signalled when the writer finishes a batch.
    written: Condvar,
}

impl LogQueue {
    /// A queue of at most `capacity` records.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(LogQueue {
            capacity,
            state: Mutex::default(),
            ready: Condvar::new(),
            written: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queue `record` (a formatted line), or drop and count it if the queue is full. Never
    /// waits for the writer.
    pub fn push(&self, record: Vec<u8>) {
        let mut st = self.lock();
        if st.records.len() < self.capacity {
            st.records.push_back(record);
        } else {
            st.dropped += 1;
        }
        drop(st);
        self.ready.notify_one();
    }

    /// Records dropped and not yet reported by the writer.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    /// Write queued records to `sink` until the process ends: the writer thread's body. Takes
    /// every queued record at once and writes them without the lock, then the number dropped
    /// meanwhile, which came after them; write errors are ignored, as there is nowhere to
    /// report them.
    fn drain_into(&self, sink: &mut dyn Write) -> ! {
        loop {
            let (batch, dropped) = {
                let mut st = self.lock();
                while st.records.is_empty() && st.dropped == 0 {
                    st = self.ready.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
                st.writing = true;
                (
                    std::mem::take(&mut st.records),
                    std::mem::take(&mut st.dropped),
                )
            };
            for record in &batch {
                let _ = sink.write_all(record);
            }
            if dropped > 0 {
                let _ = writeln!(sink, "exitless: warn: {dropped} log lines dropped");
            }
            let _ = sink.flush();
            self.lock().writing = false;
            self.written.notify_all();
        }
    }

    /// Wait until everything queued so far is written, or `timeout` passes. Returns whether
    /// the queue was written.
    pub fn flush(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        while !st.records.is_empty() || st.dropped > 0 || st.writing {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            st = self
                .written
                .wait_timeout(st, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// Start the thread that writes this queue to `sink`.
    pub fn spawn_writer(
        self: &Arc<Self>,
        mut sink: Box<dyn Write + Send>,
    ) -> io::Result<thread::JoinHandle<()>> {
        let queue = self.clone();
        seccomp::spawn(ThreadKind::LogWriter, WRITER_THREAD.into(), move || {
            queue.drain_into(&mut sink)
        })
    }
}

const WRITER_THREAD: &str = "log writer";

/// The `Write` end of a [`LogQueue`] that `env_logger` writes to: it writes each record with
/// one `write_all` and then flushes, so what arrives between flushes is one record.
pub struct QueueWriter {
    queue: Arc<LogQueue>,
    record: Vec<u8>,
}

impl QueueWriter {
    /// A writer into `queue`.
    pub fn new(queue: Arc<LogQueue>) -> Self {
        QueueWriter {
            queue,
            record: Vec::new(),
        }
    }
}

impl Write for QueueWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.record.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.record.is_empty() {
            self.queue.push(std::mem::take(&mut self.record));
        }
        Ok(())
    }
}

/// The binary's queue, once [`init`] has installed the logger.
static QUEUE: OnceLock<Arc<LogQueue>> = OnceLock::new();

/// Install the logger of the `exitless` binary: `env_logger`, level `warn` unless `RUST_LOG`
/// says otherwise, lines as `exitless: LEVEL: message` (other crates' records name their
/// module), written to stderr by the log writer thread (module comment). A second call does
/// nothing.
pub fn init() {
    let env = env_logger::Env::default().default_filter_or("warn");
    let mut builder = env_logger::Builder::from_env(env);
    builder.format(|buf, record| {
        let level = record.level().as_str().to_ascii_lowercase();
        match record.module_path() {
            Some(m) if !m.starts_with("exitless") => {
                writeln!(buf, "exitless: {level}: {m}: {}", record.args())
            }
            _ => writeln!(buf, "exitless: {level}: {}", record.args()),
        }
    });
    if QUEUE.get().is_some() {
        return;
    }
    let queue = LogQueue::new(QUEUE_RECORDS);
    // Without a writer thread, log synchronously rather than not at all.
    if queue.spawn_writer(Box::new(io::stderr())).is_ok() && QUEUE.set(queue.clone()).is_ok() {
        builder.target(env_logger::Target::Pipe(Box::new(QueueWriter::new(queue))));
        // A panic's message goes straight to stderr: write what was logged before it first.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::Relaxed);
            flush();
            if seccomp::enabled() {
                report_panic(info);
            } else {
                previous(info);
            }
        }));
    }
    let _ = builder.try_init();
}

/// Write `args` and a newline to stderr, ignoring a failed write: stderr on a full disk or a
/// closed pipe has nowhere to report its own failure, and `eprintln!` would panic instead.
pub fn stderr_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "{args}");
}

/// A panic's report under seccomp: its thread, place and message, with write(2) alone. std's
/// own hook would also print a backtrace when RUST_BACKTRACE asks for one, and resolving it
/// needs calls no filter allows (getcwd, opening the binary): the process would end with the
/// seccomp status instead of the panic's. Backtraces are `--no-seccomp`'s.
fn report_panic(info: &std::panic::PanicHookInfo<'_>) {
    let thread = thread::current();
    let name = thread.name().unwrap_or("<unnamed>");
    let payload = info.payload();
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("Box<dyn Any>");
    match info.location() {
        Some(at) => stderr_line(format_args!("thread '{name}' panicked at {at}: {message}")),
        None => stderr_line(format_args!("thread '{name}' panicked: {message}")),
    }
}

/// Panics on any thread since [`init`] (a device or vCPU thread's panic ends that thread,
/// not the process: the soak reports them).
static PANICS: AtomicU64 = AtomicU64::new(0);

/// How many threads have panicked since [`init`].
pub fn panics() -> u64 {
    PANICS.load(Ordering::Relaxed)
}

/// Wait, at most [`FLUSH_TIMEOUT`], until the log queue is empty (records logged meanwhile
/// count too, so steady logging runs to the timeout). Does nothing without [`init`], or on
/// the log writer thread itself.
pub fn flush() {
    if thread::current().name() == Some(WRITER_THREAD) {
        return;
    }
    if let Some(queue) = QUEUE.get() {
        queue.flush(FLUSH_TIMEOUT);
    }
}

#[cfg(test)]
mod tests;
