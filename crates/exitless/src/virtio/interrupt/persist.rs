//! A device's interrupt state in a snapshot (`crate::persist`): the status bits the driver has
//! not acknowledged and the MSI vector of each queue and of configuration changes (virtio 1.2
//! §4.1.4.3, §4.1.4.5). The vectors' own messages, masks and pending bits are the vector
//! table's (`crate::pci::msix`, the virtio-mmio MSI extension).

use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{Interrupts, NO_VECTOR};
use crate::persist::StateError;

/// What [`Interrupts`] holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptState {
    /// Unacknowledged `VIRTIO_MMIO_INT_*` bits (the ISR status).
    pub status: u32,
    /// Whether notifications go to MSI vectors rather than the line.
    pub msi_active: bool,
    /// The configuration change vector.
    pub config_vector: u16,
    /// Each queue's vector.
    pub queue_vectors: Vec<u16>,
}

impl Interrupts {
    /// The state, for a snapshot.
    pub fn save(&self) -> InterruptState {
        InterruptState {
            status: self.status(),
            msi_active: self.msi_active(),
            config_vector: self.config_vector(),
            queue_vectors: (0..self.queue_vectors.len())
                .map(|q| self.queue_vector(q))
                .collect(),
        }
    }

    /// Take `saved`; a vector the table does not have, a queue count that differs or a status
    /// bit that does not exist is an error naming `what`'s field, and changes nothing.
    pub fn restore(&self, what: &str, saved: &InterruptState) -> Result<(), StateError> {
        if saved.queue_vectors.len() != self.queue_vectors.len() {
            return Err(StateError::new(
                format!("{what}.queue_vectors"),
                format_args!(
                    "{} queues, the device has {}",
                    saved.queue_vectors.len(),
                    self.queue_vectors.len()
                ),
            ));
        }
        let count = self.msi.as_ref().map_or(0, |m| m.len());
        let check = |name: String, v: u16| {
            if v == NO_VECTOR || usize::from(v) < count {
                Ok(())
            } else {
                Err(StateError::new(
                    name,
                    format_args!("vector {v} does not exist ({count} vectors)"),
                ))
            }
        };
        check(format!("{what}.config_vector"), saved.config_vector)?;
        for (q, &v) in saved.queue_vectors.iter().enumerate() {
            check(format!("{what}.queue_vectors[{q}]"), v)?;
        }
        let bits = super::VIRTIO_MMIO_INT_VRING | super::VIRTIO_MMIO_INT_CONFIG;
        if saved.status & !bits != 0 {
            return Err(StateError::new(
                format!("{what}.status"),
                format_args!("{:#x} has bits other than {bits:#x}", saved.status),
            ));
        }
        self.status.store(saved.status, Ordering::SeqCst);
        self.set_msi_active(saved.msi_active);
        self.config_vector
            .store(saved.config_vector, Ordering::SeqCst);
        for (slot, &v) in self.queue_vectors.iter().zip(&saved.queue_vectors) {
            slot.store(v, Ordering::SeqCst);
        }
        Ok(())
    }
}
