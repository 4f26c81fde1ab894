//! Walking a descriptor chain in a queue's host-mapped table (virtio 1.2 §2.7.5), as
//! virtio-queue's `DescriptorChain` walks it through guest memory, to the descriptor: the
//! same bounds (an index inside the table, at most a table's worth of descriptors, a total
//! length that fits in 32 bits) and the same indirect tables (§2.7.5.3: one level, a whole
//! number of descriptors, read through guest memory as virtio-queue reads them, since a
//! driver does not use them unless offered). The `split_ring` fuzz target and the unit tests
//! hold the two walks to each other.

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use super::host::HostRing;

/// Bytes of a descriptor.
const DESCRIPTOR: u32 = 16;

/// The descriptors of the chain from a head, in order; it ends early (as virtio-queue's does)
/// at an index outside the table, a descriptor that cannot be read, a loop, a total length
/// past 4 GiB or a bad indirect descriptor. `chain::check` tells such an end from a complete
/// chain by the last descriptor's NEXT flag.
pub struct Descriptors<'a> {
    table: &'a HostRing,
    mem: &'a GuestMemoryMmap,
    /// The indirect table being walked, once the chain switched to one.
    indirect: Option<GuestAddress>,
    /// Entries in the table being walked.
    len: u16,
    next: u16,
    /// Descriptors the chain may still have (virtio-queue's time to live).
    ttl: u16,
    bytes: u32,
    follow_indirect: bool,
}

impl<'a> Descriptors<'a> {
    /// The chain from `head` in `table`; with `follow_indirect` false (a device behind an
    /// IOMMU, which must not read a table at an untranslated address) it ends at an indirect
    /// descriptor.
    pub(super) fn new(
        table: &'a HostRing,
        mem: &'a GuestMemoryMmap,
        head: u16,
        follow_indirect: bool,
    ) -> Self {
        let size = table.areas().size;
        Descriptors {
            table,
            mem,
            indirect: None,
            len: size,
            next: head,
            ttl: size,
            bytes: 0,
            follow_indirect,
        }
    }

    /// Descriptor `next` of the table being walked.
    fn read(&self) -> Option<Descriptor> {
        match self.indirect {
            None => self.table.descriptor(self.next),
            Some(table) => {
                let at = table.checked_add(u64::from(self.next) * u64::from(DESCRIPTOR))?;
                self.mem.read_obj(at).ok()
            }
        }
    }

    /// Go on in the indirect table `desc` points to, if it is one the chain may follow.
    fn switch_to_indirect(&mut self, desc: &Descriptor) -> Option<()> {
        if !self.follow_indirect
            || self.indirect.is_some()
            || !desc.len().is_multiple_of(DESCRIPTOR)
        {
            return None;
        }
        let len = u16::try_from(desc.len() / DESCRIPTOR).ok()?;
        self.indirect = Some(desc.addr());
        (self.len, self.next, self.ttl) = (len, 0, len);
        Some(())
    }
}

impl Iterator for Descriptors<'_> {
    type Item = Descriptor;

    fn next(&mut self) -> Option<Descriptor> {
        loop {
            if self.ttl == 0 || self.next >= self.len {
                return None;
            }
            let desc = self.read()?;
            if desc.refers_to_indirect_table() {
                self.switch_to_indirect(&desc)?;
                continue;
            }
            self.bytes = self.bytes.checked_add(desc.len())?;
            if desc.has_next() {
                self.next = desc.next();
                self.ttl -= 1;
            } else {
                self.ttl = 0;
            }
            return Some(desc);
        }
    }
}

/// Whether the chain from `head` in a table of `size` descriptors, read by `read`, has an
/// indirect descriptor in the table itself: a walk bounded as [`Descriptors`]' is, which ends
/// at a descriptor `read` cannot give.
pub fn refers_to_indirect(size: u16, head: u16, read: impl Fn(u16) -> Option<Descriptor>) -> bool {
    let mut index = head;
    for _ in 0..size {
        if index >= size {
            return false;
        }
        let Some(desc) = read(index) else {
            return false;
        };
        if desc.refers_to_indirect_table() {
            return true;
        }
        if !desc.has_next() {
            return false;
        }
        index = desc.next();
    }
    false
}
