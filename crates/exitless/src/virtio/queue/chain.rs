//! Checking a descriptor chain before a device touches it (virtio 1.2 §2.7.5).
//!
//! virtio-queue's iterator stops quietly at a loop, at a `next` outside the table or at an
//! unreadable descriptor; a device must instead tell such a chain from a complete one, so this
//! walks it and reports what is wrong.

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, GuestAddress};

use crate::dma::{Access, DmaContext, DmaError, Segments};

/// One buffer of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Guest-physical address.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
}

/// A checked chain: every buffer lies inside guest memory, readable ones first. A queue keeps
/// one and [`check`] refills it for each chain, so checking allocates nothing once it has
/// grown to the longest chain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// Index of the head descriptor (what goes in the used ring).
    pub head: u16,
    /// Device-readable buffers, in order.
    pub readable: Vec<Buffer>,
    /// Device-writable buffers, in order.
    pub writable: Vec<Buffer>,
}

/// What is wrong with a chain.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    /// The head index is outside the descriptor table.
    #[error("descriptor chain head {0} is outside the descriptor table")]
    BadHead(u16),
    /// The chain loops, links outside the table, or a descriptor cannot be read.
    #[error("descriptor chain from {0} loops, links outside the table or cannot be read")]
    Unterminated(u16),
    /// A buffer the device may not reach through its DMA context: outside guest memory, or
    /// bus mastering is off.
    #[error("descriptor buffer: {0}")]
    Dma(#[from] DmaError),
    /// The buffers add up to more than 4 GiB (virtio 1.2 §2.7.5.2).
    #[error("descriptor chain from {0} is longer than 4 GiB")]
    TooLong(u16),
    /// A device-readable buffer follows a device-writable one (virtio 1.2 §2.7.4.2).
    #[error("descriptor chain from {0} has a readable buffer after a writable one")]
    ReadableAfterWritable(u16),
    /// An indirect descriptor (virtio 1.2 §2.7.5.3), a feature not offered.
    #[error("descriptor chain from {0} uses an indirect table, a feature not offered")]
    Indirect(u16),
}

/// Walk the chain from `head`, whose descriptors `chain` yields (a queue's walk,
/// `super::split::Descriptors`, or virtio-queue's `DescriptorChain`, the reference), into
/// `out`, checking every descriptor, and every buffer against what the device may reach
/// through `dma`. The walk ends early at a descriptor it cannot follow; the chain is then
/// refused as unterminated.
pub fn check(
    head: u16,
    chain: impl IntoIterator<Item = Descriptor>,
    dma: &DmaContext,
    out: &mut Chain,
) -> Result<(), ChainError> {
    out.head = head;
    out.readable.clear();
    out.writable.clear();
    let mut total = 0u32;
    let mut last_has_next = None;
    for desc in chain {
        let (addr, len) = (desc.addr(), desc.len());
        dma.check(addr, len as usize)?;
        total = total.checked_add(len).ok_or(ChainError::TooLong(head))?;
        let buffer = Buffer { addr, len };
        if desc.is_write_only() {
            out.writable.push(buffer);
        } else if out.writable.is_empty() {
            out.readable.push(buffer);
        } else {
            return Err(ChainError::ReadableAfterWritable(head));
        }
        last_has_next = Some(desc.has_next());
    }
    match last_has_next {
        None => Err(ChainError::BadHead(head)),
        Some(true) => Err(ChainError::Unterminated(head)),
        Some(false) => Ok(()),
    }
}

/// The guest ranges that hold bytes `start..start + len` of `buffers` taken end to end.
pub fn ranges(
    buffers: &[Buffer],
    start: u64,
    len: u64,
) -> impl Iterator<Item = (GuestAddress, u64)> {
    let end = start.saturating_add(len);
    let mut at = 0u64;
    buffers.iter().filter_map(move |b| {
        let (lo, hi) = (at, at + u64::from(b.len));
        at = hi;
        let (from, to) = (lo.max(start), hi.min(end));
        // A checked chain's buffers lie in memory the device may reach: no overflow.
        (from < to).then(|| (b.addr.unchecked_add(from - lo), to - from))
    })
}

impl Chain {
    /// Total bytes the device may read.
    pub fn readable_len(&self) -> u64 {
        self.readable.iter().map(|b| u64::from(b.len)).sum()
    }

    /// Total bytes the device may write.
    pub fn writable_len(&self) -> u64 {
        self.writable.iter().map(|b| u64::from(b.len)).sum()
    }

    /// Resolve bytes `start..start + len` of the readable buffers (`Access::Read`) or of the
    /// writable ones (`Access::Write`) into `out`, cleared first: the zero-copy path for a
    /// part of a chain. Buffers outside the range, empty ones included, are not touched. The
    /// range must lie inside them (the caller checked the lengths).
    pub fn resolve(
        &self,
        dma: &DmaContext,
        access: Access,
        start: u64,
        len: u64,
        out: &mut Segments,
    ) -> Result<(), DmaError> {
        out.clear();
        let buffers = match access {
            Access::Read => &self.readable,
            Access::Write => &self.writable,
        };
        for (addr, n) in ranges(buffers, start, len) {
            let n = usize::try_from(n).expect("a buffer is at most 4 GiB");
            dma.resolve(addr, n, access, out)?;
        }
        Ok(())
    }

    /// Resolve every readable buffer into `out`, cleared first: the zero-copy twin of
    /// [`Chain::read_all`], touching the same buffers in the same order (empty ones too, whose
    /// access still needs the Bus Master gate open).
    pub fn resolve_readable(&self, dma: &DmaContext, out: &mut Segments) -> Result<(), DmaError> {
        out.clear();
        for b in &self.readable {
            dma.resolve(b.addr, b.len as usize, Access::Read, out)?;
        }
        Ok(())
    }

    /// Resolve the first `len` writable bytes into `out`, cleared first: the zero-copy twin of
    /// [`Chain::write_all`] with `len` bytes, touching the same buffers in the same order.
    pub fn resolve_writable(
        &self,
        dma: &DmaContext,
        len: usize,
        out: &mut Segments,
    ) -> Result<(), DmaError> {
        out.clear();
        self.append_writable(dma, len, out)
    }

    /// Resolve the first `len` writable bytes after what `out` holds: one frame over several
    /// chains' buffers (mergeable receive buffers, virtio 1.2 §5.1.6.4.2).
    pub fn append_writable(
        &self,
        dma: &DmaContext,
        len: usize,
        out: &mut Segments,
    ) -> Result<(), DmaError> {
        let mut left = len;
        for b in &self.writable {
            if left == 0 {
                break;
            }
            let n = left.min(b.len as usize);
            dma.resolve(b.addr, n, Access::Write, out)?;
            left -= n;
        }
        Ok(())
    }

    /// The readable bytes, in order: the copy path, the reference the zero-copy one is
    /// compared with.
    pub fn read_all(&self, dma: &DmaContext) -> Result<Vec<u8>, DmaError> {
        let mut data = Vec::with_capacity(usize::try_from(self.readable_len()).unwrap_or(0));
        for b in &self.readable {
            let start = data.len();
            data.resize(start + b.len as usize, 0);
            dma.read(b.addr, &mut data[start..])?;
        }
        Ok(data)
    }

    /// Write `data` across the writable buffers; the caller checked it fits.
    pub fn write_all(&self, dma: &DmaContext, mut data: &[u8]) -> Result<(), DmaError> {
        for b in &self.writable {
            if data.is_empty() {
                break;
            }
            let n = data.len().min(b.len as usize);
            dma.write(b.addr, &data[..n])?;
            data = &data[n..];
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // fixtures
mod tests {
    use super::*;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::mock::MockSplitQueue;
    use virtio_queue::{Queue, QueueT};
    use vm_memory::GuestMemoryMmap;

    const MEM_SIZE: usize = 0x1_0000;
    const QSIZE: u16 = 16;
    const NEXT: u16 = VRING_DESC_F_NEXT as u16;
    const WRITE: u16 = VRING_DESC_F_WRITE as u16;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap()
    }

    fn desc(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
        RawDescriptor::from(Descriptor::new(addr, len, flags, next))
    }

    /// Publish `descs` (as written, links included) and check the first chain.
    fn first_chain(descs: &[RawDescriptor]) -> Result<Chain, ChainError> {
        let mem = memory();
        let vq = MockSplitQueue::new(&mem, QSIZE);
        vq.add_desc_chains(descs, 0).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q
            .pop_descriptor_chain(&mem)
            .expect("one chain is available");
        let mut out = Chain::default();
        let dma = DmaContext::platform(mem.clone());
        check(chain.head_index(), chain, &dma, &mut out).map(|()| out)
    }

    #[test]
    fn a_well_formed_chain_is_split_into_readable_and_writable_buffers() {
        let c = first_chain(&[desc(0x8000, 12, NEXT, 1), desc(0x9000, 100, WRITE, 0)]).unwrap();
        assert_eq!(
            c.readable,
            vec![Buffer {
                addr: GuestAddress(0x8000),
                len: 12
            }]
        );
        assert_eq!(c.writable_len(), 100);
    }

    #[test]
    fn a_looping_chain_is_rejected() {
        assert_eq!(
            first_chain(&[desc(0x8000, 8, NEXT, 1), desc(0x8000, 8, NEXT, 0)]),
            Err(ChainError::Unterminated(0))
        );
    }

    #[test]
    fn a_chain_linking_past_the_queue_size_is_rejected() {
        assert_eq!(
            first_chain(&[desc(0x8000, 8, NEXT, QSIZE + 3)]),
            Err(ChainError::Unterminated(0))
        );
    }

    #[test]
    fn a_head_outside_the_table_is_rejected() {
        let mem = memory();
        let vq = MockSplitQueue::new(&mem, QSIZE);
        vq.avail().ring().ref_at(0).unwrap().store(500);
        vq.avail().idx().store(1);
        let mut q: Queue = vq.create_queue().unwrap();
        let chain = q.pop_descriptor_chain(&mem).unwrap();
        let dma = DmaContext::platform(mem.clone());
        assert_eq!(
            check(chain.head_index(), chain, &dma, &mut Chain::default()),
            Err(ChainError::BadHead(500))
        );
    }

    #[test]
    fn buffers_outside_guest_memory_or_overflowing_it_are_rejected() {
        for (addr, len) in [
            (MEM_SIZE as u64 - 4, 16),
            (0x8000, u32::MAX),
            (u64::MAX - 8, 16),
        ] {
            assert!(
                matches!(
                    first_chain(&[desc(addr, len, 0, 0)]),
                    Err(ChainError::Dma(DmaError::OutsideMemory { .. }))
                ),
                "{addr:#x}+{len:#x}"
            );
        }
    }

    #[test]
    fn a_readable_buffer_after_a_writable_one_is_rejected() {
        assert_eq!(
            first_chain(&[desc(0x8000, 8, NEXT | WRITE, 1), desc(0x9000, 8, 0, 0)]),
            Err(ChainError::ReadableAfterWritable(0))
        );
    }
}
