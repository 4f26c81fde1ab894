//! The queue work of a virtio-net device, on the device thread: each pair's transmit queue
//! feeds its backend, its receive queue takes the backend's frames, and with several pairs the
//! control queue turns them on and off (virtio 1.2 §5.1.6).

use std::os::fd::RawFd;
use std::sync::Arc;

use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;

use super::backend::NetBackend;
use super::control::ControlQueue;
use super::header::{Direction, NetHeader, Offloads};
use super::{HDR, MAX_FRAME};
use crate::dma::{DmaContext, Segments};
use crate::guest_error;
use crate::logging::{Cause, DeviceLog, QueueCounters};
use crate::virtio::device::{
    ChainServer, ChainsServed, DeviceError, Progress, QueueHandler, serve_chains,
};
use crate::virtio::queue::chain::Chain;
use crate::virtio::queue::split::ServedQueue;

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
    /// The control queue (served with several pairs only).
    control: ControlQueue,
    /// How many pairs the driver enabled (VQ_PAIRS_SET).
    enabled: usize,
    /// The offloads the driver negotiated (none before DRIVER_OK and after a reset).
    offloads: Offloads,
    /// The driver negotiated VIRTIO_NET_F_MRG_RXBUF: a frame may fill several receive
    /// buffers (§5.1.6.4.2).
    mergeable: bool,
}

impl NetQueues {
    /// One queue pair per backend, only the first enabled until a driver says otherwise
    /// (§5.1.6.5.5).
    pub(super) fn new(backends: Vec<Box<dyn NetBackend>>) -> Self {
        let control = ControlQueue::new(backends.len());
        let mut queues = NetQueues {
            pairs: backends
                .into_iter()
                .map(|backend| QueuePair {
                    backend,
                    rx: Scratch::default(),
                    tx: Scratch::default(),
                })
                .collect(),
            control,
            enabled: 1,
            offloads: Offloads::default(),
            mergeable: false,
        };
        queues.enable_pairs(1);
        queues
    }

    fn control_queue(&self) -> Option<usize> {
        (self.pairs.len() > 1).then(|| self.control.index())
    }

    /// Send what the driver put on the transmit queue `q` to the backend: the frame after its
    /// header, in place in the driver's buffers, with a checked copy of the header
    /// ([`NetHeader::for_backend`]; a frame whose header is wrong is dropped).
    fn transmit(
        pair: &mut QueuePair,
        q: &mut ServedQueue,
        dma: &DmaContext,
        log: &DeviceLog,
        offloads: Direction,
    ) -> Result<ChainsServed, DeviceError> {
        let (backend, io) = (&mut pair.backend, &mut pair.tx.io);
        let counters = Arc::clone(q.counters());
        serve_chains(q, dma, &mut pair.tx.chain, |c: &Chain| {
            let len = c.readable_len();
            if len < HDR as u64 || len > (HDR + MAX_FRAME) as u64 {
                guest_error!(
                    log,
                    "virtio-net: transmitted frame of {len} bytes (with header) dropped"
                );
                counters.error(Cause::Guest);
            } else {
                // The whole chain is accessed, header included, as a copy would (a fault on
                // the header's page is the guest's to see), and the header is then skipped.
                c.resolve_readable(dma, io)?;
                let mut raw = [0; HDR];
                io.gather(0, &mut raw);
                io.skip(HDR);
                let header = match NetHeader::from_bytes(&raw).for_backend(io.len(), offloads) {
                    Ok(header) => header,
                    Err(why) => {
                        guest_error!(log, "virtio-net: transmitted frame dropped: {why}");
                        counters.error(Cause::Guest);
                        return Ok(0);
                    }
                };
                if !backend.transmit(header, io) {
                    log.warn(format_args!(
                        "virtio-net: the backend dropped a transmitted frame (full, no link, or too short for it)"
                    ));
                    counters.error(Cause::Backend);
                }
                log.add_bad_frames(backend.take_bad_frames());
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
        (offloads, mergeable): (Direction, bool),
    ) -> Result<ChainsServed, DeviceError> {
        let counters = Arc::clone(q.counters());
        let deliver = Deliver {
            backend: &mut pair.backend,
            io: &mut pair.rx.io,
            dma,
            log,
            counters: &counters,
            offloads,
            header: NetHeader::default(),
            mergeable,
            filled: 0,
            buffers: 0,
        };
        serve_chains(q, dma, &mut pair.rx.chain, deliver)
    }

    fn set_offloads(&mut self, offloads: Offloads) {
        self.offloads = offloads;
        for pair in &mut self.pairs {
            pair.backend.set_offloads(offloads.rx);
        }
    }

    /// Enable the first `enabled` pairs and disable the rest (§5.1.6.5.5); a frame held for a
    /// disabled pair has no receive queue to go to, and is dropped.
    pub(super) fn enable_pairs(&mut self, enabled: usize) {
        self.enabled = enabled;
        for (k, pair) in self.pairs.iter_mut().enumerate() {
            pair.backend.set_enabled(k < enabled);
            if k >= enabled {
                pair.backend.discard();
            }
        }
    }

    /// Control commands (virtio 1.2 §5.1.6.5, [`ControlQueue`]). The last count the driver
    /// set in a round of commands is applied after it: the frames this thread delivers are
    /// the only ones, so none reaches a pair between the acknowledgement and the change.
    fn control(
        &mut self,
        q: &mut ServedQueue,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<ChainsServed, DeviceError> {
        let mut enabled = None;
        let served = self.control.serve(q, dma, log, |pairs| {
            enabled = Some(pairs);
            true
        });
        if let Some(pairs) = enabled {
            self.enable_pairs(pairs);
        }
        served
    }
}

/// The receive path: a chain is wanted only while a frame waits for one, with a header the
/// driver can take.
struct Deliver<'a> {
    backend: &'a mut Box<dyn NetBackend>,
    io: &'a mut Segments,
    dma: &'a DmaContext,
    log: &'a DeviceLog,
    /// The receive queue's counters, for the frames dropped.
    counters: &'a QueueCounters,
    /// What the driver takes.
    offloads: Direction,
    /// The held frame's header as the driver gets it ([`NetHeader::for_driver`]).
    header: NetHeader,
    /// Receive buffers are mergeable: a frame goes into as many as it needs.
    mergeable: bool,
    /// Bytes of the held frame (its header included) placed in the buffers taken so far, and
    /// how many buffers: while some are placed and more are needed, the chains are parts.
    filled: usize,
    buffers: u16,
}

impl ChainServer for Deliver<'_> {
    /// A frame whose header the driver cannot take (an offload it did not negotiate: the
    /// backend's offloads follow the driver's, so this is the backend's error) is dropped
    /// before a buffer is taken for it.
    fn wants_chain(&mut self) -> bool {
        while let Some(len) = self.backend.pending() {
            match self.backend.held_header().for_driver(len, self.offloads) {
                Ok(header) => {
                    self.header = header;
                    return true;
                }
                Err(why) => {
                    self.log.warn(format_args!(
                        "virtio-net: the backend gave a frame the driver cannot take: {why}; dropped"
                    ));
                    self.counters.error(Cause::Backend);
                    self.backend.discard();
                }
            }
        }
        false
    }

    fn serve(&mut self, c: &Chain) -> Result<u32, DeviceError> {
        let Some(len) = self.backend.pending() else {
            return Ok(0); // not reached: a chain is only taken for a waiting frame
        };
        let total = HDR + len;
        let room = usize::try_from(c.writable_len()).unwrap_or(usize::MAX);
        let fits = if self.mergeable && self.filled == 0 {
            // The first buffer holds the header whole (§5.1.6.3.1); the frame may go on in
            // the buffers after it.
            room >= HDR
        } else {
            self.mergeable || room >= total
        };
        if !fits {
            guest_error!(
                self.log,
                "virtio-net: receive buffer of {room} bytes too small for a {total}-byte frame{}; frame dropped",
                if self.mergeable { "'s header" } else { "" }
            );
            self.counters.error(Cause::Guest);
            self.backend.discard();
            return Ok(0);
        }
        let take = room.min(total - self.filled);
        // On an error the frame stays held for the next buffer: this one was only a pause
        // (Bus Master off), or a buffer the IOMMU refused.
        if self.filled == 0 {
            c.resolve_writable(self.dma, take, self.io)?;
        } else {
            c.append_writable(self.dma, take, self.io)?;
        }
        self.filled += take;
        self.buffers += 1;
        if self.filled == total {
            let header = NetHeader {
                num_buffers: self.buffers,
                ..self.header
            };
            self.io.scatter(0, &header.to_bytes());
            self.backend.deliver(self.io, HDR);
            self.filled = 0;
            self.buffers = 0;
        }
        Ok(u32::try_from(take).expect("≤ MAX_FRAME + header"))
    }

    /// A frame placed in part: its next buffer is wanted.
    fn more_chains(&self) -> bool {
        self.filled > 0
    }

    /// The buffers the frame was going into went back to the ring: it is placed anew in the
    /// next ones, or, if the whole ring could not hold it, dropped.
    fn parts_returned(&mut self, hopeless: bool) {
        if hopeless {
            guest_error!(
                self.log,
                "virtio-net: the receive ring's {} buffers cannot hold a {}-byte frame; frame dropped",
                self.buffers,
                self.backend.pending().map_or(0, |len| HDR + len)
            );
            self.counters.error(Cause::Guest);
            self.backend.discard();
        }
        self.filled = 0;
        self.buffers = 0;
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
            let done = Self::transmit(pair, &mut queues[tx], dma, log, self.offloads.tx)?;
            progress.mark(tx, done.used);
            progress.more = done.more;
        }
        if queues[rx].ready() {
            let rx_mode = (self.offloads.rx, self.mergeable);
            let done = Self::receive(pair, &mut queues[rx], dma, log, rx_mode)?;
            progress.mark(rx, done.used);
            progress.more |= done.more;
        }
        Ok(progress)
    }

    /// The driver's offloads: checked in its frames, and the backends told what it takes;
    /// whether its receive buffers are mergeable.
    fn activate(&mut self, features: u64) {
        self.set_offloads(Offloads::negotiated(features));
        self.mergeable = features & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
    }

    fn reset(&mut self) {
        for pair in &mut self.pairs {
            pair.backend.reset();
        }
        self.set_offloads(Offloads::default());
        self.mergeable = false;
        self.enable_pairs(1);
    }

    fn save(&self) -> Option<serde_json::Value> {
        let backends: Vec<_> = self.pairs.iter().map(|p| p.backend.save()).collect();
        Some(serde_json::json!({ "enabled": self.enabled, "backends": backends }))
    }

    fn restore(&mut self, state: serde_json::Value) -> Result<(), String> {
        #[derive(serde::Deserialize)]
        struct Saved {
            enabled: usize,
            backends: Vec<Option<serde_json::Value>>,
        }
        let saved: Saved = serde_json::from_value(state).map_err(|e| e.to_string())?;
        if !(1..=self.pairs.len()).contains(&saved.enabled)
            || saved.backends.len() != self.pairs.len()
        {
            return Err(format!(
                "{} pairs enabled of {} saved, for a device of {} pairs",
                saved.enabled,
                saved.backends.len(),
                self.pairs.len()
            ));
        }
        for (k, (pair, state)) in self.pairs.iter_mut().zip(saved.backends).enumerate() {
            if let Some(state) = state {
                pair.backend
                    .restore(state)
                    .map_err(|why| format!("pair {k}: {why}"))?;
            }
        }
        self.enable_pairs(saved.enabled);
        Ok(())
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
