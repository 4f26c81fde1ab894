//! VIRTIO_BLK_T_DISCARD and VIRTIO_BLK_T_WRITE_ZEROES, driven through a queue as a driver sends
//! them: segments after the header, the status byte last.

use std::os::unix::fs::MetadataExt;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{DATA, QSIZE, TempDisk, answer, engine, memory, request, status_desc};

/// 64 sectors: 8 pages, so that page-aligned ranges can be punched whole.
const SECTORS: u64 = 64;

/// A segment: first sector, sectors, flags.
type Segment = (u64, u32, u32);

/// Segments (`struct virtio_blk_discard_write_zeroes`: sector, sectors, flags) written at DATA,
/// and the data buffer that holds them.
fn segments(mem: &GuestMemoryMmap, segs: &[Segment]) -> (u64, u32, u32) {
    let bytes: Vec<u8> = segs
        .iter()
        .flat_map(|&(sector, n, flags)| {
            [
                &sector.to_le_bytes()[..],
                &n.to_le_bytes()[..],
                &flags.to_le_bytes()[..],
            ]
            .concat()
        })
        .collect();
    mem.write_slice(&bytes, GuestAddress(DATA)).unwrap();
    (DATA, bytes.len() as u32, 0)
}

/// Send one `kind` request of `segs` and return its status and used length.
fn erase(
    mem: &GuestMemoryMmap,
    vq: &MockSplitQueue<'_, GuestMemoryMmap>,
    engine: &mut crate::virtio::engine::QueueEngine,
    kind: u32,
    segs: &[Segment],
) -> (u32, u32) {
    let at = usize::from(vq.avail().idx().load());
    let data = segments(mem, segs);
    request(mem, vq, kind, 0, &[data, status_desc()]);
    engine.process(0);
    answer(mem, vq, at)
}

fn sectors(bytes: &[u8], range: std::ops::Range<u64>) -> &[u8] {
    &bytes[(range.start * 512) as usize..(range.end * 512) as usize]
}

#[test]
fn a_discard_frees_each_segments_pages_and_keeps_the_rest_and_the_size() {
    let (mem, disk) = (memory(), TempDisk::new(SECTORS * 512));
    let before = disk.bytes();
    let blocks = || disk.open(true).metadata().unwrap().blocks();
    let allocated = blocks();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, health, log) = engine(&disk, false, &vq, &mem);
    let done = erase(
        &mem,
        &vq,
        &mut engine,
        VIRTIO_BLK_T_DISCARD,
        &[(8, 8, 0), (32, 16, 0)],
    );
    assert_eq!(done, (VIRTIO_BLK_S_OK, 1));
    let after = disk.bytes();
    assert_eq!(after.len(), before.len(), "the size is kept");
    for hole in [8..16, 32..48] {
        assert!(
            sectors(&after, hole.clone()).iter().all(|&b| b == 0),
            "{hole:?}"
        );
    }
    for kept in [0..8, 16..32, 48..SECTORS] {
        assert_eq!(sectors(&after, kept.clone()), sectors(&before, kept));
    }
    // Three pages of eight freed (st_blocks counts 512-byte units).
    assert_eq!(allocated - blocks(), 3 * 8, "the host freed the pages");
    assert_eq!(log.guest_errors(), 0);
    assert!(!health.needs_reset());
}

#[test]
fn a_write_of_zeroes_reads_back_zeroes_with_and_without_unmap() {
    let (mem, disk) = (memory(), TempDisk::new(SECTORS * 512));
    let before = disk.bytes();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, _, log) = engine(&disk, false, &vq, &mem);
    // Ranges that are not whole pages: a hole punched there zeroes the partial pages.
    let unmap = VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP;
    for (sector, n, flags) in [(3, 2, unmap), (9, 1, 0), (20, 17, 0), (40, 12, unmap)] {
        let done = erase(
            &mem,
            &vq,
            &mut engine,
            VIRTIO_BLK_T_WRITE_ZEROES,
            &[(sector, n, flags)],
        );
        assert_eq!(done, (VIRTIO_BLK_S_OK, 1), "sector {sector}");
    }
    let after = disk.bytes();
    let zeroed = [3..5, 9..10, 20..37, 40..52];
    for s in 1..SECTORS {
        let inside = zeroed.iter().any(|r| r.contains(&s));
        let want = if inside {
            &[0u8; 512][..]
        } else {
            sectors(&before, s..s + 1)
        };
        assert_eq!(sectors(&after, s..s + 1), want, "sector {s}");
    }
    assert_eq!(after.len(), before.len());
    assert_eq!(log.guest_errors(), 0);
}

/// Each refused request changes nothing, even where its first segment was good.
#[test]
fn malformed_discards_and_writes_of_zeroes_are_refused_before_anything_is_erased() {
    let (mem, disk) = (memory(), TempDisk::new(SECTORS * 512 + 100));
    let before = disk.bytes();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, health, log) = engine(&disk, false, &vq, &mem);
    let (unmap, ok) = (VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP, (8, 8, 0));
    let (discard, zeroes) = (VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES);
    let many: Vec<_> = (0..257).map(|k| (k % SECTORS, 1, 0)).collect();
    let cases: [(u32, Vec<Segment>, u32); 10] = [
        // §5.2.6: unmap on a discard, or any unknown flag: UNSUPP, in any segment and whatever
        // else is wrong.
        (discard, vec![ok, (16, 8, unmap)], VIRTIO_BLK_S_UNSUPP),
        (
            discard,
            vec![(SECTORS, 8, 0), (16, 8, 4)],
            VIRTIO_BLK_S_UNSUPP,
        ),
        (zeroes, vec![(16, 8, 2)], VIRTIO_BLK_S_UNSUPP),
        // More segments than max_discard_seg (256) or max_write_zeroes_seg (1).
        (discard, many, VIRTIO_BLK_S_UNSUPP),
        (zeroes, vec![ok, ok], VIRTIO_BLK_S_UNSUPP),
        // Outside the disk (the partial sector after the last is outside), or overflowing.
        (discard, vec![ok, (SECTORS - 1, 2, 0)], VIRTIO_BLK_S_IOERR),
        (zeroes, vec![(SECTORS, 1, 0)], VIRTIO_BLK_S_IOERR),
        (
            discard,
            vec![ok, (u64::MAX / 256, 1, 0)],
            VIRTIO_BLK_S_IOERR,
        ),
        // More sectors than max_discard_sectors or max_write_zeroes_sectors.
        (discard, vec![(0, (1 << 17) + 1, 0)], VIRTIO_BLK_S_IOERR),
        (zeroes, vec![(0, u32::MAX, unmap)], VIRTIO_BLK_S_IOERR),
    ];
    for (i, (kind, segs, status)) in cases.iter().enumerate() {
        let done = erase(&mem, &vq, &mut engine, *kind, segs);
        assert_eq!(done, (*status, 1), "case {i}");
    }
    // Data that is not whole 16-byte segments.
    let data = segments(&mem, &[ok]);
    request(&mem, &vq, discard, 0, &[(data.0, 20, 0), status_desc()]);
    engine.process(0);
    assert_eq!(answer(&mem, &vq, cases.len()), (VIRTIO_BLK_S_IOERR, 1));
    assert_eq!(disk.bytes(), before, "nothing erased");
    assert_eq!(log.guest_errors(), cases.len() as u64 + 1);
    assert!(!health.needs_reset());
    // No segments: nothing to do.
    assert_eq!(
        erase(&mem, &vq, &mut engine, discard, &[]),
        (VIRTIO_BLK_S_OK, 1)
    );
}

#[test]
fn a_read_only_disk_refuses_both_and_keeps_its_bytes() {
    let (mem, disk) = (memory(), TempDisk::new(SECTORS * 512));
    let before = disk.bytes();
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, _, log) = engine(&disk, true, &vq, &mem);
    for kind in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        let done = erase(&mem, &vq, &mut engine, kind, &[(8, 8, 0)]);
        assert_eq!(done, (VIRTIO_BLK_S_IOERR, 1));
    }
    assert_eq!(disk.bytes(), before);
    assert_eq!(log.guest_errors(), 2);
}

/// A write started on the ring and a discard of the same sectors taken in the same pass: the
/// discard is carried out after the write has landed, so the sectors end discarded.
#[test]
fn a_discard_after_a_write_in_the_same_pass_comes_after_it() {
    let (mem, disk) = (memory(), TempDisk::new(SECTORS * 512));
    let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
    let (mut engine, _, _) = engine(&disk, false, &vq, &mem);
    // The write's data at DATA + 0x1000, its status at STATUS (shared: both answer OK).
    let data = DATA + 0x1000;
    mem.write_slice(&[0xab; 4096], GuestAddress(data)).unwrap();
    request(
        &mem,
        &vq,
        VIRTIO_BLK_T_OUT,
        8,
        &[(data, 4096, 0), status_desc()],
    );
    let segs = segments(&mem, &[(8, 8, 0)]);
    super::publish(&vq, &[(super::HEADER + 0x100, 16, 0), segs, status_desc()]);
    let mut header = [0u8; 16];
    header[..4].copy_from_slice(&VIRTIO_BLK_T_DISCARD.to_le_bytes());
    mem.write_slice(&header, GuestAddress(super::HEADER + 0x100))
        .unwrap();
    engine.process(0);
    assert_eq!(vq.used().idx().load(), 2);
    assert!(sectors(&disk.bytes(), 8..16).iter().all(|&b| b == 0));
}
