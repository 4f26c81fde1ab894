//! The host-mapped ring reader: what a driver sees it do, and random rings served both by it
//! and by virtio-queue's reader (`virtio::reference::ring`), which must agree.

use super::*;
use crate::virtio::queue::reference::ring::RingScenario;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::RawDescriptor;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

const QSIZE: u16 = 16;
#[allow(clippy::cast_possible_truncation)] // flag bits
const NEXT: u16 = VRING_DESC_F_NEXT as u16;
#[allow(clippy::cast_possible_truncation)] // flag bits
const WRITE: u16 = VRING_DESC_F_WRITE as u16;

/// The 16-bit field `offset` bytes into ring `at`.
fn field(mem: &GuestMemoryMmap, at: GuestAddress, offset: u64) -> u16 {
    mem.read_obj(GuestAddress(at.0 + offset)).unwrap()
}

/// Byte offset of the event field after a ring of `entry`-byte entries.
fn event(entry: u64) -> u64 {
    4 + entry * u64::from(QSIZE)
}

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap()
}

fn desc(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags, next))
}

/// Where the tests' used rings are: virtio-queue's mock puts its own over the end of the
/// available ring (it sizes that ring in entries, not bytes).
const USED: GuestAddress = GuestAddress(0x6000);

/// A queue over `vq`'s descriptor table and available ring, with `descs` published as
/// chains, and its used ring at `USED`.
fn served(vq: &MockSplitQueue<'_, GuestMemoryMmap>, descs: &[RawDescriptor]) -> ServedQueue {
    vq.add_desc_chains(descs, 0).unwrap();
    let mut q: Queue = vq.create_queue().unwrap();
    q.try_set_used_ring_address(USED).unwrap();
    ServedQueue::new(q)
}

/// Used ring entry `i` at `used`: (id, len).
fn used_entry(mem: &GuestMemoryMmap, used: GuestAddress, i: u64) -> (u32, u32) {
    let at = used.0 + 4 + 8 * i;
    (
        mem.read_obj(GuestAddress(at)).unwrap(),
        mem.read_obj(GuestAddress(at + 4)).unwrap(),
    )
}

#[test]
fn chains_are_taken_walked_and_completed_in_the_used_ring() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let mut q = served(
        &vq,
        &[
            desc(0x8000, 12, NEXT, 1),
            desc(0x9000, 100, WRITE, 0),
            desc(0xa000, 8, 0, 0),
        ],
    );
    let mut ring = q.ring(&mem).unwrap();
    let first = ring.pop().unwrap().unwrap();
    let walked: Vec<(u64, u32)> = ring
        .descriptors(&mem, first, true)
        .map(|d| (d.addr().0, d.len()))
        .collect();
    assert_eq!(walked, [(0x8000, 12), (0x9000, 100)]);
    ring.add_used(first, 100).unwrap();
    let second = ring.pop().unwrap().unwrap();
    assert_eq!((first, second), (0, 2));
    assert_eq!(ring.pop().unwrap(), None, "two chains were published");
    ring.add_used(second, 0).unwrap();
    assert_eq!(field(&mem, USED, 2), 2);
    assert_eq!(used_entry(&mem, USED, 0), (0, 100));
    assert_eq!(used_entry(&mem, USED, 1), (2, 0));
    assert_eq!((q.queue().next_avail(), q.queue().next_used()), (2, 2));
}

#[test]
fn an_available_index_more_than_a_ring_ahead_is_an_error() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let mut q = served(&vq, &[desc(0x8000, 8, 0, 0)]);
    vq.avail().idx().store(QSIZE + 1);
    assert!(matches!(
        q.ring(&mem).unwrap().pop(),
        Err(Error::InvalidAvailRingIndex)
    ));
}

#[test]
fn a_walk_stops_at_a_link_outside_the_table_and_at_a_loop() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let mut q = served(&vq, &[desc(0x8000, 8, NEXT, QSIZE + 3)]);
    let ring = q.ring(&mem).unwrap();
    assert_eq!(ring.descriptors(&mem, 0, true).count(), 1);
    // A descriptor that links to itself: at most a table's worth.
    vq.desc_table().store(0, desc(0x8000, 8, NEXT, 0)).unwrap();
    assert_eq!(ring.descriptors(&mem, 0, true).count(), usize::from(QSIZE));
    assert_eq!(
        ring.descriptors(&mem, QSIZE, true).count(),
        0,
        "head past the table"
    );
}

#[test]
fn an_indirect_table_is_followed_only_where_allowed() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let table = [desc(0xa000, 4, NEXT, 1), desc(0xb000, 6, WRITE, 0)];
    for (k, d) in (0u64..).zip(table) {
        mem.write_obj(d, GuestAddress(0xc000 + 16 * k)).unwrap();
    }
    let mut q = served(&vq, &[desc(0xc000, 32, 4, 0)]);
    let ring = q.ring(&mem).unwrap();
    assert!(ring.refers_to_indirect(0));
    let lens: Vec<u32> = ring.descriptors(&mem, 0, true).map(|d| d.len()).collect();
    assert_eq!(lens, [4, 6]);
    assert_eq!(ring.descriptors(&mem, 0, false).count(), 0);
    // An indirect descriptor inside an indirect table ends the walk (§2.7.5.3.1), as it
    // ends virtio-queue's.
    mem.write_obj(desc(0xc000, 32, 4 | NEXT, 1), GuestAddress(0xc000))
        .unwrap();
    assert_eq!(ring.descriptors(&mem, 0, true).count(), 0);
    let mut reference: Queue = vq.create_queue().unwrap();
    let chain = reference.pop_descriptor_chain(&mem).unwrap();
    assert_eq!(chain.count(), 0);
}

#[test]
fn the_rings_are_mapped_again_when_their_addresses_change() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let mut q = served(&vq, &[desc(0x8000, 8, 0, 0)]);
    assert_eq!(q.ring(&mem).unwrap().pop().unwrap(), Some(0));
    // The same rings copied elsewhere (as a remapped ring would be), with another head.
    let moved = MockSplitQueue::create(&mem, GuestAddress(0x4000), QSIZE);
    moved
        .add_desc_chains(&[desc(0x8000, 8, 0, 0), desc(0x9000, 8, 0, 0)], 0)
        .unwrap();
    let moved_used = GuestAddress(0x7000);
    let queue = q.queue_mut();
    queue
        .try_set_desc_table_address(moved.desc_table_addr())
        .unwrap();
    queue
        .try_set_avail_ring_address(moved.avail_addr())
        .unwrap();
    queue.try_set_used_ring_address(moved_used).unwrap();
    let mut ring = q.ring(&mem).unwrap();
    assert_eq!(
        ring.pop().unwrap(),
        Some(1),
        "the moved ring's second entry"
    );
    ring.add_used(1, 3).unwrap();
    assert_eq!((field(&mem, moved_used, 2), field(&mem, USED, 2)), (1, 0));
    assert_eq!(used_entry(&mem, moved_used, 0), (1, 3));
}

#[test]
fn a_ring_outside_guest_memory_is_refused() {
    let mem = memory();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0xf000), QSIZE);
    let mut q = ServedQueue::new(vq.create_queue().unwrap());
    q.queue_mut()
        .try_set_used_ring_address(GuestAddress(0xfffc))
        .unwrap();
    assert!(matches!(q.ring(&mem), Err(Error::GuestMemory(_))));
}

#[test]
fn notifications_follow_event_idx() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let mut q = served(&vq, &[desc(0x8000, 8, 0, 0), desc(0x9000, 8, 0, 0)]);
    q.queue_mut().set_event_idx(true);
    // The driver wants a notification once the used idx passes 1.
    let used_event = GuestAddress(vq.avail_addr().0 + event(2));
    mem.write_obj(1u16, used_event).unwrap();
    let mut ring = q.ring(&mem).unwrap();
    ring.pop().unwrap();
    ring.add_used(0, 0).unwrap();
    assert!(
        !q.needs_notification(&mem).unwrap(),
        "used idx 1: not past 1"
    );
    let mut ring = q.ring(&mem).unwrap();
    ring.pop().unwrap();
    ring.add_used(1, 0).unwrap();
    assert!(q.needs_notification(&mem).unwrap(), "used idx 2 passed 1");
    // Re-enabled, avail_event names the next chain wanted.
    let mut ring = q.ring(&mem).unwrap();
    assert!(!ring.enable_notification(), "nothing new");
    assert_eq!(field(&mem, USED, event(8)), 2);
}

#[test]
fn without_event_idx_the_used_flag_suppresses_notifications() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let mut q = served(&vq, &[desc(0x8000, 8, 0, 0)]);
    let mut ring = q.ring(&mem).unwrap();
    ring.disable_notification();
    assert_eq!(field(&mem, USED, 0), 1);
    assert!(ring.enable_notification(), "a chain is waiting");
    assert_eq!(field(&mem, USED, 0), 0);
    assert!(q.needs_notification(&mem).unwrap());
}

/// A small deterministic generator for the random rings.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

#[test]
fn random_rings_are_served_as_virtio_queue_serves_them() {
    for seed in 0..2000 {
        let data = bytes(seed, 2048);
        if let Err(difference) = RingScenario::from_bytes(&data).compare() {
            panic!("seed {seed}: {difference}");
        }
    }
}

/// A queue the device thread polls (`ServedQueue::hold`): running dry leaves the driver's
/// notifications off (§2.7.10), the poll sees chains the driver adds without notifying, and
/// rearming turns notifications on again and says that chains came meanwhile, so none is lost.
#[test]
fn a_held_queue_keeps_notifications_off_until_rearmed() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let mut q = served(&vq, &[desc(0x8000, 8, 0, 0), desc(0x9000, 8, 0, 0)]);
    // The driver has published the first chain only.
    vq.avail().idx().store(1);
    q.hold();
    let mut ring = q.ring(&mem).unwrap();
    ring.disable_notification();
    let head = ring.pop().unwrap().unwrap();
    ring.add_used(head, 0).unwrap();
    assert_eq!(ring.pop().unwrap(), None);
    assert!(!ring.enable_notification(), "held: nothing looked at");
    assert_eq!(field(&mem, USED, 0), 1, "NO_NOTIFY stays set");
    assert!(!q.avail_moved(&mem).unwrap());
    assert!(!q.rearm(&mem).unwrap(), "still held: nothing rearmed");
    assert_eq!(field(&mem, USED, 0), 1);
    // The driver publishes the second chain and, told not to, does not notify.
    vq.avail().idx().store(2);
    assert!(q.avail_moved(&mem).unwrap(), "the poll sees it");
    assert!(q.release(), "the hold left them off");
    assert!(q.rearm(&mem).unwrap(), "a chain came while held");
    assert_eq!(field(&mem, USED, 0), 0, "notifications on again");
    assert!(!q.rearm(&mem).unwrap(), "rearmed once");
}

/// With VIRTIO_F_EVENT_IDX a held queue's avail_event is not moved on when its ring runs dry,
/// so the driver, past it, does not notify; rearming moves it to next avail.
#[test]
fn a_held_queue_leaves_avail_event_behind() {
    let mem = memory();
    let vq = MockSplitQueue::new(&mem, QSIZE);
    let mut q = served(&vq, &[desc(0x8000, 8, 0, 0)]);
    q.queue_mut().set_event_idx(true);
    q.hold();
    let mut ring = q.ring(&mem).unwrap();
    let head = ring.pop().unwrap().unwrap();
    ring.add_used(head, 0).unwrap();
    assert!(!ring.enable_notification());
    assert_eq!(field(&mem, USED, event(8)), 0, "avail_event left behind");
    assert!(q.release());
    assert!(!q.rearm(&mem).unwrap(), "nothing new");
    assert_eq!(field(&mem, USED, event(8)), 1, "avail_event at next avail");
    // Unheld, running dry turns notifications on as before.
    let mut ring = q.ring(&mem).unwrap();
    assert_eq!(ring.pop().unwrap(), None);
    assert!(!ring.enable_notification());
    assert!(!q.rearm(&mem).unwrap(), "not held: nothing to rearm");
}
