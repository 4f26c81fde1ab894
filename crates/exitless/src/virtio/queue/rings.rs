//! Rings behind an IOMMU. With VIRTIO_F_ACCESS_PLATFORM the driver gives the rings' bus
//! addresses (IOVAs), but virtio-queue walks rings by guest-physical address. The device
//! thread translates them, each ring one physically contiguous range, before it first uses
//! the queues and again whenever an invalidation covers one of their pages (the unit marks
//! the [`RingWatch`] stale); meanwhile it uses the translation it has, as a device's cached
//! one would be.

use std::sync::Arc;

use super::split::ServedQueue;
use crate::dma::{Access, DmaContext, RingArea, RingWatch};
use crate::virtio::device::DeviceError;
use virtio_queue::{Queue, QueueT};

/// Bytes of a descriptor table entry (virtio 1.2 §2.7.5).
const DESCRIPTOR_SIZE: u64 = 16;
/// Flags, index and used_event/avail_event around a driver or device ring (virtio 1.2 §2.7.6,
/// §2.7.8).
const RING_HEADER_AND_EVENT: u64 = 6;
/// Bytes of an available ring entry.
const AVAIL_ENTRY: u64 = 2;
/// Bytes of a used ring entry.
const USED_ENTRY: u64 = 8;

/// The bus addresses of a device's enabled queues, and whether their translation is current.
#[derive(Debug)]
pub struct BusRings {
    /// Per queue: descriptor table, driver ring and device ring, if the queue is enabled.
    addresses: Vec<Option<[u64; 3]>>,
    watch: Arc<RingWatch>,
}

impl BusRings {
    /// The rings of `queues` as the driver gave them (bus addresses), not translated yet.
    pub fn new(queues: &[Queue]) -> Self {
        BusRings {
            addresses: queues
                .iter()
                .map(|q| {
                    q.ready()
                        .then(|| [q.desc_table(), q.avail_ring(), q.used_ring()])
                })
                .collect(),
            watch: Arc::default(),
        }
    }

    /// Point `queues` at their rings' guest-physical addresses, translating them through `dma`
    /// if the translation they have is stale. A fault is recorded by the unit and returned:
    /// the queues then wait for the driver's next notification.
    pub fn map(&self, queues: &mut [ServedQueue], dma: &DmaContext) -> Result<(), DeviceError> {
        if !self.watch.is_stale() {
            return Ok(());
        }
        let mut areas = Vec::new();
        for (q, addresses) in queues.iter().zip(&self.addresses) {
            let Some([desc, avail, used]) = *addresses else {
                continue;
            };
            let size = u64::from(q.queue().size());
            let area = |address, len, access| RingArea {
                address,
                len,
                access,
            };
            areas.extend([
                area(desc, DESCRIPTOR_SIZE * size, Access::Read),
                area(
                    avail,
                    RING_HEADER_AND_EVENT + AVAIL_ENTRY * size,
                    Access::Read,
                ),
                area(
                    used,
                    RING_HEADER_AND_EVENT + USED_ENTRY * size,
                    Access::Write,
                ),
            ]);
        }
        let found = dma.map_rings(&self.watch, &areas)?;
        let enabled = queues
            .iter_mut()
            .zip(&self.addresses)
            .filter_map(|(q, addresses)| addresses.map(|_| q.queue_mut()));
        for (q, rings) in enabled.zip(found.chunks_exact(3)) {
            // Translation keeps the offset in the page, so the alignment holds.
            q.try_set_desc_table_address(rings[0])?;
            q.try_set_avail_ring_address(rings[1])?;
            q.try_set_used_ring_address(rings[2])?;
        }
        Ok(())
    }
}
