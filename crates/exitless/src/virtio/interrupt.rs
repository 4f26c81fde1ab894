//! How a virtio device interrupts the driver: through a level-triggered line with an
//! interrupt status register (virtio-mmio, virtio 1.2 §4.2.3.4), or through MSI vectors picked
//! per queue and for configuration changes (virtio-pci's MSI-X, exitless's virtio-mmio MSI
//! extension).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, Ordering};

use vmm_sys_util::eventfd::EventFd;

use super::device::Notification;
use super::regs::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING, VIRTIO_MSI_NO_VECTOR};
use crate::guest_error;
use crate::irq::MsiVectors;
use crate::logging::DeviceLog;

pub mod persist;

/// A level-triggered IOAPIC line driven through an irqfd with a resample eventfd: KVM keeps the
/// line asserted until the guest's EOI, then signals `resample`, and the device re-asserts it
/// if the status register is still non-zero.
pub struct LegacyLine {
    /// Asserts the line.
    pub irqfd: EventFd,
    /// Signalled by KVM at the EOI that de-asserted the line.
    pub resample: EventFd,
}

/// The interrupt state of one device.
pub struct Interrupts {
    line: Option<LegacyLine>,
    msi: Option<Arc<MsiVectors>>,
    msi_active: AtomicBool,
    status: AtomicU32,
    queue_vectors: Vec<AtomicU16>,
    config_vector: AtomicU16,
    log: Arc<DeviceLog>,
}

const NO_VECTOR: u16 = VIRTIO_MSI_NO_VECTOR;

impl Interrupts {
    /// For a device with `queues` queues, an optional line and optional MSI vectors, logging
    /// to the device's `log`.
    pub fn new(
        queues: usize,
        line: Option<LegacyLine>,
        msi: Option<Arc<MsiVectors>>,
        log: Arc<DeviceLog>,
    ) -> Self {
        Interrupts {
            log,
            line,
            msi,
            msi_active: AtomicBool::new(false),
            status: AtomicU32::new(0),
            queue_vectors: (0..queues).map(|_| AtomicU16::new(NO_VECTOR)).collect(),
            config_vector: AtomicU16::new(NO_VECTOR),
        }
    }

    /// The MSI vectors, if the transport has them.
    pub fn msi(&self) -> Option<&Arc<MsiVectors>> {
        self.msi.as_ref()
    }

    /// The resample eventfd of the line, if there is one.
    pub fn resample_fd(&self) -> Option<&EventFd> {
        self.line.as_ref().map(|l| &l.resample)
    }

    /// Route interrupts through the MSI vectors (true) or the line/status register (false).
    pub fn set_msi_active(&self, active: bool) {
        self.msi_active
            .store(active && self.msi.is_some(), Ordering::SeqCst);
    }

    /// Whether interrupts go through MSI vectors.
    pub fn msi_active(&self) -> bool {
        self.msi_active.load(Ordering::SeqCst)
    }

    /// The pending notification bits (`VIRTIO_MMIO_INT_*`), as virtio-mmio InterruptStatus and
    /// the virtio-pci ISR status byte read them (virtio 1.2 §4.2.2, §4.1.4.5).
    pub fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// Read and clear the status (virtio-pci's ISR is read-to-clear, §4.1.4.5).
    pub fn take_status(&self) -> u32 {
        self.status.swap(0, Ordering::SeqCst)
    }

    /// InterruptACK: clear `bits`.
    pub fn ack(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// After an EOI de-asserted the line: assert it again if anything is still unacknowledged.
    pub fn resample(&self) {
        if let Some(line) = &self.line {
            let _ = line.resample.read();
            if self.status() != 0 {
                let _ = line.irqfd.write(1);
            }
        }
    }

    /// Give queue `queue` MSI vector `vector`; returns what the register reads back:
    /// `VIRTIO_MSI_NO_VECTOR` when the vector does not exist (virtio 1.2 §4.1.5.1.2).
    pub fn set_queue_vector(&self, queue: usize, vector: u16) -> u16 {
        let v = self.checked_vector(vector);
        match self.queue_vectors.get(queue) {
            Some(slot) => {
                slot.store(v, Ordering::SeqCst);
                v
            }
            None => NO_VECTOR,
        }
    }

    /// Vector of queue `queue`.
    pub fn queue_vector(&self, queue: usize) -> u16 {
        self.queue_vectors
            .get(queue)
            .map_or(NO_VECTOR, |v| v.load(Ordering::SeqCst))
    }

    /// Give configuration changes MSI vector `vector`; returns the read-back value.
    pub fn set_config_vector(&self, vector: u16) -> u16 {
        let v = self.checked_vector(vector);
        self.config_vector.store(v, Ordering::SeqCst);
        v
    }

    /// Vector of configuration changes.
    pub fn config_vector(&self) -> u16 {
        self.config_vector.load(Ordering::SeqCst)
    }

    fn checked_vector(&self, vector: u16) -> u16 {
        let count = self.msi.as_ref().map_or(0, |m| m.len());
        if usize::from(vector) < count {
            vector
        } else {
            if vector != NO_VECTOR {
                guest_error!(
                    self.log,
                    "MSI vector {vector} does not exist ({count} vectors)"
                );
            }
            NO_VECTOR
        }
    }

    /// Device reset: vectors unassigned, status clear, back to the line.
    pub fn reset(&self) {
        for v in &self.queue_vectors {
            v.store(NO_VECTOR, Ordering::SeqCst);
        }
        self.config_vector.store(NO_VECTOR, Ordering::SeqCst);
        self.status.store(0, Ordering::SeqCst);
        self.msi_active.store(false, Ordering::SeqCst);
    }

    /// Send `n` to the driver.
    pub fn notify(&self, n: Notification) {
        if self.msi_active() {
            let vector = match n {
                Notification::Queue(q) => self.queue_vector(q),
                Notification::Config => self.config_vector(),
            };
            // NO_VECTOR: the driver asked for no interrupt (§4.1.5.1.2).
            if vector != NO_VECTOR
                && let Some(msi) = &self.msi
            {
                msi.trigger(usize::from(vector));
            }
            return;
        }
        let bit = match n {
            Notification::Queue(_) => VIRTIO_MMIO_INT_VRING,
            Notification::Config => VIRTIO_MMIO_INT_CONFIG,
        };
        self.status.fetch_or(bit, Ordering::SeqCst);
        match &self.line {
            Some(line) => {
                let _ = line.irqfd.write(1);
            }
            None => self.log.warn(format_args!(
                "interrupt without MSI-X enabled; INTx is not implemented, so it is lost"
            )),
        }
    }
}
