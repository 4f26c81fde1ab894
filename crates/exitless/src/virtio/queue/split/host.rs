//! A split virtqueue's three areas as the host maps them (virtio 1.2 §2.7): resolved to host
//! pointers once, so that the device thread reads the driver's ring and descriptors and writes
//! its own ring with plain loads and stores instead of a guest-memory lookup and a copy per
//! access. vm-memory offers no typed, ordered access to a resolved range (its `VolatileSlice`
//! checks bounds and alignment on every access, which is what this avoids), so the accesses
//! are written here, each bounded by the queue size the area was mapped for.
//!
//! Guest memory is shared with the guest's vCPUs, which write it concurrently: every access
//! is volatile or atomic, as vm-memory's own are, and ordered as §2.7 requires (the caller,
//! [`super::Ring`], says which ordering each one needs).

use std::mem::size_of;
use std::sync::atomic::{AtomicU16, Ordering};

use virtio_queue::Error;
use virtio_queue::desc::split::Descriptor;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Bytes before an available or used ring's entries: flags and index (§2.7.6, §2.7.8).
const RING_HEADER: usize = 4;
/// The event field after either ring's entries (used_event, avail_event; §2.7.10).
const EVENT: usize = 2;
/// A used ring entry: id and len, both le32 (§2.7.8).
const USED_ENTRY: usize = 8;

/// Where a queue's areas are in guest memory: what a [`HostRing`] was mapped for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Areas {
    /// Descriptor table, available ring and used ring (guest-physical).
    pub(super) addresses: [u64; 3],
    /// Queue size: entries in each.
    pub(super) size: u16,
}

/// The host mapping of one queue's areas.
#[derive(Debug)]
pub(super) struct HostRing {
    areas: Areas,
    desc: *const Descriptor,
    avail: *mut u16,
    used: *mut u8,
    /// The memory the pointers point into, held so that they stay mapped.
    _mem: GuestMemoryMmap,
}

// SAFETY: the pointers point into guest memory held in `_mem`, which is itself shared between
// threads (`GuestMemoryMmap` is Send and Sync); nothing here is tied to the thread that made it.
unsafe impl Send for HostRing {}

impl HostRing {
    /// Map `areas` in `mem`: each area must lie in one memory region (a ring is one range of
    /// guest-physical memory; a queue whose ring is not in guest memory cannot be served) and
    /// be aligned as §2.7 requires (the queue's address setters checked it; translation keeps
    /// the offset in the page, and a region's host mapping is page-aligned).
    pub(super) fn map(mem: &GuestMemoryMmap, areas: Areas) -> Result<Self, Error> {
        if areas.size == 0 {
            return Err(Error::InvalidSize);
        }
        let size = usize::from(areas.size);
        let [desc, avail, used] = areas.addresses;
        let host = |addr: u64, len: usize, align: usize, misaligned: Error| {
            let slice = mem
                .get_slice(GuestAddress(addr), len)
                .map_err(Error::GuestMemory)?;
            let ptr = slice.ptr_guard_mut().as_ptr();
            if (ptr as usize).is_multiple_of(align) {
                Ok(ptr)
            } else {
                Err(misaligned)
            }
        };
        let desc = host(
            desc,
            size_of::<Descriptor>() * size,
            16,
            Error::InvalidDescTableAlign,
        )?;
        let avail = host(
            avail,
            RING_HEADER + 2 * size + EVENT,
            2,
            Error::InvalidAvailRingAlign,
        )?;
        let used = host(
            used,
            RING_HEADER + USED_ENTRY * size + EVENT,
            4,
            Error::InvalidUsedRingAlign,
        )?;
        Ok(HostRing {
            areas,
            desc: desc.cast(),
            avail: avail.cast(),
            used,
            _mem: mem.clone(),
        })
    }

    /// What the mapping was made for.
    pub(super) fn areas(&self) -> Areas {
        self.areas
    }

    /// The 16-bit field `index` of the available ring, counted in 16-bit units from its start
    /// (flags 0, idx 1, entries from 2, used_event after them).
    fn avail_field(&self, index: usize) -> &AtomicU16 {
        debug_assert!(index < 2 + usize::from(self.areas.size) + 1);
        // SAFETY: `map` checked that the available ring's header, `size` entries and event
        // field (all `index` can name) lie in guest memory held by `_mem`, 2-byte aligned. The
        // guest writes them concurrently, which atomics allow; Rust code reaches them only
        // through these atomics.
        unsafe { AtomicU16::from_ptr(self.avail.add(index)) }
    }

    /// The 16-bit field at byte `offset` of the used ring (flags 0, idx 2, avail_event after
    /// the entries).
    fn used_field(&self, offset: usize) -> &AtomicU16 {
        debug_assert!(offset + 2 <= self.used_len() && offset.is_multiple_of(2));
        // SAFETY: as in `avail_field`: `offset` is inside the used ring `map` checked (4-byte
        // aligned, so an even offset is 2-byte aligned).
        unsafe { AtomicU16::from_ptr(self.used.add(offset).cast()) }
    }

    fn used_len(&self) -> usize {
        RING_HEADER + USED_ENTRY * usize::from(self.areas.size) + EVENT
    }

    /// The available ring's idx.
    pub(super) fn avail_idx(&self, order: Ordering) -> u16 {
        u16::from_le(self.avail_field(1).load(order))
    }

    /// Available ring entry `slot` (taken modulo the queue size).
    pub(super) fn avail_entry(&self, slot: u16, order: Ordering) -> u16 {
        let slot = usize::from(slot % self.areas.size);
        u16::from_le(self.avail_field(2 + slot).load(order))
    }

    /// The available ring's used_event (§2.7.10).
    pub(super) fn used_event(&self, order: Ordering) -> u16 {
        u16::from_le(
            self.avail_field(2 + usize::from(self.areas.size))
                .load(order),
        )
    }

    /// Descriptor `index` of the table, if the table has one.
    pub(super) fn descriptor(&self, index: u16) -> Option<Descriptor> {
        (index < self.areas.size).then(|| {
            // SAFETY: `index` is below the size `map` checked the table for; the table is in
            // guest memory held by `_mem`, 16-byte aligned, and any 16 bytes are a
            // `Descriptor` (plain little-endian integers). The read is volatile: the guest
            // may write the table concurrently.
            unsafe { self.desc.add(usize::from(index)).read_volatile() }
        })
    }

    /// Write used ring entry `slot` (taken modulo the queue size).
    pub(super) fn write_used(&self, slot: u16, id: u16, len: u32) {
        let slot = usize::from(slot % self.areas.size);
        let offset = RING_HEADER + USED_ENTRY * slot;
        // SAFETY: `slot` is below the size `map` checked the used ring for; the entry's two
        // le32 fields are in guest memory held by `_mem`, 4-byte aligned. The writes are
        // volatile: the guest reads the ring concurrently (it reads this entry only once the
        // used idx, stored after it with release ordering, says it may).
        unsafe {
            let entry = self.used.add(offset).cast::<u32>();
            entry.write_volatile(u32::from(id).to_le());
            entry.add(1).write_volatile(len.to_le());
        }
    }

    /// Store the used ring's idx.
    pub(super) fn set_used_idx(&self, idx: u16, order: Ordering) {
        self.used_field(2).store(idx.to_le(), order);
    }

    /// Store the used ring's flags.
    pub(super) fn set_used_flags(&self, flags: u16, order: Ordering) {
        self.used_field(0).store(flags.to_le(), order);
    }

    /// Store the used ring's avail_event (§2.7.10).
    pub(super) fn set_avail_event(&self, value: u16, order: Ordering) {
        let offset = self.used_len() - EVENT;
        self.used_field(offset).store(value.to_le(), order);
    }
}
