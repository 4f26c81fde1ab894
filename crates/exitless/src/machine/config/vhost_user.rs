//! A device whose queues a vhost-user backend serves (`--net vhost-user=SOCKET`, `--disk
//! vhost-user=SOCKET`): what the user gives and how its options read.

use std::path::PathBuf;
use std::time::Duration;

/// Most queues a vhost-user virtio-blk device asks for: one MSI-X vector each and one for
/// configuration changes must fit the MSI-X table.
pub const MAX_DISK_QUEUES: usize = crate::virtio::transport::pci::MAX_VECTORS - 1;
/// Longest `reconnect=`: an hour of tries every 100 ms.
pub const MAX_RECONNECT_SECS: u64 = 3600;

/// A device whose queues a vhost-user backend serves.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VhostUserConfig {
    /// The backend's listening socket.
    pub socket: PathBuf,
    /// Queues (virtio-blk) or queue pairs (virtio-net) asked of the backend.
    pub queues: u16,
    /// How long, after the backend goes away, exitless keeps trying to connect again (every
    /// 100 ms) so that a driver reset finds it; `None`: once, at the driver's reset.
    pub reconnect: Option<Duration>,
}

impl VhostUserConfig {
    /// One queue (pair) on `socket`, connected again only at the driver's reset.
    pub fn new(socket: PathBuf) -> Self {
        VhostUserConfig {
            socket,
            queues: 1,
            reconnect: None,
        }
    }

    /// Apply `reconnect=SECONDS`: whole seconds up to [`MAX_RECONNECT_SECS`], 0 being the
    /// default (no retries); None if `seconds` is not that.
    pub(super) fn set_reconnect(&mut self, seconds: &str) -> Option<()> {
        let secs: u64 = seconds.parse().ok().filter(|&s| s <= MAX_RECONNECT_SECS)?;
        self.reconnect = (secs > 0).then(|| Duration::from_secs(secs));
        Some(())
    }
}

/// `count` as `queues=` takes it: 1 to `max`.
pub(super) fn parse_queues(count: &str, max: usize) -> Option<u16> {
    count
        .parse()
        .ok()
        .filter(|&n: &u16| (1..=max).contains(&usize::from(n)))
}
