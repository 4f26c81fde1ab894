//! The register side of a virtio device, whatever its transport: features, status, queue
//! configuration and device configuration (virtio 1.2 §2, §3), as the driver's register
//! accesses see them. Transports keep [`VirtioState`] under a short lock; no access ever
//! waits behind queue processing.
//!
//! At DRIVER_OK the transport copies the configured queues out of it
//! ([`VirtioState::activation_queues`]) and hands them to the device thread
//! ([`super::worker`], [`super::engine`]). A reset is a message the device thread acknowledges
//! before the status reads 0, so nothing computed before a reset is delivered after it; until
//! it does, the pending acknowledgement waits here. The device thread reports a broken device
//! through the shared [`DeviceHealth`], without taking the register lock.

use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::Ring;
use super::device::{DeviceHealth, VirtioDevice};
use super::regs::*;
use super::worker::PendingAck;
use crate::guest_error;
use crate::logging::DeviceLog;

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

/// Transport-independent register state.
pub struct VirtioState {
    device: Box<dyn VirtioDevice>,
    offered: u64,
    acked: u64,
    /// Which 32 offered feature bits the driver reads: virtio-mmio DeviceFeaturesSel,
    /// virtio-pci device_feature_select (virtio 1.2 §4.2.2, §4.1.4.3).
    pub device_features_select: u32,
    /// Which 32 accepted feature bits the driver writes: virtio-mmio DriverFeaturesSel,
    /// virtio-pci driver_feature_select.
    pub driver_features_select: u32,
    status: u32,
    queues: Vec<Queue>,
    /// The queue the queue registers act on: virtio-mmio QueueSel, virtio-pci queue_select.
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
                self.health.log(),
                "driver features written after FEATURES_OK; ignored"
            );
            return;
        }
        let shift = match self.driver_features_select {
            0 => 0,
            1 => 32,
            sel => {
                guest_error!(
                    self.health.log(),
                    "driver feature select {sel} does not exist"
                );
                return;
            }
        };
        self.acked = (self.acked & !(0xffff_ffff << shift)) | (u64::from(value) << shift);
    }

    /// Every feature the driver accepted.
    pub fn driver_features(&self) -> u64 {
        self.acked
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

    /// The configuration generation the driver reads: it changes whenever the configuration
    /// (or DEVICE_NEEDS_RESET) may have (virtio 1.2 §2.5.1).
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
                self.health.log(),
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
                    self.health.log(),
                    "driver accepted features {unoffered:#x} the device did not offer"
                );
                value &= !VIRTIO_STATUS_FEATURES_OK;
            } else if self.acked & bit(VIRTIO_F_VERSION_1) == 0 {
                guest_error!(
                    self.health.log(),
                    "driver did not accept VIRTIO_F_VERSION_1 (legacy drivers are not supported)"
                );
                value &= !VIRTIO_STATUS_FEATURES_OK;
            }
        }
        if newly & VIRTIO_STATUS_DRIVER_OK != 0 && value & VIRTIO_STATUS_FEATURES_OK == 0 {
            guest_error!(self.health.log(), "DRIVER_OK without FEATURES_OK; ignored");
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
                    self.health.log(),
                    "{what} of queue {index} written while it is live; ignored"
                );
                false
            }
            None => {
                guest_error!(
                    self.health.log(),
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
            guest_error!(self.health.log(), "{ring:?} ring address: {e}; ignored");
        }
    }

    /// The driver enables the selected queue. A queue whose rings do not fit in guest memory
    /// breaks the device, and so does an available ring at guest-physical 0, which
    /// virtio-queue takes for "not set up" (its iterator then refuses the queue). With
    /// VIRTIO_F_ACCESS_PLATFORM the ring addresses are bus addresses: the device thread
    /// translates and checks them (`super::queue::rings`).
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

    /// A driver's read of the device-specific configuration space (virtio 1.2 §2.5).
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.device.read_config(offset, data);
    }

    /// A driver's write of the device-specific configuration space (virtio 1.2 §2.5).
    pub fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.device.write_config(offset, data);
    }
}

mod persist;
#[cfg(test)]
mod tests;

pub use persist::{QueueRegs, RegisterState};
