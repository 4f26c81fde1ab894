//! What every virtio device has, whatever its transport: features, status, queues and reset
//! (virtio 1.2 §2, §3), split the way the work is split.
//!
//! - [`VirtioState`] is what the driver's register accesses see: features, status, queue
//!   configuration, device configuration. Transports keep it under a short lock; no access
//!   ever waits behind queue processing.
//! - At DRIVER_OK the transport copies the configured queues out of it and hands them to the
//!   device thread ([`super::worker`]), where a [`QueueEngine`] runs the device type's
//!   [`QueueHandler`] over them through the device's [`DmaContext`]. A reset is a message the
//!   device thread acknowledges before the status reads 0, so nothing computed before a reset
//!   is delivered after it.
//! - [`DeviceHealth`] is the only state both sides write: the device thread sets
//!   DEVICE_NEEDS_RESET in it without taking the register lock.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::Ring;
use super::chain::{self, Chain, ChainError};
use super::regs::*;
use super::rings::BusRings;
use super::worker::PendingAck;
use crate::dma::{DmaContext, DmaError};
use crate::guest_error;
use crate::logging::DeviceLog;

/// Why a device stopped: it sets DEVICE_NEEDS_RESET and waits for the driver to reset it.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// A malformed descriptor chain.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// A ring the device could not access, or an available index more than the queue size
    /// ahead of the device (virtio 1.2 §2.7.6 lets the driver be at most a ring ahead).
    #[error("queue access failed: {0}")]
    Queue(#[from] virtio_queue::Error),
    /// Guest memory the device could not access.
    #[error("guest memory access failed: {0}")]
    Memory(#[from] vm_memory::GuestMemoryError),
    /// A buffer the device may not access now.
    #[error(transparent)]
    Dma(#[from] DmaError),
}

impl DeviceError {
    /// The device may not master the bus now: not an error but a pause, until Bus Master
    /// Enable is set again (PCI 3.0 §6.2.2).
    pub fn is_pause(&self) -> bool {
        matches!(
            self,
            DeviceError::Dma(DmaError::NotMaster(_))
                | DeviceError::Chain(ChainError::Dma(DmaError::NotMaster(_)))
        )
    }

    /// The IOMMU blocked an access and recorded the fault (VT-d §7): not the device's error.
    /// The chain completes with nothing written, or the rings wait for the next kick.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            DeviceError::Dma(DmaError::Fault { .. })
                | DeviceError::Chain(ChainError::Dma(DmaError::Fault { .. }))
        )
    }
}

/// A device type as the transport sees it: identity, features, queues, configuration space.
pub trait VirtioDevice: Send {
    /// Virtio device ID (virtio 1.2 §5).
    fn device_type(&self) -> u32;
    /// Device-specific feature bits offered (the transport adds its own).
    fn features(&self) -> u64;
    /// Largest size of each queue.
    fn queue_max_sizes(&self) -> Vec<u16>;
    /// Read device configuration space; bytes past its end read zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Write device configuration space (ignored where it is read-only).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
}

/// Copy bytes `offset..` of a device's configuration space `config` into `data`, as a driver's
/// read sees them: bytes past its end read zero.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    for (i, b) in data.iter_mut().enumerate() {
        *b = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(i))
            .and_then(|o| config.get(o))
            .copied()
            .unwrap_or(0);
    }
}

/// What one call of [`QueueHandler::process_queue`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Queues that got used buffers.
    pub used: Vec<usize>,
    /// The handler stopped at its budget with work left: call it again (after other events).
    pub more: bool,
}

impl Progress {
    /// Add `queue` to the used queues if `used`.
    pub fn mark(&mut self, queue: usize, used: bool) {
        if used && !self.used.contains(&queue) {
            self.used.push(queue);
        }
    }
}

/// The queue work of a device type, run on the device thread. Its loops over a ring go through
/// [`serve_chains`], which bounds them: a driver that keeps adding buffers cannot keep the
/// thread from its other events (reset, stop).
pub trait QueueHandler: Send {
    /// The driver made buffers available on queue `index` (or the device may make progress on
    /// it). Guest errors that do not break the device (a frame dropped) are counted on `log`.
    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [Queue],
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<Progress, DeviceError>;
    /// Forget all in-flight state (the driver reset the device).
    fn reset(&mut self);
    /// Files from outside the guest whose readiness means work on a queue: (file, queue
    /// index). The device thread watches them edge-triggered, as it watches the doorbells.
    fn wake_sources(&self) -> Vec<(RawFd, usize)> {
        Vec::new()
    }
}

/// What a handler does with the chains [`serve_chains`] takes for it.
pub trait ChainServer {
    /// Whether there is anything to do with a chain now (a receive path needs a frame to
    /// deliver), asked before each chain is taken: when there is not, no chain is taken and
    /// notifications are not re-enabled (the device will not need a kick for it).
    fn wants_chain(&mut self) -> bool {
        true
    }
    /// Serve one checked chain; returns the bytes written into it, for the used ring.
    fn serve(&mut self, chain: &Chain) -> Result<u32, DeviceError>;
}

impl<F: FnMut(&Chain) -> Result<u32, DeviceError>> ChainServer for F {
    fn serve(&mut self, chain: &Chain) -> Result<u32, DeviceError> {
        self(chain)
    }
}

/// What [`serve_chains`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ChainsServed {
    /// Chains were put in the used ring.
    pub used: bool,
    /// The budget ran out with chains left: come back for them.
    pub more: bool,
}

/// Take the available chains of `q`, check each through `dma` and give it to `server`: the one
/// loop over a ring that every handler uses. It is bounded: a ring's worth of attempts per
/// call, re-reads of the ring included, so a driver that keeps adding buffers (or toggles the
/// available index) cannot hold the device thread; `more` then asks to be called again. Ring
/// errors (an available index more than a ring ahead, virtio 1.2 §2.7.6) are device errors.
/// Notifications stay off while chains are being taken and are re-enabled when the ring runs
/// dry, looking once more for buffers added meanwhile (§2.7.10). If Bus Master Enable closes
/// in the middle of a chain, the chain goes back to the ring and the loop stops: a pause, not
/// an error; the transport looks at the queues again when it opens. The used-ring write that
/// completes a chain already served is not gated again. A chain whose buffer the IOMMU
/// refused is completed with used length 0 (the fault is the unit's to report); behind an
/// IOMMU a chain with an indirect descriptor is refused outright (its table would be read
/// untranslated).
pub fn serve_chains(
    q: &mut Queue,
    dma: &DmaContext,
    mut server: impl ChainServer,
) -> Result<ChainsServed, DeviceError> {
    let Ok(mem) = dma.memory() else {
        return Ok(ChainsServed::default());
    };
    let mut done = ChainsServed::default();
    q.disable_notification(mem)?;
    for _ in 0..usize::from(q.size()) {
        if !server.wants_chain() {
            return Ok(done);
        }
        let Some(desc) = q.iter(mem)?.next() else {
            if q.enable_notification(mem)? {
                // Buffers arrived meanwhile: take them, notifications off again.
                q.disable_notification(mem)?;
                continue;
            }
            return Ok(done);
        };
        let head = desc.head_index();
        let served = if dma.translated() && chain::refers_to_indirect(mem, q, head) {
            Err(ChainError::Indirect(head).into())
        } else {
            chain::check(desc, dma)
                .map_err(DeviceError::from)
                .and_then(|c| server.serve(&c))
        };
        match served {
            Ok(len) => {
                q.add_used(mem, head, len)?;
                done.used = true;
            }
            Err(e) if e.is_pause() => {
                q.go_to_previous_position();
                return Ok(done);
            }
            Err(e) if e.is_fault() => {
                q.add_used(mem, head, 0)?;
                done.used = true;
            }
            Err(e) => return Err(e),
        }
    }
    done.more = true;
    Ok(done)
}

/// The one state both the register side and the device thread write: DEVICE_NEEDS_RESET and
/// the configuration generation it bumps, and the device's log.
#[derive(Debug)]
pub struct DeviceHealth {
    needs_reset: AtomicBool,
    config_generation: AtomicU32,
    log: Arc<DeviceLog>,
}

impl DeviceHealth {
    /// A healthy device logging to `log`.
    pub fn new(log: Arc<DeviceLog>) -> Self {
        DeviceHealth {
            needs_reset: AtomicBool::new(false),
            config_generation: AtomicU32::new(0),
            log,
        }
    }

    /// The device's log.
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    /// Mark the device broken (virtio 1.2 §2.1.2), a guest error. Returns whether it was
    /// newly broken.
    pub fn fail(&self, why: &dyn std::fmt::Display) -> bool {
        guest_error!(self.log, "{why}; the device needs a reset");
        let newly = !self.needs_reset.swap(true, Ordering::SeqCst);
        if newly {
            self.config_generation.fetch_add(1, Ordering::SeqCst);
        }
        newly
    }

    /// Whether the device is broken.
    pub fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::SeqCst)
    }

    /// ConfigGeneration.
    pub fn config_generation(&self) -> u32 {
        self.config_generation.load(Ordering::SeqCst)
    }

    fn clear(&self) {
        self.needs_reset.store(false, Ordering::SeqCst);
    }
}

/// What a status write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusChange {
    /// Nothing a transport must act on.
    None,
    /// The driver wrote 0: the device was reset.
    Reset,
    /// DRIVER_OK was newly set: hand the queues to the device thread.
    Activate,
}

/// A notification the device sends the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notification {
    /// Used buffers on this queue.
    Queue(usize),
    /// The configuration (or the status: DEVICE_NEEDS_RESET) changed.
    Config,
}

/// Transport-independent register state.
pub struct VirtioState {
    device: Box<dyn VirtioDevice>,
    offered: u64,
    acked: u64,
    /// DeviceFeaturesSel / device_feature_select.
    pub device_features_select: u32,
    /// DriverFeaturesSel / driver_feature_select.
    pub driver_features_select: u32,
    status: u32,
    queues: Vec<Queue>,
    /// QueueSel / queue_select.
    pub queue_select: u32,
    health: Arc<DeviceHealth>,
    mem: GuestMemoryMmap,
    /// A reset the device thread has not acknowledged yet.
    pending_reset: Option<PendingAck>,
}

fn bit(n: u32) -> u64 {
    1 << n
}

impl VirtioState {
    /// `device`, offering its features plus `transport_features`; rings are checked against
    /// guest memory `mem`; guest errors are counted on `log`.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        transport_features: u64,
        mem: GuestMemoryMmap,
        log: Arc<DeviceLog>,
    ) -> Self {
        let offered = device.features()
            | transport_features
            | bit(VIRTIO_F_VERSION_1)
            | bit(VIRTIO_F_EVENT_IDX);
        let queues = device
            .queue_max_sizes()
            .into_iter()
            .map(|max| Queue::new(max).expect("device queue sizes are powers of two ≤ 32768"))
            .collect();
        VirtioState {
            device,
            offered,
            acked: 0,
            device_features_select: 0,
            driver_features_select: 0,
            status: 0,
            queues,
            queue_select: 0,
            health: Arc::new(DeviceHealth::new(log)),
            mem,
            pending_reset: None,
        }
    }

    /// The state the device thread shares.
    pub fn health(&self) -> &Arc<DeviceHealth> {
        &self.health
    }

    /// The device type.
    pub fn device_type(&self) -> u32 {
        self.device.device_type()
    }

    /// Number of queues.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// The 32 offered feature bits the device feature select picks.
    pub fn device_features_word(&self) -> u32 {
        match self.device_features_select {
            0 => (self.offered & 0xffff_ffff) as u32,
            1 => (self.offered >> 32) as u32,
            _ => 0,
        }
    }

    /// The driver writes 32 feature bits at the driver feature select.
    pub fn write_driver_features(&mut self, value: u32) {
        if self.status & VIRTIO_STATUS_FEATURES_OK != 0 {
            guest_error!(
                self.health.log,
                "driver features written after FEATURES_OK; ignored"
            );
            return;
        }
        let shift = match self.driver_features_select {
            0 => 0,
            1 => 32,
            sel => {
                guest_error!(
                    self.health.log,
                    "driver feature select {sel} does not exist"
                );
                return;
            }
        };
        self.acked = (self.acked & !(0xffff_ffff << shift)) | (u64::from(value) << shift);
    }

    /// The 32 accepted feature bits the driver feature select picks.
    pub fn driver_features_word(&self) -> u32 {
        match self.driver_features_select {
            0 => (self.acked & 0xffff_ffff) as u32,
            1 => (self.acked >> 32) as u32,
            _ => 0,
        }
    }

    /// Whether feature `n` was negotiated (FEATURES_OK accepted).
    pub fn negotiated(&self, n: u32) -> bool {
        self.status & VIRTIO_STATUS_FEATURES_OK != 0 && self.acked & bit(n) != 0
    }

    /// Device status, with DEVICE_NEEDS_RESET if the device broke.
    pub fn status(&self) -> u32 {
        let broken = if self.health.needs_reset() {
            VIRTIO_STATUS_DEVICE_NEEDS_RESET
        } else {
            0
        };
        self.status | broken
    }

    /// ConfigGeneration.
    pub fn config_generation(&self) -> u32 {
        self.health.config_generation()
    }

    /// The driver writes the status register (virtio 1.2 §3.1.1). On a reset the transport
    /// must first have stopped the device thread's work (see the module comment).
    pub fn write_status(&mut self, value: u32) -> StatusChange {
        if value == 0 {
            self.reset();
            return StatusChange::Reset;
        }
        let mut value = value & 0xff & !VIRTIO_STATUS_DEVICE_NEEDS_RESET;
        if value & self.status != self.status {
            guest_error!(
                self.health.log,
                "driver cleared status bits ({:#x} → {value:#x}) without a reset; ignored",
                self.status
            );
            return StatusChange::None;
        }
        let newly = value & !self.status;
        if newly & VIRTIO_STATUS_FEATURES_OK != 0 {
            let unoffered = self.acked & !self.offered;
            if unoffered != 0 {
                // §2.2.2: a device must not accept features it did not offer; FEATURES_OK then
                // reads back clear and the driver gives up.
                guest_error!(
                    self.health.log,
                    "driver accepted features {unoffered:#x} the device did not offer"
                );
                value &= !VIRTIO_STATUS_FEATURES_OK;
            } else if self.acked & bit(VIRTIO_F_VERSION_1) == 0 {
                guest_error!(
                    self.health.log,
                    "driver did not accept VIRTIO_F_VERSION_1 (legacy drivers are not supported)"
                );
                value &= !VIRTIO_STATUS_FEATURES_OK;
            }
        }
        if newly & VIRTIO_STATUS_DRIVER_OK != 0 && value & VIRTIO_STATUS_FEATURES_OK == 0 {
            guest_error!(self.health.log, "DRIVER_OK without FEATURES_OK; ignored");
            value &= !VIRTIO_STATUS_DRIVER_OK;
        }
        self.status = value;
        if newly & value & VIRTIO_STATUS_DRIVER_OK != 0 {
            StatusChange::Activate
        } else {
            StatusChange::None
        }
    }

    /// The configured queues, for the device thread (at DRIVER_OK): copies, so the registers
    /// keep reading back what the driver wrote.
    pub fn activation_queues(&self) -> Vec<Queue> {
        let event_idx = self.acked & bit(VIRTIO_F_EVENT_IDX) != 0;
        self.queues
            .iter()
            .map(|q| {
                let mut copy = Queue::try_from(q.state())
                    .expect("a queue's own state is valid for a queue of its size");
                copy.set_event_idx(event_idx);
                copy
            })
            .collect()
    }

    /// Mark the device broken (DEVICE_NEEDS_RESET, virtio 1.2 §2.1.2). Returns whether the
    /// transport should send a configuration notification (newly broken while live).
    pub fn fail(&self, why: &dyn std::fmt::Display) -> bool {
        self.health.fail(why) && self.status & VIRTIO_STATUS_DRIVER_OK != 0
    }

    /// The driver's reset waits for the device thread, which has not let go of the rings yet:
    /// until it does the status reads as before, with DEVICE_NEEDS_RESET (virtio 1.2 §2.4.1
    /// lets a device take its time; the driver reads the status back until it is 0).
    pub fn reset_pending(&mut self, ack: PendingAck) -> bool {
        self.pending_reset = Some(ack);
        self.fail(&"the device thread is slow to stop for a reset")
    }

    /// Whether a pending reset's acknowledgement has come: the transport finishes the reset.
    pub fn pending_reset_arrived(&mut self) -> bool {
        if self.pending_reset.as_ref().is_some_and(PendingAck::arrived) {
            self.pending_reset = None;
            return true;
        }
        false
    }

    fn reset(&mut self) {
        for q in &mut self.queues {
            q.reset();
        }
        self.health.clear();
        self.acked = 0;
        self.status = 0;
        self.device_features_select = 0;
        self.driver_features_select = 0;
        self.queue_select = 0;
    }

    /// The queue QueueSel picks, if it exists.
    pub fn selected_queue(&self) -> Option<&Queue> {
        self.queues.get(self.queue_select as usize)
    }

    /// Change the selected queue's configuration; only while it is disabled and before
    /// DRIVER_OK (virtio 1.2 §4.1.4.3.2, §4.2.2.2). Returns whether the change was allowed.
    pub fn configure_queue(&mut self, what: &str, change: impl FnOnce(&mut Queue)) -> bool {
        let index = self.queue_select;
        let locked = self.status & VIRTIO_STATUS_DRIVER_OK != 0;
        match self.queues.get_mut(index as usize) {
            Some(q) if !q.ready() && !locked => {
                change(q);
                true
            }
            Some(_) => {
                guest_error!(
                    self.health.log,
                    "{what} of queue {index} written while it is live; ignored"
                );
                false
            }
            None => {
                guest_error!(
                    self.health.log,
                    "{what} of queue {index}, which does not exist; ignored"
                );
                false
            }
        }
    }

    /// The driver writes the selected queue's size; a size that is not a power of two, is 0 or
    /// exceeds the maximum breaks the device (§2.7: sizes are powers of two). Queues can only
    /// change before DRIVER_OK, so no configuration notification is ever due.
    pub fn set_queue_size(&mut self, size: u32) {
        let mut bad = false;
        self.configure_queue("size", |q| {
            bad = u16::try_from(size)
                .map_err(|_| virtio_queue::Error::InvalidSize)
                .and_then(|s| q.try_set_size(s))
                .is_err();
        });
        if bad {
            self.fail(&format_args!(
                "queue size {size} is not a power of two ≤ the maximum"
            ));
        }
    }

    /// Set the low or high dword of the selected queue's `ring` address. A misaligned address
    /// (virtio 1.2 §2.7: 16, 2 and 4 bytes) is refused and leaves the old one.
    pub fn set_queue_address(&mut self, ring: Ring, high: bool, value: u32) {
        let merge = |old: u64| {
            if high {
                old & 0xffff_ffff | u64::from(value) << 32
            } else {
                old & !0xffff_ffff | u64::from(value)
            }
        };
        let mut refused = None;
        self.configure_queue("ring address", |q| {
            let result = match ring {
                Ring::Descriptors => {
                    q.try_set_desc_table_address(GuestAddress(merge(q.desc_table())))
                }
                Ring::Driver => q.try_set_avail_ring_address(GuestAddress(merge(q.avail_ring()))),
                Ring::Device => q.try_set_used_ring_address(GuestAddress(merge(q.used_ring()))),
            };
            refused = result.err();
        });
        if let Some(e) = refused {
            guest_error!(self.health.log, "{ring:?} ring address: {e}; ignored");
        }
    }

    /// The driver enables the selected queue. A queue whose rings do not fit in guest memory
    /// breaks the device, and so does an available ring at guest-physical 0, which
    /// virtio-queue takes for "not set up" (its iterator then refuses the queue). With
    /// VIRTIO_F_ACCESS_PLATFORM the ring addresses are bus addresses: the device thread
    /// translates and checks them (`super::rings`).
    pub fn set_queue_ready(&mut self) {
        let mem = self.mem.clone();
        let bus_addresses = self.negotiated(VIRTIO_F_ACCESS_PLATFORM);
        let mut invalid = false;
        let ok = self.configure_queue("enable", |q| {
            q.set_ready(true);
            if !(bus_addresses || q.is_valid(&mem)) || q.avail_ring() == 0 {
                q.set_ready(false);
                invalid = true;
            }
        });
        if ok && invalid {
            let index = self.queue_select;
            self.fail(&format_args!(
                "queue {index}'s rings are misaligned, outside guest memory or at address 0"
            ));
        }
    }

    /// The driver stops the selected queue (virtio-mmio QueueReady = 0, virtio 1.2 §4.2.2).
    /// Returns the queue's index if the device thread has it: the transport stops its copy and
    /// then calls [`VirtioState::queue_stopped`], so the register reads 0 only once the queue
    /// is no longer used.
    pub fn stop_queue(&mut self) -> Option<usize> {
        let index = self.queue_select as usize;
        let live = self.status & VIRTIO_STATUS_DRIVER_OK != 0;
        let q = self.queues.get_mut(index)?;
        if live && q.ready() {
            return Some(index);
        }
        q.set_ready(false);
        None
    }

    /// The device thread no longer uses queue `index`.
    pub fn queue_stopped(&mut self, index: usize) {
        if let Some(q) = self.queues.get_mut(index) {
            q.set_ready(false);
        }
    }

    /// Device configuration read.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.device.read_config(offset, data);
    }

    /// Device configuration write.
    pub fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.device.write_config(offset, data);
    }
}

/// The device-thread side of a device: its queue handler and, between DRIVER_OK and reset,
/// the live queues and the DMA context they are reached through.
pub struct QueueEngine {
    handler: Box<dyn QueueHandler>,
    health: Arc<DeviceHealth>,
    live: Option<Live>,
}

/// What a device works on between DRIVER_OK and reset.
struct Live {
    queues: Vec<Queue>,
    dma: DmaContext,
    /// The rings' bus addresses, when they are translated.
    rings: Option<BusRings>,
}

/// What processing a queue produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Work {
    /// Notifications due now.
    pub notifications: Vec<Notification>,
    /// The queue has work left beyond the handler's budget.
    pub more: bool,
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

    /// DRIVER_OK: start working on `queues` through `dma`.
    pub fn activate(&mut self, queues: Vec<Queue>, dma: DmaContext) {
        let rings = dma.translated().then(|| BusRings::new(&queues));
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
            q.set_ready(false);
        }
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
                .process_queue(index, queues, dma, &self.health.log)
        });
        match result {
            Ok(progress) => Work {
                notifications: progress
                    .used
                    .into_iter()
                    .filter(|&u| {
                        queues
                            .get_mut(u)
                            .is_some_and(|q| q.needs_notification(mem).unwrap_or(true))
                    })
                    .map(Notification::Queue)
                    .collect(),
                more: progress.more,
            },
            Err(e) if e.is_fault() => Work::default(),
            Err(e) => {
                let notifications = if self.health.fail(&e) {
                    vec![Notification::Config]
                } else {
                    Vec::new()
                };
                Work {
                    notifications,
                    more: false,
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // fixtures
mod tests {
    use super::*;
    use crate::virtio::net::{RequestResponse, VirtioNet};
    use vm_memory::GuestAddress;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap()
    }

    fn device() -> VirtioState {
        let (net, _) = VirtioNet::new([0; 6], vec![Box::new(RequestResponse::new(8))]);
        VirtioState::new(Box::new(net), 0, memory(), DeviceLog::new("test"))
    }

    const UP_TO_DRIVER: u32 = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
    const FEATURES_OK: u32 = UP_TO_DRIVER | VIRTIO_STATUS_FEATURES_OK;

    fn accept(st: &mut VirtioState, features: u64) {
        for sel in 0..2 {
            st.driver_features_select = sel;
            st.write_driver_features((features >> (32 * sel)) as u32);
        }
    }

    #[test]
    fn features_the_device_did_not_offer_are_refused() {
        let mut st = device();
        st.write_status(UP_TO_DRIVER);
        accept(&mut st, 1 << VIRTIO_F_VERSION_1 | 1 << 40);
        st.write_status(FEATURES_OK);
        assert_eq!(st.status() & VIRTIO_STATUS_FEATURES_OK, 0);
        st.write_status(FEATURES_OK | VIRTIO_STATUS_DRIVER_OK);
        assert_eq!(
            st.status() & VIRTIO_STATUS_DRIVER_OK,
            0,
            "no DRIVER_OK without FEATURES_OK"
        );
    }

    #[test]
    fn a_legacy_driver_without_version_1_is_refused() {
        let mut st = device();
        st.write_status(UP_TO_DRIVER);
        accept(&mut st, 1 << VIRTIO_F_EVENT_IDX);
        st.write_status(FEATURES_OK);
        assert_eq!(st.status() & VIRTIO_STATUS_FEATURES_OK, 0);
    }

    #[test]
    fn negotiated_features_are_fixed_after_features_ok() {
        let mut st = device();
        st.write_status(UP_TO_DRIVER);
        accept(&mut st, 1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_F_EVENT_IDX);
        st.write_status(FEATURES_OK);
        assert!(st.negotiated(VIRTIO_F_EVENT_IDX));
        accept(&mut st, 1 << VIRTIO_F_VERSION_1);
        assert!(st.negotiated(VIRTIO_F_EVENT_IDX));
        assert_eq!(
            st.device_features_word() & (1 << VIRTIO_F_EVENT_IDX),
            1 << VIRTIO_F_EVENT_IDX
        );
    }

    #[test]
    fn queue_sizes_must_be_powers_of_two_within_the_maximum() {
        for bad in [0u32, 3, 100, 512, 0x1_0000] {
            let mut st = device();
            st.set_queue_size(bad);
            assert_ne!(
                st.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET,
                0,
                "size {bad}"
            );
            st.write_status(0);
            assert_eq!(st.status(), 0, "reset clears DEVICE_NEEDS_RESET");
        }
        let mut st = device();
        st.set_queue_size(64);
        assert_eq!(st.status(), 0);
        assert_eq!(st.selected_queue().map(|q| q.size()), Some(64));
    }

    #[test]
    fn queues_that_do_not_exist_or_are_live_cannot_be_changed() {
        let mut st = device();
        st.queue_select = 9;
        assert!(!st.configure_queue("size", |_| panic!("must not run")));
        assert!(st.selected_queue().is_none());
        assert_eq!(st.stop_queue(), None);
    }

    #[test]
    fn rings_outside_guest_memory_break_the_device() {
        let mut st = device();
        st.set_queue_address(Ring::Device, false, 0xffff_f000);
        st.set_queue_ready();
        assert_ne!(st.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET, 0);
        assert_eq!(st.selected_queue().map(|q| q.ready()), Some(false));
    }

    /// virtio-queue takes an available ring at 0 for "not set up" and would refuse the queue
    /// at its first use; the device says so when the driver enables it.
    #[test]
    fn an_available_ring_at_address_zero_is_refused_when_enabled() {
        let mut st = device();
        st.set_queue_size(16);
        st.set_queue_address(Ring::Descriptors, false, 0x1000);
        st.set_queue_address(Ring::Device, false, 0x3000);
        st.set_queue_ready();
        assert_ne!(st.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET, 0);
        assert_eq!(st.selected_queue().map(|q| q.ready()), Some(false));
    }

    #[test]
    fn misaligned_ring_addresses_are_refused() {
        let mut st = device();
        st.set_queue_address(Ring::Descriptors, false, 0x1008);
        assert_eq!(st.selected_queue().map(|q| q.desc_table()), Some(0));
        st.set_queue_address(Ring::Descriptors, false, 0x1010);
        st.set_queue_address(Ring::Descriptors, true, 0x1);
        assert_eq!(
            st.selected_queue().map(|q| q.desc_table()),
            Some(0x1_0000_1010)
        );
    }
}
