//! The vhost-user thread: one per vhost-user device, under its own seccomp filter. It takes the
//! transport's [`Command`]s as a device thread does, but the queues are the backend's: it
//! configures them at DRIVER_OK, stops them (VHOST_USER_GET_VRING_BASE, answered once the
//! backend has stopped the ring) before a reset, queue stop or Bus Master clear is
//! acknowledged, swaps the call fds when a vector's deliverability changes ([`super::calls`]),
//! and turns a hangup or a nonsense answer into DEVICE_NEEDS_RESET, connecting again at the
//! driver's reset (and meanwhile every 100 ms for `reconnect=`).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Weak};
use std::time::Instant;

use vhost::VhostBackend;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use virtio_queue::{Queue, QueueT};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::calls::{CallWatcher, Calls};
use super::connection::{Connection, VHOST_USER_F_PROTOCOL_FEATURES};
use super::{VhostUserSpec, VhostUserWork, memory};
use crate::irq::VectorWatcher;
use crate::seccomp::ThreadKind;
use crate::virtio::device::QueuePosition;
use crate::virtio::device::{DeviceHealth, Notification};
use crate::virtio::interrupt::Interrupts;
use crate::virtio::notify::QueueEvents;
use crate::virtio::state::VirtioState;
use crate::virtio::worker::{Command, Worker};
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
    /// None after a hangup, until connected again.
    connection: Option<Connection>,
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
    /// Rings the backend runs now.
    started: Vec<bool>,
    /// Keep trying to connect until then (`reconnect=`).
    retry_until: Option<Instant>,
}

/// Epoll tokens past the watch fds' (a watch fd's token is its queue).
const COMMAND: u64 = 1 << 32;
const STOP: u64 = COMMAND + 1;
const RESYNC: u64 = COMMAND + 2;
const SOCKET: u64 = COMMAND + 3;

/// Start the vhost-user thread of a transport whose registers are `state`.
pub(in crate::virtio) fn spawn(
    name: String,
    state: &VirtioState,
    work: VhostUserWork,
    interrupts: &Arc<Interrupts>,
    events: &QueueEvents,
) -> std::io::Result<Worker> {
    let kicks = events.clones()?;
    let calls = Calls::new(kicks.len())?;
    let (watcher, resyncs) = CallWatcher::new()?;
    if let Some(msi) = interrupts.msi() {
        let w: Arc<dyn VectorWatcher> = watcher.clone();
        msi.set_watcher(Arc::downgrade(&w) as Weak<dyn VectorWatcher>);
    }
    let health = state.health().clone();
    let interrupts = interrupts.clone();
    let VhostUserWork {
        spec,
        connection,
        offered,
        mem,
    } = work;
    Worker::start(
        ThreadKind::VhostUser,
        name,
        health.log().clone(),
        |inbox, wake, stop| {
            let epoll = Epoll::new()?;
            let started = vec![false; kicks.len()];
            let t = VhostUserThread {
                spec,
                offered,
                mem,
                connection: Some(connection),
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
                retry_until: None,
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
        self.watch_socket()
    }

    fn watch(&self, fd: RawFd, events: EventSet, token: u64) -> std::io::Result<()> {
        self.epoll
            .ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
    }

    /// The backend sends nothing unasked (no backend channel is set up): the socket becoming
    /// readable means it hung up or is talking nonsense.
    fn watch_socket(&self) -> std::io::Result<()> {
        match &self.connection {
            Some(c) => self.watch(
                c.frontend.as_raw_fd(),
                EventSet::IN | EventSet::HANG_UP | EventSet::READ_HANG_UP,
                SOCKET,
            ),
            None => Ok(()),
        }
    }

    /// The loop: until the stop eventfd (or an epoll failure).
    fn run(mut self) {
        self.watcher.running_on_this_thread();
        let mut events = vec![EpollEvent::default(); self.kicks.len() + 4];
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
                match ev.data() {
                    STOP => return,
                    COMMAND => {
                        let _ = self.wake.read();
                        self.run_commands();
                    }
                    RESYNC => self.resync(),
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
        if self.connection.is_some() || Instant::now() > until || self.reconnect() {
            self.retry_until = None;
        }
    }

    /// Connect to the socket again; true if the new backend offers every feature the old one
    /// gave the driver (a driver may have negotiated any of them).
    fn reconnect(&mut self) -> bool {
        let Ok(c) = Connection::open(&self.spec) else {
            return false;
        };
        if c.features & self.offered != self.offered {
            return false;
        }
        self.connection = Some(c);
        for q in 0..self.kicks.len() {
            self.calls.forget(q);
        }
        self.health
            .log()
            .warn(format_args!("connected to the vhost-user backend again"));
        self.watch_socket().is_ok()
    }

    /// The backend hung up or answered nonsense: drop it, the device needs a reset (one log
    /// line), the driver hears it through a configuration change (virtio 1.2 §2.1.2).
    fn disconnect(&mut self, why: &dyn std::fmt::Display) {
        if self.connection.take().is_none() {
            return;
        }
        self.started.fill(false);
        self.rings = None;
        if self.health.fail(why) {
            self.interrupts.notify(Notification::Config);
        }
        self.retry_until = self.spec.reconnect.map(|d| Instant::now() + d);
    }

    /// Carry out every command waiting, acknowledging those that ask for it.
    fn run_commands(&mut self) {
        while let Ok(command) = self.inbox.try_recv() {
            match command {
                Command::Activate(queues, _, features) => {
                    let rings = Rings { queues, features };
                    if self.connection.is_none() {
                        // Hung up before DRIVER_OK: the device stays broken.
                        if self.health.fail(&"no vhost-user backend at DRIVER_OK") {
                            self.interrupts.notify(Notification::Config);
                        }
                    } else {
                        self.start(&rings);
                        self.rings = Some(rings);
                    }
                }
                Command::Reset(ack) => {
                    self.stop_all();
                    self.rings = None;
                    self.interrupts.reset();
                    if self.connection.is_none() {
                        self.reconnect();
                    }
                    let _ = ack.send(());
                }
                Command::StopQueue(q, ack) => {
                    self.stop(q);
                    let _ = ack.send(());
                }
                Command::Sync(ack) => {
                    self.stop_at_bases();
                    let _ = ack.send(());
                }
                Command::Pause(ack) => {
                    // The backend has finished with what it took once GET_VRING_BASE answers:
                    // every chain it took is used, so both positions are the base.
                    self.stop_at_bases();
                    let positions = self.rings.as_ref().map(|r| {
                        r.queues
                            .iter()
                            .map(|q| QueuePosition {
                                next_avail: q.next_avail(),
                                next_used: q.next_avail(),
                            })
                            .collect()
                    });
                    let _ = ack.send(positions);
                }
                Command::KickAll | Command::Resume => {
                    if let Some(r) = self.rings.take() {
                        if !self.started.iter().any(|&s| s) {
                            self.start(&r);
                        }
                        self.rings = Some(r);
                    }
                }
            }
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
        (0..self.kicks.len()).map(|q| self.stop(q)).collect()
    }

    /// Stop ring `q` if it runs: GET_VRING_BASE returns once the backend has stopped it.
    fn stop(&mut self, q: usize) -> Option<u16> {
        if !self.started.get(q).copied().unwrap_or(false) {
            return None;
        }
        self.started[q] = false;
        self.calls.forget(q);
        let c = self.connection.as_mut()?;
        let result = stop_ring(&mut c.frontend, q, c.features);
        match result {
            Ok(base) => Some(base),
            Err(e) => {
                self.disconnect(&format_args!(
                    "the vhost-user backend: GET_VRING_BASE failed: {e}"
                ));
                None
            }
        }
    }

    /// Hand the backend the rings (DRIVER_OK, or Bus Master set again after a clear).
    fn start(&mut self, rings: &Rings) {
        if let Err(e) = self.configure(rings) {
            self.disconnect(&format_args!("the vhost-user backend: {e}"));
        }
    }

    /// The messages of DRIVER_OK: features, memory table, then each ready ring's size,
    /// addresses, base, call and kick fds, and enable.
    fn configure(&mut self, rings: &Rings) -> Result<(), String> {
        let Some(c) = self.connection.as_mut() else {
            return Ok(());
        };
        let err = |what: &str| {
            let what = what.to_owned();
            move |e: vhost::Error| format!("{what} failed: {e}")
        };
        let protocol = c.features & VHOST_USER_F_PROTOCOL_FEATURES;
        c.frontend
            .set_features(rings.features & c.features | protocol)
            .map_err(err("SET_FEATURES"))?;
        let regions = memory::regions(&self.mem).map_err(|e| e.to_string())?;
        c.frontend
            .set_mem_table(&regions)
            .map_err(err("SET_MEM_TABLE"))?;
        for (q, queue) in rings.queues.iter().enumerate() {
            if !queue.ready() {
                continue;
            }
            let addrs = memory::ring_addresses(&self.mem, queue)
                .ok_or_else(|| format!("queue {q}'s rings are not in guest RAM"))?;
            let f = &mut c.frontend;
            f.set_vring_num(q, queue.size())
                .map_err(err("SET_VRING_NUM"))?;
            f.set_vring_addr(q, &addrs).map_err(err("SET_VRING_ADDR"))?;
            f.set_vring_base(q, queue.next_avail())
                .map_err(err("SET_VRING_BASE"))?;
            self.calls
                .sync(f, &self.interrupts, q)
                .map_err(err("SET_VRING_CALL"))?;
            f.set_vring_kick(q, &self.kicks[q])
                .map_err(err("SET_VRING_KICK"))?;
            if protocol != 0 {
                f.set_vring_enable(q, true)
                    .map_err(err("SET_VRING_ENABLE"))?;
            }
            self.started[q] = true;
        }
        Ok(())
    }

    /// A vector's deliverability changed (a vCPU waits on the requests): give each running
    /// ring's backend the call fd it should hold, then acknowledge.
    fn resync(&mut self) {
        self.watcher.woken();
        let mut failed = None;
        if let Some(c) = self.connection.as_mut() {
            for q in 0..self.kicks.len() {
                if self.started[q]
                    && let Err(e) = self.calls.sync(&mut c.frontend, &self.interrupts, q)
                {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            self.disconnect(&format_args!(
                "the vhost-user backend: SET_VRING_CALL failed: {e}"
            ));
        }
        while let Ok(ack) = self.resyncs.try_recv() {
            let _ = ack.send(());
        }
    }
}

/// Stop ring `q`: disabled first where rings are enabled by message, then its base asked for,
/// which the backend answers once it no longer uses the ring (vhost-user protocol, "Ring
/// states").
fn stop_ring(f: &mut Frontend, q: usize, features: u64) -> vhost::Result<u16> {
    if features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
        f.set_vring_enable(q, false)?;
    }
    let base = f.get_vring_base(q)?;
    // The base is a 16-bit ring index (virtio 1.2 §2.7.6); anything wider is nonsense.
    u16::try_from(base)
        .map_err(|_| vhost::Error::VhostUserProtocol(vhost::vhost_user::Error::InvalidMessage))
}
