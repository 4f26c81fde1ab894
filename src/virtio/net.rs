//! virtio-net (virtio 1.2 §5.1) with a pluggable backend. Frames the driver transmits go to the
//! backend; frames the backend produces go into the driver's receive buffers.

use std::collections::VecDeque;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::chain;
use super::device::{DeviceError, VirtioDevice};
use super::regs::{VIRTIO_ID_NET, VIRTIO_NET_HDR_SIZE};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR, VIRTIO_NET_F_CTRL_VQ,
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MQ, VIRTIO_NET_OK,
};

/// Largest frame accepted: a 64 KiB GSO-less frame plus the Ethernet header.
pub const MAX_FRAME: usize = 65_550;
/// Queue size offered for every queue.
pub const QUEUE_SIZE: u16 = 256;

const HDR: usize = VIRTIO_NET_HDR_SIZE as usize;

/// Where frames go and come from. A tap device is one backend; the benchmark's request/response
/// responder is another.
pub trait NetBackend: Send {
    /// The driver sent `frame` (without the virtio-net header).
    fn transmit(&mut self, frame: &[u8]);
    /// The next frame for the driver, if any.
    fn receive(&mut self) -> Option<Vec<u8>>;
    /// Drop anything queued (the device was reset).
    fn reset(&mut self);
}

/// Answers every transmitted frame with one frame of `response_size` bytes, as netperf TCP_RR
/// `-r 32,1024` does: byte `i` of the response is the complement of request byte
/// `i % request length`, so the driver can check that both directions were intact.
pub struct RequestResponse {
    response_size: usize,
    queued: VecDeque<Vec<u8>>,
}

/// Most responses the responder holds before it drops requests (a full receive queue).
const MAX_QUEUED: usize = 256;

impl RequestResponse {
    /// A responder that answers with `response_size`-byte frames.
    pub fn new(response_size: usize) -> Self {
        RequestResponse {
            response_size,
            queued: VecDeque::new(),
        }
    }

    /// The response to `request`.
    pub fn response_to(request: &[u8], size: usize) -> Vec<u8> {
        (0..size).map(|i| !request[i % request.len()]).collect()
    }
}

impl NetBackend for RequestResponse {
    fn transmit(&mut self, frame: &[u8]) {
        if frame.is_empty() {
            return;
        }
        if self.queued.len() >= MAX_QUEUED {
            warn_ratelimited!(
                "virtio-net responder: {MAX_QUEUED} responses undelivered; request dropped"
            );
            return;
        }
        self.queued
            .push_back(Self::response_to(frame, self.response_size));
    }

    fn receive(&mut self) -> Option<Vec<u8>> {
        self.queued.pop_front()
    }

    fn reset(&mut self) {
        self.queued.clear();
    }
}

/// One receive/transmit queue pair and the backend queue behind it (a multiqueue tap has one
/// file per pair in the same way).
struct QueuePair {
    backend: Box<dyn NetBackend>,
    /// A frame that found no receive buffer, delivered when the driver adds one.
    waiting: Option<Vec<u8>>,
}

/// A virtio-net device with one or more receive/transmit queue pairs (virtio 1.2 §5.1.2:
/// receiveq`k` is queue 2k, transmitq`k` is 2k+1) and, with several pairs, the control queue
/// last, offering VIRTIO_NET_F_MQ (§5.1.6.5.5).
pub struct VirtioNet {
    pairs: Vec<QueuePair>,
    mac: [u8; 6],
}

/// Offset of `max_virtqueue_pairs` in `struct virtio_net_config` (after mac[6] and status).
const CONFIG_MAX_PAIRS: usize = 8;

impl VirtioNet {
    /// A device with `mac` and one queue pair per backend (at least one).
    pub fn new(mac: [u8; 6], backends: Vec<Box<dyn NetBackend>>) -> Self {
        assert!(!backends.is_empty(), "a virtio-net device has a queue pair");
        VirtioNet {
            pairs: backends
                .into_iter()
                .map(|backend| QueuePair {
                    backend,
                    waiting: None,
                })
                .collect(),
            mac,
        }
    }

    fn multiqueue(&self) -> bool {
        self.pairs.len() > 1
    }

    fn control_queue(&self) -> Option<usize> {
        self.multiqueue().then(|| 2 * self.pairs.len())
    }

    fn transmit(
        pair: &mut QueuePair,
        q: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let mut used = false;
        loop {
            q.disable_notification(mem)?;
            while let Some(desc) = q.pop_descriptor_chain(mem) {
                let c = chain::check(desc, mem)?;
                let len = c.readable_len();
                if len < HDR as u64 || len > (HDR + MAX_FRAME) as u64 {
                    warn_ratelimited!(
                        "virtio-net: transmitted frame of {len} bytes (with header) dropped"
                    );
                } else {
                    let data = c.read_all(mem)?;
                    pair.backend.transmit(&data[HDR..]);
                }
                q.add_used(mem, c.head, 0)?;
                used = true;
            }
            if !q.enable_notification(mem)? {
                return Ok(used);
            }
        }
    }

    fn receive(
        pair: &mut QueuePair,
        q: &mut Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<bool, DeviceError> {
        let mut used = false;
        // Receive buffers are refilled by the driver as it consumes them: no kicks are needed
        // while there are buffers, so notifications stay off until the queue runs dry.
        q.disable_notification(mem)?;
        while let Some(frame) = pair.waiting.take().or_else(|| pair.backend.receive()) {
            let Some(desc) = q.pop_descriptor_chain(mem) else {
                pair.waiting = Some(frame);
                if q.enable_notification(mem)? {
                    continue; // buffers arrived meanwhile
                }
                break;
            };
            let c = chain::check(desc, mem)?;
            let total = HDR + frame.len();
            if c.writable_len() < total as u64 {
                warn_ratelimited!(
                    "virtio-net: receive buffer of {} bytes too small for a {total}-byte frame; frame dropped",
                    c.writable_len()
                );
                q.add_used(mem, c.head, 0)?;
            } else {
                let mut data = vec![0u8; total];
                // num_buffers (le16 at offset 10) is 1: one buffer holds the frame.
                data[10] = 1;
                data[HDR..].copy_from_slice(&frame);
                c.write_all(mem, &data)?;
                q.add_used(
                    mem,
                    c.head,
                    u32::try_from(total).expect("≤ MAX_FRAME + header"),
                )?;
            }
            used = true;
        }
        Ok(used)
    }

    /// Control commands (virtio 1.2 §5.1.6.5): class, command, data, then one writable ack
    /// byte. Only VQ_PAIRS_SET is supported; anything else is answered VIRTIO_NET_ERR.
    fn control(&self, q: &mut Queue, mem: &GuestMemoryMmap) -> Result<bool, DeviceError> {
        let mut used = false;
        while let Some(desc) = q.pop_descriptor_chain(mem) {
            let c = chain::check(desc, mem)?;
            if c.writable_len() == 0 || c.readable_len() > 64 {
                warn_ratelimited!("virtio-net: malformed control command dropped");
                q.add_used(mem, c.head, 0)?;
                used = true;
                continue;
            }
            let command = c.read_all(mem)?;
            let ack = match command.as_slice() {
                [class, cmd, lo, hi]
                    if u32::from(*class) == VIRTIO_NET_CTRL_MQ
                        && u32::from(*cmd) == VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET =>
                {
                    let pairs = usize::from(u16::from_le_bytes([*lo, *hi]));
                    // Responses only ever go to the pair whose transmit queue carried the
                    // request, so no pair beyond the enabled ones receives anything (as
                    // §5.1.6.5.5 requires) and the count needs no state of its own.
                    if (1..=self.pairs.len()).contains(&pairs) {
                        VIRTIO_NET_OK
                    } else {
                        warn_ratelimited!(
                            "virtio-net: driver asked for {pairs} queue pairs of {}; refused",
                            self.pairs.len()
                        );
                        VIRTIO_NET_ERR
                    }
                }
                _ => VIRTIO_NET_ERR,
            };
            c.write_all(
                mem,
                &[u8::try_from(ack).expect("VIRTIO_NET_OK or VIRTIO_NET_ERR")],
            )?;
            q.add_used(mem, c.head, 1)?;
            used = true;
        }
        Ok(used)
    }
}

impl VirtioDevice for VirtioNet {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        let mq = (1 << VIRTIO_NET_F_MQ) | (1 << VIRTIO_NET_F_CTRL_VQ);
        (1 << VIRTIO_NET_F_MAC) | if self.multiqueue() { mq } else { 0 }
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 2 * self.pairs.len() + usize::from(self.multiqueue())]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_net_config: mac[6], status (not offered: 0), max_virtqueue_pairs.
        let mut config = [0u8; CONFIG_MAX_PAIRS + 2];
        config[..6].copy_from_slice(&self.mac);
        let pairs = u16::try_from(self.pairs.len()).unwrap_or(u16::MAX);
        config[CONFIG_MAX_PAIRS..].copy_from_slice(&pairs.to_le_bytes());
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| config.get(o))
                .copied()
                .unwrap_or(0);
        }
    }

    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        mem: &GuestMemoryMmap,
    ) -> Result<Vec<usize>, DeviceError> {
        if Some(index) == self.control_queue() {
            return Ok(if self.control(&mut queues[index], mem)? {
                vec![index]
            } else {
                Vec::new()
            });
        }
        let (rx, tx) = (index & !1, index | 1);
        let Some(pair) = self.pairs.get_mut(index / 2) else {
            return Ok(Vec::new());
        };
        let mut used = Vec::new();
        if index == tx && Self::transmit(pair, &mut queues[tx], mem)? {
            used.push(tx);
        }
        if queues[rx].ready() && Self::receive(pair, &mut queues[rx], mem)? {
            used.push(rx);
        }
        Ok(used)
    }

    fn reset(&mut self) {
        for pair in &mut self.pairs {
            pair.waiting = None;
            pair.backend.reset();
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // fixtures
mod tests {
    use super::*;
    use crate::virtio::chain::tests::{memory, publish, write_desc};
    use crate::virtio::device::{Notification, VirtioState};
    use crate::virtio::regs::*;
    use crate::virtio::{Ring, set_queue_address};
    use vm_memory::{Bytes, GuestAddress};

    /// Rings of queue q at 0x1000 + 0x3000 q: descriptors, then available, then used.
    fn ring(q: u64, part: u64) -> u64 {
        0x1000 + 0x3000 * q + 0x1000 * part
    }

    /// A live single-pair device with both queues set up as a driver would.
    fn live_device(mem: &vm_memory::GuestMemoryMmap) -> VirtioState {
        live_with(mem, 1, &[0, 1])
    }

    /// A live device with `pairs` queue pairs whose queues `queues` are set up, the n-th of
    /// them with its rings at `ring(n, _)`.
    fn live_with(mem: &vm_memory::GuestMemoryMmap, pairs: usize, queues: &[u32]) -> VirtioState {
        let backends = (0..pairs)
            .map(|_| Box::new(RequestResponse::new(64)) as Box<dyn NetBackend>)
            .collect();
        let net = VirtioNet::new([2, 0, 0, 0, 0, 1], backends);
        let mut st = VirtioState::new(Box::new(net), 0, mem.clone());
        st.write_status(VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
        st.driver_features_select = 1;
        st.write_driver_features(1); // VIRTIO_F_VERSION_1
        st.write_status(
            VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER | VIRTIO_STATUS_FEATURES_OK,
        );
        for (n, &q) in queues.iter().enumerate() {
            st.queue_select = q;
            assert!(!st.set_queue_size(16));
            for (part, r) in [Ring::Descriptors, Ring::Driver, Ring::Device]
                .into_iter()
                .enumerate()
            {
                set_queue_address(&mut st, r, false, ring(n as u64, part as u64) as u32);
            }
            assert!(!st.set_queue_ready(true));
        }
        st.write_status(0xf);
        assert!(st.is_live());
        st
    }

    #[test]
    fn each_request_is_answered_in_the_next_receive_buffer() {
        let mem = memory();
        let mut st = live_device(&mem);
        write_desc(
            &mem,
            ring(0, 0),
            0,
            (0x9000, 0x800, VIRTQ_DESC_F_WRITE as u16, 0),
        );
        publish(&mem, ring(0, 1), &[0]);
        let request: Vec<u8> = (0..(12 + 5))
            .map(|i| if i < 12 { 0 } else { i as u8 })
            .collect();
        mem.write_slice(&request, GuestAddress(0x8000)).unwrap();
        write_desc(&mem, ring(1, 0), 0, (0x8000, 17, 0, 0));
        publish(&mem, ring(1, 1), &[0]);
        let due = st.process(VIRTIO_NET_TX_QUEUE as usize);
        assert!(due.contains(&Notification::Queue(0)), "{due:?}");
        let used_len: u32 = mem.read_obj(GuestAddress(ring(0, 2) + 8)).unwrap();
        assert_eq!(used_len, 12 + 64);
        let mut response = [0u8; 64];
        mem.read_slice(&mut response, GuestAddress(0x9000 + 12))
            .unwrap();
        assert_eq!(
            response.to_vec(),
            RequestResponse::response_to(&request[12..], 64)
        );
        assert_eq!(mem.read_obj::<u16>(GuestAddress(0x9000 + 10)).unwrap(), 1); // num_buffers
    }

    #[test]
    fn a_malformed_chain_stops_the_device_until_reset() {
        let mem = memory();
        let mut st = live_device(&mem);
        write_desc(
            &mem,
            ring(1, 0),
            0,
            (0x8000, 17, VIRTQ_DESC_F_NEXT as u16, 1),
        );
        write_desc(
            &mem,
            ring(1, 0),
            1,
            (0x8000, 17, VIRTQ_DESC_F_NEXT as u16, 0),
        );
        publish(&mem, ring(1, 1), &[0]);
        assert_eq!(st.process(1), vec![Notification::Config]);
        assert_ne!(st.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET, 0);
        assert!(
            st.process(1).is_empty(),
            "a broken device does nothing more"
        );
        st.write_status(0);
        assert_eq!(st.status(), 0);
    }

    #[test]
    fn a_too_small_receive_buffer_drops_the_frame_not_the_device() {
        let mem = memory();
        let mut st = live_device(&mem);
        write_desc(
            &mem,
            ring(0, 0),
            0,
            (0x9000, 16, VIRTQ_DESC_F_WRITE as u16, 0),
        );
        publish(&mem, ring(0, 1), &[0]);
        write_desc(&mem, ring(1, 0), 0, (0x8000, 20, 0, 0));
        publish(&mem, ring(1, 1), &[0]);
        st.process(1);
        assert!(st.is_live());
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(ring(0, 2) + 8)).unwrap(),
            0
        );
    }

    #[test]
    fn several_pairs_offer_multiqueue_with_a_control_queue() {
        let one = VirtioNet::new([0; 6], vec![Box::new(RequestResponse::new(8))]);
        assert_eq!(one.queue_max_sizes().len(), 2);
        assert_eq!(one.features() & (1 << VIRTIO_NET_F_MQ), 0);
        let backends = (0..32)
            .map(|_| Box::new(RequestResponse::new(8)) as Box<dyn NetBackend>)
            .collect();
        let mq = VirtioNet::new([0; 6], backends);
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
        let mut st = live_with(&mem, 3, &[2, 3, 6]);
        write_desc(
            &mem,
            ring(0, 0),
            0,
            (0xb000, 0x800, VIRTQ_DESC_F_WRITE as u16, 0),
        );
        publish(&mem, ring(0, 1), &[0]);
        mem.write_slice(&[0u8; 12 + 4], GuestAddress(0xc000))
            .unwrap();
        write_desc(&mem, ring(1, 0), 0, (0xc000, 16, 0, 0));
        publish(&mem, ring(1, 1), &[0]);
        let due = st.process(3);
        assert!(due.contains(&Notification::Queue(2)), "{due:?}");
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(ring(0, 2) + 8)).unwrap(),
            12 + 64
        );
        // VQ_PAIRS_SET 2 is accepted, 4 (more than there are) refused.
        for (n, (pairs, ack)) in [(2u16, VIRTIO_NET_OK), (4, VIRTIO_NET_ERR)]
            .into_iter()
            .enumerate()
        {
            let command = 0xd000 + 0x100 * n as u64;
            let mut bytes = vec![
                VIRTIO_NET_CTRL_MQ as u8,
                VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8,
            ];
            bytes.extend_from_slice(&pairs.to_le_bytes());
            mem.write_slice(&bytes, GuestAddress(command)).unwrap();
            mem.write_obj(0xffu8, GuestAddress(command + 0x80)).unwrap();
            let d = 2 * n as u16;
            write_desc(
                &mem,
                ring(2, 0),
                d,
                (command, 4, VIRTQ_DESC_F_NEXT as u16, d + 1),
            );
            write_desc(
                &mem,
                ring(2, 0),
                d + 1,
                (command + 0x80, 1, VIRTQ_DESC_F_WRITE as u16, 0),
            );
            let heads: Vec<u16> = (0..=n as u16).map(|h| 2 * h).collect();
            publish(&mem, ring(2, 1), &heads);
            assert_eq!(st.process(6), vec![Notification::Queue(6)]);
            assert_eq!(
                mem.read_obj::<u8>(GuestAddress(command + 0x80)).unwrap(),
                ack as u8
            );
        }
        assert!(st.is_live());
    }
}
