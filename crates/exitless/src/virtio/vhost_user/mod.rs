//! vhost-user devices: the queues are served by a backend in another process (DPDK,
//! qemu-storage-daemon, SPDK), the register side stays in exitless (docs/vhost-user.md).
//!
//! The backend gets guest RAM's memfd regions ([`memory`]), each queue's doorbell eventfd as its
//! kick (the one KVM's ioeventfd signals: nothing exits to exitless) and, as its call, the
//! vector's KVM irqfd while the vector may deliver or a watch eventfd exitless polls while it
//! may not ([`calls`]: QEMU's "masked notifier" swap). [`connection`] negotiates, [`device`] is
//! the register side, [`thread`] the thread that talks to the backend, which also serves a
//! multiqueue NIC's control queue ([`control`]).
//!
//! The kernel's vhost-net serves a NIC's queues the same way from inside the host kernel
//! ([`kernel`]); [`backend`] is what differs between the two.

mod backend;
mod calls;
mod connection;
mod control;
mod deadline;
mod device;
mod kernel;
mod memory;
#[cfg(test)]
mod tests;
mod thread;

use crate::virtio::net::tap::{Tap, TapError};
use std::path::PathBuf;
use std::time::Duration;

use vm_memory::GuestMemoryMmap;

use super::DeviceParts;
use crate::virtio::regs::{VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};
use backend::Backend;
use connection::Connection;
use deadline::{EXCHANGE_DEADLINE, Watchdog};
pub use device::VhostUserDevice;
use kernel::KernelNet;
pub use kernel::{VHOST_NET_PATH, VhostNetError};
pub(super) use thread::spawn;

/// A device whose queues a vhost-user backend serves.
#[derive(Clone, Debug)]
pub struct VhostUserSpec {
    /// The backend's listening socket (for the kernel's vhost-net, its device file).
    pub socket: PathBuf,
    /// What the device is.
    pub kind: VhostUserKind,
    /// Queues (virtio-blk) or queue pairs (virtio-net).
    pub queues: u16,
    /// How long after a hangup to keep trying to connect again (every 100 ms); `None`: once,
    /// at the driver's reset.
    pub reconnect: Option<Duration>,
}

/// The device type a backend serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VhostUserKind {
    /// virtio-net with this MAC address.
    Net {
        /// The address the configuration space shows.
        mac: [u8; 6],
    },
    /// virtio-blk; its configuration space is the backend's.
    Block,
}

impl VhostUserSpec {
    /// Whether the device has a control queue, served by exitless: a NIC with several queue
    /// pairs (virtio 1.2 §5.1.6.5; VIRTIO_NET_F_MQ needs VIRTIO_NET_F_CTRL_VQ).
    pub fn control_queue(&self) -> bool {
        matches!(self.kind, VhostUserKind::Net { .. }) && self.queues > 1
    }

    /// The virtqueues the backend serves: a receive and a transmit queue per pair for net
    /// (not the control queue).
    pub fn queue_count(&self) -> usize {
        match self.kind {
            VhostUserKind::Net { .. } => 2 * usize::from(self.queues),
            VhostUserKind::Block => usize::from(self.queues),
        }
    }
}

/// The first ring feature exitless needs that a backend (vhost-user or the kernel's) lacks
/// in `features`, by name: virtio 1.x rings, with event indexes.
fn lacking_ring_feature(features: u64) -> Option<&'static str> {
    [
        (VIRTIO_F_VERSION_1, "VIRTIO_F_VERSION_1"),
        (VIRTIO_F_EVENT_IDX, "VIRTIO_RING_F_EVENT_IDX"),
    ]
    .into_iter()
    .find(|&(bit, _)| features & (1 << bit) == 0)
    .map(|(_, name)| name)
}

/// Why a vhost-user device could not be built: the one line the user sees.
#[derive(Debug, thiserror::Error)]
pub enum VhostUserError {
    /// The socket could not be reached.
    #[error(
        "cannot connect to the vhost-user backend at {}: {source}; start the backend first",
        socket.display()
    )]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// What connect said.
        #[source]
        source: std::io::Error,
    },
    /// A message failed or was answered with nonsense.
    #[error("the vhost-user backend at {}: {what} failed: {source}", socket.display())]
    Protocol {
        /// The socket.
        socket: PathBuf,
        /// The message.
        what: &'static str,
        /// What the vhost crate said.
        #[source]
        source: vhost::Error,
    },
    /// The backend lacks a feature the device needs.
    #[error(
        "the vhost-user backend at {} does not offer {feature}, which exitless needs; use a backend that does",
        socket.display()
    )]
    Lacks {
        /// The socket.
        socket: PathBuf,
        /// The feature.
        feature: &'static str,
    },
    /// The backend serves fewer queues than asked for.
    #[error(
        "the vhost-user backend at {} serves {has} queues, {asked} asked for; lower queues=",
        socket.display()
    )]
    Queues {
        /// The socket.
        socket: PathBuf,
        /// Queues asked for: a NIC's receive and transmit queues.
        asked: usize,
        /// Queues it has.
        has: u64,
    },
    /// The backend took the connection but did not answer in time (it serves another VMM,
    /// sent half a reply, or is stuck).
    #[error(
        "the vhost-user backend at {} did not answer {what} within {} s; is it serving \
         another VMM, or stuck? (restart it)",
        socket.display(),
        EXCHANGE_DEADLINE.as_secs()
    )]
    Silent {
        /// The socket.
        socket: PathBuf,
        /// The message it did not answer.
        what: &'static str,
    },
    /// The watchdog thread that puts a deadline on the backend's answers could not start.
    #[error("cannot start the vhost-user deadline thread: {0}")]
    Watchdog(#[source] std::io::Error),
    /// Guest RAM is not in shareable memory.
    #[error("guest RAM is not shareable with a vhost-user backend (not a memfd mapping)")]
    RamNotShared,
}

impl VhostUserError {
    /// This error, said as the backend's silence if the exchange's deadline passed (`late`):
    /// the crate's own error is then only the socket shut down.
    fn late(self, late: bool) -> Self {
        match self {
            VhostUserError::Protocol { socket, what, .. } if late => {
                VhostUserError::Silent { socket, what }
            }
            e => e,
        }
    }
}

/// What a vhost-user device's thread is started with.
pub struct VhostUserWork {
    spec: VhostUserSpec,
    backend: Backend,
    /// The deadline on every exchange with a vhost-user backend (the kernel's has none).
    watchdog: Option<Watchdog>,
    /// The features offered to the driver: a backend connected again must offer them all.
    offered: u64,
    mem: GuestMemoryMmap,
}

/// Connect to `spec`'s backend and build the device's two halves. The memory table needs
/// guest RAM in a memfd (`vm::RamBacking::SharedMemfd`).
pub fn connect(spec: &VhostUserSpec, mem: &GuestMemoryMmap) -> Result<DeviceParts, VhostUserError> {
    memory::regions(mem)?;
    let watchdog = Watchdog::start("vhost-user").map_err(VhostUserError::Watchdog)?;
    let mut connection = Connection::open(spec, &watchdog)?;
    let device = VhostUserDevice::new(spec, &mut connection, &watchdog)?;
    // What the driver may negotiate of the backend's: a backend connected later must offer it.
    let offered = device.offered() & connection.features;
    Ok(DeviceParts {
        device: Box::new(device),
        work: super::DeviceWork::VhostUser(VhostUserWork {
            spec: spec.clone(),
            backend: Backend::User(connection),
            watchdog: Some(watchdog),
            offered,
            mem: mem.clone(),
        }),
    })
}

/// A NIC with `mac` and `pairs` queue pairs on the queues `taps` opens, served by the kernel's
/// vhost-net (`--net tap=NAME,vhost=on`).
pub fn kernel_net(
    taps: impl FnOnce() -> Result<Vec<Tap>, TapError>,
    pairs: u16,
    mac: [u8; 6],
    mem: &GuestMemoryMmap,
) -> Result<DeviceParts, VhostNetError> {
    let kernel = KernelNet::open(taps, pairs.into(), mem)?;
    let spec = VhostUserSpec {
        socket: VHOST_NET_PATH.into(),
        kind: VhostUserKind::Net { mac },
        queues: pairs,
        reconnect: None,
    };
    // The kernel's ring features, and the offloads the tap does.
    let device = VhostUserDevice::net(&spec, mac, kernel.features | kernel.offloads());
    Ok(DeviceParts {
        work: super::DeviceWork::VhostUser(VhostUserWork {
            spec,
            backend: Backend::Kernel(kernel),
            watchdog: None,
            offered: device.offered(),
            mem: mem.clone(),
        }),
        device: Box::new(device),
    })
}
