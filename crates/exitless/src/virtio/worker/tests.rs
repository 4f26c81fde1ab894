//! The device thread as a driver sees it: a stream on a queue that asks for no interrupts,
//! driven by a driver that notifies exactly when §2.7.10 says it must, is served chain after
//! chain whatever phase the thread is in (serving, polling with notifications held off,
//! rearming, asleep): no chain waits forever for a kick the thread told the driver to skip.

use std::num::Wrapping;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_queue::desc::RawDescriptor;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::Worker;
use crate::dma::DmaContext;
use crate::logging::DeviceLog;
use crate::virtio::device::{DeviceHealth, VirtioDevice};
use crate::virtio::engine::QueueEngine;
use crate::virtio::interrupt::Interrupts;
use crate::virtio::net::{NetBackend, Sink, VirtioNet};

const QSIZE: u16 = 16;
/// The transmit queue of the first pair.
const TX: usize = 1;
/// Chains the driver streams.
const CHAINS: u16 = 300;

#[test]
fn a_stream_is_served_whatever_phase_its_kicks_meet() {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
    let tx = MockSplitQueue::create(&mem, GuestAddress(0x8000), QSIZE);
    let (net, handler) = VirtioNet::new(
        [2, 0, 0, 0, 0, 1],
        vec![Box::new(Sink::default()) as Box<dyn NetBackend>],
    );
    let mut queues: Vec<Queue> = (net.queue_max_sizes().into_iter())
        .map(|max| Queue::new(max).unwrap())
        .collect();
    queues[TX] = tx.create_queue().unwrap();
    queues[TX].set_event_idx(true);
    // No transmit interrupts: used_event far ahead, as the probe's driver sets it.
    let used_event = GuestAddress(tx.avail_addr().0 + 4 + 2 * u64::from(QSIZE));
    mem.write_obj(0x4000u16, used_event).unwrap();
    let avail_event = GuestAddress(tx.used_addr().0 + 4 + 8 * u64::from(QSIZE));
    let health = Arc::new(DeviceHealth::new(DeviceLog::new("test")));
    let mut engine = QueueEngine::new(Box::new(handler), health);
    engine.activate(queues, DmaContext::platform(mem.clone()), 0);
    let doorbells: Vec<EventFd> = (0..net.queue_max_sizes().len())
        .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
        .collect();
    let kick = doorbells[TX].try_clone().unwrap();
    let interrupts = Arc::new(Interrupts::new(
        doorbells.len(),
        None,
        None,
        DeviceLog::new("test"),
    ));
    let _worker = Worker::spawn("poll-test".into(), engine, interrupts, doorbells).unwrap();
    let frame = RawDescriptor::from(Descriptor::new(0x2_0000, 64, 0, 0));
    let mut kicks = 0;
    for n in 0..CHAINS {
        // Publish chain `n` (descriptor `n % QSIZE`, the ring's slot `n % QSIZE`).
        let slot = n % QSIZE;
        tx.desc_table().store(slot, frame).unwrap();
        tx.avail()
            .ring()
            .ref_at(usize::from(slot))
            .unwrap()
            .store(slot);
        tx.avail().idx().store(n + 1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // §2.7.10: notify if the new idx passed avail_event.
        let event = Wrapping(mem.read_obj::<u16>(avail_event).unwrap());
        let (new, old) = (Wrapping(n + 1), Wrapping(n));
        if new - event - Wrapping(1) < new - old {
            kick.write(1).unwrap();
            kicks += 1;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while tx.used().idx().load() != n + 1 {
            assert!(
                Instant::now() < deadline,
                "chain {n} never served ({kicks} kicks)"
            );
            std::thread::yield_now();
        }
        // Vary the phase the next chain meets: at once, within the poll, after it.
        match n % 3 {
            0 => {}
            1 => std::thread::sleep(Duration::from_micros(10)),
            _ => std::thread::sleep(Duration::from_micros(200)),
        }
    }
    assert!(kicks >= 1, "the first chain had to be notified");
}
