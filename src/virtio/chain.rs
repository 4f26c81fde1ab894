//! Checking a descriptor chain before a device touches it (virtio 1.2 §2.7.5).
//!
//! virtio-queue's iterator stops quietly at a loop, at a `next` outside the table or at an
//! unreadable descriptor; a device must instead tell such a chain from a complete one, so this
//! walks it and reports what is wrong.

use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// One buffer of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Guest-physical address.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
}

/// A checked chain: every buffer lies inside guest memory, readable ones first.
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
    /// A buffer lies (partly) outside guest memory.
    #[error("descriptor buffer {addr:#x}+{len:#x} is outside guest memory")]
    OutsideMemory {
        /// Buffer address.
        addr: u64,
        /// Buffer length.
        len: u32,
    },
    /// The buffers add up to more than 4 GiB (virtio 1.2 §2.7.5.2).
    #[error("descriptor chain from {0} is longer than 4 GiB")]
    TooLong(u16),
    /// A device-readable buffer follows a device-writable one (virtio 1.2 §2.7.4.2).
    #[error("descriptor chain from {0} has a readable buffer after a writable one")]
    ReadableAfterWritable(u16),
}

/// Walk `chain` (of queue memory `mem`), checking every descriptor.
pub fn check<M>(chain: DescriptorChain<M>, mem: &GuestMemoryMmap) -> Result<Chain, ChainError>
where
    M: Deref<Target = GuestMemoryMmap>,
{
    let head = chain.head_index();
    let mut out = Chain {
        head,
        ..Default::default()
    };
    let mut total = 0u32;
    let mut last_has_next = None;
    for desc in chain {
        let (addr, len) = (desc.addr(), desc.len());
        if !mem.check_range(addr, len as usize) && len != 0 {
            return Err(ChainError::OutsideMemory { addr: addr.0, len });
        }
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
        Some(false) => Ok(out),
    }
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

    /// The readable bytes, in order.
    pub fn read_all(&self, mem: &GuestMemoryMmap) -> Result<Vec<u8>, vm_memory::GuestMemoryError> {
        let mut data = Vec::with_capacity(usize::try_from(self.readable_len()).unwrap_or(0));
        for b in &self.readable {
            let start = data.len();
            data.resize(start + b.len as usize, 0);
            mem.read_slice(&mut data[start..], b.addr)?;
        }
        Ok(data)
    }

    /// Write `data` across the writable buffers; the caller checked it fits.
    pub fn write_all(
        &self,
        mem: &GuestMemoryMmap,
        mut data: &[u8],
    ) -> Result<(), vm_memory::GuestMemoryError> {
        for b in &self.writable {
            if data.is_empty() {
                break;
            }
            let n = data.len().min(b.len as usize);
            mem.write_slice(&data[..n], b.addr)?;
            data = &data[n..];
        }
        Ok(())
    }
}
