//! The console's output side: the queue between the UART and the console writer thread, what
//! the UART tells the guest when the writer is behind, and what is said when output is lost.
//!
//! A vCPU never waits on the writer: it appends to the queue under a short lock. When the
//! writer falls [`CONSOLE_QUEUE_LIMIT`] bytes behind, the default ([`Overflow::Hold`]) holds
//! the guest back as QEMU does: the UART reports its transmitter busy (LSR THRE and TEMT clear)
//! until the writer has taken the queue, then raises the THR-empty interrupt. A console nobody
//! reads would then hold the guest for ever, so [`Overflow::Drop`] drops what does not fit
//! instead. Either way every byte lost is counted and the count is said at exit, in one line.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, mpsc};
use std::time::Duration;

use crate::seccomp::{self, ThreadKind};

/// Most bytes the console thread may be behind by before the UART holds the guest back (or,
/// with [`Overflow::Drop`], drops what the guest writes).
pub const CONSOLE_QUEUE_LIMIT: usize = 64 << 10;

/// How long dropping the console waits for its thread to write what is queued before it says
/// so ([`Overflow::Hold`]: then it waits on) or gives up and counts the rest as dropped
/// ([`Overflow::Drop`]).
pub const CONSOLE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes of a 16550A's transmit FIFO: a driver that saw THRE set may write this many without
/// reading LSR again (PC16550D datasheet, "FIFO Interrupt Mode Operation"; Linux's `tx_loadsz`
/// for PORT_16550A). The queue reports THRE only while it has room for them.
pub const TX_FIFO: usize = 16;

/// What the UART does when the console thread is [`CONSOLE_QUEUE_LIMIT`] bytes behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Overflow {
    /// Hold the guest back: its transmitter stays busy until the writer catches up, so a
    /// driver that waits for THRE loses nothing; at exit, wait for the writer.
    #[default]
    Hold,
    /// Never hold the guest back: drop what does not fit; at exit, wait at most
    /// [`CONSOLE_FLUSH_TIMEOUT`] for the writer.
    Drop,
}

/// The queue between the UART and the console thread.
pub(super) struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
    overflow: Overflow,
}

#[derive(Default)]
struct QueueState {
    bytes: Vec<u8>,
    closed: bool,
    /// Bytes ever queued.
    queued: u64,
    /// Bytes that did not fit.
    overflowed: u64,
}

impl QueueState {
    fn room(&self) -> usize {
        CONSOLE_QUEUE_LIMIT.saturating_sub(self.bytes.len())
    }
}

impl Queue {
    pub(super) fn new(overflow: Overflow) -> Self {
        Queue {
            state: Mutex::default(),
            ready: Condvar::new(),
            overflow,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the transmitter is empty as LSR shows it (THRE and TEMT): always when dropping,
    /// else while a transmit FIFO's worth fits.
    pub(super) fn transmitter_empty(&self) -> bool {
        self.overflow == Overflow::Drop || self.lock().room() >= TX_FIFO
    }

    /// Queue what fits and count the rest; returns how many bytes did not fit. Never waits on
    /// the writer: the lock is only ever held to append or to take the whole queue.
    pub(super) fn push(&self, buf: &[u8]) -> usize {
        let mut s = self.lock();
        let taken = buf.len().min(s.room());
        s.bytes.extend_from_slice(&buf[..taken]);
        s.queued += taken as u64;
        let lost = buf.len() - taken;
        s.overflowed += lost as u64;
        drop(s);
        self.ready.notify_one();
        lost
    }

    /// What the policy is.
    pub(super) fn overflow(&self) -> Overflow {
        self.overflow
    }

    /// Everything queued, waiting for some, and whether the transmitter was shown busy before
    /// (so the guest may wait for the THR-empty interrupt); `None` once closed and drained.
    fn take(&self) -> Option<(Vec<u8>, bool)> {
        let s = self.lock();
        let mut s = self
            .ready
            .wait_while(s, |s| s.bytes.is_empty() && !s.closed)
            .unwrap_or_else(PoisonError::into_inner);
        let was_busy = self.overflow == Overflow::Hold && s.room() < TX_FIFO;
        (!s.bytes.is_empty()).then(|| (std::mem::take(&mut s.bytes), was_busy))
    }

    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }
}

/// What the console thread did with the bytes it took.
#[derive(Default)]
struct Tally {
    written: AtomicU64,
    /// Bytes taken but not written, after the first write error.
    unwritten: AtomicU64,
    /// The first write error; nothing is written after it.
    error: OnceLock<String>,
}

/// Bytes of guest output that did not reach the console, by why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Dropped with [`Overflow::Drop`]: the writer was behind, or still behind at exit.
    pub dropped: u64,
    /// Written by the guest while the transmitter was busy and full ([`Overflow::Hold`]): a
    /// driver that did not wait for THRE, as a real UART's overrun.
    pub overrun: u64,
    /// Not written because writing the console failed, with the error.
    pub unwritten: u64,
    /// The write error, if there was one.
    pub error: Option<String>,
}

impl Lost {
    /// The line said at exit, if anything was lost.
    pub fn summary(&self) -> Option<String> {
        let mut why = Vec::new();
        if self.dropped > 0 {
            why.push(format!(
                "{} dropped while its reader was behind (--console-drop)",
                self.dropped
            ));
        }
        if self.overrun > 0 {
            why.push(format!(
                "{} written while the UART's transmitter was busy (LSR.THRE clear)",
                self.overrun
            ));
        }
        if let Some(e) = &self.error {
            why.push(format!("{} not written: {e}", self.unwritten));
        }
        let total = self.dropped + self.overrun + self.unwritten;
        (!why.is_empty()).then(|| {
            format!(
                "console: {total} bytes of the guest's output lost: {}",
                why.join("; ")
            )
        })
    }
}

/// Raises the THR-empty interrupt once the queue has room again.
pub(super) type Kick = Box<dyn Fn() + Send>;

/// The console thread and its queue. Dropping it waits for the thread to write what is
/// queued ([`Overflow`] says how long) and says at exit what was lost.
pub(super) struct ConsoleThread {
    queue: Arc<Queue>,
    tally: Arc<Tally>,
    /// Disconnected when the thread has written everything and ended (in a mutex: the UART
    /// is shared between vCPU threads, and a receiver is not `Sync`).
    finished: Mutex<mpsc::Receiver<()>>,
}

impl ConsoleThread {
    /// Start the thread that writes what `queue` gets to `out`, calling `kick` when the
    /// queue has room again after the transmitter was shown busy.
    pub(super) fn spawn(
        mut out: Box<dyn Write + Send>,
        queue: Arc<Queue>,
        kick: Kick,
    ) -> io::Result<Self> {
        let tally = Arc::new(Tally::default());
        let (done, finished) = mpsc::channel::<()>();
        let (q, t) = (queue.clone(), tally.clone());
        seccomp::spawn(ThreadKind::Console, "console".into(), move || {
            let _done = done;
            while let Some((bytes, was_busy)) = q.take() {
                if was_busy {
                    // The queue is empty again: the guest may go on while this batch is written.
                    kick();
                }
                t.write(&mut out, &bytes);
            }
        })?;
        Ok(ConsoleThread {
            queue,
            tally,
            finished: Mutex::new(finished),
        })
    }

    /// The queue the UART writes into.
    pub(super) fn queue(&self) -> &Queue {
        &self.queue
    }

    /// What was lost so far (bytes the thread has taken but not yet written are not).
    pub(super) fn lost(&self) -> Lost {
        let overflowed = self.queue.lock().overflowed;
        let (dropped, overrun) = match self.queue.overflow {
            Overflow::Drop => (overflowed, 0),
            Overflow::Hold => (0, overflowed),
        };
        Lost {
            dropped,
            overrun,
            unwritten: self.tally.unwritten.load(Ordering::Relaxed),
            error: self.tally.error.get().cloned(),
        }
    }

    /// Bytes queued but neither written nor failed: in flight while the thread runs, dropped
    /// once it is abandoned.
    fn in_flight(&self) -> u64 {
        let queued = self.queue.lock().queued;
        let done = self.tally.written.load(Ordering::Relaxed)
            + self.tally.unwritten.load(Ordering::Relaxed);
        queued.saturating_sub(done)
    }

    /// Wait for the thread to write everything; whether it did.
    fn wait(&self) -> bool {
        let finished = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        let timed_out = |r| matches!(r, Err(mpsc::RecvTimeoutError::Timeout));
        if !timed_out(finished.recv_timeout(CONSOLE_FLUSH_TIMEOUT)) {
            return true;
        }
        match self.queue.overflow {
            Overflow::Drop => false,
            Overflow::Hold => {
                // What the guest wrote reaches the console, as any program's output to a pipe
                // does: the run ends once the reader has taken it (Ctrl-C gives up).
                log::warn!("console: waiting for its reader to take the guest's last output");
                let _ = finished.recv();
                true
            }
        }
    }
}

impl Tally {
    /// Write `bytes` to `out` unless an earlier write failed; the first failure is said once,
    /// and what is not written from then on is counted.
    fn write(&self, out: &mut dyn Write, bytes: &[u8]) {
        if self.error.get().is_some() {
            self.unwritten
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            return;
        }
        let mut rest = bytes;
        let failed = loop {
            match out.write(rest) {
                Ok(0) if !rest.is_empty() => break Some(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
            if rest.is_empty() {
                break out.flush().err();
            }
        };
        let written = bytes.len() - rest.len();
        self.written.fetch_add(written as u64, Ordering::Relaxed);
        if let Some(e) = failed {
            self.unwritten
                .fetch_add(rest.len() as u64, Ordering::Relaxed);
            // A full file system (ENOSPC), an I/O error, a reader gone (EPIPE): the guest goes
            // on, and what it writes is counted, not written (a gap would hide the loss).
            log::warn!("console: cannot write the guest's output: {e}; its further output is lost");
            let _ = self.error.set(e.to_string());
        }
    }
}

impl Drop for ConsoleThread {
    fn drop(&mut self) {
        self.queue.close();
        let finished = self.wait();
        let mut lost = self.lost();
        if !finished {
            lost.dropped += self.in_flight();
        }
        if let Some(line) = lost.summary() {
            log::warn!("{line}");
        }
    }
}
