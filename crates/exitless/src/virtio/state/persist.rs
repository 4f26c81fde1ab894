//! The register side of a virtio device in a snapshot (`crate::persist`): features, status,
//! selectors, each queue's configuration as the driver wrote it (virtio 1.2 §4.1.4.3,
//! §4.2.2), whether the device broke, and its configuration space, which exitless's devices
//! derive from the machine's configuration (so it is compared, not written back). Every value
//! is checked at restore as a driver's write would be; a bad one is an error naming it.

use serde::{Deserialize, Serialize};
use virtio_queue::{Queue, QueueState, QueueT};

use super::VirtioState;
use crate::persist::StateError;
use crate::virtio::device::QueuePosition;
use crate::virtio::regs::{
    VIRTIO_F_ACCESS_PLATFORM, VIRTIO_STATUS_DEVICE_NEEDS_RESET, VIRTIO_STATUS_DRIVER_OK,
    VIRTIO_STATUS_FEATURES_OK,
};

/// Bytes of device configuration space a snapshot compares: more than any device here has.
const CONFIG_BYTES: usize = 256;

/// One queue's registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRegs {
    /// Queue size.
    pub size: u16,
    /// Queue enable.
    pub ready: bool,
    /// Descriptor table address.
    pub desc: u64,
    /// Driver (available) ring address.
    pub driver: u64,
    /// Device (used) ring address.
    pub device: u64,
}

/// The register side's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterState {
    /// Features the device offered: a different device or configuration if they differ.
    pub offered: u64,
    /// Features the driver accepted.
    pub acked: u64,
    /// Device feature select.
    pub device_features_select: u32,
    /// Driver feature select.
    pub driver_features_select: u32,
    /// Device status.
    pub status: u32,
    /// Queue select.
    pub queue_select: u32,
    /// Each queue's registers.
    pub queues: Vec<QueueRegs>,
    /// DEVICE_NEEDS_RESET.
    pub needs_reset: bool,
    /// The driver wrote 0 to the status and the device thread had not let go of the queues
    /// yet: the restored device completes the reset.
    #[serde(default)]
    pub reset_pending: bool,
    /// The device configuration space as the driver reads it.
    pub config: Vec<u8>,
}

impl VirtioState {
    fn config_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![0; CONFIG_BYTES];
        self.read_config(0, &mut bytes);
        bytes
    }

    /// The registers, for a snapshot.
    pub fn save(&self) -> RegisterState {
        RegisterState {
            offered: self.offered,
            acked: self.acked,
            device_features_select: self.device_features_select,
            driver_features_select: self.driver_features_select,
            status: self.status,
            queue_select: self.queue_select,
            queues: self
                .queues
                .iter()
                .map(|q| QueueRegs {
                    size: q.size(),
                    ready: q.ready(),
                    desc: q.desc_table(),
                    driver: q.avail_ring(),
                    device: q.used_ring(),
                })
                .collect(),
            needs_reset: self.health.needs_reset(),
            reset_pending: self.pending_reset.is_some(),
            config: self.config_bytes(),
        }
    }

    /// Take the registers of `saved` (this device is freshly built from the same
    /// configuration); errors name `what`'s field. Nothing changes unless all are valid.
    pub fn restore(&mut self, what: &str, saved: &RegisterState) -> Result<(), StateError> {
        self.check_same_device(what, saved)?;
        check_status(what, saved)?;
        // With VIRTIO_F_ACCESS_PLATFORM the rings are bus addresses, checked when translated.
        let bus_addresses = saved.status & VIRTIO_STATUS_FEATURES_OK != 0
            && saved.acked & 1 << VIRTIO_F_ACCESS_PLATFORM != 0;
        let queues = saved
            .queues
            .iter()
            .zip(&self.queues)
            .enumerate()
            .map(|(i, (regs, q))| {
                let what = format!("{what}.queue[{i}]");
                let q = queue_from(&what, regs, q.max_size())?;
                // As `set_queue_ready` refuses them from a driver.
                if q.ready() && !bus_addresses && (!q.is_valid(&self.mem) || q.avail_ring() == 0) {
                    return Err(StateError::new(
                        format!("{what}.ready"),
                        "enabled with rings outside guest memory or at address 0",
                    ));
                }
                Ok(q)
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.queues = queues;
        self.acked = saved.acked;
        self.device_features_select = saved.device_features_select;
        self.driver_features_select = saved.driver_features_select;
        self.status = saved.status;
        self.queue_select = saved.queue_select;
        if saved.needs_reset {
            self.health
                .fail(&"it needed a reset when the snapshot was taken");
        }
        Ok(())
    }

    /// Whether `saved` is of this device: the same features offered, configuration space and
    /// number of queues.
    fn check_same_device(&self, what: &str, saved: &RegisterState) -> Result<(), StateError> {
        let field = |name: &str| format!("{what}.{name}");
        if saved.offered != self.offered {
            return Err(StateError::new(
                field("offered"),
                format_args!(
                    "the device offers {:#x}, the snapshot's offered {:#x}: another device or \
                     configuration",
                    self.offered, saved.offered
                ),
            ));
        }
        if saved.config != self.config_bytes() {
            return Err(StateError::new(
                field("config"),
                "the device configuration differs from the snapshot's (another disk size or MAC?)",
            ));
        }
        if saved.queues.len() != self.queues.len() {
            return Err(StateError::new(
                field("queues"),
                format_args!(
                    "{} queues, the device has {}",
                    saved.queues.len(),
                    self.queues.len()
                ),
            ));
        }
        Ok(())
    }

    /// Whether the driver has set DRIVER_OK: the device thread then has the queues.
    pub fn is_live(&self) -> bool {
        self.status & VIRTIO_STATUS_DRIVER_OK != 0
    }

    /// The configured queues at the device positions `positions` (from a snapshot), for the
    /// device thread; a position more than a ring ahead of the used index (virtio 1.2 §2.7.6)
    /// or a count that differs is an error naming `what`'s field.
    pub fn queues_at(
        &self,
        what: &str,
        positions: &[QueuePosition],
    ) -> Result<Vec<Queue>, StateError> {
        if positions.len() != self.queues.len() {
            return Err(StateError::new(
                format!("{what}.positions"),
                format_args!(
                    "{} positions for {} queues",
                    positions.len(),
                    self.queues.len()
                ),
            ));
        }
        let mut queues = self.activation_queues();
        for (i, (q, p)) in queues.iter_mut().zip(positions).enumerate() {
            if p.next_avail.wrapping_sub(p.next_used) > q.size() {
                return Err(StateError::new(
                    format!("{what}.positions[{i}]"),
                    format_args!(
                        "next_avail {} is more than the queue size {} ahead of next_used {}",
                        p.next_avail,
                        q.size(),
                        p.next_used
                    ),
                ));
            }
            q.set_next_avail(p.next_avail);
            q.set_next_used(p.next_used);
        }
        Ok(queues)
    }
}

/// Whether the status is one a driver could have reached (virtio 1.2 §3.1.1): 8 bits, no
/// DEVICE_NEEDS_RESET (the device's, saved apart), and features past FEATURES_OK offered.
fn check_status(what: &str, saved: &RegisterState) -> Result<(), StateError> {
    if saved.status & !0xff != 0 || saved.status & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0 {
        return Err(StateError::new(
            format!("{what}.status"),
            format_args!("{:#x} is not a status a driver sets", saved.status),
        ));
    }
    // Before FEATURES_OK a driver may have written anything; the device refused it there.
    if saved.status & VIRTIO_STATUS_FEATURES_OK != 0 && saved.acked & !saved.offered != 0 {
        return Err(StateError::new(
            format!("{what}.acked"),
            "features never offered, accepted at FEATURES_OK",
        ));
    }
    Ok(())
}

/// A queue of maximum size `max_size` with the registers `regs`, checked as virtio-queue
/// checks a driver's writes: a size that is a power of two ≤ the maximum, aligned rings.
fn queue_from(what: &str, regs: &QueueRegs, max_size: u16) -> Result<Queue, StateError> {
    let state = QueueState {
        max_size,
        size: regs.size,
        ready: regs.ready,
        desc_table: regs.desc,
        avail_ring: regs.driver,
        used_ring: regs.device,
        ..QueueState::default()
    };
    Queue::try_from(state).map_err(|e| {
        let name = match e {
            virtio_queue::Error::InvalidSize => "size",
            virtio_queue::Error::InvalidDescTableAlign => "desc",
            virtio_queue::Error::InvalidAvailRingAlign => "driver",
            virtio_queue::Error::InvalidUsedRingAlign => "device",
            _ => "state",
        };
        StateError::new(format!("{what}.{name}"), e)
    })
}
