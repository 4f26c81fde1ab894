//! What a machine is made of: RAM, vCPUs, how ECAM is served, the console, the platform
//! devices, the virtio devices.

mod vhost_user;

use std::borrow::Cow;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::devices::serial::Overflow;
use crate::irq::CommitStrategy;
use crate::machine::layout;
use crate::pci::EcamMode;
use crate::virtio::notify::NotifyPath;
pub use crate::vm::cpuid::CpuTemplate;
pub use vhost_user::{MAX_DISK_QUEUES, MAX_RECONNECT_SECS, VhostUserConfig};

/// Most virtio-pci devices: PCI device numbers from `VIRTIO_PCI_FIRST_DEVICE` to 31.
pub const MAX_VIRTIO_PCI: usize = 32 - layout::VIRTIO_PCI_FIRST_DEVICE as usize;
/// Most queue pairs per virtio-net device: two MSI-X vectors each and one for configuration
/// changes must fit the MSI-X table.
pub const MAX_QUEUE_PAIRS: usize = (crate::virtio::transport::pci::MAX_VECTORS - 1) / 2;
/// Most vCPUs a run machine has: each is a thread, and the MADT's APIC IDs are one byte.
pub const MAX_CPUS: u64 = 64;
/// Most MSI-X vectors a virtio-pci function's table holds (`vectors=`).
pub const MAX_VECTORS: usize = crate::virtio::transport::pci::MAX_VECTORS;

/// The hardware of one machine.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    /// A split irqchip (KVM's local APICs, the VMM's IOAPIC, no PICs) instead of KVM's full
    /// one: what lets the unit remap IOAPIC interrupts too (`irq::ioapic`). Only
    /// `exitless run --iommu` machines have it.
    pub split_irqchip: bool,
    /// Keep guest RAM in the VMM's core dumps (by default it is left out: MADV_DONTDUMP).
    pub dump_guest_memory: bool,
    /// Guest RAM in a memfd mapped shared, as a vhost-user backend needs it, so that a
    /// same-host live update (`migrate local:`) can hand it to the next exitless.
    #[serde(default)]
    pub shared_memory: bool,
    /// The probe's test endpoints on bus 0 (00:01.0, 00:02.0 and 00:02.1), whose registers
    /// its config-space ops time; no other guest is shown them.
    #[serde(default)]
    pub pci_test_endpoints: bool,
    /// The vCPUs' CPU template (`--cpu`), kept as given so that a snapshot can record it.
    #[serde(with = "cpu_template")]
    pub cpu: CpuTemplate,
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
            split_irqchip: false,
            dump_guest_memory: false,
            shared_memory: false,
            pci_test_endpoints: false,
            cpu: CpuTemplate::default(),
        }
    }
}

impl MachineConfig {
    /// Whether any NIC's queues are served by the kernel's vhost-net.
    pub fn has_vhost_net(&self) -> bool {
        self.virtio.iter().any(|n| n.vhost_net)
    }

    /// Whether guest RAM is a shared memfd: asked for, or needed by a vhost-user backend.
    pub fn ram_is_shared(&self) -> bool {
        self.shared_memory || self.has_vhost_user()
    }

    /// Whether a vhost-user backend serves any device: guest RAM must then be shareable.
    pub fn has_vhost_user(&self) -> bool {
        self.virtio
            .iter()
            .any(|n| matches!(n.backend, NetBackendKind::VhostUser(_)))
            || self.disks.iter().any(|d| d.vhost_user.is_some())
    }
}

/// A [`CpuTemplate`] in a snapshot's description as `--cpu` writes it (its `Display`), read
/// back through its parser, so a feature name this build does not know is refused by name.
mod cpu_template {
    use super::CpuTemplate;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(cpu: &CpuTemplate, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(cpu)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CpuTemplate, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Where a machine's serial console goes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// fw_cfg's named files, beside its fixed items (RAM size and CPU count, from the machine).
    pub fw_cfg_files: Vec<(String, Vec<u8>)>,
}

/// Which transport a virtio device sits behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Transport {
    /// virtio-mmio (the guest picks the legacy line or the MSI extension).
    Mmio,
    /// Modern virtio-pci with MSI-X.
    Pci,
}

/// Where a virtio-net device's frames go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// A vhost-user backend serves the queues; its `queues` are the device's queue pairs.
    VhostUser(VhostUserConfig),
}

/// A virtio-net device of a machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Its MAC address; by default, on a tap, [`tap_mac`]'s; with no link,
    /// [`layout::VIRTIO_NET_MAC`] with the device's index as the last byte.
    pub mac: Option<[u8; 6]>,
    /// Its MSI-X table's size, as QEMU's `-device virtio-net-pci,vectors=N` sets it apart from
    /// the queues (virtio-pci only); by default the queues' and the configuration's,
    /// [`VirtioNetConfig::msix_vectors`].
    pub vectors: Option<u16>,
    /// A tap's queues served by the kernel's vhost-net (`vhost=on`) instead of a device
    /// thread of exitless's.
    #[serde(default)]
    pub vhost_net: bool,
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
            vectors: None,
            vhost_net: false,
        }
    }

    /// The size of its MSI-X table: `vectors` if given, else one vector per receive and
    /// transmit queue and one for configuration changes (the control queue needs none:
    /// drivers poll it, as Linux does). Refused: fewer than that (a queue would share a
    /// vector, which exitless's transport does not do), more than the table holds, or any
    /// `vectors` on virtio-mmio, whose MSI extension has a vector per queue and no table.
    pub fn msix_vectors(&self) -> Result<usize, ConfigSyntaxError> {
        let least = 2 * usize::from(self.queue_pairs) + 1;
        let Some(n) = self.vectors else {
            return Ok(least);
        };
        if self.transport == Transport::Mmio {
            return Err(ConfigSyntaxError::VectorsOnMmio);
        }
        let n = usize::from(n);
        if !(least..=MAX_VECTORS).contains(&n) {
            return Err(ConfigSyntaxError::Vectors(n.to_string(), least));
        }
        Ok(n)
    }
}

/// The MAC a device on the tap `name` gets unless one is given: QEMU's locally administered
/// prefix 52:54:00 and three bytes of a hash of the name, as libvirt gives each VM three
/// bytes of its own. VMs on one bridge, whose taps have names of their own, so differ, and
/// each keeps its MAC from run to run.
pub fn tap_mac(name: &str) -> [u8; 6] {
    let mut mac = layout::VIRTIO_NET_MAC;
    mac[3..].copy_from_slice(&name_hash(name));
    mac
}

/// Three bytes of the 64-bit FNV-1a hash of `name` (draft-eastlake-fnv), folded: a hash that
/// is the same in every build and on every host, unlike std's.
fn name_hash(name: &str) -> [u8; 3] {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = name
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    let folded = (hash ^ (hash >> 24) ^ (hash >> 48)).to_be_bytes();
    [folded[5], folded[6], folded[7]]
}

/// A virtio-blk device of a machine: a raw image (a file or a block device), sector `n` at
/// byte `512 n`, or a vhost-user backend's disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskConfig {
    /// The image; empty for a vhost-user disk.
    pub path: PathBuf,
    /// Opened read-only; the device offers VIRTIO_BLK_F_RO and refuses writes.
    pub read_only: bool,
    /// Locked as QEMU locks its images, so that no other VM writes it meanwhile (or reads it
    /// while this one writes); QEMU's `locking=off` turns that off.
    pub locking: bool,
    /// Its transport.
    pub transport: Transport,
    /// Request queues of an image exitless serves (`VIRTIO_BLK_F_MQ`, virtio 1.2 §5.2.3):
    /// None for one per vCPU, as Linux's driver asks and QEMU's `num-queues` defaults. A
    /// snapshot taken before disks had several queues had one.
    #[serde(default = "one_queue")]
    pub queues: Option<u16>,
    /// How an image's requests reach it.
    #[serde(default)]
    pub aio: DiskAio,
    /// The backend serving its queues, instead of an image exitless opens.
    pub vhost_user: Option<VhostUserConfig>,
}

/// How the requests of a disk exitless serves reach its image (`--disk FILE,aio=`, QEMU's
/// name for the choice).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiskAio {
    /// On an io_uring, a pass's reads and writes in flight together; a request at a time
    /// where the kernel makes no ring (`virtio::block`).
    #[default]
    IoUring,
    /// A request at a time, with `preadv`/`pwritev`.
    Sync,
}

/// What a saved disk without `queues` had.
fn one_queue() -> Option<u16> {
    Some(1)
}

impl DiskConfig {
    /// A read-write, locked disk on `path` behind virtio-pci.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        DiskConfig {
            path: path.into(),
            read_only: false,
            locking: true,
            transport: Transport::Pci,
            queues: None,
            aio: DiskAio::IoUring,
            vhost_user: None,
        }
    }

    /// A one-queue disk behind virtio-pci whose backend listens on `socket`: the backend opens
    /// the image, so exitless neither locks it nor decides whether it is writable.
    pub fn vhost_user(socket: PathBuf) -> Self {
        DiskConfig {
            locking: false,
            vhost_user: Some(VhostUserConfig::new(socket)),
            ..DiskConfig::new(PathBuf::new())
        }
    }
}

/// Why a `--disk` or `--net` value of `exitless run` is not one exitless takes: one line each.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigSyntaxError {
    /// A disk with no file.
    #[error("no file")]
    NoFile,
    /// A disk option other than `ro`, `locking=`, `queues=`, `aio=` and `transport=`.
    #[error(
        "unknown option `{0}` (ro, locking=on|off, queues=N, aio=io_uring|sync, transport=pci|mmio; a comma in the file's name is written twice)"
    )]
    DiskOption(String),
    /// An option given twice: which one counts would be a guess.
    #[error("`{0}` given twice: give each option once")]
    Twice(String),
    /// A network device that does not start with its backend.
    #[error("`{0}`: tap=NAME or none first, or vhost-user=SOCKET")]
    NetBackend(String),
    /// `vhost-user=` with no socket.
    #[error("vhost-user= needs the backend's socket: vhost-user=SOCKET")]
    NoSocket,
    /// An option for images exitless opens, given to a vhost-user disk.
    #[error(
        "`{0}` does not go with vhost-user: the backend opens the image and decides (qemu-storage-daemon's --export writable=on|off, its own locking)"
    )]
    NotWithVhostUser(String),
    /// An option only vhost-user devices take.
    #[error("`{0}`: for vhost-user devices only (vhost-user=SOCKET first)")]
    VhostUserOnly(String),
    /// An option a vhost-user device does not take.
    #[error("unknown option `{0}` ({1})")]
    VhostUserOption(String, &'static str),
    /// A queue count a disk's MSI-X table cannot hold (or not a number).
    #[error("queues={0}: 1 to {MAX_DISK_QUEUES} queues")]
    DiskQueues(String),
    /// A reconnect time that is not whole seconds in range.
    #[error(
        "reconnect={0}: whole seconds, 0 (try once, at the driver's reset) to {MAX_RECONNECT_SECS}"
    )]
    Reconnect(String),
    /// A queue-pair count the MSI-X table cannot hold (or not a number).
    #[error("queues={0}: 1 to {MAX_QUEUE_PAIRS} queue pairs")]
    QueuePairs(String),
    /// A network option other than `mac=`, `queues=`, `vectors=`, `transport=` and `vhost=`.
    #[error(
        "unknown option `{0}` (mac=MAC, queues=N, vectors=N, transport=pci|mmio, vhost=on|off)"
    )]
    NetOption(String),
    /// `vhost=on` on a device without a tap.
    #[error("vhost=on is for tap=NAME: the kernel's vhost-net moves a tap's frames")]
    VhostNetWithoutTap,
    /// An MSI-X table size too small for the queues, too large, or not a number.
    #[error("vectors={0}: {1} (2 × queue pairs + 1) to {MAX_VECTORS}, or leave it out for {1}")]
    Vectors(String, usize),
    /// `vectors=` that is not a number.
    #[error("vectors={0}: a number, 2 × queue pairs + 1 to {MAX_VECTORS}")]
    VectorsNumber(String),
    /// `vectors=` on virtio-mmio.
    #[error(
        "vectors= is for transport=pci: a virtio-mmio device has one vector per queue (leave vectors= out)"
    )]
    VectorsOnMmio,
    /// A MAC address that is not a unicast station's.
    #[error("mac={0}: six hexadecimal bytes, xx:xx:xx:xx:xx:xx, unicast, not all zero")]
    Mac(String),
}

/// What a vhost-user device of each kind takes, for the unknown option's message.
const VHOST_USER_DISK_OPTIONS: &str = "queues=N, transport=pci|mmio, reconnect=SECONDS";
const VHOST_USER_NET_OPTIONS: &str =
    "mac=MAC, queues=N, vectors=N, transport=pci|mmio, reconnect=SECONDS";

impl DiskConfig {
    /// `FILE[,ro][,locking=on|off][,queues=N][,aio=io_uring|sync][,transport=pci|mmio]` or
    /// `vhost-user=SOCKET[,queues=N][,transport=pci|mmio][,reconnect=SECONDS]`, `exitless run
    /// --disk`'s syntax. FILE and SOCKET are any bytes a path may hold, a comma in them written
    /// twice as QEMU's options write one (`a,,b` is the file `a,b`); a file whose name starts
    /// with `vhost-user=` is written `./vhost-user=...`. The image is opened (the backend
    /// connected) when the machine is built.
    pub fn parse(arg: &OsStr) -> Result<Self, ConfigSyntaxError> {
        let (mut disk, options) = match arg.as_bytes().strip_prefix(b"vhost-user=") {
            Some(socket) => {
                let (socket, options) = vhost_user_socket(socket)?;
                (DiskConfig::vhost_user(socket), options)
            }
            None => {
                let (path, options) = split_path(arg.as_bytes());
                if path.is_empty() {
                    return Err(ConfigSyntaxError::NoFile);
                }
                (DiskConfig::new(OsString::from_vec(path)), options)
            }
        };
        let Some(options) = options else {
            return Ok(disk);
        };
        let (options, mut seen) = (String::from_utf8_lossy(options), Vec::new());
        for option in options.split(',') {
            once(&mut seen, option)?;
            disk.apply(option)?;
        }
        Ok(disk)
    }

    /// Apply one option of `--disk`.
    fn apply(&mut self, option: &str) -> Result<(), ConfigSyntaxError> {
        let (name, value) = option.split_once('=').unwrap_or((option, ""));
        match (name, value, &mut self.vhost_user) {
            ("transport", "pci", _) => self.transport = Transport::Pci,
            ("transport", "mmio", _) => self.transport = Transport::Mmio,
            ("ro" | "locking" | "aio", _, Some(_)) => {
                return Err(ConfigSyntaxError::NotWithVhostUser(name.into()));
            }
            ("ro", "", None) => self.read_only = true,
            ("aio", "io_uring", None) => self.aio = DiskAio::IoUring,
            ("aio", "sync", None) => self.aio = DiskAio::Sync,
            ("locking", on, None) => {
                self.locking =
                    on_off(on).ok_or_else(|| ConfigSyntaxError::DiskOption(option.into()))?;
            }
            ("queues", n, backend) => {
                let queues = vhost_user::parse_queues(n, MAX_DISK_QUEUES)
                    .ok_or_else(|| ConfigSyntaxError::DiskQueues(n.into()))?;
                match backend {
                    Some(v) => v.queues = queues,
                    None => self.queues = Some(queues),
                }
            }
            ("reconnect", secs, Some(v)) => set_reconnect(v, secs)?,
            ("reconnect", _, None) => {
                return Err(ConfigSyntaxError::VhostUserOnly(option.into()));
            }
            (_, _, Some(_)) => {
                return Err(ConfigSyntaxError::VhostUserOption(
                    option.into(),
                    VHOST_USER_DISK_OPTIONS,
                ));
            }
            (_, _, None) => return Err(ConfigSyntaxError::DiskOption(option.into())),
        }
        Ok(())
    }
}

/// `reconnect=SECONDS` of a vhost-user device.
fn set_reconnect(v: &mut VhostUserConfig, secs: &str) -> Result<(), ConfigSyntaxError> {
    v.set_reconnect(secs)
        .ok_or_else(|| ConfigSyntaxError::Reconnect(secs.into()))
}

/// A vhost-user device's SOCKET, written as a disk's FILE is, and what follows it.
fn vhost_user_socket(arg: &[u8]) -> Result<(PathBuf, Option<&[u8]>), ConfigSyntaxError> {
    let (socket, options) = split_path(arg);
    if socket.is_empty() {
        return Err(ConfigSyntaxError::NoSocket);
    }
    Ok((OsString::from_vec(socket).into(), options))
}

/// A disk's FILE, its doubled commas made single, and what follows the first single comma.
fn split_path(arg: &[u8]) -> (Vec<u8>, Option<&[u8]>) {
    let mut path = Vec::with_capacity(arg.len());
    let mut i = 0;
    while let Some(&byte) = arg.get(i) {
        if byte == b',' {
            if arg.get(i + 1) != Some(&b',') {
                return (path, Some(&arg[i + 1..]));
            }
            i += 1;
        }
        path.push(byte);
        i += 1;
    }
    (path, None)
}

/// QEMU's on and off.
fn on_off(value: &str) -> Option<bool> {
    match value {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    }
}

/// Refuse `option` if an option of its name is in `seen` already, else add its name.
fn once<'a>(seen: &mut Vec<&'a str>, option: &'a str) -> Result<(), ConfigSyntaxError> {
    let name = option.split_once('=').map_or(option, |(name, _)| name);
    if seen.contains(&name) {
        return Err(ConfigSyntaxError::Twice(name.into()));
    }
    seen.push(name);
    Ok(())
}

/// `tap=NAME|none|vhost-user=SOCKET[,mac=MAC][,queues=N][,vectors=N][,transport=pci|mmio]
/// [,vhost=on|off][,reconnect=SECONDS]`, `exitless run --net`'s syntax (`vhost=` for a tap
/// only, `reconnect=` for vhost-user only; a comma in SOCKET is written twice, as in a disk's
/// FILE). The tap is opened (the backend
/// connected) when the machine is built.
impl std::str::FromStr for VirtioNetConfig {
    type Err = ConfigSyntaxError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (backend, options) = match s.strip_prefix("vhost-user=") {
            Some(socket) => {
                let (socket, options) = vhost_user_socket(socket.as_bytes())?;
                let backend = NetBackendKind::VhostUser(VhostUserConfig::new(socket));
                (backend, options.map(String::from_utf8_lossy))
            }
            None => {
                let (first, options) = s.split_once(',').map_or((s, None), |(f, o)| (f, Some(o)));
                let backend = match first {
                    "none" => NetBackendKind::Sink,
                    tap => match tap.strip_prefix("tap=") {
                        Some(name) if !name.is_empty() => NetBackendKind::Tap(name.into()),
                        _ => return Err(ConfigSyntaxError::NetBackend(tap.into())),
                    },
                };
                (backend, options.map(Cow::Borrowed))
            }
        };
        let mut net = VirtioNetConfig {
            backend,
            ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
        };
        let mut seen = Vec::new();
        for option in options.iter().flat_map(|o| o.split(',')) {
            once(&mut seen, option)?;
            net.apply(option)?;
        }
        if let NetBackendKind::VhostUser(v) = &mut net.backend {
            v.queues = net.queue_pairs;
        }
        if net.vhost_net && !matches!(net.backend, NetBackendKind::Tap(_)) {
            return Err(ConfigSyntaxError::VhostNetWithoutTap);
        }
        // Checked once every option is in: queues= and transport= may follow vectors=.
        net.msix_vectors()?;
        Ok(net)
    }
}

impl VirtioNetConfig {
    /// Apply one option of `--net`.
    fn apply(&mut self, option: &str) -> Result<(), ConfigSyntaxError> {
        let vhost_user = match &mut self.backend {
            NetBackendKind::VhostUser(v) => Some(v),
            _ => None,
        };
        match (option.split_once('='), vhost_user) {
            (Some(("mac", mac)), _) => self.mac = Some(parse_mac(mac)?),
            (Some(("queues", n)), _) => {
                self.queue_pairs = vhost_user::parse_queues(n, MAX_QUEUE_PAIRS)
                    .ok_or_else(|| ConfigSyntaxError::QueuePairs(n.into()))?;
            }
            (Some(("vectors", n)), _) => {
                let count = n.parse();
                self.vectors = Some(count.map_err(|_| ConfigSyntaxError::VectorsNumber(n.into()))?);
            }
            (Some(("transport", "pci")), _) => self.transport = Transport::Pci,
            (Some(("vhost", on @ ("on" | "off"))), None) => self.vhost_net = on == "on",
            // QueueNotify with its queue index: the doorbell a standard driver uses never
            // exits (the per-queue pages are the MSI extension's).
            (Some(("transport", "mmio")), _) => {
                (self.transport, self.notify) = (Transport::Mmio, NotifyPath::Datamatch);
            }
            (Some(("reconnect", secs)), Some(v)) => set_reconnect(v, secs)?,
            (Some(("reconnect", _)), None) => {
                return Err(ConfigSyntaxError::VhostUserOnly(option.into()));
            }
            (_, Some(_)) => {
                return Err(ConfigSyntaxError::VhostUserOption(
                    option.into(),
                    VHOST_USER_NET_OPTIONS,
                ));
            }
            (_, None) => return Err(ConfigSyntaxError::NetOption(option.into())),
        }
        Ok(())
    }
}

/// `mac` as `--net`'s `mac=` takes it: six hexadecimal bytes separated by colons.
pub fn format_mac(mac: [u8; 6]) -> String {
    let bytes: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
    bytes.join(":")
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

#[cfg(test)]
mod tests;
