//! Mergeable receive buffers (VIRTIO_NET_F_MRG_RXBUF, virtio 1.2 §5.1.6.4.2): a frame fills
//! as many buffers as it needs, says how many in the first one's header, and reaches the
//! driver whole or not at all.

use super::*;

/// The responder's frames: 200 bytes, 212 with the header.
const RESPONSE: usize = 200;
const FRAME: u32 = (HDR + RESPONSE) as u32;

/// A device whose driver negotiated mergeable receive buffers, answering with `RESPONSE`
/// bytes.
fn mergeable(
    rx: &MockSplitQueue<'_, GuestMemoryMmap>,
    tx: &MockSplitQueue<'_, GuestMemoryMmap>,
    dma: DmaContext,
) -> (QueueEngine, Arc<DeviceHealth>) {
    let backends: Vec<Box<dyn NetBackend>> = vec![Box::new(RequestResponse::new(RESPONSE))];
    let features = 1 << VIRTIO_NET_F_MRG_RXBUF;
    engine_negotiated(backends, &[(0, rx), (1, tx)], dma, features)
}

/// `n` receive buffers of `len` bytes each, one per chain, 0x100 apart from `BUFFERS`, the
/// descriptors from table index `first` (the avail ring's index goes on from where it is).
fn buffers(rx: &MockSplitQueue<'_, GuestMemoryMmap>, bus: u64, first: u16, n: u16, len: u32) {
    let descs: Vec<RawDescriptor> = (0..n)
        .map(|k| {
            let at = BUFFERS + 0x100 * u64::from(first + k);
            desc(bus + at, len, VRING_DESC_F_WRITE)
        })
        .collect();
    rx.add_desc_chains(&descs, first).unwrap();
}

/// The first `n` used entries of `rx`: (id, length).
fn used(rx: &MockSplitQueue<'_, GuestMemoryMmap>, n: usize) -> Vec<(u32, u32)> {
    (0..n)
        .map(|i| {
            let e = rx.used().ring().ref_at(i).unwrap().load();
            (e.id(), e.len())
        })
        .collect()
}

/// The bytes placed in `parts` of [`buffers`] (buffer, length), end to end.
fn placed(mem: &GuestMemoryMmap, parts: &[(u16, u32)]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for &(k, len) in parts {
        let start = bytes.len();
        bytes.resize(start + len as usize, 0);
        let at = GuestAddress(BUFFERS + 0x100 * u64::from(k));
        mem.read_slice(&mut bytes[start..], at).unwrap();
    }
    bytes
}

/// Check that `parts` of [`buffers`] hold the response to `request` after a header that says
/// it fills them all.
fn expect_response(mem: &GuestMemoryMmap, parts: &[(u16, u32)], request: &[u8]) {
    let bytes = placed(mem, parts);
    let header = header::NetHeader::from_bytes(bytes[..HDR].try_into().unwrap());
    assert_eq!(usize::from(header.num_buffers), parts.len());
    assert_eq!(
        bytes[HDR..],
        RequestResponse::response_to(&request[HDR..], RESPONSE)
    );
}

/// Check that `work` notified the receive queue, whose buffers 0, 1 and 2 of [`buffers`]
/// (100 bytes each) were used, in order, for the response to `request`: 100, 100 and 12
/// bytes.
fn expect_delivered(
    work: &Work,
    rx: &MockSplitQueue<'_, GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    request: &[u8],
) {
    assert!(
        work.notifications().any(|n| n == Notification::Queue(0)),
        "{work:?}"
    );
    let frame = [(0, 100), (1, 100), (2, FRAME - 200)];
    assert_eq!(rx.used().idx().load(), 3);
    assert_eq!(used(rx, 3), frame.map(|(k, len)| (u32::from(k), len)));
    expect_response(mem, &frame, request);
}

#[test]
fn mergeable_buffers_are_offered_whatever_the_backend() {
    let (net, _) = VirtioNet::new([2, 0, 0, 0, 0, 1], vec![Box::new(RequestResponse::new(8))]);
    assert_ne!(net.features() & (1 << VIRTIO_NET_F_MRG_RXBUF), 0);
}

#[test]
fn a_frame_larger_than_a_buffer_fills_several_and_the_first_says_how_many() {
    let mem = memory();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let (mut engine, health) = mergeable(&rx, &tx, DmaContext::platform(mem.clone()));
    buffers(&rx, 0, 0, 4, 100);
    let request = request_at(&mem, &tx, 0, BUFFERS + 0x1000);
    let work = engine.process(1);
    // 212 bytes: 100, 100 and 12; the fourth buffer is left for the next frame.
    expect_delivered(&work, &rx, &mem, &request);
    assert!(!health.needs_reset());
}

#[test]
fn a_frame_in_one_big_enough_buffer_says_one() {
    let mem = memory();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let (mut engine, _) = mergeable(&rx, &tx, DmaContext::platform(mem.clone()));
    buffers(&rx, 0, 0, 1, 0x100);
    request_at(&mem, &tx, 0, BUFFERS + 0x1000);
    engine.process(1);
    assert_eq!((rx.used().idx().load(), used_len(&rx, 0)), (1, FRAME));
    assert_eq!(mem.read_obj::<u16>(GuestAddress(BUFFERS + 10)).unwrap(), 1);
}

/// Buffers for part of a frame are not used: they go back to the ring, and the frame goes
/// into them, and the ones added after, when there are enough.
#[test]
fn a_frame_waits_whole_until_the_driver_adds_enough_buffers() {
    let mem = memory();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let (mut engine, health) = mergeable(&rx, &tx, DmaContext::platform(mem.clone()));
    buffers(&rx, 0, 0, 2, 100);
    let request = request_at(&mem, &tx, 0, BUFFERS + 0x1000);
    engine.process(1);
    assert_eq!(rx.used().idx().load(), 0, "200 bytes of buffers for 212");
    buffers(&rx, 0, 2, 1, 100);
    let work = engine.process(0);
    expect_delivered(&work, &rx, &mem, &request);
    assert_eq!(health.log().guest_errors(), 0);
}

#[test]
fn a_first_buffer_shorter_than_the_header_drops_the_frame_not_the_device() {
    let mem = memory();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let (mut engine, health) = mergeable(&rx, &tx, DmaContext::platform(mem.clone()));
    buffers(&rx, 0, 0, 1, HDR as u32 - 1);
    request_at(&mem, &tx, 0, BUFFERS + 0x1000);
    engine.process(1);
    assert_eq!((rx.used().idx().load(), used_len(&rx, 0)), (1, 0));
    assert!(!health.needs_reset());
    assert_eq!(health.log().guest_errors(), 1);
}

/// A driver whose whole ring of buffers cannot hold a frame would wait for it forever: the
/// frame is dropped, and the buffers go back to the ring for the next one.
#[test]
fn a_frame_the_whole_ring_cannot_hold_is_dropped_and_its_buffers_kept() {
    let mem = memory();
    // A ring of 2 (virtio-queue's mock lays out larger rings' used ring over the second half
    // of their available ring), with two buffers of 12 bytes: 24 for 212.
    let rx = MockSplitQueue::create(&mem, GuestAddress(0x4000), 2);
    let tx = driver_queue(&mem, 1);
    let (mut engine, health) = mergeable(&rx, &tx, DmaContext::platform(mem.clone()));
    buffers(&rx, 0, 0, 2, HDR as u32);
    request_at(&mem, &tx, 0, BUFFERS + 0x1000);
    engine.process(1);
    engine.process(0);
    assert_eq!(rx.used().idx().load(), 0);
    assert!(!health.needs_reset());
    assert_eq!(health.log().guest_errors(), 1);
    // The buffers went back to the ring: the next frame is tried in them (and dropped the
    // same way), where a ring left empty would have it wait.
    request_at(&mem, &tx, 0, BUFFERS + 0x1000);
    engine.process(1);
    assert_eq!(rx.used().idx().load(), 0);
    assert_eq!(health.log().guest_errors(), 2);
}

/// Behind an IOMMU, a buffer the guest did not map in the middle of a frame: every buffer
/// taken for it completes with length 0 (a driver drops each as too short), the frame stays
/// held, and goes whole into the next buffers.
#[test]
fn a_buffer_the_iommu_refuses_mid_frame_completes_the_frames_buffers_empty() {
    let (u, mut t, pt) = behind_iommu();
    let (rx, tx) = (driver_queue(&u.mem, 0), driver_queue(&u.mem, 1));
    let (mut engine, health) = mergeable(&rx, &tx, u.device());
    // Buffer 1 lies on the second buffer page, unmapped.
    buffers(&rx, IOVA, 0, 1, 100);
    rx.add_desc_chains(&[desc(IOVA + BUFFERS + 0x1800, 100, VRING_DESC_F_WRITE)], 1)
        .unwrap();
    buffers(&rx, IOVA, 2, 3, 100);
    t.unmap(pt, IOVA + BUFFERS + 0x1000);
    // Not on the unmapped page, where the other tests put it.
    let request = request_at(&u.mem, &tx, IOVA, BUFFERS + 0xf00);
    engine.process(1);
    assert!(!health.needs_reset(), "a fault is not DEVICE_NEEDS_RESET");
    assert_eq!(u.fault_reason(), Some(VTD_FR_WRITE));
    // Buffers 0 and 1 completed empty, then 2, 3 and 4 took the frame.
    let frame = [(2, 100), (3, 100), (4, FRAME - 200)];
    assert_eq!(
        used(&rx, 5),
        [(0, 0), (1, 0), (2, 100), (3, 100), (4, FRAME - 200)]
    );
    expect_response(&u.mem, &frame, &request);
}
