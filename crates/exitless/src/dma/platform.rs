//! What a device's DMA goes through when its bus addresses are translated: the interface a
//! remapping unit offers the devices behind it (named after VIRTIO_F_ACCESS_PLATFORM, virtio
//! 1.2 §6.1, as in Cloud Hypervisor's `AccessPlatform`), and the vocabulary the two share.
//! The unit implements it; the DMA side knows no unit.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLockReadGuard};

use super::DmaError;

/// The direction of a request, for the permission it needs (VT-d §3.6: a read needs R, a
/// write needs W).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The device reads memory (a device-readable buffer, the descriptor and driver rings).
    Read,
    /// The device writes memory (a device-writable buffer, the used ring).
    Write,
}

/// A bus address translated: where it is in guest memory, and for how many bytes from there
/// the translation holds (to the end of its page, or of the run of pages after it that are
/// contiguous in guest memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The guest-physical address.
    pub address: u64,
    /// Bytes from `address` that the same translation covers; never 0.
    pub len: u64,
}

/// Where a ring is for the device, to be translated as one guest-physical range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingArea {
    /// Bus address (IOVA) of the ring's first byte.
    pub address: u64,
    /// Size of the ring in bytes (virtio 1.2 §2.7: its entries and their header).
    pub len: u64,
    /// What the device does with it.
    pub access: Access,
}

/// The rings of one device as the unit last translated them: an invalidation that covers
/// one of their pages, or a change of translation altogether, marks them stale, and the
/// device translates them again ([`AccessPlatform::map_rings`]) before it next touches them.
#[derive(Debug)]
pub struct RingWatch {
    stale: AtomicBool,
}

impl Default for RingWatch {
    /// Stale: nothing translated yet.
    fn default() -> Self {
        RingWatch {
            stale: AtomicBool::new(true),
        }
    }
}

impl RingWatch {
    /// Whether the rings must be translated (again).
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// For the unit: the translation of the rings changed; the device must map them again.
    pub fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// For the unit: the rings were just translated, and the unit watches their pages.
    pub fn mark_current(&self) {
        self.stale.store(false, Ordering::Release);
    }
}

/// A unit that translates the bus addresses of the devices behind it, by their requester ID
/// (`source`: bus << 8 | device << 3 | function, PCIe 4.0 §2.2.6.2).
pub trait AccessPlatform: Debug + Send + Sync {
    /// The guest-physical address of `iova` for a request of `source`, or the fault, which
    /// the unit records.
    fn translate(&self, source: u16, iova: u64, access: Access) -> Result<Translation, DmaError>;

    /// [`AccessPlatform::translate`] for a buffer of `want` bytes at `iova`: the length may
    /// then cover the pages after `iova`'s while they map contiguously, so a device
    /// translates a multi-page buffer once. A unit that cannot tell translates one page.
    fn translate_run(
        &self,
        source: u16,
        iova: u64,
        want: u64,
        access: Access,
    ) -> Result<Translation, DmaError> {
        let _ = want;
        self.translate(source, iova, access)
    }

    /// The guest-physical addresses of `rings` for `source`, each a physically contiguous
    /// range of guest RAM (virtio-queue walks rings by guest-physical address), with `watch`
    /// then standing for their pages.
    fn map_rings(
        &self,
        source: u16,
        watch: &Arc<RingWatch>,
        rings: &[RingArea],
    ) -> Result<Vec<u64>, DmaError>;

    /// A round of DMA (one round of queue work): the unit completes no invalidation until the
    /// guard is dropped, so a translation it drops is out of use when the guest learns so.
    fn round(&self) -> RwLockReadGuard<'_, ()>;
}
