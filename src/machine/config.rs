//! What a machine is made of: RAM, vCPUs, how ECAM is served, the console, the platform
//! devices, the virtio devices.

use std::path::PathBuf;

pub use crate::devices::serial::Overflow;
use crate::irq::CommitStrategy;
use crate::machine::layout;
use crate::pci::EcamMode;
use crate::virtio::notify::NotifyPath;

/// Most virtio-pci devices: PCI device numbers from `VIRTIO_PCI_FIRST_DEVICE` to 31.
pub const MAX_VIRTIO_PCI: usize = 32 - layout::VIRTIO_PCI_FIRST_DEVICE as usize;
/// Most queue pairs per virtio-net device: two MSI-X vectors each and one for configuration
/// changes must fit the MSI-X table.
pub const MAX_QUEUE_PAIRS: usize = (crate::virtio::transport::pci::MAX_VECTORS - 1) / 2;

/// The hardware of one machine.
#[derive(Clone, Debug)]
pub struct MachineConfig {
    /// Bytes of guest RAM, from address 0.
    pub ram_size: usize,
    /// How ECAM is served; `None` leaves it undescribed.
    pub ecam: Option<EcamMode>,
    /// vCPUs; vCPU 0 boots.
    pub vcpus: u8,
    /// Where the guest's serial console goes.
    pub console: Console,
    /// What the console does when its writer is behind.
    pub console_overflow: Overflow,
    /// The PC platform devices, if the machine has them.
    pub platform: Option<Platform>,
    /// virtio-net devices, in order: virtio-mmio ones take the layout's windows in turn;
    /// virtio-pci ones are 00:03.0, 00:04.0, ….
    pub virtio: Vec<VirtioNetConfig>,
    /// virtio-blk devices, in order: virtio-pci ones take the functions after the virtio-net
    /// ones, virtio-mmio ones the layout's next windows.
    pub disks: Vec<DiskConfig>,
    /// Bytes of each response frame the request/response backend sends.
    pub response_size: usize,
    /// When GSI routing changes reach KVM.
    pub gsi_commits: CommitStrategy,
    /// A VT-d remapping unit at [`layout::IOMMU_BASE`]: virtio-pci devices then offer
    /// VIRTIO_F_ACCESS_PLATFORM, and their DMA goes through it when the driver takes it.
    pub iommu: bool,
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            ram_size: layout::DEFAULT_RAM_SIZE,
            ecam: Some(EcamMode::Shadow),
            vcpus: 1,
            console: Console::default(),
            console_overflow: Overflow::default(),
            platform: None,
            virtio: Vec::new(),
            disks: Vec::new(),
            response_size: 1024,
            gsi_commits: CommitStrategy::default(),
            iommu: false,
        }
    }
}

/// Where a machine's serial console goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Console {
    /// Into memory, for [`Machine::console`](crate::machine::Machine::console).
    #[default]
    Buffer,
    /// To stdout, as it is written.
    Stdout,
    /// To stdout, and stdin feeds the UART's receiver.
    Stdio,
    /// Into this file, created, or emptied once the machine is wired.
    File(PathBuf),
}

/// The PC platform devices guests written for QEMU expect, which `exitless run`'s machine has
/// and the probe's does not: isa-debug-exit, fw_cfg, the ACPI power-management block, the
/// i8042's reset command and the reset control register at 0xCF9.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Platform {
    /// fw_cfg's named files, beside its fixed items (RAM size and CPU count, from the machine).
    pub fw_cfg_files: Vec<(String, Vec<u8>)>,
}

/// Which transport a virtio device sits behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// virtio-mmio (the guest picks the legacy line or the MSI extension).
    Mmio,
    /// Modern virtio-pci with MSI-X.
    Pci,
}

/// Where a virtio-net device's frames go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NetBackendKind {
    /// Every frame is answered ([`crate::virtio::net::RequestResponse`]).
    #[default]
    RequestResponse,
    /// Frames are taken and dropped, nothing is received ([`crate::virtio::net::Sink`]): a
    /// transmit stream's far end; for `exitless run --net none`, a device with no link.
    Sink,
    /// The host's tap interface of this name ([`crate::virtio::net::tap::Tap`]), one tap
    /// queue per queue pair (IFF_MULTI_QUEUE when there are several).
    Tap(String),
}

/// A virtio-net device of a machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtioNetConfig {
    /// Its transport.
    pub transport: Transport,
    /// How its doorbells reach it.
    pub notify: NotifyPath,
    /// Receive/transmit queue pairs (more than one adds the control queue and
    /// VIRTIO_NET_F_MQ); each has its own backend and MSI-X vectors.
    pub queue_pairs: u16,
    /// What each pair's backend is.
    pub backend: NetBackendKind,
    /// Its MAC address; by default [`layout::VIRTIO_NET_MAC`] with the device's index as the
    /// last byte.
    pub mac: Option<[u8; 6]>,
}

impl VirtioNetConfig {
    /// A single-pair device on `transport` with doorbells on `notify`.
    pub fn new(transport: Transport, notify: NotifyPath) -> Self {
        VirtioNetConfig {
            transport,
            notify,
            queue_pairs: 1,
            backend: NetBackendKind::default(),
            mac: None,
        }
    }
}

/// A virtio-blk device of a machine: a raw file, sector `n` at byte `512 n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// The file.
    pub path: PathBuf,
    /// Opened read-only; the device offers VIRTIO_BLK_F_RO and refuses writes.
    pub read_only: bool,
    /// Its transport.
    pub transport: Transport,
}

/// Why a `--disk` or `--net` value of `exitless run` is not one exitless takes: one line each.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigSyntaxError {
    /// A disk with no file.
    #[error("no file")]
    NoFile,
    /// A disk option other than `ro` and `transport=`.
    #[error("unknown option `{0}` (ro, transport=pci|mmio)")]
    DiskOption(String),
    /// A network device that does not start with its backend.
    #[error("`{0}`: tap=NAME or none first")]
    NetBackend(String),
    /// A queue-pair count the MSI-X table cannot hold (or not a number).
    #[error("queues={0}: 1 to {MAX_QUEUE_PAIRS} queue pairs")]
    QueuePairs(String),
    /// A network option other than `mac=`, `queues=` and `transport=`.
    #[error("unknown option `{0}` (mac=MAC, queues=N, transport=pci|mmio)")]
    NetOption(String),
    /// A MAC address that is not a unicast station's.
    #[error("mac={0}: six hexadecimal bytes, xx:xx:xx:xx:xx:xx, unicast, not all zero")]
    Mac(String),
}

/// `FILE[,ro][,transport=pci|mmio]`, `exitless run --disk`'s syntax. The file is opened when
/// the machine is built.
impl std::str::FromStr for DiskConfig {
    type Err = ConfigSyntaxError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(',');
        let path = parts
            .next()
            .filter(|p| !p.is_empty())
            .ok_or(ConfigSyntaxError::NoFile)?;
        let mut disk = DiskConfig {
            path: path.into(),
            read_only: false,
            transport: Transport::Pci,
        };
        for option in parts {
            match option {
                "ro" => disk.read_only = true,
                "transport=pci" => disk.transport = Transport::Pci,
                "transport=mmio" => disk.transport = Transport::Mmio,
                _ => return Err(ConfigSyntaxError::DiskOption(option.into())),
            }
        }
        Ok(disk)
    }
}

/// `tap=NAME|none[,mac=MAC][,queues=N][,transport=pci|mmio]`, `exitless run --net`'s syntax.
/// The tap is opened when the machine is built.
impl std::str::FromStr for VirtioNetConfig {
    type Err = ConfigSyntaxError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(',');
        let backend = match parts.next().unwrap_or_default() {
            "none" => NetBackendKind::Sink,
            tap => match tap.strip_prefix("tap=") {
                Some(name) if !name.is_empty() => NetBackendKind::Tap(name.into()),
                _ => return Err(ConfigSyntaxError::NetBackend(tap.into())),
            },
        };
        let mut net = VirtioNetConfig {
            backend,
            ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
        };
        for option in parts {
            match option.split_once('=') {
                Some(("mac", mac)) => net.mac = Some(parse_mac(mac)?),
                Some(("queues", n)) => {
                    net.queue_pairs = n
                        .parse()
                        .ok()
                        .filter(|&n| (1..=MAX_QUEUE_PAIRS).contains(&usize::from(n)))
                        .ok_or_else(|| ConfigSyntaxError::QueuePairs(n.into()))?;
                }
                Some(("transport", "pci")) => net.transport = Transport::Pci,
                // QueueNotify with its queue index: the doorbell a standard driver uses never
                // exits (the per-queue pages are the MSI extension's).
                Some(("transport", "mmio")) => {
                    (net.transport, net.notify) = (Transport::Mmio, NotifyPath::Datamatch);
                }
                _ => return Err(ConfigSyntaxError::NetOption(option.into())),
            }
        }
        Ok(net)
    }
}

/// Six hexadecimal bytes separated by colons, not all zero (no station has that address),
/// unicast (bit 0 of the first byte clear: a multicast source address is invalid, IEEE
/// 802-2014 §8.2).
fn parse_mac(s: &str) -> Result<[u8; 6], ConfigSyntaxError> {
    let bad = || ConfigSyntaxError::Mac(s.into());
    let mut mac = [0u8; 6];
    let mut bytes = s.split(':');
    for b in &mut mac {
        let part = bytes.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
        *b = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if bytes.next().is_some() || mac[0] & 1 != 0 || mac == [0; 6] {
        return Err(bad());
    }
    Ok(mac)
}
