//! The queue work of a virtio-net device, on the device thread: each pair's transmit queue
//! feeds its backend, its receive queue takes the backend's frames, and with several pairs the
//! control queue turns them on and off (virtio 1.2 §5.1.6).

use std::os::fd::RawFd;

use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR, VIRTIO_NET_OK,
};

use super::backend::NetBackend;
use super::{HDR, MAX_FRAME};
use crate::dma::{DmaContext, Segments};
use crate::guest_error;
use crate::logging::DeviceLog;
use crate::virtio::chain::Chain;
use crate::virtio::device::{
    ChainServer, ChainsServed, DeviceError, Progress, QueueHandler, serve_chains,
};
use crate::virtio::split::ServedQueue;

/// One receive/transmit queue pair and the backend queue behind it (a multiqueue tap has one
/// file per pair in the same way), with each queue's scratch: the chain being served and its
/// buffers resolved to host memory, reused for every chain.
struct QueuePair {
    backend: Box<dyn NetBackend>,
    rx: Scratch,
    tx: Scratch,
}

/// A queue's scratch (see [`QueuePair`]).
#[derive(Default)]
struct Scratch {
    chain: Chain,
    io: Segments,
}

/// The queue work of a [`super::VirtioNet`]: the backends of its pairs.
pub struct NetQueues {
    pairs: Vec<QueuePair>,
    /// The control queue's chain.
    control: Chain,
}

impl NetQueues {
    /// One queue pair per backend, only the first enabled until a driver says otherwise
    /// (§5.1.6.5.5).
    pub(super) fn new(backends: Vec<Box<dyn NetBackend>>) -> Self {
        let mut queues = NetQueues {
            pairs: backends
                .into_iter()
                .map(|backend| QueuePair {
                    backend,
                    rx: Scratch::default(),
                    tx: Scratch::default(),
                })
                .collect(),
            control: Chain::default(),
        };
        queues.enable_pairs(1);
        queues
    }

    fn control_queue(&self) -> Option<usize> {
        (self.pairs.len() > 1).then(|| 2 * self.pairs.len())
    }

    /// Send what the driver put on the transmit queue `q` to the backend: the frame after its
    /// header, in place in the driver's buffers.
    fn transmit(
        pair: &mut QueuePair,
        q: &mut ServedQueue,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<ChainsServed, DeviceError> {
        let (backend, io) = (&mut pair.backend, &mut pair.tx.io);
        serve_chains(q, dma, &mut pair.tx.chain, |c: &Chain| {
            let len = c.readable_len();
            if len < HDR as u64 || len > (HDR + MAX_FRAME) as u64 {
                guest_error!(
                    log,
                    "virtio-net: transmitted frame of {len} bytes (with header) dropped"
                );
            } else {
                // The whole chain is accessed, header included, as a copy would (a fault on
                // the header's page is the guest's to see), and the header is then skipped.
                c.resolve_readable(dma, io)?;
                io.skip(HDR);
                if !backend.transmit(io) {
                    log.warn(format_args!(
                        "virtio-net: the backend dropped a transmitted frame (full, no link, or too short for it)"
                    ));
                }
            }
            Ok(0)
        })
    }

    /// Fill the driver's receive buffers (`q`) with the backend's frames. Receive buffers are
    /// refilled by the driver as it consumes them: no kicks are needed while there are
    /// buffers, so notifications stay off until the ring runs dry with a frame waiting.
    fn receive(
        pair: &mut QueuePair,
        q: &mut ServedQueue,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<ChainsServed, DeviceError> {
        let deliver = Deliver {
            backend: &mut pair.backend,
            io: &mut pair.rx.io,
            dma,
            log,
        };
        serve_chains(q, dma, &mut pair.rx.chain, deliver)
    }

    /// Enable the first `enabled` pairs and disable the rest (§5.1.6.5.5); a frame held for a
    /// disabled pair has no receive queue to go to, and is dropped.
    pub(super) fn enable_pairs(&mut self, enabled: usize) {
        for (k, pair) in self.pairs.iter_mut().enumerate() {
            pair.backend.set_enabled(k < enabled);
            if k >= enabled {
                pair.backend.discard();
            }
        }
    }

    /// Control commands (virtio 1.2 §5.1.6.5): class, command, data, then one writable ack
    /// byte. Only VQ_PAIRS_SET is supported; anything else is answered VIRTIO_NET_ERR.
    fn control(
        &mut self,
        q: &mut ServedQueue,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<ChainsServed, DeviceError> {
        let available = self.pairs.len();
        // The last count the driver set in this round of commands, applied after it.
        let mut enabled = None;
        let served = serve_chains(q, dma, &mut self.control, |c: &Chain| {
            if c.writable_len() == 0 || c.readable_len() > 64 {
                guest_error!(log, "virtio-net: malformed control command dropped");
                return Ok(0);
            }
            let command = c.read_all(dma)?;
            let ack = match command.as_slice() {
                [class, cmd, lo, hi]
                    if u32::from(*class) == VIRTIO_NET_CTRL_MQ
                        && u32::from(*cmd) == VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET =>
                {
                    let pairs = usize::from(u16::from_le_bytes([*lo, *hi]));
                    if (1..=available).contains(&pairs) {
                        enabled = Some(pairs);
                        VIRTIO_NET_OK
                    } else {
                        guest_error!(
                            log,
                            "virtio-net: driver asked for {pairs} queue pairs of {available}; refused"
                        );
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
        });
        if let Some(pairs) = enabled {
            self.enable_pairs(pairs);
        }
        served
    }
}

/// The receive path: a chain is wanted only while a frame waits for one.
struct Deliver<'a> {
    backend: &'a mut Box<dyn NetBackend>,
    io: &'a mut Segments,
    dma: &'a DmaContext,
    log: &'a DeviceLog,
}

impl ChainServer for Deliver<'_> {
    fn wants_chain(&mut self) -> bool {
        self.backend.pending().is_some()
    }

    fn serve(&mut self, c: &Chain) -> Result<u32, DeviceError> {
        let Some(len) = self.backend.pending() else {
            return Ok(0); // not reached: a chain is only taken for a waiting frame
        };
        let total = HDR + len;
        if c.writable_len() < total as u64 {
            guest_error!(
                self.log,
                "virtio-net: receive buffer of {} bytes too small for a {total}-byte frame; frame dropped",
                c.writable_len()
            );
            self.backend.discard();
            return Ok(0);
        }
        // On an error the frame stays held for the next buffer: this one was only a pause
        // (Bus Master off), or a buffer the IOMMU refused.
        c.resolve_writable(self.dma, total, self.io)?;
        // The header is all zeros but num_buffers (le16 at offset 10), 1: one buffer holds
        // the frame.
        let mut header = [0u8; HDR];
        header[10] = 1;
        self.io.scatter(0, &header);
        self.backend.deliver(self.io, HDR);
        Ok(u32::try_from(total).expect("≤ MAX_FRAME + header"))
    }
}

impl QueueHandler for NetQueues {
    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [ServedQueue],
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<Progress, DeviceError> {
        let mut progress = Progress::default();
        if Some(index) == self.control_queue() {
            let done = self.control(&mut queues[index], dma, log)?;
            progress.mark(index, done.used);
            progress.more = done.more;
            return Ok(progress);
        }
        let (rx, tx) = (index & !1, index | 1);
        let Some(pair) = self.pairs.get_mut(index / 2) else {
            return Ok(progress);
        };
        if index == tx && tx < queues.len() {
            let done = Self::transmit(pair, &mut queues[tx], dma, log)?;
            progress.mark(tx, done.used);
            progress.more = done.more;
        }
        if queues[rx].ready() {
            let done = Self::receive(pair, &mut queues[rx], dma, log)?;
            progress.mark(rx, done.used);
            progress.more |= done.more;
        }
        Ok(progress)
    }

    fn reset(&mut self) {
        for pair in &mut self.pairs {
            pair.backend.reset();
        }
        self.enable_pairs(1);
    }

    /// Each pair's backend file wakes its receive queue (2k, §5.1.2).
    fn wake_sources(&self) -> Vec<(RawFd, usize)> {
        self.pairs
            .iter()
            .enumerate()
            .filter_map(|(k, pair)| Some((pair.backend.wake_fd()?, 2 * k)))
            .collect()
    }
}
