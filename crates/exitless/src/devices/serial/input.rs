//! The console's input side: the console input thread feeds what its source gives (stdin for
//! `exitless run`) into the UART's 64-byte receive FIFO, which raises the receive interrupt when
//! the guest enabled it, and waits for the guest to empty the FIFO before it puts more, so no
//! byte is lost and a vCPU never waits.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::{Arc, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use vm_superio::serial::SerialEvents;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::SerialConsole;
use crate::seccomp::{self, ThreadKind};

/// Signals the console input thread, once there is one, when the guest has read the last byte
/// of the receive FIFO: there is room for more input. Clones share the thread's signal, so a
/// UART restored from a snapshot keeps its input thread.
#[derive(Clone, Default)]
pub struct InputRoom(Arc<OnceLock<Arc<EventFd>>>);

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

/// How long the input thread waits for room in the receive FIFO before it tries again: the
/// guest may have put the UART in loopback mode, where input is dropped and no room is ever
/// signalled.
const INPUT_RETRY: Duration = Duration::from_millis(100);

impl SerialConsole {
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
        self.spawn_input_with(source, || {})
    }

    /// [`SerialConsole::spawn_input`], calling `on_input` each time input arrives (before it
    /// reaches the FIFO): a key wakes a sleeping machine (ACPI S3).
    pub fn spawn_input_with<S: AsFd + Send + 'static>(
        self: &Arc<Self>,
        source: S,
        on_input: impl Fn() + Send + 'static,
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
            pump(
                &serial,
                source.as_fd().as_raw_fd(),
                &room,
                &thread_stop,
                &on_input,
            )
        })?;
        Ok(ConsoleInput {
            stop,
            thread: Some(thread),
        })
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
fn pump(
    serial: &SerialConsole,
    source: RawFd,
    room: &EventFd,
    stop: &EventFd,
    on_input: &dyn Fn(),
) {
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
        on_input();
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
