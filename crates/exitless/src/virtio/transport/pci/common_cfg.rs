//! The common configuration structure at the start of BAR 0 (virtio 1.2 §4.1.4.3,
//! `struct virtio_pci_common_cfg`): feature negotiation, device status, and the selected
//! queue's size, vector, enable and ring addresses. Every field has its own width; an access
//! of another width, or between fields, is no access (reads zero, writes are ignored).

// Fields are 8, 16 or 32 bits wide: a value is cut to its field's width, as the hardware
// register would cut it.
#![allow(clippy::cast_possible_truncation)]

use virtio_queue::QueueT;

use super::VirtioPci;
use crate::guest_error;
use crate::virtio::Ring;
use crate::virtio::regs::{
    VIRTIO_PCI_COMMON_CFGGENERATION, VIRTIO_PCI_COMMON_DF, VIRTIO_PCI_COMMON_DFSELECT,
    VIRTIO_PCI_COMMON_GF, VIRTIO_PCI_COMMON_GFSELECT, VIRTIO_PCI_COMMON_MSIX,
    VIRTIO_PCI_COMMON_NUMQ, VIRTIO_PCI_COMMON_Q_AVAILLO, VIRTIO_PCI_COMMON_Q_DESCLO,
    VIRTIO_PCI_COMMON_Q_ENABLE, VIRTIO_PCI_COMMON_Q_MSIX, VIRTIO_PCI_COMMON_Q_NOFF,
    VIRTIO_PCI_COMMON_Q_SELECT, VIRTIO_PCI_COMMON_Q_SIZE, VIRTIO_PCI_COMMON_Q_USEDHI,
    VIRTIO_PCI_COMMON_STATUS,
};
use crate::virtio::state::StatusChange;
use crate::virtio::transport::ring_dword;
use crate::virtio::transport::shared::finish_late_reset;

/// Distance between two rings' address fields: queue_desc, queue_driver, queue_device are
/// 64 bits each.
const RING_STRIDE: u32 = VIRTIO_PCI_COMMON_Q_AVAILLO - VIRTIO_PCI_COMMON_Q_DESCLO;

/// The only value a driver may write to queue_enable (virtio 1.2 §4.1.4.3.2).
const QUEUE_ENABLE: u32 = 1;

/// The ring address a dword access at `offset` (of `len` bytes) of the structure names, if it
/// is one: the address fields take aligned dword accesses.
fn ring_address(offset: u32, len: usize) -> Option<(Ring, bool)> {
    let in_range = (VIRTIO_PCI_COMMON_Q_DESCLO..=VIRTIO_PCI_COMMON_Q_USEDHI).contains(&offset);
    (in_range && len == 4 && offset.is_multiple_of(4))
        .then(|| ring_dword(offset - VIRTIO_PCI_COMMON_Q_DESCLO, RING_STRIDE))
}

impl VirtioPci {
    /// A read of `len` bytes at `offset` of the structure: the field's value, or None if the
    /// access is no field.
    pub(super) fn common_read(&self, offset: u32, len: usize) -> Option<u32> {
        let mut st = self.core.state.lock().unwrap();
        if finish_late_reset(&mut st) {
            self.after_reset();
        }
        let queue = st.selected_queue();
        if let Some((ring, high)) = ring_address(offset, len) {
            let q = queue?;
            let addr = match ring {
                Ring::Descriptors => q.desc_table(),
                Ring::Driver => q.avail_ring(),
                Ring::Device => q.used_ring(),
            };
            return Some(if high {
                (addr >> 32) as u32
            } else {
                addr as u32
            });
        }
        let sel = st.queue_select as usize;
        Some(match (offset, len) {
            (VIRTIO_PCI_COMMON_DFSELECT, 4) => st.device_features_select,
            (VIRTIO_PCI_COMMON_DF, 4) => st.device_features_word(),
            (VIRTIO_PCI_COMMON_GFSELECT, 4) => st.driver_features_select,
            (VIRTIO_PCI_COMMON_GF, 4) => st.driver_features_word(),
            (VIRTIO_PCI_COMMON_MSIX, 2) => u32::from(self.core.interrupts.config_vector()),
            (VIRTIO_PCI_COMMON_NUMQ, 2) => st.queue_count() as u32,
            (VIRTIO_PCI_COMMON_STATUS, 1) => st.status(),
            (VIRTIO_PCI_COMMON_CFGGENERATION, 1) => u32::from(st.config_generation() as u8),
            (VIRTIO_PCI_COMMON_Q_SELECT, 2) => st.queue_select,
            (VIRTIO_PCI_COMMON_Q_SIZE, 2) => queue.map_or(0, |q| u32::from(q.size())),
            (VIRTIO_PCI_COMMON_Q_MSIX, 2) => u32::from(self.core.interrupts.queue_vector(sel)),
            (VIRTIO_PCI_COMMON_Q_ENABLE, 2) => queue.map_or(0, |q| u32::from(q.ready())),
            // Each queue's doorbell is its own: queue_notify_off is the queue's index.
            (VIRTIO_PCI_COMMON_Q_NOFF, 2) => queue.map_or(0, |_| st.queue_select),
            _ => return None,
        })
    }

    /// A write of `value` (`len` bytes) at `offset` of the structure: false if the access is no
    /// writable field.
    pub(super) fn common_write(&mut self, offset: u32, len: usize, value: u32) -> bool {
        let mut st = self.core.state.lock().unwrap();
        if finish_late_reset(&mut st) {
            self.after_reset();
        }
        if let Some((ring, high)) = ring_address(offset, len) {
            st.set_queue_address(ring, high, value);
            return true;
        }
        match (offset, len) {
            (VIRTIO_PCI_COMMON_DFSELECT, 4) => st.device_features_select = value,
            (VIRTIO_PCI_COMMON_GFSELECT, 4) => st.driver_features_select = value,
            (VIRTIO_PCI_COMMON_GF, 4) => st.write_driver_features(value),
            (VIRTIO_PCI_COMMON_MSIX, 2) => {
                self.core.interrupts.set_config_vector(value as u16);
            }
            (VIRTIO_PCI_COMMON_STATUS, 1) => {
                let change = self.core.write_status(&mut st, value);
                if change == StatusChange::Reset {
                    self.after_reset();
                }
            }
            (VIRTIO_PCI_COMMON_Q_SELECT, 2) => st.queue_select = value,
            (VIRTIO_PCI_COMMON_Q_SIZE, 2) => st.set_queue_size(value),
            (VIRTIO_PCI_COMMON_Q_MSIX, 2) => {
                self.core
                    .interrupts
                    .set_queue_vector(st.queue_select as usize, value as u16);
            }
            (VIRTIO_PCI_COMMON_Q_ENABLE, 2) if value == QUEUE_ENABLE => st.set_queue_ready(),
            (VIRTIO_PCI_COMMON_Q_ENABLE, 2) => guest_error!(
                self.core.log,
                "queue_enable written with {value} (only 1 is allowed); ignored"
            ),
            _ => return false,
        }
        true
    }
}
