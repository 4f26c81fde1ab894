//! Device wiring: which devices a machine has, where each sits on the buses, and which
//! interrupt it raises, by kind: the interrupt controllers and the VT-d unit
//! ([`interrupts`]), the PC platform devices and the console ([`platform`]), PCI bus 0 and the
//! ways into it ([`pci`]), and the virtio devices behind virtio-mmio or virtio-pci
//! ([`virtio`]).
//!
//! Every device goes through one [`Devices::add`], which takes its place on a bus, what a
//! snapshot keeps of it, the log its guest errors count under and its thread together, so a
//! device cannot be on a bus and missing from a snapshot by accident.

pub mod files;
pub mod interrupts;
pub mod names;
pub mod pci;
pub mod platform;
pub mod virtio;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::bus::{BusDevice, DeviceId, IoBuses};
use crate::devices::serial::ConsoleInput;
use crate::iommu::Iommu;
use crate::irq::ioapic::PinWatcher;
use crate::irq::{GsiRouting, MsiVectors};
use crate::logging::DeviceLog;
use crate::machine::MachineError;
use crate::machine::config::MachineConfig;
use crate::machine::console as machine_console;
use crate::machine::layout::MemoryLayout;
use crate::persist::Persist;
use crate::virtio::block::image::ImageLock;
use crate::virtio::worker::{Worker, WorkerHandle};
use crate::vm::Vm;
use crate::vm::run_control::RunControl;
use files::{FileSource, HostFiles};

pub use pci::virtio_pci_address;
pub use virtio::check_vhost;

/// The devices of a machine once wired.
pub struct Devices {
    /// Both address spaces, every device on them.
    pub io: IoBuses,
    /// The one owner of the GSI routing table.
    pub routing: Arc<GsiRouting>,
    /// MSI-X vectors of each virtio-pci function, by ECAM-style function address.
    pub msix: BTreeMap<u64, Arc<MsiVectors>>,
    /// Device threads, stopped when dropped.
    pub workers: Vec<Worker>,
    /// What the guest wrote to its console, unless it went elsewhere.
    pub console: Arc<Mutex<Vec<u8>>>,
    /// The thread that feeds the console from stdin, if it does.
    pub console_input: Option<ConsoleInput>,
    /// The logs of devices that count their guest errors, for the exit accounting.
    pub logs: Vec<CountedLog>,
    /// The IOMMU, if the machine has one.
    pub iommu: Option<Arc<Iommu>>,
    /// The userspace IOAPIC's input thread, under a split irqchip.
    pub ioapic: Option<PinWatcher>,
    /// Every stateful piece a snapshot saves, under its id (unique in the machine).
    pub persist: PersistList,
    /// What a snapshot keeps of each device registered, by name, in the order added.
    pub kept: Vec<(String, Kept)>,
    /// The locks of the disk images the machine opened (a migration hands them over).
    pub image_locks: Vec<ImageLock>,
    /// Its disk images' and taps' files (a same-host live update hands them over).
    pub files: HostFiles,
    /// The threads of its vhost-user devices, whose backends a migration hands over.
    pub backends: Vec<WorkerHandle>,
}

/// A device that counts its guest errors: its bus id and its log.
pub type CountedLog = (DeviceId, Arc<DeviceLog>);

/// What a snapshot saves, each under its id.
pub type PersistList = Vec<(String, Arc<dyn Persist>)>;

/// Where a device answers the guest.
pub enum Place {
    /// Ports `base..base + len`.
    Pio {
        /// First port.
        base: u16,
        /// Number of ports.
        len: u16,
        /// What answers them.
        device: Arc<dyn BusDevice>,
    },
    /// Guest-physical `base..base + len`.
    Mmio {
        /// First address.
        base: u64,
        /// Length in bytes.
        len: u64,
        /// What answers it.
        device: Arc<dyn BusDevice>,
    },
    /// Through another device's range (a virtio-pci function through the BARs): a bus id of
    /// its own for its counts, no range.
    Behind,
    /// Nowhere the exit accounting sees (bus 0 as a whole; the Reset Control Register, which
    /// CF8/CFC serves at 0xCF9).
    Unlisted,
}

/// What a snapshot keeps of a device; every device registered says which.
#[derive(Clone)]
pub enum Kept {
    /// Its own state, saved under its name.
    Saved(Arc<dyn Persist>),
    /// Its state is part of another device's, saved under that name (a virtio-pci function's
    /// and the ways into bus 0 are bus 0's, [`names::PCI_ROOT`]).
    Within(&'static str),
    /// Nothing: it holds no state the guest can see (QEMU's debug exit, the i8042's reset
    /// command).
    Nothing,
}

/// One device as [`Devices::add`] registers it.
pub struct Device {
    name: String,
    place: Place,
    kept: Kept,
    log: Option<Arc<DeviceLog>>,
    worker: Option<Worker>,
}

impl Device {
    /// A device called `name` at `place`, of which a snapshot keeps `kept`.
    pub fn new(name: impl Into<String>, place: Place, kept: Kept) -> Self {
        Device {
            name: name.into(),
            place,
            kept,
            log: None,
            worker: None,
        }
    }

    /// Its guest errors are counted beside its exits, from `log`.
    pub fn counted(mut self, log: Arc<DeviceLog>) -> Self {
        self.log = Some(log);
        self
    }

    /// Its thread, which the machine keeps until it is dropped.
    pub fn serving(mut self, worker: Worker) -> Self {
        self.worker = Some(worker);
        self
    }
}

impl Devices {
    /// Register `device`: its place on the buses, what a snapshot keeps of it, its log and its
    /// thread. Returns its bus id ([`Place::Unlisted`]: none).
    pub fn add(&mut self, device: Device) -> Result<Option<DeviceId>, MachineError> {
        let Device {
            name,
            place,
            kept,
            log,
            worker,
        } = device;
        let id = match place {
            Place::Pio { base, len, device } => Some(self.io.add_pio(&name, base, len, device)?),
            Place::Mmio { base, len, device } => Some(self.io.add_mmio(&name, base, len, device)?),
            Place::Behind => Some(self.io.id_for(&name)),
            Place::Unlisted => None,
        };
        if let (Some(id), Some(log)) = (id, log) {
            self.logs.push((id, log));
        }
        if let Kept::Saved(state) = &kept {
            self.persist.push((name.clone(), state.clone()));
        }
        self.kept.push((name, kept));
        self.workers.extend(worker);
        Ok(id)
    }
}

/// Wire every device `cfg` asks for onto `vm`, placing virtio-mmio ones through `layout`,
/// on the host files `files` gives; the platform devices end the run through `control`.
pub fn wire(
    vm: &mut Vm,
    layout: &mut MemoryLayout,
    cfg: &MachineConfig,
    control: &Arc<RunControl>,
    mut files: FileSource,
) -> Result<Devices, MachineError> {
    let (pins, routing) = interrupts::routing(vm, cfg)?;
    let console = Arc::new(Mutex::new(Vec::new()));
    let (out, truncate) = machine_console::open(&cfg.console, &cfg.disks, &console)?;
    let mut devices = Devices {
        io: IoBuses::default(),
        routing,
        msix: BTreeMap::new(),
        workers: Vec::new(),
        console,
        console_input: None,
        logs: Vec::new(),
        iommu: None,
        ioapic: None,
        persist: Vec::new(),
        kept: Vec::new(),
        image_locks: Vec::new(),
        files: HostFiles::default(),
        backends: Vec::new(),
    };
    platform::add_serial(&mut devices, cfg, out, control)?;
    let reset_control = match &cfg.platform {
        Some(platform) => Some(platform::add_platform(
            &mut devices,
            cfg,
            platform,
            control,
            vm,
            layout,
        )?),
        None => None,
    };
    let root = pci::add_root(&mut devices, layout, cfg.pci_test_endpoints)?;
    if cfg.iommu {
        interrupts::add_iommu(&mut devices, vm, layout)?;
    }
    if let Some(pins) = pins {
        interrupts::add_ioapic(&mut devices, pins)?;
    }
    // Bus 0's state, after the unit's and the IOAPIC's as a snapshot has always listed them.
    let state = Kept::Saved(root.clone());
    devices.add(Device::new(names::PCI_ROOT, Place::Unlisted, state))?;
    virtio::add_devices(&mut devices, vm, layout, cfg, &root, &mut files)?;
    devices.files = files.kept;
    pci::add_windows(&mut devices, vm, &root, cfg.ecam, reset_control)?;
    // Every option has been checked: the last run's console log may go.
    if let Some(truncate) = truncate {
        truncate.now()?;
    }
    Ok(devices)
}
