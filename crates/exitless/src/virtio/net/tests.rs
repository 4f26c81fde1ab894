#![allow(clippy::cast_possible_truncation)] // fixtures

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;
use crate::dma::{DmaContext, Segments};
use crate::iommu::regs::{VTD_FR_READ, VTD_FR_WRITE, VTD_PTE_R};
use crate::iommu::tables::build::Tables;
use crate::iommu::testing::*;
use crate::logging::DeviceLog;
use crate::virtio::device::QueueHandler;
use crate::virtio::device::{DeviceHealth, Notification};
use crate::virtio::engine::{QueueEngine, Work};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR,
    VIRTIO_NET_HDR_F_DATA_VALID, VIRTIO_NET_HDR_GSO_UDP, VIRTIO_NET_OK,
};
use virtio_bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT as VIRTQ_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::RawDescriptor;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

mod mergeable;

const QSIZE: u16 = 16;
/// Buffers live above the rings.
const BUFFERS: u64 = 0x8_0000;
/// Behind an IOMMU, the bus address of guest-physical `p` is `IOVA + p`.
const IOVA: u64 = 0x1_0000_0000;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
}

/// The driver side of queue `n`: its rings at 0x1000 · (n + 1) · 4.
fn driver_queue(mem: &GuestMemoryMmap, n: usize) -> MockSplitQueue<'_, GuestMemoryMmap> {
    MockSplitQueue::create(mem, GuestAddress(0x4000 * (n as u64 + 1)), QSIZE)
}

fn desc(addr: u64, len: u32, flags: u32) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags as u16, 0))
}

/// A device with `pairs` pairs whose queues `live` (index, driver side) are enabled, live
/// through `dma`.
fn engine(
    pairs: usize,
    live: &[(usize, &MockSplitQueue<'_, GuestMemoryMmap>)],
    dma: DmaContext,
) -> (QueueEngine, Arc<DeviceHealth>) {
    let backends = (0..pairs)
        .map(|_| Box::new(RequestResponse::new(64)) as Box<dyn NetBackend>)
        .collect();
    engine_with(backends, live, dma)
}

fn engine_with(
    backends: Vec<Box<dyn NetBackend>>,
    live: &[(usize, &MockSplitQueue<'_, GuestMemoryMmap>)],
    dma: DmaContext,
) -> (QueueEngine, Arc<DeviceHealth>) {
    engine_negotiated(backends, live, dma, 0)
}

/// The same, the driver having negotiated `features`.
fn engine_negotiated(
    backends: Vec<Box<dyn NetBackend>>,
    live: &[(usize, &MockSplitQueue<'_, GuestMemoryMmap>)],
    dma: DmaContext,
    features: u64,
) -> (QueueEngine, Arc<DeviceHealth>) {
    let (net, handler) = VirtioNet::new([2, 0, 0, 0, 0, 1], backends);
    let mut queues: Vec<Queue> = net
        .queue_max_sizes()
        .into_iter()
        .map(|max| Queue::new(max).unwrap())
        .collect();
    // Behind an IOMMU the driver gives bus addresses: `IOVA` above the guest-physical ones.
    let bus = if dma.translated() { IOVA } else { 0 };
    for (i, mock) in live {
        let q = &mut queues[*i];
        *q = mock.create_queue().unwrap();
        q.try_set_desc_table_address(GuestAddress(bus + q.desc_table()))
            .unwrap();
        q.try_set_avail_ring_address(GuestAddress(bus + q.avail_ring()))
            .unwrap();
        q.try_set_used_ring_address(GuestAddress(bus + q.used_ring()))
            .unwrap();
    }
    let health = Arc::new(DeviceHealth::new(DeviceLog::new("test")));
    let mut engine = QueueEngine::new(Box::new(handler), health.clone());
    engine.activate(queues, dma, features);
    (engine, health)
}

fn used_len(q: &MockSplitQueue<'_, GuestMemoryMmap>, i: usize) -> u32 {
    q.used().ring().ref_at(i).unwrap().load().len()
}

/// A 5-byte request (after the header) on `tx`, a 2 KiB receive buffer on `rx`, given to
/// the device at bus address `bus` + their guest-physical one.
fn request_and_buffer(
    mem: &GuestMemoryMmap,
    rx: &MockSplitQueue<'_, GuestMemoryMmap>,
    tx: &MockSplitQueue<'_, GuestMemoryMmap>,
    bus: u64,
) -> Vec<u8> {
    let next = rx.avail().idx().load();
    rx.add_desc_chains(&[desc(bus + BUFFERS, 0x800, VRING_DESC_F_WRITE)], next)
        .unwrap();
    request_at(mem, tx, bus, BUFFERS + 0x1000)
}

/// A 5-byte request (after the header) on `tx` at guest-physical `at`, given to the device
/// at bus address `bus` + `at`.
fn request_at(
    mem: &GuestMemoryMmap,
    tx: &MockSplitQueue<'_, GuestMemoryMmap>,
    bus: u64,
    at: u64,
) -> Vec<u8> {
    let request: Vec<u8> = (0..(HDR + 5))
        .map(|i| if i < HDR { 0 } else { i as u8 })
        .collect();
    mem.write_slice(&request, GuestAddress(at)).unwrap();
    let next = tx.avail().idx().load();
    tx.add_desc_chains(&[desc(bus + at, request.len() as u32, 0)], next)
        .unwrap();
    request
}

#[test]
fn each_request_is_answered_in_the_next_receive_buffer() {
    let mem = memory();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let (mut engine, health) = engine(1, &[(0, &rx), (1, &tx)], DmaContext::platform(mem.clone()));
    let request = request_and_buffer(&mem, &rx, &tx, 0);
    let work = engine.process(1);
    assert!(
        work.notifications().any(|n| n == Notification::Queue(0)),
        "{work:?}"
    );
    assert_eq!(used_len(&rx, 0), HDR as u32 + 64);
    let mut response = [0u8; 64];
    mem.read_slice(&mut response, GuestAddress(BUFFERS + HDR as u64))
        .unwrap();
    assert_eq!(
        response.to_vec(),
        RequestResponse::response_to(&request[HDR..], 64)
    );
    assert_eq!(mem.read_obj::<u16>(GuestAddress(BUFFERS + 10)).unwrap(), 1); // num_buffers
    // One frame each way, headers counted: what `vm.counters` shows per queue.
    let [rx_count, tx_count] = health.log().queue_totals()[..2] else {
        panic!("two queues counted")
    };
    assert_eq!(
        (rx_count.completed, rx_count.bytes_written),
        (1, HDR as u64 + 64)
    );
    assert_eq!(
        (tx_count.completed, tx_count.bytes_read),
        (1, request.len() as u64)
    );
    assert_eq!((rx_count.bytes_read, tx_count.bytes_written), (0, 0));
}

#[test]
fn a_malformed_chain_stops_the_device_until_reset() {
    let mem = memory();
    let tx = driver_queue(&mem, 1);
    let (mut engine, health) = engine(1, &[(1, &tx)], DmaContext::platform(mem.clone()));
    // Descriptor 0 → 1 → 0: a loop.
    let looped = RawDescriptor::from(Descriptor::new(BUFFERS, 17, VRING_DESC_F_NEXT as u16, 1));
    let back = RawDescriptor::from(Descriptor::new(BUFFERS, 17, VRING_DESC_F_NEXT as u16, 0));
    tx.add_desc_chains(&[looped, back], 0).unwrap();
    assert_eq!(
        engine.process(1).notifications().collect::<Vec<_>>(),
        vec![Notification::Config]
    );
    assert!(health.needs_reset());
    assert_eq!(
        engine.process(1),
        Work::default(),
        "a broken device does nothing more"
    );
}

/// Defect: an available index more than a ring ahead made virtio-queue's pop return nothing
/// while "more work" stayed true, so the transmit loop spun forever.
#[test]
fn an_available_index_beyond_the_ring_breaks_the_device_instead_of_hanging_it() {
    for queue in [0usize, 1] {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mem = memory();
            let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
            let (mut engine, health) =
                engine(1, &[(0, &rx), (1, &tx)], DmaContext::platform(mem.clone()));
            // One request to answer, so the receive path runs too.
            request_and_buffer(&mem, &rx, &tx, 0);
            let ahead = [&rx, &tx][queue];
            ahead.avail().idx().store(QSIZE + 5);
            let work = engine.process(1);
            let _ = done.send((work, health.needs_reset()));
        });
        let (work, broken) = finished
            .recv_timeout(Duration::from_secs(20))
            .expect("the device loop returns");
        assert!(broken, "queue {queue}");
        assert_eq!(
            work.notifications().collect::<Vec<_>>(),
            vec![Notification::Config],
            "queue {queue}"
        );
    }
}

#[test]
fn without_bus_master_enable_the_rings_are_left_alone_until_it_is_set() {
    let mem = memory();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let dma = DmaContext::pci(mem.clone(), 0x18);
    let (mut engine, health) = engine(1, &[(0, &rx), (1, &tx)], dma.clone());
    request_and_buffer(&mem, &rx, &tx, 0);
    assert_eq!(engine.process(1), Work::default());
    assert_eq!(tx.used().idx().load(), 0, "nothing consumed");
    assert_eq!(rx.used().idx().load(), 0, "nothing written");
    assert!(!health.needs_reset(), "not an error: the work waits");
    dma.bus_master().set(true);
    assert!(
        engine
            .process(1)
            .notifications()
            .collect::<Vec<_>>()
            .contains(&Notification::Queue(0))
    );
    assert_eq!(rx.used().idx().load(), 1);
}

#[test]
fn a_too_small_receive_buffer_drops_the_frame_not_the_device() {
    let mem = memory();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let (mut engine, health) = engine(1, &[(0, &rx), (1, &tx)], DmaContext::platform(mem.clone()));
    rx.add_desc_chains(&[desc(BUFFERS, 16, VRING_DESC_F_WRITE)], 0)
        .unwrap();
    tx.add_desc_chains(&[desc(BUFFERS + 0x1000, 20, 0)], 0)
        .unwrap();
    engine.process(1);
    assert!(!health.needs_reset());
    assert_eq!(rx.used().idx().load(), 1);
    assert_eq!(used_len(&rx, 0), 0);
    let rx_count = health.log().queue_totals()[0];
    assert_eq!((rx_count.completed, rx_count.errors.guest), (1, 1));
}

/// A sink counts, in the device's log, each transmitted frame whose payload breaks the
/// stream's pattern: a figure, not a guest error; every frame is used all the same.
#[test]
fn the_sink_counts_bad_frames_in_the_devices_log() {
    let mem = memory();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let sink: Vec<Box<dyn NetBackend>> = vec![Box::new(Sink::default())];
    let dma = DmaContext::platform(mem.clone());
    let (mut engine, health) = engine_with(sink, &[(0, &rx), (1, &tx)], dma);
    // Frame n of a stream (byte i of its payload is n + i), with one byte flipped or not.
    let frame = |n: u64, wrong: Option<usize>| {
        let at = BUFFERS + n * 0x1000;
        let mut bytes = vec![0u8; HDR + 1500];
        for (i, b) in bytes[HDR..].iter_mut().enumerate() {
            *b = (n as usize + i) as u8;
        }
        if let Some(k) = wrong {
            bytes[HDR + k] ^= 0xff;
        }
        mem.write_slice(&bytes, GuestAddress(at)).unwrap();
        desc(at, bytes.len() as u32, 0)
    };
    let frames = [frame(0, None), frame(1, Some(1499)), frame(2, None)];
    tx.add_desc_chains(&frames, 0).unwrap();
    engine.process(1);
    assert_eq!(tx.used().idx().load(), 3, "every frame is used");
    assert_eq!(health.log().bad_frames(), 1);
    assert_eq!(health.log().guest_errors(), 0);
}

#[test]
fn several_pairs_offer_multiqueue_with_a_control_queue() {
    let (one, _) = VirtioNet::new([0; 6], vec![Box::new(RequestResponse::new(8))]);
    assert_eq!(one.queue_max_sizes().len(), 2);
    assert_eq!(one.features() & (1 << VIRTIO_NET_F_MQ), 0);
    let backends = (0..32)
        .map(|_| Box::new(RequestResponse::new(8)) as Box<dyn NetBackend>)
        .collect();
    let (mq, _) = VirtioNet::new([0; 6], backends);
    assert_eq!(
        mq.queue_max_sizes().len(),
        65,
        "32 pairs and the control queue"
    );
    let both = (1 << VIRTIO_NET_F_MQ) | (1 << VIRTIO_NET_F_CTRL_VQ);
    assert_eq!(mq.features() & both, both);
    let mut pairs = [0u8; 2];
    mq.read_config(8, &mut pairs);
    assert_eq!(u16::from_le_bytes(pairs), 32, "max_virtqueue_pairs");
}

#[test]
fn each_pair_answers_on_its_own_receive_queue_and_the_control_queue_acks() {
    let mem = memory();
    // Pair 1 (queues 2 and 3) and the control queue (6) of a 3-pair device.
    let (rx, tx, ctrl) = (
        driver_queue(&mem, 0),
        driver_queue(&mem, 1),
        driver_queue(&mem, 2),
    );
    let flags: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::default()).collect();
    let (mut engine, health) = engine_with(
        flagged(&flags),
        &[(2, &rx), (3, &tx), (6, &ctrl)],
        DmaContext::platform(mem.clone()),
    );
    assert_eq!(enabled(&flags), [true, false, false], "one pair until told");
    request_and_buffer(&mem, &rx, &tx, 0);
    let work = engine.process(3);
    assert!(
        work.notifications().any(|n| n == Notification::Queue(2)),
        "{work:?}"
    );
    assert_eq!(used_len(&rx, 0), HDR as u32 + 64);
    // VQ_PAIRS_SET 2 is accepted, 4 (more than there are) refused.
    for (n, (pairs, ack)) in [(2u16, VIRTIO_NET_OK), (4, VIRTIO_NET_ERR)]
        .into_iter()
        .enumerate()
    {
        let command = BUFFERS + 0x2000 + 0x100 * n as u64;
        let mut bytes = vec![
            VIRTIO_NET_CTRL_MQ as u8,
            VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8,
        ];
        bytes.extend_from_slice(&pairs.to_le_bytes());
        mem.write_slice(&bytes, GuestAddress(command)).unwrap();
        mem.write_obj(0xffu8, GuestAddress(command + 0x80)).unwrap();
        let d = 2 * n as u16;
        ctrl.add_desc_chains(
            &[
                RawDescriptor::from(Descriptor::new(command, 4, VRING_DESC_F_NEXT as u16, d + 1)),
                desc(command + 0x80, 1, VRING_DESC_F_WRITE),
            ],
            d,
        )
        .unwrap();
        assert_eq!(
            engine.process(6).notifications().collect::<Vec<_>>(),
            vec![Notification::Queue(6)]
        );
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress(command + 0x80)).unwrap(),
            ack as u8
        );
    }
    assert_eq!(enabled(&flags), [true, true, false], "2 set, 4 refused");
    assert!(!health.needs_reset());
}

/// A responder that records whether its pair is enabled.
struct Flagged(RequestResponse, Arc<AtomicBool>);

impl NetBackend for Flagged {
    fn transmit(&mut self, header: header::NetHeader, frame: &Segments) -> bool {
        self.0.transmit(header, frame)
    }
    fn pending(&mut self) -> Option<usize> {
        self.0.pending()
    }
    fn deliver(&mut self, into: &Segments, at: usize) {
        self.0.deliver(into, at);
    }
    fn discard(&mut self) {
        self.0.discard();
    }
    fn reset(&mut self) {
        self.0.reset();
    }
    fn set_enabled(&mut self, enabled: bool) {
        self.1.store(enabled, Ordering::SeqCst);
    }
}

fn flagged(flags: &[Arc<AtomicBool>]) -> Vec<Box<dyn NetBackend>> {
    flags
        .iter()
        .map(|f| Box::new(Flagged(RequestResponse::new(64), f.clone())) as Box<dyn NetBackend>)
        .collect()
}

fn enabled(flags: &[Arc<AtomicBool>]) -> Vec<bool> {
    flags.iter().map(|f| f.load(Ordering::SeqCst)).collect()
}

#[test]
fn a_reset_leaves_only_the_first_pair_enabled() {
    let flags: Vec<Arc<AtomicBool>> = (0..3).map(|_| Arc::default()).collect();
    let (_, mut queues) = VirtioNet::new([2, 0, 0, 0, 0, 1], flagged(&flags));
    queues.enable_pairs(3);
    assert_eq!(enabled(&flags), [true; 3]);
    QueueHandler::reset(&mut queues);
    assert_eq!(enabled(&flags), [true, false, false]);
}

/// A responder that clears Bus Master Enable as it takes a frame, as a guest clearing it
/// in the middle of a batch would.
struct ClosesTheGate(crate::dma::BusMaster, RequestResponse);

impl NetBackend for ClosesTheGate {
    fn transmit(&mut self, header: header::NetHeader, frame: &Segments) -> bool {
        self.0.set(false);
        self.1.transmit(header, frame)
    }
    fn pending(&mut self) -> Option<usize> {
        self.1.pending()
    }
    fn deliver(&mut self, into: &Segments, at: usize) {
        self.1.deliver(into, at);
    }
    fn discard(&mut self) {
        self.1.discard();
    }
    fn reset(&mut self) {}
}

/// Defect: clearing Bus Master Enable in the middle of a batch broke the device and lost
/// the chain it was on; it is a pause, and the chain is served when it is set again.
#[test]
fn bus_master_closing_mid_batch_pauses_instead_of_breaking_the_device() {
    let mem = memory();
    let tx = driver_queue(&mem, 1);
    let dma = DmaContext::pci(mem.clone(), 0x18);
    dma.bus_master().set(true);
    let backend = ClosesTheGate(dma.bus_master().clone(), RequestResponse::new(8));
    let (mut engine, health) = engine_with(vec![Box::new(backend)], &[(1, &tx)], dma.clone());
    mem.write_slice(&[0u8; HDR + 4], GuestAddress(BUFFERS))
        .unwrap();
    let frame = |at: u64| desc(at, (HDR + 4) as u32, 0);
    tx.add_desc_chains(&[frame(BUFFERS)], 0).unwrap();
    tx.add_desc_chains(&[frame(BUFFERS)], 1).unwrap();
    engine.process(1);
    assert!(!health.needs_reset(), "a pause, not an error");
    assert_eq!(
        tx.used().idx().load(),
        1,
        "the second chain went back to the ring"
    );
    dma.bus_master().set(true);
    engine.process(1);
    assert_eq!(tx.used().idx().load(), 2, "served once mastering is back");
    assert!(!health.needs_reset());
}

/// A backend fed from outside the guest, as a tap is: frames appear in `frames`, and
/// `wake` becomes readable when they do.
struct Outside {
    frames: Arc<std::sync::Mutex<VecDeque<Vec<u8>>>>,
    wake: vmm_sys_util::eventfd::EventFd,
}

impl NetBackend for Outside {
    fn transmit(&mut self, _header: header::NetHeader, _frame: &Segments) -> bool {
        true
    }
    fn pending(&mut self) -> Option<usize> {
        self.frames.lock().unwrap().front().map(Vec::len)
    }
    fn deliver(&mut self, into: &Segments, at: usize) {
        if let Some(frame) = self.frames.lock().unwrap().pop_front() {
            into.scatter(at, &frame);
        }
    }
    fn discard(&mut self) {
        self.frames.lock().unwrap().pop_front();
    }
    fn reset(&mut self) {}
    fn wake_fd(&self) -> Option<RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(&self.wake))
    }
}

/// A frame from outside reaches the driver with no doorbell rung: the backend's file wakes
/// the device thread for its pair's receive queue (pair 1: queue 2), and until it does
/// the frame waits.
#[test]
fn a_frame_from_outside_wakes_the_device_thread_for_its_pairs_receive_queue() {
    use crate::virtio::interrupt::{Interrupts, LegacyLine};
    use crate::virtio::worker::Worker;
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    let mem = memory();
    let rx = driver_queue(&mem, 0);
    let frames = Arc::new(std::sync::Mutex::new(VecDeque::new()));
    let outside = Outside {
        frames: frames.clone(),
        wake: EventFd::new(EFD_NONBLOCK).unwrap(),
    };
    let wake = outside.wake.try_clone().unwrap();
    let backends: Vec<Box<dyn NetBackend>> = vec![Box::new(Sink::default()), Box::new(outside)];
    let (engine, _) = engine_with(backends, &[(2, &rx)], DmaContext::platform(mem.clone()));
    let line = LegacyLine {
        irqfd: EventFd::new(EFD_NONBLOCK).unwrap(),
        resample: EventFd::new(EFD_NONBLOCK).unwrap(),
    };
    let irq = line.irqfd.try_clone().unwrap();
    let log = DeviceLog::new("test");
    let interrupts = Arc::new(Interrupts::new(5, Some(line), None, log));
    let doorbells = (0..5)
        .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
        .collect();
    let _worker = Worker::spawn("net-test".into(), engine, interrupts, doorbells).unwrap();
    rx.add_desc_chains(&[desc(BUFFERS, 0x800, VRING_DESC_F_WRITE)], 0)
        .unwrap();
    let frame: Vec<u8> = (0..60u8).collect();
    frames.lock().unwrap().push_back(frame.clone());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(rx.used().idx().load(), 0, "nothing woke the thread yet");
    wake.write(1).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rx.used().idx().load() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(rx.used().idx().load(), 1, "delivered once woken");
    assert_eq!(used_len(&rx, 0), (HDR + frame.len()) as u32);
    let mut got = vec![0u8; frame.len()];
    mem.read_slice(&mut got, GuestAddress(BUFFERS + HDR as u64))
        .unwrap();
    assert_eq!(got, frame);
    assert_eq!(irq.read().unwrap(), 1, "the driver was interrupted");
}

/// A remapping unit with translation and queued invalidation on, the function `SID` in
/// domain 1 with every page of the first two queues' rings and of the buffers mapped at
/// `IOVA` above it; the engine is given its DMA context.
fn behind_iommu() -> (Unit, Tables, u64) {
    let u = unit();
    u.enable();
    u.enable_queue();
    let mut t = Tables::new(&u.mem, ROOT);
    let pt = t.attach(SID, 1);
    for page in (0x4000..0xc000)
        .chain(BUFFERS..BUFFERS + 0x2000)
        .step_by(0x1000)
    {
        t.map(pt, IOVA + page, page, RW);
    }
    (u, t, pt)
}

#[test]
fn behind_an_iommu_requests_are_answered_through_translated_rings_and_buffers() {
    let (u, _t, _pt) = behind_iommu();
    let (rx, tx) = (driver_queue(&u.mem, 0), driver_queue(&u.mem, 1));
    let (mut engine, health) = engine(1, &[(0, &rx), (1, &tx)], u.device());
    let request = request_and_buffer(&u.mem, &rx, &tx, IOVA);
    let work = engine.process(1);
    assert!(
        work.notifications().any(|n| n == Notification::Queue(0)),
        "{work:?}"
    );
    assert_eq!(used_len(&rx, 0), HDR as u32 + 64);
    let mut response = [0u8; 64];
    u.mem
        .read_slice(&mut response, GuestAddress(BUFFERS + HDR as u64))
        .unwrap();
    assert_eq!(
        response.to_vec(),
        RequestResponse::response_to(&request[HDR..], 64)
    );
    assert!(!health.needs_reset());
    let s = u.iommu.stats();
    assert!(s.walks >= 2 && s.faults == 0, "{s:?}");
}

/// A buffer the guest did not map: the unit records the fault, the device never touches
/// it and completes the chain with length 0, and goes on with the next one.
#[test]
fn a_buffer_the_iommu_refuses_completes_with_length_zero_and_the_device_goes_on() {
    let (u, mut t, pt) = behind_iommu();
    let (rx, tx) = (driver_queue(&u.mem, 0), driver_queue(&u.mem, 1));
    let (mut engine, health) = engine(1, &[(0, &rx), (1, &tx)], u.device());
    t.unmap(pt, IOVA + BUFFERS + 0x1000);
    request_and_buffer(&u.mem, &rx, &tx, IOVA);
    let work = engine.process(1);
    assert_eq!(
        work.notifications().collect::<Vec<_>>(),
        vec![Notification::Queue(1)]
    );
    assert_eq!((tx.used().idx().load(), used_len(&tx, 0)), (1, 0));
    assert_eq!(rx.used().idx().load(), 0, "nothing was transmitted");
    assert!(!health.needs_reset(), "a fault is not DEVICE_NEEDS_RESET");
    assert_eq!(u.fault_reason(), Some(VTD_FR_READ));
    assert_eq!(u.routes.injected(), vec![FAULT_MSI]);
    let tx_count = health.log().queue_totals()[1];
    assert_eq!((tx_count.completed, tx_count.errors.iommu), (1, 1));
    // Mapped again (not-present entries are not cached): served.
    t.map(pt, IOVA + BUFFERS + 0x1000, BUFFERS + 0x1000, VTD_PTE_R);
    request_and_buffer(&u.mem, &rx, &tx, IOVA);
    engine.process(1);
    assert_eq!(rx.used().idx().load(), 1);
}

/// The window deferred invalidation leaves open and strict closes, at the device: after the
/// guest clears the PTE of a buffer page, a chain on it is still served from the IOTLB until
/// the invalidation and its wait; the first chain after them faults.
#[test]
fn after_unmap_a_buffer_is_reachable_until_the_invalidation_and_not_after_it() {
    let (mut u, mut t, pt) = behind_iommu();
    let mem = u.mem.clone();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let (mut engine, _) = engine(1, &[(0, &rx), (1, &tx)], u.device());
    request_and_buffer(&u.mem, &rx, &tx, IOVA);
    engine.process(1);
    assert_eq!(rx.used().idx().load(), 1);
    t.unmap(pt, IOVA + BUFFERS + 0x1000);
    request_and_buffer(&u.mem, &rx, &tx, IOVA);
    engine.process(1);
    assert_eq!(
        rx.used().idx().load(),
        2,
        "deferred: the cached translation is used"
    );
    u.submit(&[
        iotlb_pages(1, IOVA + BUFFERS + 0x1000, 0),
        wait(Some(1), false),
    ]);
    request_and_buffer(&u.mem, &rx, &tx, IOVA);
    engine.process(1);
    assert_eq!(
        rx.used().idx().load(),
        2,
        "strict: refused right after the wait"
    );
    assert_eq!((tx.used().idx().load(), used_len(&tx, 2)), (3, 0));
    assert_eq!(u.iommu.stats().iotlb_dropped_stale, 1);
}

/// Rings are translated at activation and again when an invalidation covers them: a ring
/// the unit refuses is a fault and the queue waits, the device stays healthy.
#[test]
fn a_ring_is_translated_again_after_an_invalidation_covering_it() {
    let (mut u, mut t, pt) = behind_iommu();
    let mem = u.mem.clone();
    let (rx, tx) = (driver_queue(&mem, 0), driver_queue(&mem, 1));
    let (mut engine, health) = engine(1, &[(0, &rx), (1, &tx)], u.device());
    request_and_buffer(&u.mem, &rx, &tx, IOVA);
    engine.process(1);
    let used_ring = tx.used_addr().0 & !0xfff;
    t.unmap(pt, IOVA + used_ring);
    request_and_buffer(&u.mem, &rx, &tx, IOVA);
    engine.process(1);
    assert_eq!(
        tx.used().idx().load(),
        2,
        "uninvalidated: the ring translation stays"
    );
    u.submit(&[iotlb_pages(1, IOVA + used_ring, 0), wait(Some(1), false)]);
    request_and_buffer(&u.mem, &rx, &tx, IOVA);
    assert_eq!(engine.process(1), Work::default());
    assert_eq!(tx.used().idx().load(), 2);
    // The page holds the driver ring too, translated (for reading) first.
    assert_eq!(u.fault_reason(), Some(VTD_FR_READ));
    assert!(!health.needs_reset());
    t.map(pt, IOVA + used_ring, used_ring, RW);
    engine.process(1);
    assert_eq!(tx.used().idx().load(), 3, "mapped again: the queue goes on");
}

#[test]
fn behind_an_iommu_an_indirect_descriptor_breaks_the_device() {
    let (u, _t, _pt) = behind_iommu();
    let tx = driver_queue(&u.mem, 1);
    let (mut engine, health) = engine(1, &[(1, &tx)], u.device());
    let indirect = VIRTQ_DESC_F_INDIRECT;
    tx.add_desc_chains(&[desc(IOVA + BUFFERS, 16, indirect)], 0)
        .unwrap();
    assert_eq!(
        engine.process(1).notifications().collect::<Vec<_>>(),
        vec![Notification::Config]
    );
    assert!(health.needs_reset());
}

/// A backend that passes headers, as a tap does: it records the headers it is given with
/// their frames' lengths and the offloads it is told, and gives the frames in `incoming`
/// with their headers.
#[derive(Default)]
struct Offloading {
    sent: Arc<std::sync::Mutex<Vec<(header::NetHeader, usize)>>>,
    told: Arc<std::sync::Mutex<Vec<header::Direction>>>,
    incoming: VecDeque<(header::NetHeader, Vec<u8>)>,
    /// It takes UDP segments too.
    uso: bool,
}

impl NetBackend for Offloading {
    fn transmit(&mut self, header: header::NetHeader, frame: &Segments) -> bool {
        self.sent.lock().unwrap().push((header, frame.len()));
        true
    }
    fn pending(&mut self) -> Option<usize> {
        self.incoming.front().map(|(_, frame)| frame.len())
    }
    fn held_header(&self) -> header::NetHeader {
        self.incoming.front().map(|(h, _)| *h).unwrap_or_default()
    }
    fn deliver(&mut self, into: &Segments, at: usize) {
        if let Some((_, frame)) = self.incoming.pop_front() {
            into.scatter(at, &frame);
        }
    }
    fn discard(&mut self) {
        self.incoming.pop_front();
    }
    fn reset(&mut self) {}
    fn passes_headers(&self) -> bool {
        true
    }
    fn passes_uso(&self) -> bool {
        self.uso
    }
    fn set_offloads(&mut self, rx: header::Direction) {
        self.told.lock().unwrap().push(rx);
    }
}

use header::tests::tso4 as tso4_header;

#[test]
fn the_offloads_are_offered_only_where_every_backend_passes_headers() {
    let offloading = || Box::new(Offloading::default()) as Box<dyn NetBackend>;
    let (net, _) = VirtioNet::new([2, 0, 0, 0, 0, 1], vec![offloading(), offloading()]);
    assert_eq!(
        net.features() & header::OFFLOAD_FEATURES,
        header::OFFLOAD_FEATURES
    );
    let (net, _) = VirtioNet::new(
        [2, 0, 0, 0, 0, 1],
        vec![offloading(), Box::new(Sink::default())],
    );
    assert_eq!(net.features() & header::OFFLOAD_FEATURES, 0);
}

/// UDP segmentation is offered where every backend takes it (a tap on Linux 6.2 or later),
/// and not where one does not.
#[test]
fn uso_is_offered_only_where_every_backend_takes_udp_segments() {
    let backend = |uso| {
        Box::new(Offloading {
            uso,
            ..Offloading::default()
        }) as Box<dyn NetBackend>
    };
    let uso = header::USO_FEATURES;
    let (net, _) = VirtioNet::new([2, 0, 0, 0, 0, 1], vec![backend(true), backend(true)]);
    assert_eq!(net.features() & uso, uso);
    let (net, _) = VirtioNet::new([2, 0, 0, 0, 0, 1], vec![backend(true), backend(false)]);
    assert_eq!(net.features() & uso, 0);
    assert_eq!(
        net.features() & header::OFFLOAD_FEATURES,
        header::OFFLOAD_FEATURES
    );
}

/// Transmitted frames, each `len` bytes after `header`, one chain each on `tx` from
/// `BUFFERS` + 0x1000.
fn transmit_frames(
    mem: &GuestMemoryMmap,
    tx: &MockSplitQueue<'_, GuestMemoryMmap>,
    frames: &[(header::NetHeader, usize)],
) {
    let mut at = BUFFERS + 0x1000;
    let mut chains = Vec::new();
    for (header, len) in frames {
        mem.write_slice(&header.to_bytes(), GuestAddress(at))
            .unwrap();
        chains.push(desc(at, (HDR + len) as u32, 0));
        at += 0x1000;
    }
    tx.add_desc_chains(&chains, 0).unwrap();
}

#[test]
fn a_segment_reaches_the_backend_with_its_header_and_one_against_the_features_is_dropped_and_counted()
 {
    let mem = memory();
    let tx = driver_queue(&mem, 1);
    let backend = Offloading::default();
    let sent = backend.sent.clone();
    let (mut engine, health) = engine_negotiated(
        vec![Box::new(backend)],
        &[(1, &tx)],
        DmaContext::platform(mem.clone()),
        header::OFFLOAD_FEATURES,
    );
    let udp = header::NetHeader {
        gso_type: VIRTIO_NET_HDR_GSO_UDP as u8,
        ..tso4_header()
    };
    let past_the_frame = header::NetHeader {
        csum_start: 2000,
        ..tso4_header()
    };
    transmit_frames(
        &mem,
        &tx,
        &[(tso4_header(), 3000), (udp, 3000), (past_the_frame, 1000)],
    );
    engine.process(1);
    assert_eq!(
        tx.used().idx().load(),
        3,
        "every chain is used, dropped or not"
    );
    assert_eq!(*sent.lock().unwrap(), vec![(tso4_header(), 3000)]);
    assert_eq!(health.log().guest_errors(), 2);
    let tx_count = health.log().queue_totals()[1];
    assert_eq!((tx_count.completed, tx_count.errors.guest), (3, 2));
}

#[test]
fn without_the_offloads_negotiated_a_segment_is_dropped_and_a_plain_frame_goes() {
    let mem = memory();
    let tx = driver_queue(&mem, 1);
    let backend = Offloading::default();
    let sent = backend.sent.clone();
    let (mut engine, health) = engine_negotiated(
        vec![Box::new(backend)],
        &[(1, &tx)],
        DmaContext::platform(mem.clone()),
        0,
    );
    transmit_frames(
        &mem,
        &tx,
        &[(tso4_header(), 3000), (header::NetHeader::default(), 60)],
    );
    engine.process(1);
    assert_eq!(
        *sent.lock().unwrap(),
        vec![(header::NetHeader::default(), 60)]
    );
    assert_eq!(health.log().guest_errors(), 1);
}

#[test]
fn the_driver_gets_the_backends_header_only_with_what_it_negotiated_and_the_backend_is_told() {
    let mem = memory();
    let rx = driver_queue(&mem, 0);
    let valid = header::NetHeader {
        flags: VIRTIO_NET_HDR_F_DATA_VALID as u8,
        ..header::NetHeader::default()
    };
    let backend = Offloading {
        incoming: [(tso4_header(), vec![7; 3000]), (valid, vec![8; 60])].into(),
        ..Offloading::default()
    };
    let told = backend.told.clone();
    let guest_csum = 1 << virtio_bindings::virtio_net::VIRTIO_NET_F_GUEST_CSUM;
    let (mut engine, _) = engine_negotiated(
        vec![Box::new(backend)],
        &[(0, &rx)],
        DmaContext::platform(mem.clone()),
        guest_csum,
    );
    assert_eq!(
        *told.lock().unwrap(),
        vec![header::Offloads::negotiated(guest_csum).rx]
    );
    let chains = [
        desc(BUFFERS, 0x1000, VRING_DESC_F_WRITE),
        desc(BUFFERS + 0x1000, 0x1000, VRING_DESC_F_WRITE),
    ];
    rx.add_desc_chains(&chains, 0).unwrap();
    engine.process(0);
    // The segment (GUEST_TSO4 not negotiated) is dropped before a buffer is taken for it.
    assert_eq!(rx.used().idx().load(), 1);
    assert_eq!(used_len(&rx, 0), (HDR + 60) as u32);
    let mut got = [0u8; HDR];
    mem.read_slice(&mut got, GuestAddress(BUFFERS)).unwrap();
    let delivered = header::NetHeader {
        num_buffers: 1,
        ..valid
    };
    assert_eq!(got, delivered.to_bytes());
    engine.reset();
    assert_eq!(
        told.lock().unwrap().last(),
        Some(&header::Direction::default()),
        "a reset takes the offloads away"
    );
}
