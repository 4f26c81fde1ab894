//! Virtio devices and their transports (virtio 1.2): what every device and both its sides
//! share ([`device`]); the register side, with feature negotiation, status and reset
//! ([`state`]); the device thread ([`worker`]) and the queue work it runs on split virtqueues
//! (on virtio-queue) ([`engine`]); virtio-mmio with exitless's MSI and per-queue doorbell
//! extension ([`transport::mmio`]); modern virtio-pci with MSI-X ([`transport::pci`]); the notification paths
//! ([`notify`]); virtio-net ([`net`]); virtio-blk on a raw file ([`block`]).

pub mod block;
pub mod device;
pub mod engine;
#[cfg(test)]
mod hostile;
pub mod interrupt;
pub mod net;
pub mod notify;
pub mod queue;
pub mod state;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
pub mod transport;
pub mod vhost_user;
pub mod worker;

pub use exitless_contract::virtio as regs;

use crate::irq::{IrqError, Signaller};
use device::{QueueHandler, VirtioDevice};

#[cfg(test)]
pub(crate) use testing::test_parts;

/// Errors building a virtio device.
#[derive(Debug, thiserror::Error)]
pub enum VirtioError {
    /// The interrupt routes (irqfds, MSI routes) could not be set up.
    #[error(transparent)]
    Irq(#[from] IrqError),
    /// A KVM call (an ioeventfd registration) failed.
    #[error("cannot {what}: {source}")]
    Kvm {
        /// What was being done.
        what: &'static str,
        /// What KVM returned.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Creating an eventfd or the device thread failed.
    #[error("virtio device setup: {0}{hint}", hint = crate::resource_hint(.0))]
    Io(#[source] std::io::Error),
}

impl VirtioError {
    fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Self {
        move |source| VirtioError::Kvm { what, source }
    }
}

/// A device type's two halves: the register side the transport keeps, and who serves the
/// queues.
pub struct DeviceParts {
    /// Identity, features, queues and configuration space.
    pub device: Box<dyn VirtioDevice>,
    /// The queue work.
    pub work: DeviceWork,
}

/// Who serves a device's queues.
pub enum DeviceWork {
    /// exitless's device thread, running this handler.
    InProcess(Box<dyn QueueHandler>),
    /// A vhost-user backend, which exitless's vhost-user thread configures.
    VhostUser(vhost_user::VhostUserWork),
}

impl DeviceWork {
    /// Who signals the device's MSI irqfds: a vhost-user backend needs routes whatever the
    /// commit strategy (`irq::msi`).
    pub fn signaller(&self) -> Signaller {
        match self {
            DeviceWork::InProcess(_) => Signaller::Vmm,
            DeviceWork::VhostUser(_) => Signaller::Outside,
        }
    }

    /// Whether the device's DMA may go through the IOMMU: a vhost-user backend maps guest RAM
    /// itself, and exitless does not implement the vhost-user IOTLB messages.
    pub fn translatable(&self) -> bool {
        matches!(self, DeviceWork::InProcess(_))
    }
}

/// The three areas of a split virtqueue (virtio 1.2 §2.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    /// The descriptor table.
    Descriptors,
    /// The available ring ("driver area").
    Driver,
    /// The used ring ("device area").
    Device,
}
