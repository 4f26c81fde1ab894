#![no_main]
//! The virtio-blk queue work over arbitrary rings and requests: guest memory is the input
//! (descriptor table, available ring, request headers, data), the queue's size, event-idx and
//! whether the disk is read-only come from its first byte, and the disk is a small unnamed
//! file (4 KiB of whole sectors and a 100-byte partial sector after them). Beyond "no panic":
//! - every chain completes or the device breaks: once the device says it has no more work (on
//!   a kick after its last pass) and is healthy, the used index has caught up with the
//!   available index;
//! - the file never grows, and the bytes past its last whole sector are never written (nor is
//!   anything on a read-only disk);
//! - nothing outside guest memory is touched: guest memory is the only memory the device
//!   reaches, through its DMA context, and the file only at offsets inside its capacity.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, OnceLock};

use exitless::dma::DmaContext;
use exitless::logging::DeviceLog;
use exitless::virtio::block::{DiskImage, VirtioBlock};
use exitless::virtio::device::DeviceHealth;
use exitless::virtio::engine::QueueEngine;
use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MEM: usize = 0x2_0000;
/// The ring areas at the start of memory, where the input lands: the available ring (its index
/// in the input's first bytes), the descriptor table (16 × 16 bytes), the used ring.
const AVAIL: u64 = 0x40;
const DESC: u64 = 0x200;
const USED: u64 = 0x800;
/// The disk's whole sectors, then a partial one the device must never reach.
const SECTORS: usize = 8;
const TAIL: usize = 100;

/// The file every run starts from: sector `n` filled with `n`, the tail with 0xee.
fn image() -> Vec<u8> {
    (0..SECTORS * 512 + TAIL)
        .map(|i| {
            if i < SECTORS * 512 {
                (i / 512) as u8
            } else {
                0xee
            }
        })
        .collect()
}

/// This process's disk: a file with no name, so that nothing is left behind however the
/// process ends (each run rewrites it whole).
fn disk() -> &'static File {
    static DISK: OnceLock<File> = OnceLock::new();
    DISK.get_or_init(|| {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("exitless-fuzz-blk-{}", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    })
}

/// The whole of `file`.
fn contents(file: &File) -> Vec<u8> {
    let mut bytes = vec![0; usize::try_from(file.metadata().unwrap().len()).unwrap()];
    file.read_exact_at(&mut bytes, 0).unwrap();
    bytes
}

fuzz_target!(|data: &[u8]| {
    let Some((&config, image_in)) = data.split_first() else {
        return;
    };
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    mem.write_slice(&image_in[..image_in.len().min(MEM)], GuestAddress(0))
        .unwrap();
    // The device's own area starts from zero, as a driver leaves it (the used index is the
    // device's: the invariant below compares it with what the driver published).
    mem.write_obj(0u16, GuestAddress(USED + 2)).unwrap();
    let read_only = config & 0x40 != 0;
    let file = disk();
    let before = image();
    file.set_len(0).unwrap();
    file.write_all_at(&before, 0).unwrap();
    // Writable even for a read-only disk: a write the device should have refused lands, and
    // the check below sees it.
    let image = DiskImage::from_file(file.try_clone().unwrap(), read_only).unwrap();
    // Half the inputs on an io_uring (where the kernel makes one), half a request at a time.
    let (_blk, handler) = VirtioBlock::new(image, b"fuzz", 1, config & 0x20 == 0);
    let size = 1u16 << (config % 5); // 1..=16: the rings fit their areas
    let mut q = Queue::new(256).unwrap();
    q.set_size(size);
    q.set_desc_table_address(Some(DESC as u32), Some(0));
    q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    q.set_used_ring_address(Some(USED as u32), Some(0));
    q.set_event_idx(config & 0x80 != 0);
    q.set_ready(true);
    let health = Arc::new(DeviceHealth::new(DeviceLog::new("fuzz")));
    let mut engine = QueueEngine::new(Box::new(handler), health.clone());
    engine.activate(vec![q], DmaContext::platform(mem.clone()), 0);
    let mut done = false;
    for _ in 0..8 {
        if !engine.process(0).more {
            done = true;
            break;
        }
    }
    // And once more, as the driver's next kick would: a pass answers its requests together
    // after it last read the available ring, so data it read from the disk into the ring's
    // own memory (the input may place buffers there) is only seen now, as a real device
    // would see it: a bad available index breaks the device.
    done = done && !engine.process(0).more;
    if done && !health.needs_reset() {
        let avail = mem.read_obj::<u16>(GuestAddress(AVAIL + 2)).unwrap();
        let used = mem.read_obj::<u16>(GuestAddress(USED + 2)).unwrap();
        assert_eq!(
            used, avail,
            "a healthy device with no work left completed every chain"
        );
    }
    let after = contents(file);
    assert_eq!(after.len(), before.len(), "the file never changes size");
    assert_eq!(
        after[SECTORS * 512..],
        before[SECTORS * 512..],
        "the partial sector is never reached"
    );
    if read_only {
        assert_eq!(after, before, "a read-only disk is never written");
    }
});
