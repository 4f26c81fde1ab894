//! virtio-net (virtio 1.2 §5.1) with a pluggable backend. Frames the driver transmits go to the
//! backend; frames the backend produces go into the driver's receive buffers. This file is the
//! register side ([`VirtioNet`]: identity, features, configuration space); the queue work on
//! the device thread is [`NetQueues`]; the backends are [`NetBackend`]s, the host's
//! [`tap::Tap`] among them.

mod backend;
mod control;
pub mod header;
mod queues;
pub mod tap;

pub use backend::{NetBackend, RequestResponse, Sink};
pub use control::ControlQueue;
pub use queues::NetQueues;

use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CTRL_VQ, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MQ, VIRTIO_NET_F_MRG_RXBUF,
};

use super::DeviceParts;
use super::device::{VirtioDevice, read_config_bytes};
use super::regs::{VIRTIO_ID_NET, VIRTIO_NET_HDR_SIZE};
use header::offload_features;

/// Largest frame accepted: a 64 KiB IP packet (a TCP segment before segmentation, or one
/// frame without it) plus the Ethernet header.
pub const MAX_FRAME: usize = 65_550;
/// Queue size offered for every queue.
pub const QUEUE_SIZE: u16 = 256;

const HDR: usize = VIRTIO_NET_HDR_SIZE as usize;

/// A virtio-net device with one or more receive/transmit queue pairs (virtio 1.2 §5.1.2:
/// receiveq`k` is queue 2k, transmitq`k` is 2k+1) and, with several pairs, the control queue
/// last, offering VIRTIO_NET_F_MQ (§5.1.6.5.5). This is the register side; [`NetQueues`] does
/// the queue work on the device thread.
pub struct VirtioNet {
    pairs: usize,
    mac: [u8; 6],
    /// The offload features, where every backend passes headers through
    /// ([`NetBackend::passes_headers`]; USO where each also [passes it](NetBackend::passes_uso)).
    offloads: u64,
}

/// Offset of `max_virtqueue_pairs` in `struct virtio_net_config` (after mac[6] and status).
const CONFIG_MAX_PAIRS: usize = 8;

impl VirtioNet {
    /// A device with `mac` and one queue pair per backend (at least one): the register side
    /// and the queue work.
    pub fn new(mac: [u8; 6], backends: Vec<Box<dyn NetBackend>>) -> (Self, NetQueues) {
        assert!(!backends.is_empty(), "a virtio-net device has a queue pair");
        let net = VirtioNet {
            pairs: backends.len(),
            mac,
            offloads: if backends.iter().all(|b| b.passes_headers()) {
                offload_features(backends.iter().all(|b| b.passes_uso()))
            } else {
                0
            },
        };
        (net, NetQueues::new(backends))
    }

    /// The same, as the [`DeviceParts`] a transport takes.
    pub fn parts(mac: [u8; 6], backends: Vec<Box<dyn NetBackend>>) -> DeviceParts {
        let (device, queues) = VirtioNet::new(mac, backends);
        DeviceParts {
            device: Box::new(device),
            work: crate::virtio::DeviceWork::InProcess(Box::new(queues)),
        }
    }

    fn multiqueue(&self) -> bool {
        self.pairs > 1
    }
}

impl VirtioDevice for VirtioNet {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    /// The MAC, mergeable receive buffers (a frame fills as many of the driver's buffers as
    /// it needs, so a driver taking 64 KiB segments need not post 64 KiB buffers: Linux then
    /// posts page fragments instead of 17-page "big packet" chains, §5.1.6.4.2), the offloads
    /// where the backends carry them, and multiqueue with several pairs.
    fn features(&self) -> u64 {
        let mq = (1 << VIRTIO_NET_F_MQ) | (1 << VIRTIO_NET_F_CTRL_VQ);
        (1 << VIRTIO_NET_F_MAC)
            | (1 << VIRTIO_NET_F_MRG_RXBUF)
            | self.offloads
            | if self.multiqueue() { mq } else { 0 }
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 2 * self.pairs + usize::from(self.multiqueue())]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_net_config: mac[6], status (not offered: 0), max_virtqueue_pairs.
        let mut config = [0u8; CONFIG_MAX_PAIRS + 2];
        config[..6].copy_from_slice(&self.mac);
        let pairs = u16::try_from(self.pairs).unwrap_or(u16::MAX);
        config[CONFIG_MAX_PAIRS..].copy_from_slice(&pairs.to_le_bytes());
        read_config_bytes(&config, offset, data);
    }
}

#[cfg(test)]
mod tests;
