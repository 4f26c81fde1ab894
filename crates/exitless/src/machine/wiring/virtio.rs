//! The virtio devices: virtio-net on its backends and virtio-blk on its image (or either on a
//! vhost-user backend, or virtio-net on the kernel's vhost-net), each behind virtio-mmio in the layout's next window or virtio-pci at
//! the next free function of bus 0.

use std::sync::Arc;

use super::files::FileSource;
use super::{Device, Devices, Kept, Place, names, virtio_pci_address};
use crate::logging::DeviceLog;
use crate::machine::MachineError;
use crate::machine::config::{
    DiskAio, DiskConfig, MAX_QUEUE_PAIRS, MAX_VIRTIO_PCI, MachineConfig, NetBackendKind, Transport,
    VhostUserConfig, VirtioNetConfig, tap_mac,
};
use crate::machine::layout::{self, MemoryLayout};
use crate::pci::PciRoot;
use crate::virtio::DeviceParts;
use crate::virtio::block::VirtioBlock;
use crate::virtio::block::image::Images;
use crate::virtio::net::tap::{Tap, TapError};
use crate::virtio::net::{NetBackend, RequestResponse, Sink, VirtioNet};
use crate::virtio::notify::NotifyPath;
use crate::virtio::transport::TransportEnv;
use crate::virtio::transport::mmio::{MmioPlacement, MmioTransport};
use crate::virtio::transport::pci::VirtioPci;
use crate::virtio::vhost_user::{self, VhostUserKind, VhostUserSpec};
use crate::virtio::worker::WorkerHandle;
use crate::vm::Vm;

/// Refuse, before anything is built, the vhost devices exitless cannot serve: any behind the
/// IOMMU (no vhost IOTLB).
pub fn check_vhost(cfg: &MachineConfig) -> Result<(), MachineError> {
    if cfg.has_vhost_user() && cfg.iommu {
        return Err(MachineError::VhostUserBehindIommu);
    }
    if cfg.has_vhost_net() && cfg.iommu {
        return Err(MachineError::VhostNetBehindIommu);
    }
    Ok(())
}

/// Where the next virtio device goes and what it is put on: virtio-pci functions take
/// 00:03.0, 00:04.0, … in turn (network devices first, then disks), virtio-mmio ones the
/// layout's next window.
struct Slots<'a> {
    vm: &'a Vm,
    layout: &'a mut MemoryLayout,
    root: &'a PciRoot,
    pci: usize,
}

/// What a device needs from its transport beyond its parts.
struct Placement {
    transport: Transport,
    notify: NotifyPath,
    /// MSI-X vectors, for virtio-pci.
    vectors: usize,
    /// The PCI class code, for virtio-pci.
    class: u32,
}

/// Every virtio device of `cfg`: the network devices, then the disks, on the host files
/// `files` gives.
pub fn add_devices(
    devices: &mut Devices,
    vm: &Vm,
    layout: &mut MemoryLayout,
    cfg: &MachineConfig,
    root: &PciRoot,
    files: &mut FileSource,
) -> Result<(), MachineError> {
    let mut slots = Slots {
        vm,
        layout,
        root,
        pci: 0,
    };
    add_virtio_net(devices, &mut slots, cfg, files)?;
    add_virtio_blk(devices, &mut slots, cfg, files)
}

/// The virtio-net devices of `cfg`, each with its backends (one per queue pair), behind its
/// transport.
fn add_virtio_net(
    devices: &mut Devices,
    slots: &mut Slots<'_>,
    cfg: &MachineConfig,
    files: &mut FileSource,
) -> Result<(), MachineError> {
    for (i, dev) in cfg.virtio.iter().enumerate() {
        let mac = match (dev.mac, &dev.backend) {
            (Some(mac), _) => mac,
            (None, NetBackendKind::Tap(name)) => tap_mac(name),
            (None, _) => {
                let mut mac = layout::VIRTIO_NET_MAC;
                mac[5] = u8::try_from(i).map_err(|_| MachineError::TooManyDevices)?;
                mac
            }
        };
        let pairs = usize::from(dev.queue_pairs);
        if !(1..=MAX_QUEUE_PAIRS).contains(&pairs) {
            return Err(MachineError::QueuePairs(pairs));
        }
        // Checked before a backend is opened or connected.
        let placement = net_placement(dev)?;
        let in_process = |backends: Vec<Box<dyn NetBackend>>| VirtioNet::parts(mac, backends);
        let parts = match &dev.backend {
            NetBackendKind::RequestResponse => in_process(
                (0..pairs)
                    .map(|_| Box::new(RequestResponse::new(cfg.response_size)) as _)
                    .collect(),
            ),
            NetBackendKind::Sink => {
                in_process((0..pairs).map(|_| Box::new(Sink::default()) as _).collect())
            }
            NetBackendKind::Tap(name) => {
                let (handed, kept) = (files.next_tap(), &mut files.kept.taps);
                let open = || {
                    let taps = match handed {
                        Some(queues) => Tap::adopt_queues(name, queues)?,
                        None => Tap::open_queues(name, pairs)?,
                    };
                    kept.push(
                        taps.iter()
                            .map(|t| t.duplicate(name))
                            .collect::<Result<_, _>>()?,
                    );
                    Ok::<_, TapError>(taps)
                };
                if dev.vhost_net {
                    vhost_user::kernel_net(open, dev.queue_pairs, mac, slots.vm.memory())?
                } else {
                    in_process(open()?.into_iter().map(|tap| Box::new(tap) as _).collect())
                }
            }
            NetBackendKind::VhostUser(vu) => {
                let spec = vhost_user_spec(vu, VhostUserKind::Net { mac });
                vhost_user::connect(&spec, slots.vm.memory())?
            }
        };
        let thread = add_virtio(devices, slots, parts, &placement)?;
        if let NetBackendKind::VhostUser(_) = dev.backend {
            devices.backends.push(thread);
        }
    }
    Ok(())
}

/// Where a virtio-net device goes.
fn net_placement(dev: &VirtioNetConfig) -> Result<Placement, MachineError> {
    Ok(Placement {
        transport: dev.transport,
        notify: dev.notify,
        // 2 × pairs + 1 unless `vectors=` sized the table apart from the queues (checked
        // again here: a config built in code has not been through `--net`'s parser).
        vectors: dev.msix_vectors().map_err(MachineError::NetVectors)?,
        // Class 02/00/00: Ethernet controller (PCI Code and ID Assignment §1.3).
        class: 0x02_00_00,
    })
}

/// What the frontend is told of a vhost-user device the user configured.
fn vhost_user_spec(cfg: &VhostUserConfig, kind: VhostUserKind) -> VhostUserSpec {
    VhostUserSpec {
        socket: cfg.socket.clone(),
        kind,
        queues: cfg.queues,
        reconnect: cfg.reconnect,
    }
}

/// The virtio-blk devices of `cfg`, each on its image, opened for reading (and writing unless
/// the disk is read-only) and locked unless the disk says otherwise; no image serves two.
fn add_virtio_blk(
    devices: &mut Devices,
    slots: &mut Slots<'_>,
    cfg: &MachineConfig,
    files: &mut FileSource,
) -> Result<(), MachineError> {
    let mut images = Images::default();
    for disk in &cfg.disks {
        if let Some(vu) = &disk.vhost_user {
            let spec = vhost_user_spec(vu, VhostUserKind::Block);
            let parts = vhost_user::connect(&spec, slots.vm.memory())?;
            let thread = add_virtio(devices, slots, parts, &disk_placement(disk, vu.queues))?;
            devices.backends.push(thread);
            continue;
        }
        let image = match files.next_image() {
            Some(file) => images.adopt(file, &disk.path, disk.read_only, disk.locking)?,
            None => images.open(&disk.path, disk.read_only, disk.locking)?,
        };
        // The serial (VIRTIO_BLK_T_GET_ID) is the file's name, as far as 20 bytes hold it.
        let serial = disk.path.file_name().map(|n| n.as_encoded_bytes());
        let queues = disk.queues.unwrap_or(u16::from(cfg.vcpus));
        let io_uring = disk.aio == DiskAio::IoUring;
        let blk = VirtioBlock::parts(image, serial.unwrap_or_default(), queues, io_uring);
        add_virtio(devices, slots, blk, &disk_placement(disk, queues))?;
    }
    (devices.image_locks, files.kept.images) = images.into_parts();
    Ok(())
}

/// Where a virtio-blk device of `queues` request queues goes.
fn disk_placement(disk: &DiskConfig, queues: u16) -> Placement {
    Placement {
        transport: disk.transport,
        // Doorbells that never exit where every driver uses them: virtio-pci's per-queue
        // notification addresses, and virtio-mmio's QueueNotify with its queue index
        // (the per-queue pages are the MSI extension's, which a standard driver lacks).
        notify: match disk.transport {
            Transport::Pci => NotifyPath::Address,
            Transport::Mmio => NotifyPath::Datamatch,
        },
        // One per request queue, and the configuration change's.
        vectors: usize::from(queues) + 1,
        // Class 01/80/00: other mass storage controller, as virtio-blk functions are
        // elsewhere (PCI Code and ID Assignment §1.2).
        class: 0x01_80_00,
    }
}

/// Put a virtio device behind its transport, and register it with its thread; a handle on
/// that thread.
fn add_virtio(
    devices: &mut Devices,
    slots: &mut Slots<'_>,
    parts: DeviceParts,
    placement: &Placement,
) -> Result<WorkerHandle, MachineError> {
    match placement.transport {
        Transport::Mmio => {
            let slot = slots
                .layout
                .allocate_virtio_mmio()
                .map_err(|_| MachineError::TooManyDevices)?;
            let n = slots.layout.virtio_mmio().len() - 1;
            let at = MmioPlacement {
                base: slot.base,
                gsi: slot.gsi,
                notify: placement.notify,
            };
            let name = format!("virtio-mmio.{n}");
            let log = DeviceLog::new(name.as_str());
            let source = VIRTIO_MMIO_SOURCE_IDS + u16::try_from(n).expect("few devices");
            let env = transport_env(slots.vm, devices, log.clone(), source);
            let (transport, worker) = MmioTransport::new(env, parts, at)?;
            let thread = worker.handle();
            let transport = Arc::new(transport);
            let place = Place::Mmio {
                base: slot.base,
                len: slot.size,
                device: transport.clone(),
            };
            let device = Device::new(name, place, Kept::Saved(transport));
            devices.add(device.counted(log).serving(worker))?;
            Ok(thread)
        }
        Transport::Pci => {
            let at = virtio_pci_address(slots.pci)
                .filter(|_| slots.pci < MAX_VIRTIO_PCI)
                .ok_or(MachineError::TooManyDevices)?;
            slots.pci += 1;
            // Its registers are reached through BARs counted as `names::PCI_BARS`; its
            // guest errors are counted under a name of its own.
            let name = names::virtio_pci(at);
            let log = DeviceLog::new(name.as_str());
            let env = transport_env(slots.vm, devices, log.clone(), at.requester_id());
            let (function, worker) = VirtioPci::new(
                env,
                parts,
                at.requester_id(),
                placement.vectors,
                placement.notify,
            )?;
            let thread = worker.handle();
            let device = Device::new(name, Place::Behind, Kept::Within(names::PCI_ROOT));
            devices.add(device.counted(log).serving(worker))?;
            let layout = function.config_layout(placement.class);
            devices
                .msix
                .insert(at.ecam_offset(), function.msi().clone());
            slots.root.add(at, &layout, Box::new(function))?;
            Ok(thread)
        }
    }
}

/// The source-ids of virtio-mmio devices' messages (the MSI extension) for interrupt
/// remapping: bus 0xF1, device n (not a PCI function; no DMA source-id, docs/iommu.md).
const VIRTIO_MMIO_SOURCE_IDS: u16 = 0xf100;

/// A transport's environment on `vm`: KVM's ioeventfds, the machine's routing owner (through
/// the IOMMU's interrupt remapping for requester `source`, if the machine has the unit).
fn transport_env(vm: &Vm, devices: &Devices, log: Arc<DeviceLog>, source: u16) -> TransportEnv {
    let routes = match &devices.iommu {
        Some(unit) => unit.interrupt_routes(source),
        None => devices.routing.clone(),
    };
    TransportEnv {
        ioevents: vm.shared_fd(),
        routes,
        mem: vm.memory().clone(),
        iommu: devices.iommu.clone().map(|unit| unit as _),
        log,
    }
}
