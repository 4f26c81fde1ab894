//! The vhost-user thread: one per vhost-user device, under its own seccomp filter. It takes the
//! transport's [`Command`]s as a device thread does, but the queues are the backend's: it
//! configures them at DRIVER_OK, stops them (VHOST_USER_GET_VRING_BASE, answered once the
//! backend has stopped the ring) before a reset, queue stop or Bus Master clear is
//! acknowledged, swaps the call fds when a vector's deliverability changes ([`super::calls`]),
//! serves a multiqueue NIC's control queue ([`super::control`]), and turns a hangup or a
//! nonsense answer into DEVICE_NEEDS_RESET, connecting again at the driver's reset (and
//! meanwhile every 100 ms for `reconnect=`).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Weak};
use std::time::Instant;

use virtio_queue::{Queue, QueueT};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::backend::Backend;
use super::calls::{CallWatcher, Calls};
use super::connection::Connection;
use super::control::NetControl;
use super::deadline::{EXCHANGE_DEADLINE, Exchange, Watchdog};
use super::{VhostUserSpec, VhostUserWork};
use crate::irq::VectorWatcher;
use crate::seccomp::ThreadKind;
use crate::virtio::device::QueuePosition;
use crate::virtio::device::{DeviceHealth, Notification};
use crate::virtio::interrupt::Interrupts;
use crate::virtio::notify::QueueEvents;
use crate::virtio::state::VirtioState;
use crate::virtio::worker::{Command, Paused, Worker};
use vm_memory::GuestMemoryMmap;

/// How often `reconnect=` tries the socket again, in ms (epoll's timeout).
const RETRY_EVERY_MS: i32 = 100;

/// The rings of the last activation, to start again after a Bus Master clear.
struct Rings {
    queues: Vec<Queue>,
    features: u64,
}

/// The thread's state.
struct VhostUserThread {
    spec: VhostUserSpec,
    /// The features offered to the driver: a backend connected again must offer them all.
    offered: u64,
    mem: GuestMemoryMmap,
    /// None after a vhost-user backend's hangup, until connected again (the kernel's
    /// vhost-net stays).
    backend: Option<Backend>,
    /// The deadline on every exchange with a vhost-user backend (the kernel's has none).
    watchdog: Option<Watchdog>,
    kicks: Vec<EventFd>,
    calls: Calls,
    watcher: Arc<CallWatcher>,
    resyncs: Receiver<SyncSender<()>>,
    interrupts: Arc<Interrupts>,
    health: Arc<DeviceHealth>,
    inbox: Receiver<Command>,
    wake: Arc<EventFd>,
    epoll: Epoll,
    rings: Option<Rings>,
    /// Rings the backend runs now, one per backend queue.
    started: Vec<bool>,
    /// A multiqueue NIC's control queue, served here.
    control: Option<NetControl>,
    /// Keep trying to connect until then (`reconnect=`).
    retry_until: Option<Instant>,
    /// The backend was let go for a migration's target ([`Command::Release`]).
    released: bool,
}

/// Epoll tokens past the watch fds' (a watch fd's token is its queue).
const COMMAND: u64 = 1 << 32;
const STOP: u64 = COMMAND + 1;
const RESYNC: u64 = COMMAND + 2;
const SOCKET: u64 = COMMAND + 3;
const CONTROL: u64 = COMMAND + 4;

/// Start the vhost-user thread of a transport whose registers are `state`.
pub(in crate::virtio) fn spawn(
    name: String,
    state: &VirtioState,
    work: VhostUserWork,
    interrupts: &Arc<Interrupts>,
    events: &QueueEvents,
) -> std::io::Result<Worker> {
    let kicks = events.clones()?;
    let calls = Calls::new(work.spec.queue_count())?;
    let (watcher, resyncs) = CallWatcher::new()?;
    if let Some(msi) = interrupts.msi() {
        let w: Arc<dyn VectorWatcher> = watcher.clone();
        msi.set_watcher(Arc::downgrade(&w) as Weak<dyn VectorWatcher>);
    }
    let health = state.health().clone();
    let interrupts = interrupts.clone();
    let VhostUserWork {
        spec,
        backend,
        watchdog,
        offered,
        mem,
    } = work;
    Worker::start(
        ThreadKind::VhostUser,
        name,
        health.log().clone(),
        |inbox, wake, stop| {
            let epoll = Epoll::new()?;
            let started = vec![false; spec.queue_count()];
            let control = spec
                .control_queue()
                .then(|| NetControl::new(spec.queues.into()));
            let t = VhostUserThread {
                spec,
                offered,
                mem,
                backend: Some(backend),
                watchdog,
                kicks,
                calls,
                watcher,
                resyncs,
                interrupts,
                health,
                inbox,
                wake,
                epoll,
                rings: None,
                started,
                control,
                retry_until: None,
                released: false,
            };
            t.watch_own_files(stop)?;
            Ok(move || t.run())
        },
    )
}

impl VhostUserThread {
    /// Put the watch fds, the command, stop and resync eventfds and the socket in the set.
    fn watch_own_files(&self, stop: &EventFd) -> std::io::Result<()> {
        for (q, w) in self.calls.watches().iter().enumerate() {
            self.watch(w.as_raw_fd(), EventSet::IN, q as u64)?;
        }
        self.watch(self.wake.as_raw_fd(), EventSet::IN, COMMAND)?;
        self.watch(stop.as_raw_fd(), EventSet::IN, STOP)?;
        self.watch(self.watcher.wake_fd(), EventSet::IN, RESYNC)?;
        if let Some(c) = &self.control {
            self.watch(self.kicks[c.index()].as_raw_fd(), EventSet::IN, CONTROL)?;
        }
        self.watch_socket()
    }

    fn watch(&self, fd: RawFd, events: EventSet, token: u64) -> std::io::Result<()> {
        self.epoll
            .ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
    }

    /// A vhost-user backend sends nothing unasked (no backend channel is set up): the socket
    /// becoming readable means it hung up or is talking nonsense.
    fn watch_socket(&self) -> std::io::Result<()> {
        match self.backend.as_ref().and_then(Backend::hangup_fd) {
            Some(fd) => self.watch(
                fd,
                EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP,
                SOCKET,
            ),
            None => Ok(()),
        }
    }

    /// The loop: until the stop eventfd (or an epoll failure).
    fn run(mut self) {
        self.watcher.running_on_this_thread();
        let mut events = vec![EpollEvent::default(); self.kicks.len() + 5];
        loop {
            let timeout = if self.retry_until.is_some() {
                RETRY_EVERY_MS
            } else {
                -1
            };
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    log::error!("vhost-user thread stopped: epoll: {e}");
                    return;
                }
            };
            for ev in &events[..n] {
                // The events that talk to the backend: each exchange is done within the
                // deadline, or the socket is shut down and the device needs a reset. (A watch
                // fd's drain, the hot one, sends it nothing and arms nothing.)
                match ev.data() {
                    STOP => return,
                    COMMAND => {
                        let _exchange = self.arm();
                        let _ = self.wake.read();
                        self.run_commands();
                    }
                    RESYNC => {
                        let _exchange = self.arm();
                        self.resync();
                    }
                    CONTROL => {
                        let _exchange = self.arm();
                        self.serve_control();
                    }
                    SOCKET => self.disconnect(&"the vhost-user backend hung up"),
                    q => {
                        if let Ok(q) = usize::try_from(q) {
                            self.calls.drain(&self.interrupts, q);
                        }
                    }
                }
            }
            self.retry();
        }
    }

    /// While `reconnect=` runs: try the socket again.
    fn retry(&mut self) {
        let Some(until) = self.retry_until else {
            return;
        };
        if self.backend.is_some() || Instant::now() > until || self.reconnect() {
            self.retry_until = None;
        }
    }

    /// Connect to the socket again; true if the new backend offers every feature the old one
    /// gave the driver (a driver may have negotiated any of them).
    fn reconnect(&mut self) -> bool {
        let Some(watchdog) = &self.watchdog else {
            return false;
        };
        let Ok(c) = Connection::open(&self.spec, watchdog) else {
            return false;
        };
        if c.features & self.offered != self.offered {
            return false;
        }
        self.backend = Some(Backend::User(c));
        for q in 0..self.started.len() {
            self.calls.forget(q);
        }
        self.health
            .log()
            .warn(format_args!("connected to the vhost-user backend again"));
        self.watch_socket().is_ok()
    }

    /// Arm the deadline for the exchanges of one event, if connected to a vhost-user backend
    /// (the kernel's ioctls need none).
    fn arm(&self) -> Option<Exchange> {
        let fd = self.backend.as_ref()?.hangup_fd()?;
        Some(self.watchdog.as_ref()?.arm(fd))
    }

    /// The backend hung up, answered nonsense or did not answer in time: drop it, the device
    /// needs a reset (one log line), the driver hears it through a configuration change
    /// (virtio 1.2 §2.1.2). The kernel's vhost-net, whose ioctl failed, is kept with its rings
    /// stopped: the driver's reset sets them up again.
    fn disconnect(&mut self, why: &dyn std::fmt::Display) {
        if let Some(w) = &self.watchdog {
            w.disarm();
        }
        match self.backend.take() {
            None => return,
            Some(Backend::Kernel(mut k)) => {
                k.release();
                self.backend = Some(Backend::Kernel(k));
            }
            Some(Backend::User(_)) => {}
        }
        self.started.fill(false);
        self.rings = None;
        let silent;
        let why = if self.watchdog.as_ref().is_some_and(Watchdog::fired) {
            silent = format!(
                "the vhost-user backend did not answer within {} s ({why})",
                EXCHANGE_DEADLINE.as_secs()
            );
            &silent as &dyn std::fmt::Display
        } else {
            why
        };
        self.lost(why);
    }

    /// No backend, for `why`: the device needs a reset, which the driver hears through a
    /// configuration change; `reconnect=` keeps trying meanwhile.
    fn lost(&mut self, why: &dyn std::fmt::Display) {
        if self.health.fail(why) {
            self.interrupts.notify(Notification::Config);
        }
        self.retry_until = self.spec.reconnect.map(|d| Instant::now() + d);
    }

    /// Carry out every command waiting, acknowledging those that ask for it.
    fn run_commands(&mut self) {
        while let Ok(command) = self.inbox.try_recv() {
            match command {
                Command::Activate(mut queues, dma, features) => {
                    // The backend's queues, then the control queue (if any) for this thread.
                    let own = queues.split_off(self.started.len().min(queues.len()));
                    if let Some(c) = &mut self.control {
                        c.activate(own.into_iter().next(), dma);
                    }
                    let rings = Rings { queues, features };
                    if self.backend.is_none() {
                        // Hung up before DRIVER_OK: the device stays broken.
                        if self.health.fail(&"no vhost-user backend at DRIVER_OK") {
                            self.interrupts.notify(Notification::Config);
                        }
                    } else {
                        self.start(&rings);
                        self.rings = Some(rings);
                        self.serve_control();
                    }
                }
                Command::Reset(ack) => {
                    self.stop_all();
                    if let Some(b) = &mut self.backend {
                        b.reset();
                    }
                    self.rings = None;
                    if let Some(c) = &mut self.control {
                        c.reset();
                    }
                    self.interrupts.reset();
                    if self.backend.is_none() {
                        self.reconnect();
                    }
                    let _ = ack.send(());
                }
                Command::StopQueue(q, ack) => {
                    match &mut self.control {
                        Some(c) if q == c.index() => c.stop(),
                        _ => {
                            self.stop(q);
                        }
                    }
                    let _ = ack.send(());
                }
                Command::Sync(ack) => {
                    self.stop_at_bases();
                    let _ = ack.send(());
                }
                Command::Pause(ack) => {
                    self.stop_at_bases();
                    let _ = ack.send(self.paused());
                }
                Command::Release(ack) => {
                    // Its rings stopped at the pause; the socket closes with the connection,
                    // whose fd the watchdog must no longer hold.
                    if let Some(Backend::User(_)) = self.backend {
                        if let Some(w) = &self.watchdog {
                            w.disarm();
                        }
                        self.backend = None;
                        self.released = true;
                    }
                    let _ = ack.send(());
                }
                Command::Reclaim(last, ack) => {
                    let back = !self.released || self.reconnect();
                    if back || last {
                        self.released = false;
                    }
                    if !back && last {
                        self.lost(
                            &"the vhost-user backend took no connection after the failed migration",
                        );
                    }
                    let _ = ack.send(back);
                }
                Command::RestoreHandler(state, ack) => {
                    let restored = match &mut self.control {
                        Some(c) => c.restore(state),
                        None => Err("a vhost-user backend keeps its own state".into()),
                    };
                    let _ = ack.send(restored);
                }
                Command::KickAll => self.restart(),
                // The backend serves the rings; the control queue is served here.
                Command::Resume(ack) => {
                    self.restart();
                    let _ = ack.send(());
                }
            }
        }
    }

    /// What a pause reports, the rings stopped: the backend has finished with what it took
    /// once GET_VRING_BASE answers (every chain it took is used), so both positions of a ring
    /// are its base; a multiqueue NIC's control queue, served here, comes last, and its state
    /// is the active pair count.
    fn paused(&self) -> Paused {
        let positions = self.rings.as_ref().map(|r| {
            let rings = r.queues.iter().map(|q| QueuePosition {
                next_avail: q.next_avail(),
                next_used: q.next_avail(),
            });
            let control = self.control.as_ref().map(|c| {
                c.position().unwrap_or(QueuePosition {
                    next_avail: 0,
                    next_used: 0,
                })
            });
            rings.chain(control).collect()
        });
        Paused {
            positions,
            handler: self.control.as_ref().map(NetControl::save),
        }
    }

    /// Stop every running ring, and restart them later at the bases they stopped at.
    fn stop_at_bases(&mut self) {
        let bases = self.stop_all();
        if let Some(r) = &mut self.rings {
            for (queue, base) in r.queues.iter_mut().zip(bases) {
                if let Some(b) = base {
                    queue.set_next_avail(b);
                }
            }
        }
    }

    /// Stop every running ring; the bases they stopped at.
    fn stop_all(&mut self) -> Vec<Option<u16>> {
        (0..self.started.len()).map(|q| self.stop(q)).collect()
    }

    /// Stop ring `q` if it runs: GET_VRING_BASE returns once the backend has stopped it.
    fn stop(&mut self, q: usize) -> Option<u16> {
        if !self.started.get(q).copied().unwrap_or(false) {
            return None;
        }
        self.started[q] = false;
        self.calls.forget(q);
        match self.backend.as_mut()?.stop(q) {
            Ok(base) => Some(base),
            Err(e) => {
                self.disconnect(&format_args!(
                    "the vhost backend: stopping ring {q} failed: {e}"
                ));
                None
            }
        }
    }

    /// Hand the backend the rings (DRIVER_OK, or Bus Master set again after a clear).
    fn start(&mut self, rings: &Rings) {
        if let Err(e) = self.configure(rings) {
            self.disconnect(&format_args!("the vhost backend: {e}"));
        }
    }

    /// The messages of DRIVER_OK: features, memory table, then each ready ring's size,
    /// addresses, base, call and kick fds, and enable.
    fn configure(&mut self, rings: &Rings) -> Result<(), String> {
        let Some(b) = self.backend.as_mut() else {
            return Ok(());
        };
        let err = |what: &'static str| move |e: vhost::Error| format!("{what} failed: {e}");
        b.set_features_and_memory(rings.features, &self.mem)?;
        for (q, queue) in rings.queues.iter().enumerate() {
            if !queue.ready() {
                continue;
            }
            b.set_ring(q, queue, &self.mem)?;
            self.calls
                .sync(b, &self.interrupts, q)
                .map_err(err("SET_VRING_CALL"))?;
            b.set_kick(q, &self.kicks[q])
                .map_err(err("SET_VRING_KICK"))?;
            // A multiqueue NIC's rings past its active pairs stay disabled (a vhost-user
            // backend's start so with protocol features, which MQ needs; the kernel's until
            // given the tap) until the driver sets more.
            if self.control.as_ref().is_none_or(|c| c.ring_enabled(q)) {
                b.enable(q, true).map_err(err("SET_VRING_ENABLE"))?;
            }
            self.started[q] = true;
        }
        Ok(())
    }

    /// A vector's deliverability changed (a vCPU waits on the requests): give each running
    /// ring's backend the call fd it should hold, then acknowledge the requests taken before
    /// the swap. One sent during or after it is left for the next round (its wake-up is still
    /// to come or unread): acknowledged here, it would let its vCPU's write complete with the
    /// backend still holding the fd of the change before.
    fn resync(&mut self) {
        self.watcher.woken();
        let waiting: Vec<SyncSender<()>> = self.resyncs.try_iter().collect();
        let mut failed = None;
        if let Some(b) = self.backend.as_mut() {
            for q in 0..self.started.len() {
                if self.started[q]
                    && let Err(e) = self.calls.sync(b, &self.interrupts, q)
                {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            self.disconnect(&format_args!(
                "the vhost backend: SET_VRING_CALL failed: {e}"
            ));
        }
        for ack in waiting {
            let _ = ack.send(());
        }
    }

    /// Work may have become possible again (Bus Master set, or a resume): start the rings if
    /// none runs, and serve the control queue. A device that needs a reset starts nothing
    /// until the driver's reset and DRIVER_OK (a backend kept or connected again meanwhile
    /// would otherwise run the rings of a device the driver was told is broken).
    fn restart(&mut self) {
        if self.health.needs_reset() {
            return;
        }
        if let Some(r) = self.rings.take() {
            if !self.started.iter().any(|&s| s) {
                self.start(&r);
            }
            self.rings = Some(r);
        }
        self.serve_control();
    }

    /// The control queue's doorbell rang (or its work may have become possible): serve its
    /// commands, enabling and disabling the backend's running rings as the driver sets the
    /// active pairs; a backend that fails an enable is dropped.
    fn serve_control(&mut self) {
        let Some(control) = self.control.as_mut() else {
            return;
        };
        let kick = &self.kicks[control.index()];
        let _ = kick.read();
        let (backend, started) = (&mut self.backend, &self.started);
        let served = control.serve(&self.interrupts, &self.health, |q, on| match backend {
            Some(b) if started[q] => b.enable(q, on),
            _ => Ok(()),
        });
        match served {
            // Commands left: come back after the other events.
            Ok(true) => {
                let _ = kick.write(1);
            }
            Ok(false) => {}
            Err(e) => self.disconnect(&format_args!(
                "the vhost backend: enabling or disabling a ring failed: {e}"
            )),
        }
    }
}
