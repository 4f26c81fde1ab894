//! A split virtqueue as the device thread serves it (virtio 1.2 §2.7): virtio-queue's
//! [`Queue`] holds its configuration and positions (next avail, next used: what a snapshot
//! saves, read and set through the `Queue`), and the rings are reached through their host
//! mapping ([`host`]), resolved once per queue and again only when the queue's ring
//! addresses change (behind an IOMMU, `super::rings` translates them again after an
//! invalidation that covers them, and the new addresses are mapped here on the next access).
//! Reading the available ring and the descriptors and writing the used ring are then plain
//! loads and stores, ordered as §2.7 requires: the available idx with acquire before the
//! entries it publishes (§2.7.13.1's driver writes them first), a used entry before the used
//! idx that publishes it, with release (§2.7.8), and a full fence between re-enabling
//! notifications and looking at the ring again, or between publishing used entries and
//! reading used_event (§2.7.10). Every value read from the ring is checked as virtio-queue
//! checks it, which remains the reference (the `split_ring` fuzz target and the unit tests
//! compare the two on random rings).

mod descriptors;
mod host;
#[cfg(test)]
mod tests;

use std::num::Wrapping;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use virtio_bindings::virtio_ring::VRING_USED_F_NO_NOTIFY;
use virtio_queue::{Error, Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use crate::logging::QueueCounters;
pub use descriptors::{Descriptors, refers_to_indirect};
use host::{Areas, HostRing};

/// The used ring's flag asking the driver not to notify (§2.7.10).
#[allow(clippy::cast_possible_truncation)] // 1
const NO_NOTIFY: u16 = VRING_USED_F_NO_NOTIFY as u16;

/// A queue the device thread serves: the queue, its rings' host mapping, and what
/// notification suppression needs (§2.7.10).
#[derive(Debug)]
pub struct ServedQueue {
    queue: Queue,
    host: Option<HostRing>,
    /// Used entries added since the driver was last considered for a notification.
    num_added: Wrapping<u16>,
    /// The device thread polls the available ring ([`ServedQueue::hold`]): notifications
    /// stay off when it runs dry.
    hold: bool,
    /// Notifications were left off by the hold and are still off.
    held: bool,
    /// What the queue carried, for `vm.counters` (a queue of its own until
    /// [`ServedQueue::counted_by`] names the device's).
    counters: Arc<QueueCounters>,
}

impl ServedQueue {
    /// Serve `queue` from its positions (a fresh queue's are 0; a restored one's are what was
    /// saved).
    pub fn new(queue: Queue) -> Self {
        ServedQueue {
            queue,
            host: None,
            num_added: Wrapping(0),
            hold: false,
            held: false,
            counters: Arc::default(),
        }
    }

    /// The same, its work counted on `counters`.
    pub fn counted_by(self, counters: Arc<QueueCounters>) -> Self {
        ServedQueue { counters, ..self }
    }

    /// The queue's I/O counters.
    pub fn counters(&self) -> &Arc<QueueCounters> {
        &self.counters
    }

    /// The queue: its configuration and positions.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// The queue, to change its positions or (behind an IOMMU) its ring addresses: the rings
    /// are mapped again at the next access if the addresses changed.
    pub fn queue_mut(&mut self) -> &mut Queue {
        &mut self.queue
    }

    /// Whether the driver enabled the queue.
    pub fn ready(&self) -> bool {
        self.queue.ready()
    }

    /// The rings in `mem`, mapped now if the queue's addresses are not the ones mapped: the
    /// queue must be ready with a driver ring set (virtio-queue's condition), and each ring
    /// in one memory region.
    pub fn ring(&mut self, mem: &GuestMemoryMmap) -> Result<Ring<'_>, Error> {
        let q = &self.queue;
        if !q.ready() || q.avail_ring() == 0 {
            return Err(Error::QueueNotReady);
        }
        let areas = Areas {
            addresses: [q.desc_table(), q.avail_ring(), q.used_ring()],
            size: q.size(),
        };
        let host = match self.host.take() {
            Some(h) if h.areas() == areas => h,
            _ => HostRing::map(mem, areas)?,
        };
        Ok(Ring {
            queue: &mut self.queue,
            host: self.host.insert(host),
            num_added: &mut self.num_added,
            hold: self.hold,
            held: &mut self.held,
        })
    }

    /// Leave notifications off when the ring runs dry: the device thread polls the available
    /// idx instead ([`ServedQueue::avail_moved`]) until [`ServedQueue::release`]. While the
    /// device polls it may leave notifications disabled (§2.7.10), so the driver does not kick.
    pub fn hold(&mut self) {
        self.hold = true;
    }

    /// Stop holding: notifications are turned on again at the next [`ServedQueue::rearm`] or
    /// the next time the ring runs dry. Says whether the hold left them off.
    pub fn release(&mut self) -> bool {
        self.hold = false;
        self.held
    }

    /// If the hold left notifications off, turn them on and say whether chains were made
    /// available meanwhile (the driver did not notify those: the device must look at them
    /// itself, §2.7.10).
    pub fn rearm(&mut self, mem: &GuestMemoryMmap) -> Result<bool, Error> {
        if !self.held || self.hold {
            return Ok(false);
        }
        Ok(self.ring(mem)?.enable_notification())
    }

    /// Whether the driver made chains available past next avail: what the device polls while
    /// it holds notifications off (one load from the ring's host mapping).
    pub fn avail_moved(&mut self, mem: &GuestMemoryMmap) -> Result<bool, Error> {
        let ring = self.ring(mem)?;
        Ok(ring.host.avail_idx(Ordering::Relaxed) != ring.queue.next_avail())
    }

    /// Whether the driver wants a notification for the used entries added since the last
    /// call (§2.7.10: with VIRTIO_F_EVENT_IDX, when the used idx passed used_event; without,
    /// always, as virtio-queue decides).
    pub fn needs_notification(&mut self, mem: &GuestMemoryMmap) -> Result<bool, Error> {
        let ring = self.ring(mem)?;
        // The used idx is published before used_event is read (§2.7.10).
        fence(Ordering::SeqCst);
        if !ring.queue.event_idx_enabled() {
            return Ok(true);
        }
        let used = Wrapping(ring.queue.next_used());
        let event = Wrapping(ring.host.used_event(Ordering::Relaxed));
        let old = used - *ring.num_added;
        *ring.num_added = Wrapping(0);
        Ok(used - event - Wrapping(1) < used - old)
    }
}

/// A served queue's rings, mapped: what a device does with them while it takes chains.
pub struct Ring<'a> {
    queue: &'a mut Queue,
    host: &'a HostRing,
    num_added: &'a mut Wrapping<u16>,
    hold: bool,
    held: &'a mut bool,
}

impl Ring<'_> {
    /// The queue size.
    pub fn size(&self) -> u16 {
        self.queue.size()
    }

    /// The head of the next available chain, taken (next avail advances), or `None` if the
    /// driver made none available. An available idx more than a ring ahead is an error
    /// (§2.7.6).
    pub fn pop(&mut self) -> Result<Option<u16>, Error> {
        let next = self.queue.next_avail();
        // Acquire: the entries (and descriptors) the index publishes are read after it.
        let idx = self.host.avail_idx(Ordering::Acquire);
        if idx.wrapping_sub(next) > self.queue.size() {
            return Err(Error::InvalidAvailRingIndex);
        }
        if idx == next {
            return Ok(None);
        }
        let head = self.host.avail_entry(next, Ordering::Relaxed);
        self.queue.set_next_avail(next.wrapping_add(1));
        Ok(Some(head))
    }

    /// The descriptors of the chain from `head` (indirect tables read from `mem` if
    /// `follow_indirect`).
    pub fn descriptors<'m>(
        &'m self,
        mem: &'m GuestMemoryMmap,
        head: u16,
        follow_indirect: bool,
    ) -> Descriptors<'m> {
        Descriptors::new(self.host, mem, head, follow_indirect)
    }

    /// Whether the chain from `head` has an indirect descriptor in the queue's table.
    pub fn refers_to_indirect(&self, head: u16) -> bool {
        refers_to_indirect(self.size(), head, |i| self.host.descriptor(i))
    }

    /// Put chain `head` in the used ring with `len` bytes written, and publish it.
    pub fn add_used(&mut self, head: u16, len: u32) -> Result<(), Error> {
        self.put_used(head, len)?;
        self.publish_used();
        Ok(())
    }

    /// Write chain `head`'s used entry, with `len` bytes written, after the last one, without
    /// publishing it: the driver sees it with the next [`Ring::publish_used`], so entries that
    /// belong together (a frame over several receive buffers, §5.1.6.4.2) appear at once.
    pub fn put_used(&mut self, head: u16, len: u32) -> Result<(), Error> {
        if head >= self.queue.size() {
            return Err(Error::InvalidDescriptorIndex);
        }
        let next = self.queue.next_used();
        self.host.write_used(next, head, len);
        self.queue.set_next_used(next.wrapping_add(1));
        *self.num_added += Wrapping(1);
        Ok(())
    }

    /// Publish the used entries written so far (§2.7.8).
    pub fn publish_used(&mut self) {
        // Release: the entries are visible before the index that publishes them.
        self.host
            .set_used_idx(self.queue.next_used(), Ordering::Release);
    }

    /// Put the last `n` chains taken back (they will be taken again, in the same order).
    pub fn go_back(&mut self, n: u16) {
        let next = self.queue.next_avail();
        self.queue.set_next_avail(next.wrapping_sub(n));
    }

    /// Ask the driver not to notify (§2.7.10): the used ring's NO_NOTIFY flag; with
    /// VIRTIO_F_EVENT_IDX nothing, since avail_event is only moved on by
    /// [`Ring::enable_notification`].
    pub fn disable_notification(&mut self) {
        if !self.queue.event_idx_enabled() {
            self.host.set_used_flags(NO_NOTIFY, Ordering::Relaxed);
        }
    }

    /// Ask the driver to notify again (avail_event at next avail, or the flag cleared) and
    /// say whether chains were made available meanwhile, which the driver would not notify.
    /// A held queue ([`ServedQueue::hold`]) keeps them off: the device polls it instead.
    pub fn enable_notification(&mut self) -> bool {
        if self.hold {
            *self.held = true;
            return false;
        }
        *self.held = false;
        let next = self.queue.next_avail();
        if self.queue.event_idx_enabled() {
            self.host.set_avail_event(next, Ordering::Relaxed);
        } else {
            self.host.set_used_flags(0, Ordering::Relaxed);
        }
        // The store above is visible before the index is read again.
        fence(Ordering::SeqCst);
        self.host.avail_idx(Ordering::Relaxed) != next
    }
}
