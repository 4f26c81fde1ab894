//! The register side of a vhost-user device: the device type, the features offered to the
//! driver (the backend's, less what exitless does not pass through) and the configuration
//! space: virtio-net's built here (the MAC, the link up, the queue pairs), virtio-blk's the
//! backend's (VHOST_USER_GET_CONFIG).

use std::os::fd::AsRawFd;

use vhost::vhost_user::VhostUserFrontend;
use vhost::vhost_user::message::VhostUserConfigFlags;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_GEOMETRY,
    VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_F_TOPOLOGY, VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::{VIRTIO_ID_BLOCK, VIRTIO_ID_NET};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_GUEST_UFO, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4,
    VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_HOST_UFO, VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CTRL_VQ, VIRTIO_NET_F_GUEST_USO4, VIRTIO_NET_F_GUEST_USO6, VIRTIO_NET_F_HOST_USO,
    VIRTIO_NET_F_MQ,
};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

use super::connection::Connection;
use super::deadline::Watchdog;
use super::{VhostUserError, VhostUserKind, VhostUserSpec};
use crate::virtio::device::{VirtioDevice, read_config_bytes};

/// Queue size offered for each of the backend's queues (virtio-net's and virtio-blk's own).
const QUEUE_SIZE: u16 = 256;
/// `struct virtio_blk_config` up to `num_queues` and past it (virtio 1.2 §5.2.4): 60 bytes.
const BLK_CONFIG_LEN: u32 = 60;
/// Offset of virtio-blk's `num_queues`.
const BLK_NUM_QUEUES: usize = 34;

/// virtio-net's status: the link is up (the backend's own state is not known to exitless).
#[allow(clippy::cast_possible_truncation)]
const LINK_UP: u16 = VIRTIO_NET_S_LINK_UP as u16;

/// Ring and common features passed through to the backend.
const COMMON: [u32; 3] = [
    VIRTIO_F_VERSION_1,
    VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_RING_F_INDIRECT_DESC,
];
/// virtio-net features whose work is the backend's. MQ and the control queue are offered
/// apart, with several pairs only ([`multiqueue`]).
const NET: [u32; 14] = [
    VIRTIO_NET_F_CSUM,
    VIRTIO_NET_F_GUEST_CSUM,
    VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6,
    VIRTIO_NET_F_GUEST_ECN,
    VIRTIO_NET_F_GUEST_UFO,
    VIRTIO_NET_F_HOST_TSO4,
    VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_HOST_ECN,
    VIRTIO_NET_F_HOST_UFO,
    VIRTIO_NET_F_MRG_RXBUF,
    VIRTIO_NET_F_GUEST_USO4,
    VIRTIO_NET_F_GUEST_USO6,
    VIRTIO_NET_F_HOST_USO,
];
/// virtio-blk features, all the backend's.
const BLOCK: [u32; 10] = [
    VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_F_GEOMETRY,
    VIRTIO_BLK_F_RO,
    VIRTIO_BLK_F_BLK_SIZE,
    VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_TOPOLOGY,
    VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_DISCARD,
    VIRTIO_BLK_F_WRITE_ZEROES,
];

fn bits(list: &[u32]) -> u64 {
    list.iter().fold(0, |acc, &b| acc | 1 << b)
}

/// Features whose work is exitless's whatever the backend offers, never passed to it in
/// SET_FEATURES: the control queue (as QEMU keeps VIRTIO_NET_F_CTRL_VQ out of its vhost-user
/// feature list, hw/net/vhost_net.c).
pub(super) const OWN_FEATURES: u64 = 1 << VIRTIO_NET_F_CTRL_VQ;

/// A NIC with several pairs offers VIRTIO_NET_F_MQ and the control queue it needs
/// (virtio 1.2 §5.1.3.1). The connection checked that the backend has
/// VHOST_USER_PROTOCOL_F_MQ and the rings; VIRTIO_NET_F_MQ itself goes to a backend that
/// offers it (DPDK does), as in QEMU.
fn multiqueue(spec: &VhostUserSpec) -> u64 {
    if spec.control_queue() {
        1 << VIRTIO_NET_F_MQ | 1 << VIRTIO_NET_F_CTRL_VQ
    } else {
        0
    }
}

/// A vhost-user device as the transport sees it.
pub struct VhostUserDevice {
    kind: VhostUserKind,
    /// The backend's queues and the control queue, if any.
    queues: usize,
    /// Offered to the driver: the backend's features within what passes through, and for
    /// net the MAC and status exitless provides itself.
    features: u64,
    config: Vec<u8>,
}

impl VhostUserDevice {
    /// The register side of `spec`'s device on `connection`.
    pub(super) fn new(
        spec: &VhostUserSpec,
        connection: &mut Connection,
        watchdog: &Watchdog,
    ) -> Result<Self, VhostUserError> {
        let config = match spec.kind {
            VhostUserKind::Net { mac } => return Ok(Self::net(spec, mac, connection.features)),
            VhostUserKind::Block => {
                let _exchange = watchdog.arm(connection.frontend.as_raw_fd());
                let (_, mut c) = connection
                    .frontend
                    .get_config(
                        0,
                        BLK_CONFIG_LEN,
                        VhostUserConfigFlags::empty(),
                        &[0; BLK_CONFIG_LEN as usize],
                    )
                    .map_err(|source| {
                        let e = VhostUserError::Protocol {
                            socket: spec.socket.clone(),
                            what: "GET_CONFIG",
                            source,
                        };
                        e.late(watchdog.fired())
                    })?;
                if let Some(n) = c.get_mut(BLK_NUM_QUEUES..BLK_NUM_QUEUES + 2) {
                    n.copy_from_slice(&spec.queues.to_le_bytes());
                }
                c
            }
        };
        Ok(VhostUserDevice {
            kind: spec.kind,
            queues: spec.queue_count(),
            features: connection.features & (bits(&COMMON) | bits(&BLOCK)),
            config,
        })
    }

    /// The register side of `spec`'s NIC with `mac`, on a backend offering `backend_features`
    /// (for the kernel's vhost-net, its ring features and the tap's offloads): the MAC and the
    /// link exitless provides, and with several pairs the control queue it serves.
    pub(super) fn net(spec: &VhostUserSpec, mac: [u8; 6], backend_features: u64) -> Self {
        let features = backend_features & (bits(&COMMON) | bits(&NET))
            | 1 << VIRTIO_NET_F_MAC
            | 1 << VIRTIO_NET_F_STATUS
            | multiqueue(spec);
        // mac, status, and with MQ max_virtqueue_pairs (virtio 1.2 §5.1.4).
        let mut config = mac.to_vec();
        config.extend_from_slice(&LINK_UP.to_le_bytes());
        if spec.control_queue() {
            config.extend_from_slice(&spec.queues.to_le_bytes());
        }
        VhostUserDevice {
            kind: spec.kind,
            queues: spec.queue_count() + usize::from(spec.control_queue()),
            features,
            config,
        }
    }

    /// Every feature offered to the driver (those the register side adds included).
    pub fn offered(&self) -> u64 {
        self.features | bits(&COMMON[..2])
    }
}

impl VirtioDevice for VhostUserDevice {
    fn device_type(&self) -> u32 {
        match self.kind {
            VhostUserKind::Net { .. } => VIRTIO_ID_NET,
            VhostUserKind::Block => VIRTIO_ID_BLOCK,
        }
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; self.queues]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::net::header::{OFFLOAD_FEATURES, USO_FEATURES};

    /// A NIC offers the backend's offloads, UDP segmentation included (the kernel's vhost-net
    /// on a tap that carries it, or a vhost-user backend that offers it), and none of the
    /// backend's features it does not pass through.
    #[test]
    fn a_nic_passes_the_backends_offloads_through_uso_included() {
        let spec = VhostUserSpec {
            socket: "/dev/vhost-net".into(),
            kind: VhostUserKind::Net {
                mac: [2, 0, 0, 0, 0, 1],
            },
            queues: 1,
            reconnect: None,
        };
        let offloads = OFFLOAD_FEATURES | USO_FEATURES;
        let unknown = 1 << 63;
        let nic = VhostUserDevice::net(&spec, [2, 0, 0, 0, 0, 1], offloads | unknown);
        assert_eq!(nic.features() & offloads, offloads);
        assert_eq!(nic.features() & unknown, 0);
    }
}
