//! The zero-copy path against the copy path: the cases issue 20 names, each also checked
//! against what the guest's memory holds, and random scenarios.

use super::*;

/// Guest memory's bytes `range`, as a run sees them before it writes.
fn expected(range: std::ops::Range<u64>) -> Vec<u8> {
    range.map(pattern).collect()
}

fn rw(frame: u64) -> PageEntry {
    PageEntry {
        frame: Some(frame),
        read: true,
        write: true,
    }
}

fn buffer(addr: u64, len: u32) -> Buffer {
    Buffer {
        addr: GuestAddress(addr),
        len,
    }
}

/// Eight pages of guest memory behind `pages` (the rest of the bus space unmapped).
fn translated(pages: &[PageEntry], readable: Vec<Buffer>, writable: Vec<Buffer>) -> Scenario {
    let mut map = vec![PageEntry::default(); IOVA_PAGES];
    map[..pages.len()].copy_from_slice(pages);
    let write_len =
        usize::try_from(writable.iter().map(|b| u64::from(b.len)).sum::<u64>()).expect("small");
    Scenario {
        regions: vec![(0, 8 * PAGE_BYTES)],
        pages: Some(map),
        max_run: 4,
        chain: Chain {
            head: 0,
            readable,
            writable,
        },
        write_len,
        ..Scenario::default()
    }
}

#[test]
fn a_buffer_over_pages_mapped_to_scattered_guest_pages_reads_the_same_both_ways() {
    let s = translated(
        &[rw(5), rw(2), rw(7), rw(3), rw(4)],
        vec![buffer(0x800, 0x2000)],
        vec![buffer(0x3800, 0x1000)],
    );
    s.compare().unwrap();
    let out = s.run(Path::ZeroCopy);
    let mut want = expected(0x5800..0x6000);
    want.extend(expected(0x2000..0x3000));
    want.extend(expected(0x7000..0x7800));
    assert_eq!(out.read, Ok(want));
    assert!(out.write.is_ok() && out.faults.is_empty());
}

#[test]
fn a_buffer_straddling_a_region_boundary_reads_the_same_both_ways_in_two_pieces() {
    let s = Scenario {
        regions: vec![(0, 0x2000), (0x2000, 0x2000)],
        chain: Chain {
            head: 0,
            readable: vec![buffer(0x1f00, 0x200)],
            writable: vec![buffer(0x1ff0, 0x20)],
        },
        write_len: 0x20,
        ..Scenario::default()
    };
    s.compare().unwrap();
    assert_eq!(s.run(Path::ZeroCopy).read, Ok(expected(0x1f00..0x2100)));
    let mem =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x2000), (GuestAddress(0x2000), 0x2000)])
            .unwrap();
    let dma = DmaContext::platform(mem);
    let mut io = Segments::default();
    dma.resolve(GuestAddress(0x1f00), 0x200, Access::Read, &mut io)
        .unwrap();
    assert_eq!(io.iovecs().len(), 2, "one piece per region");
}

/// A translated chain's pages are looked up only when its buffers are accessed (checking it
/// looks at descriptors alone), so a page unmapped after the chain was parsed faults then:
/// both ways, the same fault, recorded once, and nothing read.
#[test]
fn a_page_unmapped_before_access_faults_the_same_both_ways() {
    let s = translated(
        &[rw(1), PageEntry::default(), rw(3)],
        vec![buffer(0x0, 0x3000)],
        vec![],
    );
    s.compare().unwrap();
    let out = s.run(Path::ZeroCopy);
    assert_eq!(
        out.read,
        Err(DmaError::Fault {
            addr: 0x1000,
            reason: 1
        })
    );
    assert_eq!(out.faults, vec![(0x1000, Access::Read)]);
}

#[test]
fn a_write_to_a_read_only_page_faults_the_same_both_ways() {
    let read_only = PageEntry {
        write: false,
        ..rw(2)
    };
    let s = translated(&[rw(1), read_only], vec![], vec![buffer(0x800, 0x1000)]);
    s.compare().unwrap();
    let out = s.run(Path::ZeroCopy);
    assert_eq!(
        out.write,
        Err(DmaError::Fault {
            addr: 0x1000,
            reason: 1
        })
    );
}

#[test]
fn bus_master_closing_mid_chain_stops_both_ways_at_the_same_buffer() {
    let mut s = translated(
        &[rw(1), rw(4), rw(6)],
        vec![
            buffer(0x0, 0x100),
            buffer(0x1000, 0x100),
            buffer(0x2000, 0x100),
        ],
        vec![buffer(0x2800, 0x10)],
    );
    s.close_after = Some(1);
    s.compare().unwrap();
    let out = s.run(Path::ZeroCopy);
    assert!(matches!(out.read, Err(DmaError::NotMaster(_))), "{out:?}");
    assert!(matches!(out.write, Err(DmaError::NotMaster(_))), "{out:?}");
}

/// Random memories, mappings and chains: both paths agree on every one, and the cases that
/// matter (pieces over several regions or pages, faults, buffers outside memory, the gate
/// closing) all come up.
#[test]
fn random_chains_and_mappings_give_the_same_results_both_ways() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut seen = [0usize; 4];
    for _ in 0..1500 {
        let bytes: Vec<u8> = (0..96)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        let s = Scenario::from_bytes(&bytes);
        s.compare().unwrap();
        let out = s.run(Path::ZeroCopy);
        match (&out.read, &out.write) {
            (Ok(data), Ok(())) if data.len() > 0x1000 => seen[0] += 1,
            (Err(DmaError::Fault { .. }), _) => seen[1] += 1,
            (Err(DmaError::OutsideMemory { .. }), _) => seen[2] += 1,
            (Err(DmaError::NotMaster(_)), _) | (_, Err(DmaError::NotMaster(_))) => seen[3] += 1,
            _ => {}
        }
    }
    assert!(seen.iter().all(|&n| n >= 10), "cases seen: {seen:?}");
}

/// Found by the `zero_copy` fuzz target: the gate closes as the first buffer is translated,
/// and the empty buffer after it is an access all the same, refused both ways.
#[test]
fn an_empty_buffer_after_the_gate_closed_is_refused_both_ways() {
    let mut s = translated(&[rw(1)], vec![buffer(0x0, 0x100), buffer(0x0, 0)], vec![]);
    s.close_after = Some(1);
    s.compare().unwrap();
    let out = s.run(Path::ZeroCopy);
    assert!(matches!(out.read, Err(DmaError::NotMaster(_))), "{out:?}");
}
