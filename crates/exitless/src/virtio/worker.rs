//! The device thread: owns a device's [`QueueEngine`], sleeps on the queue eventfds (signalled
//! by ioeventfds in the kernel or by the transport after an exit), on its backend's files (a
//! tap), on the line's resample eventfd and on its command eventfd, and does the device's work
//! off the vCPU threads.
//!
//! Transports talk to it with [`Command`]s: activation hands it the queues at DRIVER_OK;
//! reset and queue stop are acknowledged, so when the register reads back the driver knows
//! the device thread no longer uses what it had (an acknowledgement that comes late leaves the
//! register reading as before, with DEVICE_NEEDS_RESET, until it does). Because the thread
//! sends its notifications itself, before it takes the next command, nothing it computed
//! before a reset can be delivered after the reset's acknowledgement (virtio 1.2 §2.4).

use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use virtio_queue::Queue;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::device::QueuePosition;
use super::engine::QueueEngine;
use super::interrupt::Interrupts;
use crate::dma::DmaContext;
use crate::exits::cpu_time;
use crate::logging::DeviceLog;
use crate::seccomp::{self, ThreadKind};

/// Longest a vCPU waits for the device thread to acknowledge a command. The thread's loops are
/// bounded, so this is only reached if the host stalls it; the vCPU then goes on and the
/// command completes when the acknowledgement comes. Short in unit tests, which exercise it.
const ACK_TIMEOUT: Duration = if cfg!(test) {
    Duration::from_millis(300)
} else {
    Duration::from_secs(5)
};

/// The longest the device thread polls a queue's available ring after a pass that used
/// chains, notifications left off (virtio 1.2 §2.7.10, QEMU's `poll-max-ns`), before it turns
/// them on and sleeps (the window adapts below it: `DeviceThread::window`). A kick costs the guest a trip through KVM's ioeventfd and the thread a wake-up
/// (`epoll_wait`, the scheduler: about a third of its time per streamed frame); a stream's next
/// chain comes within a few µs. Short enough that a thread whose driver went quiet spends
/// little: the poll only follows work, so an idle device never polls.
const POLL: Duration = Duration::from_micros(30);

/// The shortest poll worth starting: a window halved below it closes, and reopens at it.
const POLL_MIN: Duration = Duration::from_micros(2);

/// Longest one stretch of polling goes without looking at the epoll set (without sleeping):
/// commands, the line's resample and the stop wait at most this long behind a busy stream.
const POLL_STRETCH: Duration = Duration::from_micros(50);

/// What a transport asks of the device thread.
pub enum Command {
    /// DRIVER_OK: work on these queues through this context, with the features the driver
    /// negotiated (a vhost-user backend is told them; an in-process handler is given them).
    Activate(Vec<Queue>, DmaContext, u64),
    /// The driver reset the device: drop the queues and in-flight state, then acknowledge.
    Reset(SyncSender<()>),
    /// The driver disabled queue `.0`: stop using it, then acknowledge.
    StopQueue(usize, SyncSender<()>),
    /// Work may have become possible on every queue (Bus Master Enable was set).
    KickAll,
    /// Acknowledge once no work is in flight (Bus Master Enable was cleared: nothing may
    /// touch guest memory after the guest's write completes).
    Sync(SyncSender<()>),
    /// A snapshot: finish the work in flight, stop serving the queues (kicks wait) and answer
    /// with each queue's position (none before DRIVER_OK) and the handler's state
    /// (`crate::persist`).
    Pause(SyncSender<Paused>),
    /// A restored device: give the handler the state it saved, and answer how that went.
    RestoreHandler(serde_json::Value, SyncSender<Result<(), String>>),
    /// A migration's switch-over, after [`Command::Pause`]: let a vhost-user backend's
    /// connection go, so that the target on this host can connect to it, then acknowledge.
    /// Nothing for a device served in process or by the kernel's vhost-net.
    Release(SyncSender<()>),
    /// The migration failed after [`Command::Release`]: try once to connect to the backend
    /// again before [`Command::Resume`] (a target that took it lets it go when it sees the
    /// stream end); answer whether it took. If not and `.0` says it was the last try, the
    /// device needs a reset.
    Reclaim(bool, SyncSender<bool>),
    /// Serve the queues again after [`Command::Pause`] or a restore's [`Command::Activate`]:
    /// serve every one once, then acknowledge. A restore waits for it before any vCPU runs,
    /// so work the driver made available before the snapshot is done by then.
    Resume(SyncSender<()>),
}

/// What a paused device thread reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Paused {
    /// Each queue's position, if the device is live.
    pub positions: Option<Vec<QueuePosition>>,
    /// The queue handler's state ([`super::device::QueueHandler::save`]).
    pub handler: Option<serde_json::Value>,
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
        engine: QueueEngine,
        interrupts: Arc<Interrupts>,
        queue_events: Vec<EventFd>,
    ) -> std::io::Result<Self> {
        let log = engine.log().clone();
        Self::start(ThreadKind::Device, name, log, |inbox, wake, stop| {
            let device_thread =
                DeviceThread::new(engine, interrupts, queue_events, inbox, wake, stop)?;
            Ok(move || device_thread.run())
        })
    }

    /// Start a thread of `kind` that takes [`Command`]s: `body` gets its inbox, the eventfd
    /// signalled when a command is sent and the one signalled to stop it, and returns the
    /// loop to run (the device thread's, or the vhost-user thread's).
    pub fn start<F: FnOnce() + Send + 'static>(
        kind: ThreadKind,
        name: String,
        log: Arc<DeviceLog>,
        body: impl FnOnce(Receiver<Command>, Arc<EventFd>, &EventFd) -> std::io::Result<F>,
    ) -> std::io::Result<Self> {
        let stop = EventFd::new(EFD_NONBLOCK)?;
        let wake = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let (commands, inbox) = mpsc::channel();
        let run = body(inbox, wake.clone(), &stop)?;
        let thread = seccomp::spawn(kind, name, run)?;
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

/// The epoll tokens of the device thread's own files. A queue's doorbell (and a backend file
/// that feeds the queue) has the queue's index as its token; these come after the queues.
struct Tokens {
    resample: u64,
    command: u64,
    stop: u64,
}

impl Tokens {
    /// The tokens of a device with `queues` queues.
    fn after(queues: usize) -> Self {
        let queues = queues as u64;
        Tokens {
            resample: queues,
            command: queues + 1,
            stop: queues + 2,
        }
    }

    /// The order the events of one wait are handled in. A resample left over from the
    /// previous interrupt's EOI goes first: handled after new work it would see that work's
    /// status bit and assert the line a second time. Commands go last: work already signalled
    /// is done (and its interrupts sent) before a reset is acknowledged.
    fn rank(&self, token: u64) -> u8 {
        match token {
            t if t == self.stop => 0,
            t if t == self.resample => 1,
            t if t == self.command => 3,
            _ => 2,
        }
    }
}

/// What the device thread's loop works with: the engine, the files it waits on and the
/// commands the transport sends it.
struct DeviceThread {
    engine: QueueEngine,
    interrupts: Arc<Interrupts>,
    queue_events: Vec<EventFd>,
    inbox: Receiver<Command>,
    wake: Arc<EventFd>,
    epoll: Epoll,
    tokens: Tokens,
    /// How many files the epoll set holds: the most events one wait returns.
    watched: usize,
    /// Paused for a snapshot: kicks and backend files wait for [`Command::Resume`].
    paused: bool,
    /// Queues whose notifications are held off while the thread polls them (by index).
    held: Vec<bool>,
    /// While polling: when it ends unless a queue has chains again.
    poll: Option<Instant>,
    /// How long a poll waits for chains now, up to `POLL`: halved each time one waits in
    /// vain, doubled each time the thread, asleep, was kicked sooner than `POLL` (QEMU's
    /// `poll-shrink` and `poll-grow`). On a host whose cores are all busy the guest may not
    /// run while the thread polls, and polling then only takes its core: the window closes.
    window: Duration,
}

impl DeviceThread {
    /// The loop state, with every file it waits on in its epoll set: the doorbells, the
    /// backend's files, the line's resample eventfd, the command and stop eventfds.
    fn new(
        engine: QueueEngine,
        interrupts: Arc<Interrupts>,
        queue_events: Vec<EventFd>,
        inbox: Receiver<Command>,
        wake: Arc<EventFd>,
        stop: &EventFd,
    ) -> std::io::Result<Self> {
        let epoll = Epoll::new()?;
        let tokens = Tokens::after(queue_events.len());
        let watch = |fd: RawFd, events: EventSet, token: u64| {
            epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
        };
        // Edge-triggered: a kick (every eventfd signal, KVM's ioeventfd or a write) makes its
        // doorbell ready once, so the thread never reads the eventfd (a system call per kick)
        // to clear it. The counter only grows; it would take 2^64 kicks to fill it.
        for (i, e) in queue_events.iter().enumerate() {
            watch(
                e.as_raw_fd(),
                EventSet::IN | EventSet::EDGE_TRIGGERED,
                i as u64,
            )?;
        }
        // A backend's file (a tap) wakes the queue it feeds as its doorbell would; edge-
        // triggered, so frames left waiting for receive buffers do not wake the thread again
        // until more arrive or the driver kicks. The engine, which owns the files, lives as
        // long as the epoll set.
        let sources = engine.wake_sources();
        for &(fd, q) in &sources {
            watch(fd, EventSet::IN | EventSet::EDGE_TRIGGERED, q as u64)?;
        }
        if let Some(r) = interrupts.resample_fd() {
            watch(r.as_raw_fd(), EventSet::IN, tokens.resample)?;
        }
        for (fd, token) in [(&*wake, tokens.command), (stop, tokens.stop)] {
            watch(fd.as_raw_fd(), EventSet::IN, token)?;
        }
        let watched = queue_events.len() + 3 + sources.len();
        let held = vec![false; queue_events.len()];
        Ok(DeviceThread {
            engine,
            interrupts,
            queue_events,
            inbox,
            wake,
            epoll,
            tokens,
            watched,
            paused: false,
            held,
            poll: None,
            window: POLL,
        })
    }

    /// The thread's body: wait, handle what is ready, poll the queues that had work, until the
    /// stop eventfd (or an epoll failure) ends it.
    fn run(mut self) {
        let mut events = vec![EpollEvent::default(); self.watched];
        let mut cpu = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
        loop {
            // The device's work is what its thread spent between looks at the epoll set: one
            // clock read per sleep, or per `POLL_STRETCH` of polling, not per pass. A stream
            // polled without sleeping is still counted as it goes, at most a stretch late.
            let now = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
            self.engine.log().add_thread_cpu(now.saturating_sub(cpu));
            cpu = now;
            // While polling, the set is only looked at, not slept on.
            let timeout = if self.poll.is_some() { 0 } else { -1 };
            let slept = Instant::now();
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("device thread stopped: epoll: {e}");
                    return;
                }
            };
            let ready = &mut events[..n];
            if timeout < 0
                && slept.elapsed() < POLL
                && ready.iter().any(|ev| ev.data() < self.tokens.resample)
            {
                // Kicked soon after it slept: a longer poll would have caught it.
                self.window = (self.window * 2).clamp(POLL_MIN, POLL);
            }
            ready.sort_by_key(|ev| self.tokens.rank(ev.data()));
            for ev in ready.iter() {
                if self.handle(ev.data()).is_break() {
                    return;
                }
            }
            self.poll_rings();
        }
    }

    /// While polling: look at the held queues' available rings, serving those that have
    /// chains, until `POLL` passes without any (then turn their notifications on again) or
    /// `POLL_STRETCH` passes (then look at the epoll set, without sleeping, and come back).
    fn poll_rings(&mut self) {
        let start = Instant::now();
        while self.poll.is_some() {
            for q in 0..self.held.len() {
                if self.held[q] && self.engine.polled(q) {
                    self.serve_queue(q);
                }
            }
            let now = Instant::now();
            if self.poll.is_some_and(|deadline| now >= deadline) {
                // Waited in vain.
                self.window /= 2;
                if self.window < POLL_MIN {
                    self.window = Duration::ZERO;
                }
                self.release_all();
            } else if now.duration_since(start) >= POLL_STRETCH {
                return;
            }
            // Nothing yet. Not `yield_now`: on a host with fewer cores than busy threads it
            // put the thread behind every other one (2 runs each here, 3-10x slower streams).
            std::hint::spin_loop();
        }
    }

    /// End the poll: every held queue's notifications on again, and a queue whose driver made
    /// chains available meanwhile (without notifying) looked at as if it had.
    fn release_all(&mut self) {
        self.poll = None;
        for q in 0..self.held.len() {
            self.release(q);
        }
    }

    /// Stop holding queue `q`'s notifications off; if chains came meanwhile, come back to it
    /// through its doorbell, as the kick the driver did not send would have.
    fn release(&mut self, q: usize) {
        self.held[q] = false;
        if self.engine.release(q)
            && let Some(e) = self.queue_events.get(q)
        {
            let _ = e.write(1);
        }
    }

    /// Handle one ready file; breaks when the thread is to stop.
    fn handle(&mut self, token: u64) -> ControlFlow<()> {
        if token == self.tokens.stop {
            return ControlFlow::Break(());
        } else if token == self.tokens.resample {
            self.interrupts.resample();
        } else if token == self.tokens.command {
            let _ = self.wake.read();
            // A command may take the queues or the device's mastering away: no ring is held
            // off (or read by a poll) once it is acknowledged.
            self.release_all();
            self.run_commands();
        } else if let Ok(q) = usize::try_from(token) {
            self.serve_queue(q);
        }
        ControlFlow::Continue(())
    }

    /// Queue `q` was kicked (or its backend has frames): let the engine work on it and send
    /// the notifications due.
    fn serve_queue(&mut self, q: usize) {
        if q >= self.queue_events.len() || self.paused {
            // Resume looks at every queue.
            return;
        }
        self.engine.hold(q);
        let work = self.engine.process(q);
        for n in work.notifications() {
            self.interrupts.notify(n);
        }
        // A driver that asked for an interrupt waits for it: its next chains follow its
        // handling of the interrupt (an exit at least), not a stream, and polling for them
        // would only spin and take its kick away. One that did not is streaming: poll the
        // queue for a while, its notifications off.
        let notified = work.notifications().next().is_some();
        if work.used && !notified && !self.window.is_zero() {
            self.held[q] = true;
            self.poll = Some(Instant::now() + self.window);
        } else if work.used || !self.held[q] {
            self.release(q);
        }
        if work.more {
            // Come back after the other events: a driver that keeps the queue full cannot
            // starve a reset or another queue.
            let _ = self.queue_events[q].write(1);
        }
    }

    /// Carry out every command waiting in the inbox, acknowledging those that ask for it.
    fn run_commands(&mut self) {
        while let Ok(command) = self.inbox.try_recv() {
            match command {
                Command::Activate(queues, dma, features) => {
                    self.engine.activate(queues, dma, features);
                    // Buffers made available before DRIVER_OK (allowed, §3.1.1) get looked at.
                    kick(&self.queue_events);
                }
                Command::Reset(ack) => {
                    self.engine.reset();
                    // Cleared here, before the acknowledgement: a line resample handled after
                    // it must not see the old status and assert the line again.
                    self.interrupts.reset();
                    let _ = ack.send(());
                }
                Command::StopQueue(index, ack) => {
                    self.engine.stop_queue(index);
                    let _ = ack.send(());
                }
                Command::KickAll => kick(&self.queue_events),
                Command::Sync(ack) | Command::Release(ack) => {
                    let _ = ack.send(());
                }
                Command::Reclaim(_, ack) => {
                    let _ = ack.send(true);
                }
                Command::Pause(ack) => {
                    // Work already signalled was done before this command (`Tokens::rank`).
                    self.paused = true;
                    let _ = ack.send(Paused {
                        positions: self.engine.positions(),
                        handler: self.engine.handler_state(),
                    });
                }
                Command::RestoreHandler(state, ack) => {
                    let _ = ack.send(self.engine.restore_handler(state));
                }
                Command::Resume(ack) => {
                    self.paused = false;
                    for q in 0..self.queue_events.len() {
                        self.serve_queue(q);
                    }
                    let _ = ack.send(());
                }
            }
        }
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

    /// Serve the queues again ([`Command::Resume`]); returns once each was served once.
    pub fn resume(&self) -> Result<(), PendingAck> {
        self.call(Command::Resume)
    }

    /// Let a paused device's vhost-user backend go ([`Command::Release`]).
    pub fn release(&self) -> Result<(), PendingAck> {
        self.call(Command::Release)
    }

    /// Try to connect to the backend let go again ([`Command::Reclaim`], `last` if no try
    /// follows): whether it took.
    pub fn reclaim(&self, last: bool) -> bool {
        matches!(self.ask(|ack| Command::Reclaim(last, ack)), Ok(Some(true)))
    }

    /// Pause the device thread for a snapshot ([`Command::Pause`]): what it reports; the
    /// timeout it waited if the thread did not answer.
    pub fn pause(&self) -> Result<Paused, Duration> {
        self.ask(Command::Pause)
            .map(|paused| paused.unwrap_or_default())
    }

    /// Give a restored device's handler its saved state ([`Command::RestoreHandler`]).
    pub fn restore_handler(&self, state: serde_json::Value) -> Result<(), String> {
        match self.ask(|ack| Command::RestoreHandler(state, ack)) {
            Ok(Some(result)) => result,
            Ok(None) => Err("the device thread has ended".into()),
            Err(waited) => Err(format!(
                "the device thread did not answer within {waited:?}"
            )),
        }
    }

    /// Send the command `make` builds around an answer channel and wait for the answer: None
    /// if the thread has ended, the timeout it waited if it did not answer.
    fn ask<T>(&self, make: impl FnOnce(SyncSender<T>) -> Command) -> Result<Option<T>, Duration> {
        let (ack, acked) = mpsc::sync_channel(1);
        self.send(make(ack));
        match acked.recv_timeout(ACK_TIMEOUT) {
            Ok(answer) => Ok(Some(answer)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Ok(None),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(ACK_TIMEOUT),
        }
    }
}

/// Signal every queue's eventfd, as if the driver had kicked them all.
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

#[cfg(test)]
mod tests;
