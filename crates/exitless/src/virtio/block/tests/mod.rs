#![allow(clippy::cast_possible_truncation)] // fixtures

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::queues::{BlockQueues, HEADER_LEN};
use super::*;
use crate::dma::DmaContext;
use crate::logging::{DeviceLog, ErrorTotals};
use crate::virtio::device::{DeviceHealth, Notification};
use crate::virtio::engine::QueueEngine;
use std::os::unix::fs::MetadataExt;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::RawDescriptor;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Room for 16 requests of up to 4 descriptors each.
const QSIZE: u16 = 64;
/// Where requests' headers, data and status bytes live, above the rings.
const HEADER: u64 = 0x8_0000;
const DATA: u64 = 0x9_0000;
const STATUS: u64 = 0xa_0000;
/// The disk: 8 sectors.
const DISK: u64 = 8 * SECTOR_SIZE;

/// A file in the temporary directory, removed when dropped.
struct TempDisk(PathBuf);

impl TempDisk {
    /// `len` bytes, byte `i` = `i / 512` (each sector holds its number).
    fn new(len: u64) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "exitless-blk-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        let bytes: Vec<u8> = (0..len).map(|i| (i / SECTOR_SIZE) as u8).collect();
        std::fs::write(&path, bytes).unwrap();
        TempDisk(path)
    }

    fn open(&self, read_only: bool) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(&self.0)
            .unwrap()
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.0).unwrap()
    }
}

impl Drop for TempDisk {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
}

/// A buffer: address, length, `VRING_DESC_F_*` flags (links are added by [`publish`]).
type Buf = (u64, u32, u32);

/// Publish one chain of `bufs`, linked in order, at descriptors 4 × its ring position.
fn publish(vq: &MockSplitQueue<'_, GuestMemoryMmap>, bufs: &[Buf]) {
    let first = vq.avail().idx().load() * 4;
    let descs: Vec<RawDescriptor> = bufs
        .iter()
        .enumerate()
        .map(|(j, &(addr, len, flags))| {
            let next = first + j as u16 + 1;
            let flags = if j + 1 < bufs.len() {
                flags | VRING_DESC_F_NEXT
            } else {
                flags
            };
            RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
        })
        .collect();
    vq.add_desc_chains(&descs, first).unwrap();
}

/// The device on `disk`, its queue live on the driver side `vq`.
fn engine(
    disk: &TempDisk,
    read_only: bool,
    vq: &MockSplitQueue<'_, GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
) -> (QueueEngine, Arc<DeviceHealth>, Arc<DeviceLog>) {
    let image = DiskImage::from_file(disk.open(read_only), read_only).unwrap();
    let (_, handler) = VirtioBlock::new(image, b"exitless-test-disk", 1, true);
    live(handler, &[vq], mem, 0)
}

/// `handler` serving the driver sides `vqs` with `features` negotiated.
fn live(
    handler: BlockQueues,
    vqs: &[&MockSplitQueue<'_, GuestMemoryMmap>],
    mem: &GuestMemoryMmap,
    features: u64,
) -> (QueueEngine, Arc<DeviceHealth>, Arc<DeviceLog>) {
    let log = DeviceLog::new("test");
    let health = Arc::new(DeviceHealth::new(log.clone()));
    let mut engine = QueueEngine::new(Box::new(handler), health.clone());
    let queues = vqs.iter().map(|vq| vq.create_queue().unwrap()).collect();
    engine.activate(queues, DmaContext::platform(mem.clone()), features);
    (engine, health, log)
}

/// Publish a request: a header of `kind` and `sector`, then `bufs` (data and status).
fn request(
    mem: &GuestMemoryMmap,
    vq: &MockSplitQueue<'_, GuestMemoryMmap>,
    kind: u32,
    sector: u64,
    bufs: &[Buf],
) {
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&kind.to_le_bytes());
    header[8..].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&header, GuestAddress(HEADER)).unwrap();
    mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
    let mut chain = vec![(HEADER, HEADER_LEN as u32, 0)];
    chain.extend_from_slice(bufs);
    publish(vq, &chain);
}

fn status_desc() -> Buf {
    (STATUS, 1, VRING_DESC_F_WRITE)
}

/// The status byte and the used length of completed chain `i`.
fn answer(mem: &GuestMemoryMmap, vq: &MockSplitQueue<'_, GuestMemoryMmap>, i: usize) -> (u32, u32) {
    let status = mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap();
    (
        u32::from(status),
        vq.used().ring().ref_at(i).unwrap().load().len(),
    )
}

#[test]
fn a_read_copies_sectors_into_the_drivers_buffers() {
    let (mem, disk) = (memory(), TempDisk::new(DISK));
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, health, log) = engine(&disk, false, &vq, &mem);
    // Two data buffers across sectors 2..5, split mid-sector.
    let w = VRING_DESC_F_WRITE;
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_IN,
        2,
        &[
            (DATA, 700, w),
            (DATA + 0x1000, 3 * 512 - 700, w),
            status_desc(),
        ],
    );
    assert_eq!(
        engine.process(0).notifications().collect::<Vec<_>>(),
        vec![Notification::Queue(0)]
    );
    assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_OK, 3 * 512 + 1));
    let mut got = vec![0u8; 3 * 512];
    mem.read_slice(&mut got[..700], GuestAddress(DATA)).unwrap();
    mem.read_slice(&mut got[700..], GuestAddress(DATA + 0x1000))
        .unwrap();
    assert_eq!(got, disk.bytes()[2 * 512..5 * 512]);
    assert!(!health.needs_reset());
    assert_eq!(log.guest_errors(), 0);
    // One request: its header read, its data and status written.
    let t = log.queue_totals()[0];
    assert_eq!((t.completed, t.bytes_read), (1, HEADER_LEN as u64));
    assert_eq!(t.bytes_written, 3 * 512 + 1);
    assert_eq!(t.errors, ErrorTotals::default());
}

#[test]
fn a_write_reaches_the_file_and_a_flush_is_answered() {
    let (mem, disk) = (memory(), TempDisk::new(DISK));
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, _, log) = engine(&disk, false, &vq, &mem);
    let data: Vec<u8> = (0..1024).map(|i| (i * 7) as u8).collect();
    mem.write_slice(&data, GuestAddress(DATA)).unwrap();
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_OUT,
        6,
        &[(DATA, 1024, 0), status_desc()],
    );
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_OK, 1));
    let file = disk.bytes();
    assert_eq!(&file[6 * 512..], &data[..]);
    assert_eq!(file[6 * 512 - 1], 5, "the sector before is untouched");
    assert_eq!(file.len() as u64, DISK);
    request(&mem, &vq, VIRTIO_BLK_T_FLUSH, 0, &[status_desc()]);
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 1), (VIRTIO_BLK_S_OK, 1));
    assert_eq!(log.guest_errors(), 0);
    let t = log.queue_totals()[0];
    assert_eq!((t.completed, t.bytes_written), (2, 2), "two status bytes");
    assert_eq!(t.bytes_read, 2 * HEADER_LEN as u64 + 1024);
}

#[test]
fn get_id_answers_the_serial() {
    let (mem, disk) = (memory(), TempDisk::new(DISK));
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, _, _) = engine(&disk, false, &vq, &mem);
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_GET_ID,
        0,
        &[(DATA, 20, VRING_DESC_F_WRITE), status_desc()],
    );
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_OK, 21));
    let mut id = [0u8; 20];
    mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert_eq!(&id[..18], b"exitless-test-disk");
    assert_eq!(&id[18..], [0, 0]);
}

#[test]
fn a_read_only_disk_refuses_writes_with_ioerr_and_keeps_its_bytes() {
    let (mem, disk) = (memory(), TempDisk::new(DISK));
    let before = disk.bytes();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, health, log) = engine(&disk, true, &vq, &mem);
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_OUT,
        0,
        &[(DATA, 512, 0), status_desc()],
    );
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_IOERR, 1));
    assert_eq!(disk.bytes(), before);
    assert_eq!(log.guest_errors(), 1);
    let errors = log.queue_totals()[0].errors;
    assert_eq!((errors.guest, errors.backend), (1, 0), "the driver's error");
    // Reads still work.
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_IN,
        0,
        &[(DATA, 512, VRING_DESC_F_WRITE), status_desc()],
    );
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 1), (VIRTIO_BLK_S_OK, 513));
    assert!(!health.needs_reset());
}

#[test]
fn requests_outside_the_disk_or_of_partial_sectors_get_ioerr() {
    let (mem, disk) = (memory(), TempDisk::new(DISK + 100));
    let before = disk.bytes();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, health, log) = engine(&disk, false, &vq, &mem);
    let cases: [(u32, u64, u32); 6] = [
        (VIRTIO_BLK_T_IN, 8, 512),   // the sector after the last whole one
        (VIRTIO_BLK_T_OUT, 7, 1024), // runs past the end
        (VIRTIO_BLK_T_OUT, u64::MAX / 256, 512), // sector × 512 overflows
        (VIRTIO_BLK_T_IN, u64::MAX, 512),
        (VIRTIO_BLK_T_IN, 0, 100), // not whole sectors
        (VIRTIO_BLK_T_OUT, 0, 513),
    ];
    for (i, &(kind, sector, len)) in cases.iter().enumerate() {
        let flags = if kind == VIRTIO_BLK_T_IN {
            VRING_DESC_F_WRITE
        } else {
            0
        };
        request(
            &mem,
            &vq,
            kind,
            sector,
            &[(DATA, len, flags), status_desc()],
        );
        engine.process(0);
        assert_eq!(answer(&mem, &vq, i), (VIRTIO_BLK_S_IOERR, 1), "case {i}");
    }
    assert_eq!(
        disk.bytes(),
        before,
        "the trailing partial sector is never reached"
    );
    assert_eq!(log.guest_errors(), cases.len() as u64);
    assert!(!health.needs_reset());
}

#[test]
fn unknown_types_are_unsupported_and_short_headers_ioerr() {
    let (mem, disk) = (memory(), TempDisk::new(DISK));
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, _, log) = engine(&disk, false, &vq, &mem);
    request(&mem, &vq, 14, 0, &[status_desc()]); // VIRTIO_BLK_T_SECURE_ERASE: not offered
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_UNSUPP, 1));
    // An 8-byte header.
    publish(&vq, &[(HEADER, 8, 0), status_desc()]);
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 1), (VIRTIO_BLK_S_IOERR, 1));
    assert_eq!(log.guest_errors(), 2);
}

#[test]
fn a_chain_without_a_status_byte_completes_unanswered_and_a_malformed_one_breaks_the_device() {
    let (mem, disk) = (memory(), TempDisk::new(DISK));
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, health, log) = engine(&disk, false, &vq, &mem);
    request(&mem, &vq, VIRTIO_BLK_T_OUT, 0, &[(DATA, 512, 0)]);
    assert_eq!(
        engine.process(0).notifications().collect::<Vec<_>>(),
        vec![Notification::Queue(0)]
    );
    assert_eq!(answer(&mem, &vq, 0), (0xff, 0), "nothing written");
    assert_eq!(log.guest_errors(), 1);
    assert!(!health.needs_reset());
    // A data buffer outside guest memory: the chain is malformed.
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_IN,
        0,
        &[(0xff_fe00, 0x1000, VRING_DESC_F_WRITE), status_desc()],
    );
    assert_eq!(
        engine.process(0).notifications().collect::<Vec<_>>(),
        vec![Notification::Config]
    );
    assert!(health.needs_reset());
}

#[test]
fn the_configuration_space_holds_what_the_device_offers() {
    let disk = TempDisk::new(DISK + 511);
    let image = |read_only| DiskImage::from_file(disk.open(read_only), read_only).unwrap();
    let (blk, _) = VirtioBlock::new(image(true), b"", 1, true);
    let mut config = [0xffu8; 64];
    blk.read_config(0, &mut config);
    let u32_at = |at: usize| u32::from_le_bytes(config[at..at + 4].try_into().unwrap());
    assert_eq!(config[..8], 8u64.to_le_bytes(), "whole sectors only");
    assert_eq!(u32_at(8), 16 << 20, "size_max");
    assert_eq!(u32_at(12), SEG_MAX, "seg_max");
    assert_eq!(config[16..20], [0; 4], "geometry: not offered");
    assert_eq!(u32_at(20), 512, "blk_size");
    // A file's topology: the host's page (4 KiB) or the file system's smaller block.
    let page = disk.open(true).metadata().unwrap().blksize().min(4096) as u32;
    assert_eq!(
        config[24],
        (page / 512).trailing_zeros() as u8,
        "physical_block_exp"
    );
    assert_eq!(config[25], 0, "alignment_offset");
    assert_eq!(
        config[26..28],
        (page as u16 / 512).to_le_bytes(),
        "min_io_size"
    );
    assert_eq!(u32_at(28), 0, "opt_io_size: none said");
    assert_eq!(config[32..34], [0, 0], "writeback: not offered");
    assert_eq!(config[34..36], 1u16.to_le_bytes());
    assert_eq!(u32_at(36), 1 << 17, "max_discard_sectors: 64 MiB");
    assert_eq!(u32_at(40), 256, "max_discard_seg");
    assert_eq!(u32_at(44), page / 512, "discard_sector_alignment");
    assert_eq!(u32_at(48), 1 << 17, "max_write_zeroes_sectors");
    assert_eq!(u32_at(52), 1, "max_write_zeroes_seg");
    assert_eq!(config[56], 1, "write_zeroes_may_unmap");
    assert_eq!(config[57..60], [0; 3]);
    assert_eq!(config[60..], [0; 4], "past the end reads zero");
    assert_eq!(blk.device_type(), 2);
    let offered = |blk: &VirtioBlock, bit: u32| blk.features() & 1 << bit != 0;
    assert!(offered(&blk, VIRTIO_BLK_F_RO));
    assert!(!offered(&blk, VIRTIO_BLK_F_MQ), "one queue: no MQ");
    for bit in [
        VIRTIO_BLK_F_SIZE_MAX,
        VIRTIO_BLK_F_TOPOLOGY,
        VIRTIO_BLK_F_FLUSH,
    ] {
        assert!(offered(&blk, bit), "bit {bit}");
    }
    for bit in [VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES] {
        assert!(
            !offered(&blk, bit),
            "a read-only disk erases nothing: bit {bit}"
        );
    }
    assert_eq!(blk.queue_max_sizes(), vec![QUEUE_SIZE]);
    let (four, _) = VirtioBlock::new(image(false), b"", 4, true);
    four.read_config(34, &mut config[..2]);
    assert_eq!(config[..2], 4u16.to_le_bytes());
    assert!(offered(&four, VIRTIO_BLK_F_MQ));
    assert!(!offered(&four, VIRTIO_BLK_F_RO));
    for bit in [VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES] {
        assert!(offered(&four, bit), "bit {bit}");
    }
    assert_eq!(four.queue_max_sizes(), vec![QUEUE_SIZE; 4]);
}

/// With several request queues each is served on its own: a request is answered in its
/// queue's used ring and counted on that queue.
#[test]
fn each_request_queue_answers_its_own_requests() {
    let (mem, disk) = (memory(), TempDisk::new(DISK));
    let first = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let second = MockSplitQueue::create(&mem, GuestAddress(0x4_0000), QSIZE);
    let image = DiskImage::from_file(disk.open(false), false).unwrap();
    let (_, handler) = VirtioBlock::new(image, b"mq", 2, true);
    let (mut engine, _, log) = live(handler, &[&first, &second], &mem, 1 << VIRTIO_BLK_F_MQ);
    let w = VRING_DESC_F_WRITE;
    request(
        &mem,
        &second,
        VIRTIO_BLK_T_IN,
        3,
        &[(DATA, 512, w), status_desc()],
    );
    assert_eq!(
        engine.process(1).notifications().collect::<Vec<_>>(),
        vec![Notification::Queue(1)]
    );
    assert_eq!(answer(&mem, &second, 0), (VIRTIO_BLK_S_OK, 513));
    assert_eq!(first.used().idx().load(), 0);
    let mut got = vec![0u8; 512];
    mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(got, disk.bytes()[3 * 512..4 * 512]);
    let counted: Vec<u64> = log.queue_totals().iter().map(|q| q.completed).collect();
    assert_eq!(counted, vec![0, 1]);
}

/// Data buffers are moved in place (`preadv`/`pwritev` on the guest's memory): a buffer
/// straddling a boundary between two regions of guest memory is read into and written from
/// whole, on both sides of it.
#[test]
fn a_buffer_straddling_a_region_boundary_is_read_and_written_whole() {
    let boundary = DATA + 0x800;
    let mem = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), boundary as usize),
        (GuestAddress(boundary), 0x10_0000 - boundary as usize),
    ])
    .unwrap();
    let disk = TempDisk::new(DISK);
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, _, log) = engine(&disk, false, &vq, &mem);
    let at = boundary - 0x100;
    let w = VRING_DESC_F_WRITE;
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_IN,
        1,
        &[(at, 1024, w), status_desc()],
    );
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_OK, 1025));
    let mut got = vec![0u8; 1024];
    mem.read_slice(&mut got, GuestAddress(at)).unwrap();
    assert_eq!(got, disk.bytes()[512..1536]);
    let data: Vec<u8> = (0..1024).map(|i| (i * 13) as u8).collect();
    mem.write_slice(&data, GuestAddress(at)).unwrap();
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_OUT,
        4,
        &[(at, 1024, 0), status_desc()],
    );
    engine.process(0);
    assert_eq!(answer(&mem, &vq, 1), (VIRTIO_BLK_S_OK, 1));
    assert_eq!(&disk.bytes()[4 * 512..6 * 512], &data[..]);
    assert_eq!(log.guest_errors(), 0);
}

/// The queue work on `disk` with its data moving on an io_uring (`ring`; None if the kernel
/// refuses one here, said on stdout) or one request at a time.
fn handler(disk: &TempDisk, ring: bool) -> Option<BlockQueues> {
    let image = DiskImage::from_file(disk.open(false), false).unwrap();
    if !ring {
        return Some(BlockQueues::new(image, b"batch", false));
    }
    match super::io::Ring::new(&image.file, true, u32::from(QUEUE_SIZE)) {
        Ok(_) => Some(BlockQueues::new(image, b"batch", true)),
        Err(e) => {
            println!("skipped with a ring: no io_uring here ({e})");
            None
        }
    }
}

/// Writes to sectors 1-3, reads of sectors 5 and 6 and a flush, all available at once: one
/// pass takes them all (with a ring, the reads and writes in flight together), answers each
/// in its own status byte, and notifies once.
#[test]
fn one_pass_answers_every_request_it_takes_with_one_notification() {
    for ring in [true, false] {
        let (mem, disk) = (memory(), TempDisk::new(DISK));
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let Some(handler) = handler(&disk, ring) else {
            continue;
        };
        let (mut engine, _, log) = live(handler, &[&vq], &mem, 0);
        let requests = [
            (VIRTIO_BLK_T_OUT, 1u64),
            (VIRTIO_BLK_T_OUT, 2),
            (VIRTIO_BLK_T_IN, 5),
            (VIRTIO_BLK_T_OUT, 3),
            (VIRTIO_BLK_T_IN, 6),
            (VIRTIO_BLK_T_FLUSH, 0),
        ];
        for (i, &(kind, sector)) in requests.iter().enumerate() {
            let i = i as u64;
            let (header, data, status) = (HEADER + 0x100 * i, DATA + 0x1000 * i, STATUS + i);
            let mut bytes = [0u8; HEADER_LEN];
            bytes[..4].copy_from_slice(&kind.to_le_bytes());
            bytes[8..].copy_from_slice(&sector.to_le_bytes());
            mem.write_slice(&bytes, GuestAddress(header)).unwrap();
            mem.write_slice(&[0x40 + i as u8; 512], GuestAddress(data))
                .unwrap();
            mem.write_obj(0xffu8, GuestAddress(status)).unwrap();
            let mut chain = vec![(header, HEADER_LEN as u32, 0)];
            match kind {
                VIRTIO_BLK_T_OUT => chain.push((data, 512, 0)),
                VIRTIO_BLK_T_IN => chain.push((data, 512, VRING_DESC_F_WRITE)),
                _ => {}
            }
            chain.push((status, 1, VRING_DESC_F_WRITE));
            publish(&vq, &chain);
        }
        assert_eq!(
            engine.process(0).notifications().collect::<Vec<_>>(),
            vec![Notification::Queue(0)],
            "ring: {ring}"
        );
        assert_eq!(vq.used().idx().load(), 6, "ring: {ring}");
        let mut statuses = [0xffu8; 6];
        mem.read_slice(&mut statuses, GuestAddress(STATUS)).unwrap();
        assert_eq!(statuses, [VIRTIO_BLK_S_OK as u8; 6], "ring: {ring}");
        let file = disk.bytes();
        for (i, sector) in [(0usize, 1usize), (1, 2), (3, 3)] {
            let at = sector * 512;
            assert!(
                file[at..at + 512].iter().all(|&b| b == 0x40 + i as u8),
                "sector {sector}"
            );
        }
        for (i, sector) in [(2u64, 5usize), (4, 6)] {
            let mut got = vec![0u8; 512];
            mem.read_slice(&mut got, GuestAddress(DATA + 0x1000 * i))
                .unwrap();
            assert_eq!(
                got,
                file[sector * 512..(sector + 1) * 512],
                "sector {sector} read"
            );
        }
        let t = log.queue_totals()[0];
        assert_eq!(
            (t.completed, t.bytes_written),
            (6, 6 + 2 * 512),
            "ring: {ring}"
        );
    }
}

/// A disk file cut short under the device (by another process): a read of what is gone is
/// the backend's error, answered IOERR, not the guest's.
#[test]
fn a_read_the_file_cannot_give_is_answered_ioerr_as_the_backends_error() {
    for ring in [true, false] {
        let (mem, disk) = (memory(), TempDisk::new(DISK));
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let Some(handler) = handler(&disk, ring) else {
            continue;
        };
        let (mut engine, health, log) = live(handler, &[&vq], &mem, 0);
        disk.open(false).set_len(512).unwrap();
        let w = VRING_DESC_F_WRITE;
        request(
            &mem,
            &vq,
            VIRTIO_BLK_T_IN,
            4,
            &[(DATA, 512, w), status_desc()],
        );
        engine.process(0);
        assert_eq!(
            answer(&mem, &vq, 0),
            (VIRTIO_BLK_S_IOERR, 1),
            "ring: {ring}"
        );
        assert!(!health.needs_reset());
        assert_eq!(log.guest_errors(), 0, "not the guest's error");
        let errors = log.queue_totals()[0].errors;
        assert_eq!((errors.guest, errors.backend), (0, 1), "ring: {ring}");
    }
}

mod discard;
