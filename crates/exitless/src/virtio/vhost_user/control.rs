//! The control queue of a multiqueue vhost-user NIC (virtio 1.2 §5.1.6.5), served by exitless
//! as QEMU serves it (hw/net/virtio-net.c, `virtio_net_handle_mq`): the backend gets the data
//! queues only, and each VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET becomes `SET_VRING_ENABLE` 1 or 0 for
//! the two rings of every pair whose state changes, acknowledged by the backend before the
//! command goes in the used ring (§5.1.6.5.5).
//!
//! It runs on the vhost-user thread, not on a device thread of its own: the enables are
//! messages on the socket that thread owns (a second thread would have to hand them over and
//! wait), the thread already raises the device's interrupts for its watch fds, and the queue
//! sees a handful of commands in a driver's life. Its doorbell is the queue's KVM ioeventfd,
//! which the thread polls instead of handing to the backend; its interrupt goes through
//! [`Interrupts::notify`], the device's MSI-X or MSI vector as for the in-process control queue.

use virtio_queue::{Queue, QueueT};

use crate::virtio::queue::split::ServedQueue;

use crate::dma::DmaContext;
use crate::virtio::device::{DeviceHealth, Notification, QueuePosition};
use crate::virtio::interrupt::Interrupts;
use crate::virtio::net::ControlQueue;

/// The control queue of a NIC with several queue pairs, and which pairs the backend may use.
pub(super) struct NetControl {
    queue: ControlQueue,
    /// The ring and DMA context of the current activation, if the driver made it ready.
    live: Option<(ServedQueue, DmaContext)>,
    /// Active queue pairs: only the first until the driver sets more (§5.1.6.5.5).
    active: usize,
}

impl NetControl {
    /// The control queue of a NIC with `pairs` queue pairs.
    pub fn new(pairs: usize) -> Self {
        NetControl {
            queue: ControlQueue::new(pairs),
            live: None,
            active: 1,
        }
    }

    /// The queue's index, after the pairs' rings.
    pub fn index(&self) -> usize {
        self.queue.index()
    }

    /// Whether the backend may use ring `q` (a data queue): it belongs to an active pair.
    pub fn ring_enabled(&self, q: usize) -> bool {
        q / 2 < self.active
    }

    /// Where the device is in the queue, if it is live (a snapshot).
    pub fn position(&self) -> Option<QueuePosition> {
        self.live.as_ref().map(|(q, _)| QueuePosition {
            next_avail: q.queue().next_avail(),
            next_used: q.queue().next_used(),
        })
    }

    /// The active pairs, for a snapshot.
    pub fn save(&self) -> serde_json::Value {
        serde_json::json!({ "active": self.active })
    }

    /// Take the active pairs [`NetControl::save`] wrote, before the rings are started.
    pub fn restore(&mut self, state: serde_json::Value) -> Result<(), String> {
        #[derive(serde::Deserialize)]
        struct Saved {
            active: usize,
        }
        let saved: Saved = serde_json::from_value(state).map_err(|e| e.to_string())?;
        let pairs = self.index() / 2;
        if !(1..=pairs).contains(&saved.active) {
            return Err(format!("{} active pairs of {pairs}", saved.active));
        }
        self.active = saved.active;
        Ok(())
    }

    /// DRIVER_OK: serve `queue` through `dma`, if the driver made it ready.
    pub fn activate(&mut self, queue: Option<Queue>, dma: DmaContext) {
        self.live = queue
            .filter(Queue::ready)
            .map(|q| (ServedQueue::new(q), dma));
    }

    /// The driver disabled the queue.
    pub fn stop(&mut self) {
        self.live = None;
    }

    /// The driver reset the device: the queue goes, and only the first pair is active again.
    pub fn reset(&mut self) {
        self.live = None;
        self.active = 1;
    }

    /// Serve the commands waiting, then notify the driver if it asked to be (§2.7.10).
    /// `enable(q, on)` tells the backend to start or stop using ring `q` for a count that
    /// changes it; its error fails the command (VIRTIO_NET_ERR) and is returned, the
    /// backend being then of no use. Ok(true): budget spent with commands left, come back.
    pub fn serve(
        &mut self,
        interrupts: &Interrupts,
        health: &DeviceHealth,
        mut enable: impl FnMut(usize, bool) -> vhost::Result<()>,
    ) -> Result<bool, vhost::Error> {
        let index = self.index();
        let Some((q, dma)) = self.live.as_mut() else {
            return Ok(false);
        };
        let Ok(mem) = dma.memory() else {
            return Ok(false);
        };
        if !q.ready() || health.needs_reset() {
            return Ok(false);
        }
        let (active, rings) = (&mut self.active, index);
        let mut failed = None;
        let served = self.queue.serve(q, dma, health.log(), |pairs| {
            for ring in 0..rings {
                let (was, is) = (ring / 2 < *active, ring / 2 < pairs);
                if was != is
                    && let Err(e) = enable(ring, is)
                {
                    failed = Some(e);
                    return false;
                }
            }
            *active = pairs;
            true
        });
        match served {
            Ok(done) => {
                if done.used && q.needs_notification(mem).unwrap_or(true) {
                    interrupts.notify(Notification::Queue(index));
                }
                failed.map_or(Ok(done.more), Err)
            }
            // A malformed chain or a ring out of guest memory (a pause, Bus Master clear, is
            // not an error: serve_chains leaves the chain for later).
            Err(e) => {
                if health.fail(&e) {
                    interrupts.notify(Notification::Config);
                }
                failed.map_or(Ok(false), Err)
            }
        }
    }
}
