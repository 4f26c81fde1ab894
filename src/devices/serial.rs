//! The console UART (16550A, from vm-superio) on port 0x3F8.
//!
//! A vCPU writing the transmit register must never wait on the host's terminal: output that
//! goes to stdout (or any writer) passes through a bounded queue to a console thread, so a
//! stalled stdout holds neither the vCPU nor the UART lock. The in-memory log of tests and
//! benchmarks cannot stall and is written in place.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};
use std::time::Duration;

use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::bus::BusDevice;
use crate::guest_error;
use crate::logging::DeviceLog;
use crate::seccomp::{self, ThreadKind};

/// Most bytes of guest console output an in-memory log keeps.
pub const CONSOLE_LOG_LIMIT: usize = 1 << 20;

/// Most bytes the console thread may be behind by; more are dropped and counted.
pub const CONSOLE_QUEUE_LIMIT: usize = 64 << 10;

/// How long dropping the console waits for its thread to write what is queued. Ample for a
/// terminal or a pipe being read; a writer stalled longer is left behind (its thread detached).
pub const CONSOLE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Where guest console output goes.
pub enum ConsoleOutput {
    /// The VMM's standard output, through the console thread.
    Stdout,
    /// An in-memory log, for benchmarks and tests.
    Buffer(Arc<Mutex<Vec<u8>>>),
    /// Any writer (a file, a pipe), through the console thread.
    Writer(Box<dyn Write + Send>),
}

/// The queue between the UART and the console thread.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
    dropped: AtomicU64,
}

#[derive(Default)]
struct QueueState {
    bytes: Vec<u8>,
    closed: bool,
}

impl Queue {
    /// Queue what fits; count the rest as dropped. Never waits on the writer: the lock is only
    /// ever held to append or to take the whole queue.
    fn push(&self, buf: &[u8]) -> usize {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let room = CONSOLE_QUEUE_LIMIT.saturating_sub(s.bytes.len());
        let taken = buf.len().min(room);
        s.bytes.extend_from_slice(&buf[..taken]);
        drop(s);
        self.ready.notify_one();
        let lost = buf.len() - taken;
        self.dropped.fetch_add(lost as u64, Ordering::Relaxed);
        lost
    }

    /// Everything queued, waiting for some; `None` once closed and drained.
    fn take(&self) -> Option<Vec<u8>> {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut s = self
            .ready
            .wait_while(s, |s| s.bytes.is_empty() && !s.closed)
            .unwrap_or_else(PoisonError::into_inner);
        (!s.bytes.is_empty()).then(|| std::mem::take(&mut s.bytes))
    }

    fn close(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed = true;
        self.ready.notify_one();
    }
}

/// The console thread and its queue. Dropping it writes out what is queued (waiting at most
/// [`CONSOLE_FLUSH_TIMEOUT`]).
struct ConsoleThread {
    queue: Arc<Queue>,
    /// Disconnected when the thread has written everything and ended.
    finished: mpsc::Receiver<()>,
}

impl ConsoleThread {
    fn spawn(mut out: Box<dyn Write + Send>) -> io::Result<Self> {
        let queue = Arc::new(Queue::default());
        let (done, finished) = mpsc::channel::<()>();
        let q = queue.clone();
        seccomp::spawn(ThreadKind::Console, "console".into(), move || {
            let _done = done;
            while let Some(bytes) = q.take() {
                // A closed stdout must not stop the guest: its output is lost.
                let _ = out.write_all(&bytes).and_then(|()| out.flush());
            }
        })?;
        Ok(ConsoleThread { queue, finished })
    }
}

impl Drop for ConsoleThread {
    fn drop(&mut self) {
        self.queue.close();
        if let Err(mpsc::RecvTimeoutError::Timeout) =
            self.finished.recv_timeout(CONSOLE_FLUSH_TIMEOUT)
        {
            log::warn!("the console output is stalled; its remaining bytes are abandoned");
        }
    }
}

/// The UART's writer: the in-memory log, or the console thread's queue.
enum Sink {
    Buffer(Arc<Mutex<Vec<u8>>>),
    Thread(ConsoleThread, Arc<DeviceLog>),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Buffer(b) => {
                // A guest can print forever: keep the first CONSOLE_LOG_LIMIT bytes, drop the rest.
                let mut log = b.lock().unwrap_or_else(PoisonError::into_inner);
                let room = CONSOLE_LOG_LIMIT.saturating_sub(log.len());
                log.extend_from_slice(&buf[..buf.len().min(room)]);
            }
            Sink::Thread(t, log) => {
                // The writer is behind: dropping keeps the vCPU running, as a UART whose
                // line is not read loses characters; the count says how many.
                if t.queue.push(buf) > 0 {
                    log.warn(format_args!("console output is behind; bytes dropped"));
                }
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        // The console thread flushes after each batch; a vCPU never waits for it.
        Ok(())
    }
}

/// Raises the UART's interrupt by signalling an eventfd bound to its GSI with an irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Number of ports a 16550 decodes.
pub const SERIAL_PORT_LEN: u16 = 8;

/// The UART as a bus device.
pub struct SerialConsole {
    uart: Mutex<Serial<IrqTrigger, vm_superio::serial::NoEvents, Sink>>,
    log: Arc<DeviceLog>,
    /// The console thread's dropped-byte count, if output goes through it.
    dropped: Option<Arc<Queue>>,
}

impl SerialConsole {
    /// A UART raising `irq` and writing to `out`; stdout and writers get a console thread.
    pub fn new(irq: EventFd, out: ConsoleOutput, log: Arc<DeviceLog>) -> io::Result<Self> {
        let sink = match out {
            ConsoleOutput::Buffer(b) => Sink::Buffer(b),
            ConsoleOutput::Stdout => {
                Sink::Thread(ConsoleThread::spawn(Box::new(io::stdout()))?, log.clone())
            }
            ConsoleOutput::Writer(w) => Sink::Thread(ConsoleThread::spawn(w)?, log.clone()),
        };
        let dropped = match &sink {
            Sink::Thread(t, _) => Some(t.queue.clone()),
            Sink::Buffer(_) => None,
        };
        Ok(SerialConsole {
            uart: Mutex::new(Serial::new(IrqTrigger(irq), sink)),
            log,
            dropped,
        })
    }

    /// Bytes of output dropped because the console thread was behind.
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped
            .as_ref()
            .map_or(0, |q| q.dropped.load(Ordering::Relaxed))
    }

    /// The device's log.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }
}

impl BusDevice for SerialConsole {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0xff);
        match (u8::try_from(offset), data) {
            (Ok(reg), [byte]) => {
                *byte = self
                    .uart
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .read(reg)
            }
            (_, data) => guest_error!(
                self.log,
                "{}-byte read at offset {offset}: the registers are bytes",
                data.len()
            ),
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        match (u8::try_from(offset), data) {
            (Ok(reg), [byte]) => {
                // The sink never fails; an interrupt that cannot be signalled is lost.
                let _ = self
                    .uart
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .write(reg, *byte);
            }
            _ => guest_error!(
                self.log,
                "{}-byte write at offset {offset}: the registers are bytes",
                data.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn console(out: ConsoleOutput) -> SerialConsole {
        SerialConsole::new(EventFd::new(0).unwrap(), out, DeviceLog::new("serial")).unwrap()
    }

    #[test]
    fn the_console_log_keeps_a_bounded_prefix() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let serial = console(ConsoleOutput::Buffer(log.clone()));
        for _ in 0..CONSOLE_LOG_LIMIT + 100 {
            serial.write(0, b"x"); // THR, one byte per access as a guest would
        }
        serial.write(0, &[1, 2]); // wrong width: ignored
        assert_eq!(log.lock().unwrap().len(), CONSOLE_LOG_LIMIT);
        assert_eq!(serial.log().guest_errors(), 1, "the wide write");
    }

    /// A writer stuck until its gate's sender is dropped, like a terminal nobody drains.
    struct Gated {
        gate: Option<mpsc::Receiver<()>>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Some(gate) = self.gate.take() {
                let _ = gate.recv();
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_writer_never_blocks_the_uart() {
        let (open, gate) = mpsc::channel();
        let got = Arc::new(Mutex::new(Vec::new()));
        let serial = Arc::new(console(ConsoleOutput::Writer(Box::new(Gated {
            gate: Some(gate),
            got: got.clone(),
        }))));
        // The console thread takes at most one queue's worth before it stalls, the queue holds
        // another: the third is dropped.
        let total = 3 * CONSOLE_QUEUE_LIMIT;
        // The guest's writes run on their own thread, so a regression fails instead of hanging.
        let (finished, wrote) = mpsc::channel();
        let s = serial.clone();
        let guest = std::thread::spawn(move || {
            for _ in 0..total {
                s.write(0, b"x");
            }
            // The UART lock is free: a register read still answers.
            let mut lsr = [0];
            s.read(5, &mut lsr);
            let _ = finished.send(());
        });
        wrote
            .recv_timeout(Duration::from_secs(30))
            .expect("the UART wrote through a stalled console");
        guest.join().unwrap();
        let dropped = serial.dropped_bytes();
        assert!(dropped >= CONSOLE_QUEUE_LIMIT as u64, "{dropped} dropped");
        // The terminal recovers; dropping the console writes out everything queued.
        drop(open);
        drop(Arc::into_inner(serial).expect("the only handle"));
        assert_eq!(got.lock().unwrap().len() as u64 + dropped, total as u64);
    }

    #[test]
    fn everything_written_reaches_a_live_writer() {
        let got = Arc::new(Mutex::new(Vec::new()));
        let (open, gate) = mpsc::channel();
        drop(open);
        let serial = console(ConsoleOutput::Writer(Box::new(Gated {
            gate: Some(gate),
            got: got.clone(),
        })));
        for &b in b"hello, console" {
            serial.write(0, &[b]);
        }
        drop(serial);
        assert_eq!(&got.lock().unwrap()[..], b"hello, console");
    }
}
