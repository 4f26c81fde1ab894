//! The console UART (16550A, from vm-superio) on port 0x3F8.
//!
//! A vCPU writing the transmit register must never wait on the host's terminal: output that
//! goes to stdout (or any writer) passes through a bounded queue to a console thread, so a
//! stalled stdout holds neither the vCPU nor the UART lock. The in-memory log of tests and
//! benchmarks cannot stall and is written in place.
//!
//! Input (stdin for `exitless run`) comes the other way through a console input thread
//! ([`SerialConsole::spawn_input`]): it waits for bytes, puts what fits into the UART's 64-byte
//! receive FIFO (which raises the receive interrupt when the guest enabled it), and waits for
//! the guest to empty the FIFO before it puts more, so no byte is lost and a vCPU never waits.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use vm_superio::serial::SerialEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

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

/// Signals the console input thread, once there is one, when the guest has read the last byte
/// of the receive FIFO: there is room for more input.
#[derive(Default)]
pub struct InputRoom(OnceLock<Arc<EventFd>>);

impl SerialEvents for InputRoom {
    fn buffer_read(&self) {}
    fn out_byte(&self) {}
    fn tx_lost_byte(&self) {}
    fn in_buffer_empty(&self) {
        if let Some(room) = self.0.get() {
            // Counts up: the thread wakes once whatever the number of signals.
            let _ = room.write(1);
        }
    }
}

/// Number of ports a 16550 decodes.
pub const SERIAL_PORT_LEN: u16 = 8;

/// How long the input thread waits for room in the receive FIFO before it tries again: the
/// guest may have put the UART in loopback mode, where input is dropped and no room is ever
/// signalled.
const INPUT_RETRY: Duration = Duration::from_millis(100);

/// The UART as a bus device.
pub struct SerialConsole {
    uart: Mutex<Serial<IrqTrigger, InputRoom, Sink>>,
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
            uart: Mutex::new(Serial::with_events(
                IrqTrigger(irq),
                InputRoom::default(),
                sink,
            )),
            log,
            dropped,
        })
    }

    /// Put as much of `input` as fits into the receive FIFO, raising the receive interrupt if
    /// the guest enabled it; returns how many bytes were taken.
    fn receive(&self, input: &[u8]) -> usize {
        let mut uart = self.uart.lock().unwrap_or_else(PoisonError::into_inner);
        let room = uart.fifo_capacity();
        match uart.enqueue_raw_bytes(input) {
            Ok(n) => n,
            Err(vm_superio::serial::Error::FullFifo) => 0,
            // The bytes are in the FIFO; only the interrupt was lost.
            Err(_) => room.min(input.len()),
        }
    }

    /// Start the console input thread: it feeds the receive FIFO with what `source` gives
    /// until `source` ends or the returned handle is dropped. Once per console.
    pub fn spawn_input<S: AsFd + Send + 'static>(
        self: &Arc<Self>,
        source: S,
    ) -> io::Result<ConsoleInput> {
        let room = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let events_room = room.clone();
        let installed = self
            .uart
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .events()
            .0
            .set(events_room)
            .is_ok();
        if !installed {
            return Err(io::Error::other("the console already has an input thread"));
        }
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let (serial, thread_stop) = (self.clone(), stop.clone());
        let thread = seccomp::spawn(ThreadKind::ConsoleInput, "console-in".into(), move || {
            pump(&serial, source.as_fd().as_raw_fd(), &room, &thread_stop)
        })?;
        Ok(ConsoleInput {
            stop,
            thread: Some(thread),
        })
    }

    /// Bytes of output dropped because the console thread was behind.
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped
            .as_ref()
            .map_or(0, |q| q.dropped.load(Ordering::Relaxed))
    }

    /// The device's log, for its guest errors.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }
}

/// The console input thread; dropping the handle stops it and waits for it.
pub struct ConsoleInput {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ConsoleInput {
    fn drop(&mut self) {
        // The thread only ever waits in poll(2), which the stop event ends.
        let _ = self.stop.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a wait for input ended with.
#[derive(PartialEq, Eq)]
enum Wake {
    /// The awaited descriptor is readable (or at its end).
    Ready,
    /// The wait timed out.
    Timeout,
    /// Stop: the handle was dropped, or the descriptor is unusable.
    Stop,
}

/// Wait until `fd` is readable, `stop` is signalled or `timeout` passes (`None`: forever).
fn wait(fd: RawFd, stop: &EventFd, timeout: Option<Duration>) -> Wake {
    let pollfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let mut fds = [pollfd(fd), pollfd(stop.as_raw_fd())];
    let ms = timeout.map_or(-1, |t| libc::c_int::try_from(t.as_millis()).unwrap_or(-1));
    loop {
        // SAFETY: poll only writes the `revents` of the two entries it is given.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return match (n, fds[0].revents, fds[1].revents) {
            (0, _, _) => Wake::Timeout,
            (n, _, stopped) if n < 0 || stopped != 0 => Wake::Stop,
            (_, input, _) if input & (libc::POLLERR | libc::POLLNVAL) != 0 => Wake::Stop,
            _ => Wake::Ready,
        };
    }
}

/// The console input thread: read from `source`, feed the receive FIFO, wait for room.
fn pump(serial: &SerialConsole, source: RawFd, room: &EventFd, stop: &EventFd) {
    let mut buf = [0u8; 256];
    while wait(source, stop, None) == Wake::Ready {
        // SAFETY: read writes at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::read(source, buf.as_mut_ptr().cast(), buf.len()) };
        let Ok(n) = usize::try_from(n) else {
            match io::Error::last_os_error().kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => continue,
                _ => return,
            }
        };
        if n == 0 {
            return; // the end of the input: the guest sees no more
        }
        let mut rest = &buf[..n];
        loop {
            rest = &rest[serial.receive(rest)..];
            if rest.is_empty() {
                break;
            }
            match wait(room.as_raw_fd(), stop, Some(INPUT_RETRY)) {
                Wake::Stop => return,
                // Consume the signal; another may come before the FIFO drains again.
                Wake::Ready => drop(room.read()),
                Wake::Timeout => {}
            }
        }
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
mod tests;
