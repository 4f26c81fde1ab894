//! The device-thread side of a virtio device: between DRIVER_OK and reset, a [`QueueEngine`]
//! runs the device type's [`QueueHandler`] over the live queues through the device's
//! [`DmaContext`] (translating the rings first behind an IOMMU, [`super::queue::rings`]) and says
//! which notifications are due. The device thread ([`super::worker`]) owns it; the register
//! side ([`super::state`]) shares only the [`DeviceHealth`] with it.

use std::os::fd::RawFd;
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;

use super::device::{DeviceHealth, Notification, QueueHandler, QueuePosition, QueueSet};
use super::queue::rings::BusRings;
use super::queue::split::ServedQueue;
use crate::dma::DmaContext;
use crate::logging::DeviceLog;

/// The device-thread side of a device: its queue handler and, between DRIVER_OK and reset,
/// the live queues and the DMA context they are reached through.
pub struct QueueEngine {
    handler: Box<dyn QueueHandler>,
    health: Arc<DeviceHealth>,
    live: Option<Live>,
}

/// What a device works on between DRIVER_OK and reset.
struct Live {
    queues: Vec<ServedQueue>,
    dma: DmaContext,
    /// The rings' bus addresses, when they are translated.
    rings: Option<BusRings>,
}

/// What processing a queue produced, held inline so that a kick allocates nothing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Queues whose notification is due now.
    queues: QueueSet,
    /// A configuration change notification is due now (the device broke).
    config: bool,
    /// The queue has work left beyond the handler's budget.
    pub more: bool,
    /// Chains were used: the device thread polls the queue for a while ([`QueueEngine::hold`]).
    pub used: bool,
}

impl Work {
    /// The notifications due now.
    pub fn notifications(&self) -> impl Iterator<Item = Notification> + '_ {
        let config = self.config.then_some(Notification::Config);
        self.queues.iter().map(Notification::Queue).chain(config)
    }
}

impl QueueEngine {
    /// An idle engine for `handler`, sharing `health` with the register side.
    pub fn new(handler: Box<dyn QueueHandler>, health: Arc<DeviceHealth>) -> Self {
        QueueEngine {
            handler,
            health,
            live: None,
        }
    }

    /// DRIVER_OK: start working on `queues` through `dma`, from the positions they hold, with
    /// the driver's `features`.
    pub fn activate(&mut self, queues: Vec<Queue>, dma: DmaContext, features: u64) {
        self.handler.activate(features);
        let rings = dma.translated().then(|| BusRings::new(&queues));
        let log = self.health.log();
        let queues = (queues.into_iter().enumerate())
            .map(|(k, q)| ServedQueue::new(q).counted_by(log.queue_counters(k)))
            .collect();
        self.live = Some(Live { queues, dma, rings });
    }

    /// Reset: drop the queues and the handler's in-flight state.
    pub fn reset(&mut self) {
        self.live = None;
        self.handler.reset();
    }

    /// Stop working on queue `index` (the driver disabled it).
    pub fn stop_queue(&mut self, index: usize) {
        if let Some(q) = self.live.as_mut().and_then(|l| l.queues.get_mut(index)) {
            q.queue_mut().set_ready(false);
        }
    }

    /// Where the device is in each queue, if it is live (a snapshot, [`super::worker`]).
    pub fn positions(&self) -> Option<Vec<QueuePosition>> {
        let live = self.live.as_ref()?;
        let at = |q: &Queue| QueuePosition {
            next_avail: q.next_avail(),
            next_used: q.next_used(),
        };
        Some(live.queues.iter().map(|q| at(q.queue())).collect())
    }

    /// The handler's state, for a snapshot ([`QueueHandler::save`]).
    pub fn handler_state(&self) -> Option<serde_json::Value> {
        self.handler.save()
    }

    /// Give the handler its saved state ([`QueueHandler::restore`]).
    pub fn restore_handler(&mut self, state: serde_json::Value) -> Result<(), String> {
        self.handler.restore(state)
    }

    /// The device's log.
    pub fn log(&self) -> &Arc<DeviceLog> {
        self.health.log()
    }

    /// The handler's outside files and the queue each wakes ([`QueueHandler::wake_sources`]).
    pub fn wake_sources(&self) -> Vec<(RawFd, usize)> {
        self.handler.wake_sources()
    }

    /// Let the handler work on queue `index`; returns the notifications due. A device that
    /// may not master (Bus Master Enable clear) leaves the work where it is: the transport
    /// kicks its queues when mastering is enabled again. Behind an IOMMU the whole call is one
    /// round of DMA (`crate::iommu`: no invalidation completes while it runs), the rings are
    /// translated first if they must be, and a ring the unit refuses (the fault recorded)
    /// leaves the work for the driver's next notification.
    pub fn process(&mut self, index: usize) -> Work {
        let Some(Live { queues, dma, rings }) = self.live.as_mut() else {
            return Work::default();
        };
        let ready = queues.get(index).is_some_and(|q| q.ready());
        if !ready || self.health.needs_reset() {
            return Work::default();
        }
        let Ok(mem) = dma.memory() else {
            return Work::default();
        };
        let _round = dma.round();
        let result = match rings {
            Some(rings) => rings.map(queues, dma),
            None => Ok(()),
        }
        .and_then(|()| {
            self.handler
                .process_queue(index, queues, dma, self.health.log())
        });
        match result {
            Ok(progress) => {
                let mut due = QueueSet::default();
                for u in progress.used.iter() {
                    if queues
                        .get_mut(u)
                        .is_some_and(|q| q.needs_notification(mem).unwrap_or(true))
                    {
                        due.insert(u);
                    }
                }
                Work {
                    queues: due,
                    config: false,
                    more: progress.more,
                    used: progress.used != QueueSet::default(),
                }
            }
            Err(e) if e.is_fault() => Work::default(),
            Err(e) => Work {
                queues: QueueSet::default(),
                config: self.health.fail(&e),
                more: false,
                used: false,
            },
        }
    }

    /// Leave queue `index`'s notifications off when its ring runs dry: the device thread
    /// polls it ([`ServedQueue::hold`]).
    pub fn hold(&mut self, index: usize) {
        if let Some(q) = self.live.as_mut().and_then(|l| l.queues.get_mut(index)) {
            q.hold();
        }
    }

    /// Whether the driver made chains available on held queue `index` (a poll).
    pub fn polled(&mut self, index: usize) -> bool {
        self.on_ring(index, ServedQueue::avail_moved)
    }

    /// Stop holding queue `index`: its notifications on again; true if chains came meanwhile,
    /// which the device must look at itself ([`ServedQueue::rearm`]). A ring the device cannot
    /// reach now keeps its notifications off until the ring next runs dry (after the kick that
    /// Bus Master Enable or a new translation brings).
    pub fn release(&mut self, index: usize) -> bool {
        let held = self
            .live
            .as_mut()
            .and_then(|l| l.queues.get_mut(index))
            .is_some_and(ServedQueue::release);
        // Not left off: nothing to reach the ring for (the common case, a pass that did not
        // hold its queue).
        held && self.on_ring(index, ServedQueue::rearm)
    }

    /// `f` on queue `index` and guest memory, as one round of DMA with the rings translated;
    /// false if the device may not reach the ring now (not live, broken, not mastering, the
    /// translation refused: then nothing is read or written through a stale one).
    fn on_ring(
        &mut self,
        index: usize,
        f: impl FnOnce(&mut ServedQueue, &GuestMemoryMmap) -> Result<bool, virtio_queue::Error>,
    ) -> bool {
        let Some(Live { queues, dma, rings }) = self.live.as_mut() else {
            return false;
        };
        if self.health.needs_reset() {
            return false;
        }
        let Ok(mem) = dma.memory() else {
            return false;
        };
        let _round = dma.round();
        if rings.as_ref().is_some_and(|r| r.map(queues, dma).is_err()) {
            return false;
        }
        queues
            .get_mut(index)
            .is_some_and(|q| f(q, mem).unwrap_or(false))
    }
}
