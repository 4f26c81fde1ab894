//! virtio-net's control queue (virtio 1.2 §5.1.6.5), the last queue of a device with several
//! queue pairs: the driver sets how many pairs are active (VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET,
//! §5.1.6.5.5). Shared by the in-process device ([`super::NetQueues`], whose pairs are its
//! backends) and the vhost-user frontend, which serves it itself and turns each count into
//! the backend's ring enables, as QEMU does: a vhost-user backend never sees the control queue.

use std::sync::Arc;

use crate::dma::DmaContext;
use crate::guest_error;
use crate::logging::{Cause, DeviceLog};
use crate::virtio::device::{ChainsServed, DeviceError, serve_chains};
use crate::virtio::queue::chain::Chain;
use crate::virtio::queue::split::ServedQueue;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR, VIRTIO_NET_OK,
};

/// Longest command read: class, command and a VQ_PAIRS_SET's 2 bytes fit many times over; a
/// longer one is malformed, and is not copied out of guest memory.
const MAX_COMMAND: u64 = 64;

/// The control queue of a device with `pairs` queue pairs, and its chain scratch.
pub struct ControlQueue {
    pairs: usize,
    chain: Chain,
}

impl ControlQueue {
    /// The control queue of a device with `pairs` queue pairs.
    pub fn new(pairs: usize) -> Self {
        ControlQueue {
            pairs,
            chain: Chain::default(),
        }
    }

    /// Its queue index: after every pair's two (§5.1.2).
    pub fn index(&self) -> usize {
        2 * self.pairs
    }

    /// Serve the commands on `q`: class, command, data, then one writable ack byte. Only
    /// VQ_PAIRS_SET is supported; anything else, and a count outside 1..=pairs, is answered
    /// VIRTIO_NET_ERR and changes nothing. For a count in range `set_pairs` is called before
    /// the command's acknowledgement goes in the used ring (§5.1.6.5.5: from then on no
    /// receive queue past the count may be used); it answers whether the count took effect
    /// (VIRTIO_NET_ERR if not).
    pub fn serve(
        &mut self,
        q: &mut ServedQueue,
        dma: &DmaContext,
        log: &DeviceLog,
        mut set_pairs: impl FnMut(usize) -> bool,
    ) -> Result<ChainsServed, DeviceError> {
        let available = self.pairs;
        let counters = Arc::clone(q.counters());
        serve_chains(q, dma, &mut self.chain, |c: &Chain| {
            if c.writable_len() == 0 || c.readable_len() > MAX_COMMAND {
                guest_error!(log, "virtio-net: malformed control command dropped");
                counters.error(Cause::Guest);
                return Ok(0);
            }
            let command = c.read_all(dma)?;
            let ack = match command.as_slice() {
                [class, cmd, lo, hi]
                    if u32::from(*class) == VIRTIO_NET_CTRL_MQ
                        && u32::from(*cmd) == VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET =>
                {
                    let pairs = usize::from(u16::from_le_bytes([*lo, *hi]));
                    if !(1..=available).contains(&pairs) {
                        guest_error!(
                            log,
                            "virtio-net: driver asked for {pairs} queue pairs of {available}; refused"
                        );
                        counters.error(Cause::Guest);
                        VIRTIO_NET_ERR
                    } else if set_pairs(pairs) {
                        VIRTIO_NET_OK
                    } else {
                        VIRTIO_NET_ERR
                    }
                }
                _ => VIRTIO_NET_ERR,
            };
            c.write_all(
                dma,
                &[u8::try_from(ack).expect("VIRTIO_NET_OK or VIRTIO_NET_ERR")],
            )?;
            Ok(1)
        })
    }
}
