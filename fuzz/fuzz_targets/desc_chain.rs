#![no_main]
//! Descriptor chains alone: a descriptor table from the input, a head from the input, walked
//! and checked (`virtio::chain::check`) as every device does before touching a buffer, then
//! read and written through the DMA context. Guest memory has a hole, so buffers can straddle
//! it. Beyond "no panic", a reference walk of the same table (virtio 1.2 §2.7.5) must agree:
//! a chain is accepted exactly when it is complete, every buffer lies inside guest memory,
//! readable buffers come first and the total fits in 32 bits, and then its buffers are the
//! reference's. A chain is refused outright while the function may not master the bus.
//! Indirect tables, which exitless does not offer, are walked by virtio-queue but not modelled.

use exitless::dma::DmaContext;
use exitless::virtio::queue::chain::{self, Buffer};
use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

mod common;

/// Two 32 KiB regions with a 32 KiB hole between them.
const REGIONS: [(GuestAddress, usize); 2] =
    [(GuestAddress(0), 0x8000), (GuestAddress(0x1_0000), 0x8000)];
const DESC: u64 = 0x0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

/// What the reference walk makes of a chain: `None` where it does not model it.
fn reference(
    mem: &GuestMemoryMmap,
    size: u16,
    head: u16,
) -> Option<Result<Vec<(Buffer, bool)>, ()>> {
    let mut out = Vec::new();
    let mut total = 0u32;
    let mut seen_write = false;
    let mut index = head;
    for _ in 0..size {
        if index >= size {
            return Some(Err(()));
        }
        let at = GuestAddress(DESC + 16 * u64::from(index));
        let addr: u64 = mem.read_obj(at).ok()?;
        let len: u32 = mem.read_obj(at.unchecked_add(8)).ok()?;
        let flags: u16 = mem.read_obj(at.unchecked_add(12)).ok()?;
        let next: u16 = mem.read_obj(at.unchecked_add(14)).ok()?;
        if flags & F_INDIRECT != 0 {
            return None;
        }
        let inside = len == 0 || mem.check_range(GuestAddress(addr), len as usize);
        let Some(sum) = total.checked_add(len) else {
            return Some(Err(()));
        };
        let write = flags & F_WRITE != 0;
        if !inside || (seen_write && !write) {
            return Some(Err(()));
        }
        total = sum;
        seen_write |= write;
        out.push((
            Buffer {
                addr: GuestAddress(addr),
                len,
            },
            write,
        ));
        if flags & F_NEXT == 0 {
            return Some(Ok(out));
        }
        index = next;
    }
    Some(Err(())) // longer than the table: a loop
}

fuzz_target!(|data: &[u8]| {
    let mut input = common::Input(data);
    let [config, head_lo, head_hi] = input.bytes::<3>();
    let size = 1u16 << (config % 9); // 1..=256
    let head = u16::from_le_bytes([head_lo, head_hi]) % (2 * size);
    let master = config & 0x80 == 0;
    let mem = GuestMemoryMmap::from_ranges(&REGIONS).unwrap();
    let image = input.0;
    mem.write_slice(&image[..image.len().min(0x1000)], GuestAddress(DESC))
        .unwrap();
    // One available entry: the head.
    for (offset, value) in [(0u64, 0u16), (2, 1), (4, head)] {
        mem.write_obj(value, GuestAddress(AVAIL + offset)).unwrap();
    }
    let mut q = Queue::new(256).unwrap();
    q.set_size(size);
    q.set_desc_table_address(Some(DESC as u32), Some(0));
    q.set_avail_ring_address(Some(AVAIL as u32), Some(0));
    q.set_used_ring_address(Some(USED as u32), Some(0));
    q.set_ready(true);
    let dma = DmaContext::pci(mem.clone(), 0x8);
    dma.bus_master().set(master);

    let Some(desc) = q.iter(&mem).unwrap().next() else {
        panic!("the available ring holds one entry");
    };
    let mut out = chain::Chain::default();
    let checked = chain::check(desc.head_index(), desc, &dma, &mut out).map(|()| out);
    if !master {
        assert!(
            checked.is_err(),
            "a chain was accepted without bus mastering"
        );
        return;
    }
    match (reference(&mem, size, head), &checked) {
        (None, _) => {}
        (Some(Err(())), Ok(c)) => panic!("accepted a chain the reference refuses: {c:?}"),
        (Some(Ok(buffers)), Err(e)) => panic!("refused a good chain ({e}): {buffers:?}"),
        (Some(Err(())), Err(_)) => {}
        (Some(Ok(buffers)), Ok(c)) => {
            let readable: Vec<Buffer> = buffers.iter().filter(|b| !b.1).map(|b| b.0).collect();
            let writable: Vec<Buffer> = buffers.iter().filter(|b| b.1).map(|b| b.0).collect();
            assert_eq!(
                (c.head, &c.readable, &c.writable),
                (head, &readable, &writable)
            );
        }
    }
    // An accepted chain's buffers are all inside guest memory: reading and writing them works.
    if let Ok(c) = checked {
        let bytes = c.read_all(&dma).expect("a checked chain is readable");
        assert_eq!(bytes.len() as u64, c.readable_len());
        let fill = vec![0xa5; usize::try_from(c.writable_len()).unwrap()];
        c.write_all(&dma, &fill)
            .expect("a checked chain is writable");
    }
});
