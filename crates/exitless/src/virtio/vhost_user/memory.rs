//! The memory table a backend maps (VHOST_USER_SET_MEM_TABLE) and the ring addresses it is
//! given: exitless's own virtual addresses of guest RAM, as the protocol's "user addresses"
//! (vhost-user protocol, "Memory region description" and VHOST_USER_SET_VRING_ADDR).

use vhost::vhost_user::message::VhostUserVringAddrFlags;
use vhost::{VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryBackend as _;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestMemoryRegion};

use super::VhostUserError;

/// The regions of guest RAM with the memfd and offset each is mapped from; an error if any is
/// anonymous memory a backend cannot map.
pub(super) fn regions(
    mem: &GuestMemoryMmap,
) -> Result<Vec<VhostUserMemoryRegionInfo>, VhostUserError> {
    mem.iter()
        .map(|r| {
            VhostUserMemoryRegionInfo::from_guest_region(r)
                .map_err(|_| VhostUserError::RamNotShared)
        })
        .collect()
}

/// Where the rings of `queue` are in this process, or None if one is not inside guest RAM
/// (the register side checked them at DRIVER_OK; a ring that straddles regions is refused here).
pub(super) fn ring_addresses(mem: &GuestMemoryMmap, queue: &Queue) -> Option<VringConfigData> {
    let size = u64::from(queue.size());
    // virtio 1.2 §2.7: 16 bytes per descriptor; flags, idx, the ring and used_event (2 bytes
    // each); flags, idx, 8 bytes per used element and avail_event.
    let host = |gpa: u64, len: u64| {
        let region = mem.find_region(GuestAddress(gpa))?;
        let offset = gpa - region.start_addr().0;
        (offset.checked_add(len)? <= region.len()).then(|| region.as_ptr() as u64 + offset)
    };
    Some(VringConfigData {
        queue_max_size: queue.max_size(),
        queue_size: queue.size(),
        flags: VhostUserVringAddrFlags::empty().bits(),
        desc_table_addr: host(queue.desc_table(), 16 * size)?,
        used_ring_addr: host(queue.used_ring(), 6 + 8 * size)?,
        avail_ring_addr: host(queue.avail_ring(), 6 + 2 * size)?,
        log_addr: None,
    })
}
