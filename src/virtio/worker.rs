//! The device thread: owns a device's [`QueueEngine`], sleeps on the queue eventfds (signalled
//! by ioeventfds in the kernel or by the transport after an exit), on its backend's files (a
//! tap), on the line's resample eventfd and on its command eventfd, and does the device's work
//! off the vCPU threads.
//!
//! Transports talk to it with [`Command`]s: activation hands it the queues at DRIVER_OK;
//! reset and queue stop are acknowledged, so when the register reads back the driver knows
//! the device thread no longer uses what it had (an acknowledgement that comes late leaves the
//! register reading as before, with DEVICE_NEEDS_RESET, until it does). Because the thread sends its notifications
//! itself, before it takes the next command, nothing it computed before a reset can be
//! delivered after the reset's acknowledgement (virtio 1.2 §2.4).

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use virtio_queue::Queue;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::engine::QueueEngine;
use super::interrupt::Interrupts;
use crate::dma::DmaContext;
use crate::logging::DeviceLog;
use crate::seccomp::{self, ThreadKind};
use crate::stats::cpu_time;

/// Longest a vCPU waits for the device thread to acknowledge a command. The thread's loops are
/// bounded, so this is only reached if the host stalls it; the vCPU then goes on and the
/// command completes when the acknowledgement comes. Short in unit tests, which exercise it.
const ACK_TIMEOUT: Duration = if cfg!(test) {
    Duration::from_millis(300)
} else {
    Duration::from_secs(5)
};

/// What a transport asks of the device thread.
pub enum Command {
    /// DRIVER_OK: work on these queues through this context.
    Activate(Vec<Queue>, DmaContext),
    /// The driver reset the device: drop the queues and in-flight state, then acknowledge.
    Reset(SyncSender<()>),
    /// The driver disabled queue `.0`: stop using it, then acknowledge.
    StopQueue(usize, SyncSender<()>),
    /// Work may have become possible on every queue (Bus Master Enable was set).
    KickAll,
    /// Acknowledge once no work is in flight (Bus Master Enable was cleared: nothing may
    /// touch guest memory after the guest's write completes).
    Sync(SyncSender<()>),
}

/// An acknowledgement that did not come in time: the device thread is still working.
pub struct PendingAck(Receiver<()>);

impl PendingAck {
    /// Whether it has come by now (or the thread has ended, holding nothing).
    pub fn arrived(&self) -> bool {
        !matches!(self.0.try_recv(), Err(mpsc::TryRecvError::Empty))
    }
}

/// A running device thread; dropping it stops and joins the thread.
pub struct Worker {
    handle: WorkerHandle,
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

/// What a transport keeps to send the device thread [`Command`]s.
#[derive(Clone)]
pub struct WorkerHandle {
    commands: Sender<Command>,
    wake: Arc<EventFd>,
    log: Arc<DeviceLog>,
}

impl Worker {
    /// Start the thread for `engine`, woken by `queue_events`, notifying through `interrupts`.
    pub fn spawn(
        name: String,
        mut engine: QueueEngine,
        interrupts: Arc<Interrupts>,
        queue_events: Vec<EventFd>,
    ) -> std::io::Result<Self> {
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let wake = EventFd::new(EFD_NONBLOCK)?;
        let epoll = Epoll::new()?;
        let queues = queue_events.len();
        let (resample_token, command_token, stop_token) =
            (queues as u64, queues as u64 + 1, queues as u64 + 2);
        for (i, e) in queue_events.iter().enumerate() {
            epoll.ctl(
                ControlOperation::Add,
                e.as_raw_fd(),
                EpollEvent::new(EventSet::IN, i as u64),
            )?;
        }
        // A backend's file (a tap) wakes the queue it feeds as its doorbell would; edge-
        // triggered, so frames left waiting for receive buffers do not wake the thread again
        // until more arrive or the driver kicks. The engine, which owns the files, lives as
        // long as the epoll set.
        let sources = engine.wake_sources();
        for &(fd, q) in &sources {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, q as u64),
            )?;
        }
        if let Some(r) = interrupts.resample_fd() {
            epoll.ctl(
                ControlOperation::Add,
                r.as_raw_fd(),
                EpollEvent::new(EventSet::IN, resample_token),
            )?;
        }
        for (fd, token) in [(&wake, command_token), (&stop, stop_token)] {
            epoll.ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, token),
            )?;
        }
        let log = engine.log().clone();
        let (commands, inbox) = mpsc::channel();
        let wake = Arc::new(wake);
        let wake_clone = wake.clone();
        let thread = seccomp::spawn(ThreadKind::Device, name, move || {
            let mut events = vec![EpollEvent::default(); queues + 3 + sources.len()];
            let mut cpu = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
            loop {
                // The device's work is what its thread spent between waits.
                let now = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
                engine.log().add_thread_cpu(now.saturating_sub(cpu));
                cpu = now;
                let n = match epoll.wait(-1, &mut events) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log::error!("device thread stopped: epoll: {e}");
                        return;
                    }
                };
                // A resample left over from the previous interrupt's EOI goes first: handled
                // after new work it would see that work's status bit and assert the line a
                // second time. Commands go last: work already signalled is done (and its
                // interrupts sent) before a reset is acknowledged.
                let ready = &mut events[..n];
                ready.sort_by_key(|ev| match ev.data() {
                    t if t == stop_token => 0,
                    t if t == resample_token => 1,
                    t if t == command_token => 3,
                    _ => 2,
                });
                for ev in ready.iter() {
                    let token = ev.data();
                    if token == stop_token {
                        return;
                    } else if token == resample_token {
                        interrupts.resample();
                    } else if token == command_token {
                        let _ = wake_clone.read();
                        run_commands(&inbox, &mut engine, &interrupts, &queue_events);
                    } else if let Some((q, e)) = usize::try_from(token)
                        .ok()
                        .and_then(|q| Some((q, queue_events.get(q)?)))
                    {
                        let _ = e.read();
                        let work = engine.process(q);
                        for n in work.notifications {
                            interrupts.notify(n);
                        }
                        if work.more {
                            // Come back after the other events: a driver that keeps the
                            // queue full cannot starve a reset or another queue.
                            let _ = e.write(1);
                        }
                    }
                }
            }
        })?;
        Ok(Worker {
            handle: WorkerHandle {
                commands,
                wake,
                log,
            },
            stop,
            thread: Some(thread),
        })
    }

    /// A handle for the transport.
    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }
}

impl WorkerHandle {
    /// Send `command` without waiting.
    pub fn send(&self, command: Command) {
        if self.commands.send(command).is_ok() {
            let _ = self.wake.write(1);
        }
    }

    /// Send the command `make` builds around an acknowledgement channel and wait for the
    /// acknowledgement; if it does not come in time (the thread is still busy, so it may still
    /// use what the command was to take away), the caller gets it to look at later. A thread
    /// that has ended holds nothing and counts as done.
    fn call(&self, make: impl FnOnce(SyncSender<()>) -> Command) -> Result<(), PendingAck> {
        let (ack, acked) = mpsc::sync_channel(1);
        self.send(make(ack));
        match acked.recv_timeout(ACK_TIMEOUT) {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.log.warn(format_args!(
                    "the device thread did not acknowledge within {ACK_TIMEOUT:?}"
                ));
                Err(PendingAck(acked))
            }
            _ => Ok(()),
        }
    }

    /// Reset the device thread's side; returns once it no longer uses the queues.
    pub fn reset(&self) -> Result<(), PendingAck> {
        self.call(Command::Reset)
    }

    /// Stop queue `index`; returns once the device thread no longer uses it.
    pub fn stop_queue(&self, index: usize) -> Result<(), PendingAck> {
        self.call(|ack| Command::StopQueue(index, ack))
    }

    /// Returns once no work is in flight on the device thread.
    pub fn sync(&self) -> Result<(), PendingAck> {
        self.call(Command::Sync)
    }
}

fn run_commands(
    inbox: &Receiver<Command>,
    engine: &mut QueueEngine,
    interrupts: &Interrupts,
    queue_events: &[EventFd],
) {
    while let Ok(command) = inbox.try_recv() {
        match command {
            Command::Activate(queues, dma) => {
                engine.activate(queues, dma);
                // Buffers made available before DRIVER_OK (allowed, §3.1.1) get looked at.
                kick(queue_events);
            }
            Command::Reset(ack) => {
                engine.reset();
                // Cleared here, before the acknowledgement: a line resample handled after it
                // must not see the old status and assert the line again.
                interrupts.reset();
                let _ = ack.send(());
            }
            Command::StopQueue(index, ack) => {
                engine.stop_queue(index);
                let _ = ack.send(());
            }
            Command::KickAll => kick(queue_events),
            Command::Sync(ack) => {
                let _ = ack.send(());
            }
        }
    }
}

fn kick(queue_events: &[EventFd]) {
    for e in queue_events {
        let _ = e.write(1);
    }
}

/// Longest a dropped worker waits for its thread: one stuck in a backend that never returns
/// is reported and abandoned, so tearing a machine down always ends.
const STOP_DEADLINE: Duration = if cfg!(test) {
    Duration::from_millis(500)
} else {
    Duration::from_secs(5)
};

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let deadline = std::time::Instant::now() + STOP_DEADLINE;
            while !t.is_finished() && std::time::Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                let name = t.thread().name().unwrap_or("device").to_owned();
                log::error!("{name} thread did not stop within {STOP_DEADLINE:?}; abandoned");
            }
        }
    }
}
