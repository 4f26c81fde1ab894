//! Queued invalidation (VT-d §6.5.2): a ring of 128-bit descriptors in guest memory at IQA,
//! which software fills and hands over by writing the tail (IQT); the unit consumes it from
//! the head (IQH). The unit runs the whole queue inside the IQT write (as QEMU does), so a
//! strict unmap costs one exit and the guest's wait loop spins on a status dword in RAM.
//!
//! Descriptors the unit knows: context-cache invalidate (type 1), IOTLB invalidate (type 2),
//! interrupt entry cache invalidate (type 4) and invalidation wait (type 5). Anything else, a descriptor it cannot read, or a tail
//! outside the queue stops the queue at IQH with FSTS.IQE (§6.5.2.10); the unit carries
//! out the descriptors before it and none after, until software clears IQE.

// Register, entry and descriptor fields are cut to their width, as the hardware cuts them.
#![allow(clippy::cast_possible_truncation)]

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::event::{EventInterrupt, Message};
use super::interrupt_remapping::IecScope;
use super::iotlb::{ContextScope, IotlbScope};
use super::regs::*;
use super::tables::PAGE_SIZE;

/// A descriptor the unit carries out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Descriptor {
    /// Context-cache invalidate (§6.5.2.1).
    Context(ContextScope),
    /// IOTLB invalidate (§6.5.2.3); the drain hints DR and DW are implied (every wait drains).
    Iotlb(IotlbScope),
    /// Interrupt entry cache invalidate (§6.5.2.7).
    InterruptEntries(IecScope),
    /// Invalidation wait (§6.5.2.8): once every descriptor before it is done, write `status`
    /// (data to address) if given, and raise the invalidation event if `interrupt`.
    Wait {
        /// SW: the status address and data.
        status: Option<(u64, u32)>,
        /// IF: set ICS.IWC and raise the invalidation event.
        interrupt: bool,
    },
}

/// Why the queue stopped (FSTS.IQE).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    /// The head or the tail points past the end of the queue.
    #[error("the invalidation queue head {head:#x} or tail {tail:#x} is past its {size:#x} bytes")]
    Outside {
        /// IQH's offset.
        head: u64,
        /// IQT's offset.
        tail: u64,
        /// Bytes in the queue.
        size: u64,
    },
    /// 256-bit descriptors (IQA.DW) belong to scalable mode, which is not offered.
    #[error("256-bit invalidation descriptors (IQA.DW) are not supported")]
    Width,
    /// The descriptor at the head is not guest RAM.
    #[error("the invalidation descriptor at {0:#x} is outside guest memory")]
    Unreadable(u64),
    /// A type the unit does not know (device-TLB, PASID-based...).
    #[error("invalidation descriptor type {0:#x} is not supported")]
    Type(u64),
    /// A granularity of 0 (reserved).
    #[error("invalidation descriptor with reserved granularity 0")]
    Granularity,
    /// A page-selective invalidation's address mask beyond CAP.MAMV.
    #[error("IOTLB invalidation address mask {0} beyond the {VTD_MAMV} offered")]
    AddressMask(u64),
    /// The wait descriptor's status address is not guest RAM.
    #[error("invalidation wait status address {0:#x} is outside guest memory")]
    Status(u64),
}

/// Decode one descriptor (`low`, `high`).
pub fn decode(low: u64, high: u64) -> Result<Descriptor, QueueError> {
    let granularity = (low >> VTD_QI_GRAN_SHIFT) & 3;
    let domain = (low >> VTD_QI_DID_SHIFT) as u16;
    match low & 0xf {
        VTD_QI_CC_TYPE => Ok(Descriptor::Context(match granularity {
            VTD_GRAN_GLOBAL => ContextScope::Global,
            VTD_GRAN_DOMAIN => ContextScope::Domain(domain),
            VTD_GRAN_DEVICE => ContextScope::device(
                (low >> VTD_QI_CC_SID_SHIFT) as u16,
                low >> VTD_QI_CC_FM_SHIFT,
            ),
            _ => return Err(QueueError::Granularity),
        })),
        VTD_QI_IOTLB_TYPE => Ok(Descriptor::Iotlb(iotlb_scope(granularity, domain, high)?)),
        VTD_QI_IEC_TYPE => Ok(Descriptor::InterruptEntries(IecScope::decode(low))),
        VTD_QI_WAIT_TYPE => Ok(Descriptor::Wait {
            status: (low & VTD_QI_WAIT_SW != 0)
                .then_some((high & !3, (low >> VTD_QI_WAIT_DATA_SHIFT) as u32)),
            interrupt: low & VTD_QI_WAIT_IF != 0,
        }),
        other => Err(QueueError::Type(other)),
    }
}

/// An IOTLB invalidation's scope from its granularity, domain and address qword (IVA, or the
/// descriptor's high qword: address in 63:12, address mask in 5:0); shared by the register
/// and the queued forms.
pub fn iotlb_scope(granularity: u64, domain: u16, address: u64) -> Result<IotlbScope, QueueError> {
    match granularity {
        VTD_GRAN_GLOBAL => Ok(IotlbScope::Global),
        VTD_GRAN_DOMAIN => Ok(IotlbScope::Domain(domain)),
        VTD_GRAN_PAGE => {
            let mask = address & VTD_QI_IOTLB_AM_MASK;
            if mask > VTD_MAMV {
                return Err(QueueError::AddressMask(mask));
            }
            Ok(IotlbScope::pages(domain, address, mask as u32))
        }
        _ => Err(QueueError::Granularity),
    }
}

/// IQH, IQT, IQA, ICS and the invalidation event.
#[derive(Debug, Default)]
pub struct InvalidationQueue {
    pub(super) head: u64,
    pub(super) tail: u64,
    pub(super) address: u64,
    /// ICS.IWC.
    pub(super) wait_completed: bool,
    /// IECTL..IEUADDR.
    pub event: EventInterrupt,
}

impl InvalidationQueue {
    /// IQH: the offset of the next descriptor the unit reads.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// IQT as written.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// IQA as written.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Software writes IQT (its offset in 18:4).
    pub fn set_tail(&mut self, value: u64) {
        self.tail = value & VTD_IQ_OFFSET_MASK;
    }

    /// Software writes IQA.
    pub fn set_address(&mut self, value: u64) {
        self.address = value;
    }

    /// Queued invalidation was disabled: IQH goes back to 0 (§10.4.22).
    pub fn disable(&mut self) {
        self.head = 0;
    }

    /// Bytes in the queue: 2^QS pages.
    fn size(&self) -> u64 {
        PAGE_SIZE << (self.address & VTD_IQA_QS_MASK)
    }

    /// The descriptor at the head, if the queue holds one.
    pub fn next(&self, mem: &GuestMemoryMmap) -> Result<Option<Descriptor>, QueueError> {
        if self.head == self.tail {
            return Ok(None);
        }
        let size = self.size();
        if self.tail >= size || self.head >= size {
            return Err(QueueError::Outside {
                head: self.head,
                tail: self.tail,
                size,
            });
        }
        if self.address & VTD_IQA_DW != 0 {
            return Err(QueueError::Width);
        }
        let at = (self.address & !(PAGE_SIZE - 1)).wrapping_add(self.head);
        let mut bytes = [0u8; VTD_QI_DESC_SIZE as usize];
        mem.read_slice(&mut bytes, GuestAddress(at))
            .map_err(|_| QueueError::Unreadable(at))?;
        let (low, high) = bytes.split_at(8);
        let qword = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        decode(qword(low), qword(high)).map(Some)
    }

    /// The head descriptor is done: move past it, wrapping at the end of the queue.
    pub fn advance(&mut self) {
        self.head = (self.head + VTD_QI_DESC_SIZE) % self.size();
    }

    /// A wait descriptor with IF completed: ICS.IWC, and the event if it was clear.
    pub fn wait_completed(&mut self) -> Option<Message> {
        if std::mem::replace(&mut self.wait_completed, true) {
            return None;
        }
        self.event.raise()
    }

    /// ICS (§10.4.25).
    pub fn status(&self) -> u32 {
        u32::from(self.wait_completed)
    }

    /// Software writes ICS: IWC is write-1-to-clear, and clears a pending event.
    pub fn write_status(&mut self, value: u32) {
        if value & VTD_ICS_IWC != 0 {
            self.wait_completed = false;
            self.event.clear_pending();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_decode_by_type_and_granularity() {
        let g = |g: u64| g << VTD_QI_GRAN_SHIFT;
        assert_eq!(
            decode(
                VTD_QI_CC_TYPE | g(3) | 0x18 << VTD_QI_CC_SID_SHIFT | 1 << VTD_QI_CC_FM_SHIFT,
                0
            ),
            Ok(Descriptor::Context(ContextScope::Device {
                source: 0x18,
                ignored: 0b100
            }))
        );
        assert_eq!(
            decode(VTD_QI_CC_TYPE | g(2) | 5 << VTD_QI_DID_SHIFT, 0),
            Ok(Descriptor::Context(ContextScope::Domain(5)))
        );
        assert_eq!(
            decode(
                VTD_QI_IOTLB_TYPE | g(3) | 5 << VTD_QI_DID_SHIFT,
                0x4_3000 | 2
            ),
            Ok(Descriptor::Iotlb(IotlbScope::Pages {
                domain: 5,
                first: 0x40,
                count: 4,
                hint: false
            }))
        );
        assert_eq!(
            decode(VTD_QI_IOTLB_TYPE | g(3), 0x4_3000 | VTD_IVA_IH),
            Ok(Descriptor::Iotlb(IotlbScope::Pages {
                domain: 0,
                first: 0x43,
                count: 1,
                hint: true
            }))
        );
        assert_eq!(
            decode(VTD_QI_IOTLB_TYPE | g(3), VTD_MAMV + 1),
            Err(QueueError::AddressMask(VTD_MAMV + 1))
        );
        assert_eq!(decode(VTD_QI_IOTLB_TYPE, 0), Err(QueueError::Granularity));
        assert_eq!(
            decode(
                VTD_QI_WAIT_TYPE | VTD_QI_WAIT_SW | 0x77 << VTD_QI_WAIT_DATA_SHIFT,
                0x9003
            ),
            Ok(Descriptor::Wait {
                status: Some((0x9000, 0x77)),
                interrupt: false
            })
        );
        assert_eq!(
            decode(VTD_QI_WAIT_TYPE | VTD_QI_WAIT_IF, 0),
            Ok(Descriptor::Wait {
                status: None,
                interrupt: true
            })
        );
        assert_eq!(
            decode(VTD_QI_IEC_TYPE, 0),
            Ok(Descriptor::InterruptEntries(IecScope::Global))
        );
        assert_eq!(
            decode(
                VTD_QI_IEC_TYPE
                    | VTD_QI_IEC_INDEXED
                    | 2 << VTD_QI_IEC_IM_SHIFT
                    | 0x13 << VTD_QI_IEC_IIDX_SHIFT,
                0
            ),
            Ok(Descriptor::InterruptEntries(IecScope::Indexed {
                index: 0x13,
                mask: 2
            }))
        );
        // Device-TLB (3) and the PASID-based types are unknown.
        for t in [0, 3, 6, 7, 0xf] {
            assert_eq!(decode(t, 0), Err(QueueError::Type(t)));
        }
    }
}
