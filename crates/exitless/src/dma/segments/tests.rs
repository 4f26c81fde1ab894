//! Resolving ranges, moving them with vectored calls, and the region snapshot's bounds.

use super::*;
use crate::dma::{Access, DmaContext};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

fn two_regions() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1000)])
        .unwrap()
}

/// More pieces than one vectored call takes, moved by a call that stops short each time
/// (as preadv may): every byte lands once, in order.
#[test]
fn a_transfer_goes_on_past_short_calls_and_the_iovec_limit() {
    let mem = two_regions();
    let dma = DmaContext::platform(mem.clone());
    let mut io = Segments::default();
    // 1,500 one-byte pieces at every other byte, then a piece across the two regions.
    for k in 0..1500u64 {
        dma.resolve(GuestAddress(2 * k), 1, Access::Write, &mut io)
            .unwrap();
    }
    dma.resolve(GuestAddress(0xff0), 0x20, Access::Write, &mut io)
        .unwrap();
    assert_eq!((io.iovecs().len(), io.len()), (1502, 1532));
    let source: Vec<u8> = (0..1532u32).map(|i| (i % 251) as u8).collect();
    let mut calls = 0;
    io.transfer(|iov, moved| {
        calls += 1;
        assert!(iov.len() <= IOV_MAX);
        // Move at most 7 bytes a call, into the front of the iovecs given.
        let mut n = 0;
        for piece in iov {
            let k = piece.iov_len.min(7 - n);
            let from = usize::try_from(moved).unwrap() + n;
            // SAFETY: the piece is guest memory the scratch keeps mapped, `k` ≤ its length.
            unsafe {
                std::ptr::copy_nonoverlapping(source[from..].as_ptr(), piece.iov_base.cast(), k)
            };
            n += k;
            if n == 7 {
                break;
            }
        }
        Ok(n)
    })
    .unwrap();
    assert!(calls > 1532 / 7);
    assert!(io.is_empty(), "used up");
    for k in 0..1500u64 {
        let b: u8 = mem.read_obj(GuestAddress(2 * k)).unwrap();
        assert_eq!(b, source[usize::try_from(k).unwrap()]);
    }
    let mut tail = [0u8; 0x20];
    mem.read_slice(&mut tail, GuestAddress(0xff0)).unwrap();
    assert_eq!(&tail[..], &source[1500..]);
}

/// A call that moves nothing is an error (a file shorter than the request), not a loop.
#[test]
fn a_transfer_that_moves_nothing_fails() {
    let dma = DmaContext::platform(two_regions());
    let mut io = Segments::default();
    dma.resolve(GuestAddress(0), 16, Access::Read, &mut io)
        .unwrap();
    let e = io.transfer(|_, _| Ok(0)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
}

/// A range that leaves guest memory part way appends nothing.
#[test]
fn a_range_partly_outside_memory_appends_nothing() {
    let dma = DmaContext::platform(two_regions());
    let mut io = Segments::default();
    dma.resolve(GuestAddress(0x10), 4, Access::Read, &mut io)
        .unwrap();
    assert!(
        dma.resolve(GuestAddress(0x1ff0), 0x20, Access::Read, &mut io)
            .is_err()
    );
    assert_eq!((io.iovecs().len(), io.len()), (1, 4));
}

/// The snapshot's bounds check agrees with vm-memory's on ranges that start anywhere,
/// cross adjacent regions, fall in holes or run past the end.
#[test]
fn the_snapshot_checks_bounds_as_vm_memory_does() {
    let mem = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), 0x1000),
        (GuestAddress(0x1000), 0x2000),
        (GuestAddress(0x4000), 0x1000),
    ])
    .unwrap();
    let map = RegionMap::of(&mem);
    for addr in (0..0x5100).step_by(0x80) {
        for len in [1usize, 0x7f, 0x800, 0x1000, 0x2f80, 0x4000] {
            assert_eq!(
                map.contains(addr, len as u64),
                mem.check_range(GuestAddress(addr), len),
                "{len:#x} at {addr:#x}"
            );
        }
    }
    assert!(!map.contains(u64::MAX - 4, 8));
}

/// Skipping a prefix (a frame's header) drops whole pieces, then part of the next.
#[test]
fn skipping_a_prefix_drops_whole_pieces_then_part_of_one() {
    let mem = two_regions();
    mem.write_slice(&[7u8; 0x40], GuestAddress(0xfe0)).unwrap();
    let dma = DmaContext::platform(mem);
    let mut io = Segments::default();
    dma.resolve(GuestAddress(0xfe0), 0x10, Access::Read, &mut io)
        .unwrap();
    dma.resolve(GuestAddress(0xff0), 0x20, Access::Read, &mut io)
        .unwrap();
    assert_eq!(io.iovecs().len(), 3);
    io.skip(0x18);
    assert_eq!((io.iovecs().len(), io.len()), (2, 0x18));
    assert_eq!(io.iovecs()[0].iov_len, 8);
    io.skip(0x100);
    assert!(io.is_empty() && io.iovecs().is_empty());
}
