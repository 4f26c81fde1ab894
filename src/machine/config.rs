//! What a machine is made of: RAM, vCPUs, how ECAM is served, the console, the platform
//! devices, the virtio devices.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

pub use crate::devices::serial::Overflow;
use crate::irq::CommitStrategy;
use crate::machine::layout;
use crate::pci::EcamMode;
use crate::virtio::notify::NotifyPath;
pub use crate::vm::cpuid::CpuTemplate;

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
    /// A split irqchip (KVM's local APICs, the VMM's IOAPIC, no PICs) instead of KVM's full
    /// one: what lets the unit remap IOAPIC interrupts too (`irq::ioapic`). Only
    /// `exitless run --iommu` machines have it.
    pub split_irqchip: bool,
    /// Keep guest RAM in the VMM's core dumps (by default it is left out: MADV_DONTDUMP).
    pub dump_guest_memory: bool,
    /// The vCPUs' CPU template (`--cpu`), kept as given so that a snapshot can record it.
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
            cpu: CpuTemplate::default(),
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
    /// Its MAC address; by default, on a tap, [`tap_mac`]'s; with no link,
    /// [`layout::VIRTIO_NET_MAC`] with the device's index as the last byte.
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
/// byte `512 n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// The image.
    pub path: PathBuf,
    /// Opened read-only; the device offers VIRTIO_BLK_F_RO and refuses writes.
    pub read_only: bool,
    /// Locked as QEMU locks its images, so that no other VM writes it meanwhile (or reads it
    /// while this one writes); QEMU's `locking=off` turns that off.
    pub locking: bool,
    /// Its transport.
    pub transport: Transport,
}

impl DiskConfig {
    /// A read-write, locked disk on `path` behind virtio-pci.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        DiskConfig {
            path: path.into(),
            read_only: false,
            locking: true,
            transport: Transport::Pci,
        }
    }
}

/// Why a `--disk` or `--net` value of `exitless run` is not one exitless takes: one line each.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigSyntaxError {
    /// A disk with no file.
    #[error("no file")]
    NoFile,
    /// A disk option other than `ro`, `locking=` and `transport=`.
    #[error(
        "unknown option `{0}` (ro, locking=on|off, transport=pci|mmio; a comma in the file's name is written twice)"
    )]
    DiskOption(String),
    /// An option given twice: which one counts would be a guess.
    #[error("`{0}` given twice: give each option once")]
    Twice(String),
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

impl DiskConfig {
    /// `FILE[,ro][,locking=on|off][,transport=pci|mmio]`, `exitless run --disk`'s syntax. FILE
    /// is any bytes a path may hold, a comma in it written twice as QEMU's options write one
    /// (`a,,b` is the file `a,b`). The image is opened when the machine is built.
    pub fn parse(arg: &OsStr) -> Result<Self, ConfigSyntaxError> {
        let (path, options) = split_path(arg.as_bytes());
        if path.is_empty() {
            return Err(ConfigSyntaxError::NoFile);
        }
        let mut disk = DiskConfig::new(OsString::from_vec(path));
        let Some(options) = options else {
            return Ok(disk);
        };
        let (options, mut seen) = (String::from_utf8_lossy(options), Vec::new());
        for option in options.split(',') {
            let unknown = || ConfigSyntaxError::DiskOption(option.into());
            once(&mut seen, option)?;
            match option.split_once('=').unwrap_or((option, "")) {
                ("ro", "") => disk.read_only = true,
                ("locking", on) => disk.locking = on_off(on).ok_or_else(unknown)?,
                ("transport", "pci") => disk.transport = Transport::Pci,
                ("transport", "mmio") => disk.transport = Transport::Mmio,
                _ => return Err(unknown()),
            }
        }
        Ok(disk)
    }
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
        let mut seen = Vec::new();
        for option in parts {
            once(&mut seen, option)?;
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
mod tests {
    use super::*;

    /// A tap's MAC is pinned here: a guest keeps its MAC across exitless versions too.
    #[test]
    fn a_taps_mac_is_its_names_and_prints_as_mac_takes_it() {
        assert_eq!(format_mac(tap_mac("tap0")), "52:54:00:50:e6:72");
        assert_eq!(format_mac(tap_mac("tap1")), "52:54:00:51:e7:ad");
        let printed = format_mac(tap_mac("br0-vm7"));
        assert_eq!(parse_mac(&printed), Ok(tap_mac("br0-vm7")));
    }
}
