#![no_main]
//! The virtio-net queue work over arbitrary rings: guest memory is the input (descriptor
//! tables, available rings, buffers, control commands), the queues' sizes and event-idx come
//! from it too, and every queue is processed as a device thread would. Beyond "no panic": each
//! call returns (the work per call is bounded by a ring), the device either serves or breaks
//! (DEVICE_NEEDS_RESET), and nothing outside guest memory is touched (guest memory is the
//! only memory the device reaches, through its DMA context).

use std::sync::Arc;

use exitless::dma::DmaContext;
use exitless::logging::DeviceLog;
use exitless::virtio::device::DeviceHealth;
use exitless::virtio::engine::QueueEngine;
use exitless::virtio::net::header::{OFFLOAD_FEATURES, USO_FEATURES};
use exitless::virtio::net::{NetBackend, RequestResponse, VirtioNet};
use libfuzzer_sys::fuzz_target;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const MEM: usize = 0x4_0000;
/// The rings sit at the start of memory, where the input lands, the ones the device reads
/// first: every queue's available ring (64 bytes each, so its index is in the input's first
/// bytes), then the descriptor tables (16 × 16 bytes each), then the used rings.
const AVAIL: u64 = 0x0;
const DESC: u64 = 0x200;
const USED: u64 = 0x800;

fuzz_target!(|data: &[u8]| {
    let Some((&config, image)) = data.split_first() else {
        return;
    };
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap();
    mem.write_slice(&image[..image.len().min(MEM)], GuestAddress(0))
        .unwrap();
    // Two pairs: receive/transmit queues 0..=3 and the control queue 4.
    let backends = (0..2)
        .map(|_| Box::new(RequestResponse::new(100)) as Box<dyn NetBackend>)
        .collect();
    let (_net, handler) = VirtioNet::new([0; 6], backends);
    let size = 1u16 << (config % 5); // 1..=16: the rings fit their area
    let queues: Vec<Queue> = (0..5u64)
        .map(|i| {
            let mut q = Queue::new(256).unwrap();
            q.set_size(size);
            q.set_desc_table_address(Some((DESC + 0x100 * i) as u32), Some(0));
            // virtio-queue takes an available ring at 0 for "not set up": start at 0x40.
            q.set_avail_ring_address(Some((AVAIL + 0x40 * (i + 1)) as u32), Some(0));
            q.set_used_ring_address(Some((USED + 0x100 * i) as u32), Some(0));
            q.set_event_idx(config & 0x80 != 0);
            q.set_ready(true);
            q
        })
        .collect();
    let health = Arc::new(DeviceHealth::new(DeviceLog::new("fuzz")));
    let mut engine = QueueEngine::new(Box::new(handler), health);
    // Half the inputs with the offloads negotiated: transmitted headers are checked against
    // them (the backend passes none, so received frames carry no offloads). Half with
    // mergeable receive buffers: a 112-byte response may take several chains, or the whole
    // ring and be dropped.
    let offloads = if config & 0x40 != 0 {
        OFFLOAD_FEATURES | USO_FEATURES
    } else {
        0
    };
    let mergeable = if config & 0x20 != 0 { 1 << VIRTIO_NET_F_MRG_RXBUF } else { 0 };
    let features = offloads | mergeable;
    engine.activate(queues, DmaContext::platform(mem), features);
    for round in 0..4 {
        for q in [1usize, 3, 4, 0, 2] {
            let work = engine.process(q);
            let _ = (round, work);
        }
    }
});
