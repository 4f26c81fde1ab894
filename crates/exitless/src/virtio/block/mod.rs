//! virtio-blk (virtio 1.2 §5.2) on a raw image, a file or a block device: sector `n` of the
//! disk is bytes `512 n ..` of the image. [`image`] opens, checks, locks and sizes an image;
//! [`VirtioBlock`], in this file, is the register side (identity, features, configuration
//! space); [`BlockQueues`] serves the request queues on the device thread with reads and
//! writes at offsets and `fsync`, and [`discard`] its discards and writes of zeroes, so a
//! request never moves the file's position or changes its size.
//!
//! Every request a driver can build gets a status, never a panic: a request is a header
//! (`struct virtio_blk_outhdr`), its data, and one writable status byte last (§5.2.6). Data
//! outside the disk, lengths that are not whole sectors, headers too short and writes to a
//! read-only disk are answered VIRTIO_BLK_S_IOERR, unknown types VIRTIO_BLK_S_UNSUPP, and all
//! are counted as guest errors. A chain with no writable byte cannot be answered: it completes
//! with nothing written. Guest memory is reached only through the device's DMA context, the
//! file only inside its capacity.

mod discard;
pub mod image;
mod io;
mod queues;

pub use image::{DiskImage, Topology};
pub use queues::BlockQueues;

use std::mem::offset_of;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_TOPOLOGY,
    VIRTIO_BLK_F_WRITE_ZEROES, virtio_blk_config,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;

use super::DeviceParts;
use super::device::{VirtioDevice, read_config_bytes};

/// Size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// The unit of `capacity` and of a request's `sector`, whatever `blk_size` says (§5.2.4).
pub const SECTOR_SIZE: u64 = 512;
/// Data buffers a request may have (`seg_max`, §5.2.4): the queue's descriptors less the
/// header's and the status byte's.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// The largest data buffer a request may have (`size_max`, §5.2.4): 16 MiB, so that
/// `seg_max` of them (4,261,412,864 bytes) fit the used ring's 32-bit length and no request
/// the driver builds within the limits is too long to answer.
const SIZE_MAX: u32 = 16 << 20;
/// Configuration space through `write_zeroes_may_unmap` and its padding, the last field
/// offered.
const CONFIG_LEN: usize = offset_of!(virtio_blk_config, max_secure_erase_sectors);

/// The register side of a virtio-blk device: its capacity, whether it is read-only, its
/// blocks, and its request queues.
pub struct VirtioBlock {
    /// Capacity in sectors.
    sectors: u64,
    read_only: bool,
    topology: Topology,
    /// Request queues (`num_queues`, §5.2.4), at least 1.
    queues: u16,
}

impl VirtioBlock {
    /// A device on `disk` with `queues` request queues (at least 1), its capacity the
    /// image's whole sectors, answering VIRTIO_BLK_T_GET_ID with the first 20 bytes of
    /// `serial`; its data moving on an io_uring if `io_uring` (and the kernel makes one).
    pub fn new(disk: DiskImage, serial: &[u8], queues: u16, io_uring: bool) -> (Self, BlockQueues) {
        let device = VirtioBlock {
            sectors: disk.bytes / SECTOR_SIZE,
            read_only: disk.read_only,
            topology: disk.topology,
            queues: queues.max(1),
        };
        (device, BlockQueues::new(disk, serial, io_uring))
    }

    /// The same, as the [`DeviceParts`] a transport takes.
    pub fn parts(disk: DiskImage, serial: &[u8], queues: u16, io_uring: bool) -> DeviceParts {
        let (device, queues) = VirtioBlock::new(disk, serial, queues, io_uring);
        DeviceParts {
            device: Box::new(device),
            work: crate::virtio::DeviceWork::InProcess(Box::new(queues)),
        }
    }
}

impl VirtioDevice for VirtioBlock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let ro = if self.read_only {
            1 << VIRTIO_BLK_F_RO
        } else {
            0
        };
        // Several queues only where asked, as QEMU offers VIRTIO_BLK_F_MQ: a one-queue
        // device is the one every driver knows.
        let mq = if self.queues > 1 {
            1 << VIRTIO_BLK_F_MQ
        } else {
            0
        };
        // Discards and writes of zeroes write: not offered on a read-only disk.
        let erase = if self.read_only {
            0
        } else {
            1 << VIRTIO_BLK_F_DISCARD | 1 << VIRTIO_BLK_F_WRITE_ZEROES
        };
        ro | mq
            | erase
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_SIZE_MAX
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE
            | 1 << VIRTIO_BLK_F_TOPOLOGY
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; usize::from(self.queues)]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_blk_config (§5.2.4), through write_zeroes_may_unmap: geometry and
        // writeback not offered (0); num_queues read only with VIRTIO_BLK_F_MQ.
        let mut config = [0u8; CONFIG_LEN];
        let mut put = |at: usize, bytes: &[u8]| config[at..at + bytes.len()].copy_from_slice(bytes);
        let blk_size = u32::try_from(SECTOR_SIZE).expect("512");
        let sectors = |bytes: u32| bytes / blk_size;
        let t = &self.topology;
        put(
            offset_of!(virtio_blk_config, capacity),
            &self.sectors.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, size_max),
            &SIZE_MAX.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, seg_max),
            &SEG_MAX.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, blk_size),
            &blk_size.to_le_bytes(),
        );
        // Topology in logical blocks (blk_size's 512 bytes), the physical block as a power
        // of two of them; `Topology` keeps each within its field.
        let exp = u8::try_from(sectors(t.physical_block).trailing_zeros()).expect("below 32");
        put(offset_of!(virtio_blk_config, physical_block_exp), &[exp]);
        let alignment = u8::try_from(sectors(t.alignment_offset)).unwrap_or(0);
        put(
            offset_of!(virtio_blk_config, alignment_offset),
            &[alignment],
        );
        let min_io = u16::try_from(sectors(t.min_io)).unwrap_or(1);
        put(
            offset_of!(virtio_blk_config, min_io_size),
            &min_io.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, opt_io_size),
            &sectors(t.optimal_io).to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, num_queues),
            &self.queues.to_le_bytes(),
        );
        // Discard and write zeroes (§5.2.4, read with their features): a discard's
        // granularity is the physical block, and a write of zeroes with `unmap` may punch
        // a hole.
        for (field, value) in [
            (
                offset_of!(virtio_blk_config, max_discard_sectors),
                discard::MAX_SECTORS,
            ),
            (
                offset_of!(virtio_blk_config, max_discard_seg),
                discard::MAX_DISCARD_SEGMENTS,
            ),
            (
                offset_of!(virtio_blk_config, discard_sector_alignment),
                sectors(t.physical_block),
            ),
            (
                offset_of!(virtio_blk_config, max_write_zeroes_sectors),
                discard::MAX_SECTORS,
            ),
            (
                offset_of!(virtio_blk_config, max_write_zeroes_seg),
                discard::MAX_WRITE_ZEROES_SEGMENTS,
            ),
        ] {
            put(field, &value.to_le_bytes());
        }
        put(offset_of!(virtio_blk_config, write_zeroes_may_unmap), &[1]);
        read_config_bytes(&config, offset, data);
    }
}

#[cfg(test)]
mod tests;
