//! The connection to a vhost-user backend and what it negotiates at connection (vhost-user
//! protocol, "Session start"): SET_OWNER, the backend's virtio features, the protocol features
//! exitless uses (REPLY_ACK, MQ, CONFIG for virtio-blk, RESET_DEVICE), and its queue count.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use vhost::VhostBackend;
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};

use super::deadline::{EXCHANGE_DEADLINE, Watchdog};
use super::{VhostUserError, VhostUserKind, VhostUserSpec, lacking_ring_feature};

/// VHOST_USER_F_PROTOCOL_FEATURES: the backend has protocol features (vhost-user protocol,
/// "Protocol features"); it is a vhost-user bit, never offered to the driver.
pub(super) const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// A session with a backend.
pub(super) struct Connection {
    /// The frontend's end of the socket.
    pub frontend: Frontend,
    /// The virtio features the backend offers (with VHOST_USER_F_PROTOCOL_FEATURES).
    pub features: u64,
}

impl Connection {
    /// Connect to `spec`'s socket and start a session, all of it within one deadline of
    /// `watchdog`'s: a backend that does not answer is an error naming the message it did not
    /// answer.
    pub fn open(spec: &VhostUserSpec, watchdog: &Watchdog) -> Result<Self, VhostUserError> {
        let socket =
            UnixStream::connect(&spec.socket).map_err(|source| VhostUserError::Connect {
                socket: spec.socket.clone(),
                source,
            })?;
        // The socket's own timeouts only make the crate's waits wake up now and then; the
        // watchdog's deadline is what ends them.
        let timeouts = socket
            .set_read_timeout(Some(EXCHANGE_DEADLINE))
            .and_then(|()| socket.set_write_timeout(Some(EXCHANGE_DEADLINE)));
        timeouts.map_err(|source| VhostUserError::Connect {
            socket: spec.socket.clone(),
            source,
        })?;
        let _exchange = watchdog.arm(socket.as_raw_fd());
        Self::negotiate(spec, socket).map_err(|e| e.late(watchdog.fired()))
    }

    /// The session's start, on `socket`.
    fn negotiate(spec: &VhostUserSpec, socket: UnixStream) -> Result<Self, VhostUserError> {
        let queues = spec.queue_count();
        let mut frontend = Frontend::from_stream(socket, queues as u64);
        let fail = |what| {
            let socket = spec.socket.clone();
            move |source| VhostUserError::Protocol {
                socket,
                what,
                source,
            }
        };
        frontend.set_owner().map_err(fail("SET_OWNER"))?;
        let features = frontend.get_features().map_err(fail("GET_FEATURES"))?;
        if let Some(feature) = lacking_ring_feature(features) {
            return Err(VhostUserError::Lacks {
                socket: spec.socket.clone(),
                feature,
            });
        }
        let mut protocol = VhostUserProtocolFeatures::empty();
        if features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
            let mut wanted = VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::MQ;
            if matches!(spec.kind, VhostUserKind::Block) {
                wanted |= VhostUserProtocolFeatures::CONFIG;
            }
            let offered = frontend
                .get_protocol_features()
                .map_err(fail("GET_PROTOCOL_FEATURES"))?;
            protocol = offered & wanted;
            frontend
                .set_protocol_features(protocol)
                .map_err(fail("SET_PROTOCOL_FEATURES"))?;
        }
        if matches!(spec.kind, VhostUserKind::Block)
            && !protocol.contains(VhostUserProtocolFeatures::CONFIG)
        {
            return Err(VhostUserError::Lacks {
                socket: spec.socket.clone(),
                feature: "VHOST_USER_PROTOCOL_F_CONFIG (exitless reads the disk's size from it)",
            });
        }
        if queues > 1 {
            check_queue_num(spec, &mut frontend, protocol)?;
        }
        if protocol.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            // Every message then waits for the backend's acknowledgement: a call fd swapped at
            // a mask is in place before the guest's write completes.
            frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        Ok(Connection { frontend, features })
    }
}

/// More than one queue needs VHOST_USER_PROTOCOL_F_MQ and enough of them. GET_QUEUE_NUM is
/// read as rings, as the `vhost` crate reads it (it refuses ring indexes past the answer),
/// and as libvhost-user and Cloud Hypervisor do; DPDK answers its most queue pairs (128),
/// which passes.
fn check_queue_num(
    spec: &VhostUserSpec,
    frontend: &mut Frontend,
    protocol: VhostUserProtocolFeatures,
) -> Result<(), VhostUserError> {
    if !protocol.contains(VhostUserProtocolFeatures::MQ) {
        return Err(VhostUserError::Lacks {
            socket: spec.socket.clone(),
            feature: "VHOST_USER_PROTOCOL_F_MQ (for queues= above 1)",
        });
    }
    let has = frontend
        .get_queue_num()
        .map_err(|source| VhostUserError::Protocol {
            socket: spec.socket.clone(),
            what: "GET_QUEUE_NUM",
            source,
        })?;
    let asked = spec.queue_count();
    if has < asked as u64 {
        return Err(VhostUserError::Queues {
            socket: spec.socket.clone(),
            asked,
            has,
        });
    }
    Ok(())
}
