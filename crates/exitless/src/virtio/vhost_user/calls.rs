//! Which call fd each queue's backend holds, and the swap between them: a vector's KVM irqfd
//! while [`MsiVectors::deliverable_irqfd`] hands it out (KVM injects, exitless is not on the
//! path), otherwise a watch eventfd the vhost-user thread polls, whose signal becomes
//! [`Interrupts::notify`] and so the pending bit, the virtio-mmio line or a message. This is
//! QEMU's "masked notifier" (hw/virtio/vhost.c, vhost_virtqueue_mask): the backend is never
//! asked to know about masking, and a vector's irqfd is never signalled while its route is
//! staged or the vector masked.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, ThreadId};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::backend::Backend;
use super::deadline::EXCHANGE_DEADLINE;
use crate::irq::VectorWatcher;
use crate::virtio::device::Notification;
use crate::virtio::interrupt::Interrupts;
use crate::virtio::regs::VIRTIO_MSI_NO_VECTOR;

/// What a backend holds as a queue's call fd.
#[derive(Clone)]
enum Held {
    /// The queue's watch eventfd.
    Watch,
    /// The vector's irqfd.
    Irqfd(Arc<EventFd>),
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Held::Watch, Held::Watch) => true,
            (Held::Irqfd(a), Held::Irqfd(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

/// The call fds of a device's queues.
pub(super) struct Calls {
    watches: Vec<EventFd>,
    held: Vec<Option<Held>>,
}

impl Calls {
    /// Watch eventfds for `queues` queues; the backend holds none yet.
    pub fn new(queues: usize) -> std::io::Result<Self> {
        Ok(Calls {
            watches: (0..queues)
                .map(|_| EventFd::new(EFD_NONBLOCK))
                .collect::<Result<_, _>>()?,
            held: vec![None; queues],
        })
    }

    /// The watch eventfds, in queue order (the thread polls them).
    pub fn watches(&self) -> &[EventFd] {
        &self.watches
    }

    /// The backend no longer holds queue `q`'s call fd (its ring stopped, or it went away).
    pub fn forget(&mut self, q: usize) {
        if let Some(h) = self.held.get_mut(q) {
            *h = None;
        }
    }

    /// What queue `q` should hold now.
    fn wanted(interrupts: &Interrupts, q: usize) -> Held {
        let vector = interrupts.queue_vector(q);
        if !interrupts.msi_active() || vector == VIRTIO_MSI_NO_VECTOR {
            return Held::Watch;
        }
        match interrupts
            .msi()
            .and_then(|m| m.deliverable_irqfd(usize::from(vector)))
        {
            Some(irqfd) => Held::Irqfd(irqfd),
            None => Held::Watch,
        }
    }

    /// Give queue `q`'s backend the call fd it should hold, if that changed: the irqfd once
    /// the vector delivers (then a signal that reached the watch fd meanwhile is sent), the
    /// watch fd once it does not (acknowledged before this returns, with REPLY_ACK).
    pub fn sync(
        &mut self,
        backend: &mut Backend,
        interrupts: &Interrupts,
        q: usize,
    ) -> vhost::Result<()> {
        let want = Self::wanted(interrupts, q);
        if self.held.get(q).and_then(Option::as_ref) == Some(&want) {
            return Ok(());
        }
        match &want {
            Held::Watch => backend.set_call(q, &self.watches[q])?,
            Held::Irqfd(irqfd) => backend.set_call(q, irqfd)?,
        }
        self.held[q] = Some(want.clone());
        if let Held::Irqfd(_) = want {
            self.drain(interrupts, q);
        }
        Ok(())
    }

    /// Queue `q`'s watch fd was signalled: send the notification (or hold it pending).
    pub fn drain(&self, interrupts: &Interrupts, q: usize) {
        if let Some(w) = self.watches.get(q)
            && w.read().is_ok()
        {
            interrupts.notify(Notification::Queue(q));
        }
    }
}

/// The [`VectorWatcher`] of a vhost-user device: a vCPU that changed a vector's
/// deliverability asks the vhost-user thread to swap the call fds and waits for it, so the
/// guest's write completes with the backend holding the right fd.
pub(super) struct CallWatcher {
    requests: Mutex<Sender<SyncSender<()>>>,
    wake: EventFd,
    thread: OnceLock<ThreadId>,
}

impl CallWatcher {
    /// A watcher and the requests the thread takes.
    pub fn new() -> std::io::Result<(Arc<Self>, Receiver<SyncSender<()>>)> {
        let (tx, rx) = mpsc::channel();
        let watcher = CallWatcher {
            requests: Mutex::new(tx),
            wake: EventFd::new(EFD_NONBLOCK)?,
            thread: OnceLock::new(),
        };
        Ok((Arc::new(watcher), rx))
    }

    /// The eventfd the thread polls for requests.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Consume the wake-up.
    pub fn woken(&self) {
        let _ = self.wake.read();
    }

    /// Called on the vhost-user thread itself: its own changes (a first-use commit in a
    /// watch fd's `trigger`) are resynced without waiting.
    pub fn running_on_this_thread(&self) {
        let _ = self.thread.set(thread::current().id());
    }
}

impl VectorWatcher for CallWatcher {
    fn vectors_changed(&self) {
        if self.thread.get() == Some(&thread::current().id()) {
            let _ = self.wake.write(1);
            return;
        }
        let (ack, acked) = mpsc::sync_channel(1);
        if self.requests.lock().unwrap().send(ack).is_err() {
            return;
        }
        let _ = self.wake.write(1);
        // A backend that does not answer costs at most one exchange's deadline.
        if acked.recv_timeout(4 * EXCHANGE_DEADLINE).is_err() {
            log::warn!("the vhost-user thread did not swap the call fds in time");
        }
    }
}
