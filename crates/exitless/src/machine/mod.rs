//! A machine: a KVM VM, its guest-physical map, its devices on the buses, an optional board,
//! and its vCPUs, run once with a loader's guest.
//!
//! - [`layout`]: the guest-physical map and the allocators of its windows and pins;
//! - [`wiring`]: which devices there are and where each sits;
//! - [`loader`]: what guest memory holds at boot and how the boot vCPU enters it, and the ELF
//!   image format the kernel loaders read;
//! - [`vcpus`]: vCPU threads, from creation to join;
//! - [`probe`]: the probe machine: its board (ports), loader and ops;
//! - [`pc`]: `exitless run`'s machine: the PC platform, ACPI, memory map, kernel loaders.

pub mod config;
pub mod console;
pub mod layout;
pub mod loader;
pub mod migration;
pub mod pc;
pub mod probe;
pub mod snapshot;
pub mod vcpus;
pub mod wiring;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::bus::{BusError, IoBuses};
use crate::devices::serial::ConsoleInput;
use crate::exits::ExitCounters;
use crate::iommu::Iommu;
use crate::iommu::dmar::{IoapicScope, dmar_table};
use crate::irq::ioapic::{IOAPIC_ID, IOAPIC_SOURCE_ID, PINS, PinWatcher};
use crate::irq::{GsiRouting, IrqError, MsiVectors};
use crate::pci::root::PciError;
use crate::virtio::VirtioError;
use crate::virtio::worker::Worker;
use crate::vm::run_control::RunControl;
use crate::vm::{self, Vm, VmError};

pub use config::{
    Console, CpuTemplate, DiskConfig, MAX_QUEUE_PAIRS, MAX_VIRTIO_PCI, MachineConfig,
    NetBackendKind, Overflow, Platform, Transport, VhostUserConfig, VirtioNetConfig,
};
pub use layout::{LayoutError, MemoryLayout};
pub use loader::{CpuMode, EntryState, LoadError, Loader, MachineInfo};
// The probe machine's API, where its callers have always found it.
pub use probe::{PROBE_IMAGE, ProbeConfig, ProbeError, ProbeRun, ops, run_probe};
pub use vcpus::RunEnd;
pub use wiring::names;

/// Errors building or running a machine.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// KVM or memory.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// The guest-physical map.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Loading the guest.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Building PCI bus 0: a slot taken, a BAR window full.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// Putting a device on the port or MMIO bus: a range that overlaps another, or is empty.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// Interrupt routing: no GSI left, or a KVM call that failed.
    #[error(transparent)]
    Irq(#[from] IrqError),
    /// A virtio device.
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    /// The VT-d unit's IQT doorbells: their eventfds, epoll set or thread.
    #[error("cannot set up the IOMMU's IQT doorbells: {0}")]
    IommuDoorbells(std::io::Error),
    /// More virtio devices than the machine has room for.
    #[error(
        "too many virtio devices: the machine takes at most {slots} virtio-mmio and \
         {MAX_VIRTIO_PCI} virtio-pci ones",
        slots = layout::VIRTIO_MMIO_SLOTS
    )]
    TooManyDevices,
    /// A queue-pair count virtio-pci's MSI-X table cannot give vectors to.
    #[error("{0} queue pairs: a virtio-net device here has 1 to {MAX_QUEUE_PAIRS}")]
    QueuePairs(usize),
    /// A virtio-net device's MSI-X table size (`vectors=`) that cannot be.
    #[error("--net: {0}")]
    NetVectors(config::ConfigSyntaxError),
    /// A vhost-user backend could not be connected or lacks what the device needs.
    #[error(transparent)]
    VhostUser(#[from] crate::virtio::vhost_user::VhostUserError),
    /// A vhost-user device behind the IOMMU.
    #[error(
        "a vhost-user device behind --iommu is not supported: exitless does not implement the vhost-user IOTLB messages; leave one of them out"
    )]
    VhostUserBehindIommu,
    /// The kernel's vhost-net could not be set up on a tap.
    #[error(transparent)]
    VhostNet(#[from] crate::virtio::vhost_user::VhostNetError),
    /// vhost-net behind the IOMMU.
    #[error(
        "vhost=on behind --iommu is not supported: exitless does not give the kernel's vhost-net the IOMMU's translations (its IOTLB); leave one of them out"
    )]
    VhostNetBehindIommu,
    /// Writing or reading guest memory.
    #[error("guest memory access failed: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    /// The console's target cannot be opened, written or emptied, or is a disk.
    #[error(transparent)]
    Console(#[from] console::ConsoleError),
    /// A disk image cannot be used: not opened, not an image, used twice or by another
    /// process.
    #[error(transparent)]
    Disk(#[from] crate::virtio::block::image::ImageError),
    /// A tap a virtio-net device was to use cannot be opened.
    #[error(transparent)]
    Tap(#[from] crate::virtio::net::tap::TapError),
    /// fw_cfg's items: a file name too long or given twice, or too many files.
    #[error(transparent)]
    FwCfg(#[from] crate::devices::fw_cfg::FwCfgError),
    /// A host resource.
    #[error("{what}: {source}{hint}", hint = crate::resource_hint(source))]
    Host {
        /// What was being done.
        what: &'static str,
        /// The host's error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot that cannot be taken or restored.
    #[error(transparent)]
    Snapshot(#[from] snapshot::SnapshotError),
}

/// Guest RAM a vhost-user backend can map where one serves a device; elsewhere private
/// memory, which keeps transparent huge pages (docs/run.md).
fn ram_backing(cfg: &MachineConfig) -> vm::RamBacking {
    if cfg.ram_is_shared() {
        vm::RamBacking::SharedMemfd
    } else {
        vm::RamBacking::Private
    }
}

/// Where the machine `cfg` describes has its interrupt controllers.
fn irqchip(cfg: &MachineConfig) -> vm::Irqchip {
    if cfg.split_irqchip {
        vm::Irqchip::Split { pins: PINS }
    } else {
        vm::Irqchip::InKernel
    }
}

pub(crate) fn host_err(what: &'static str) -> impl FnOnce(std::io::Error) -> MachineError {
    move |source| MachineError::Host { what, source }
}

/// What a board's devices may use of the machine.
pub struct BoardParts<'a> {
    /// The exit counters, with a slot for each of the board's devices.
    pub counters: &'a Arc<ExitCounters>,
    /// Stops the run.
    pub control: &'a Arc<RunControl>,
    /// The GSI routing table's owner.
    pub routing: &'a Arc<GsiRouting>,
    /// MSI-X vectors of each virtio-pci function, by ECAM-style function address.
    pub msix: &'a BTreeMap<u64, Arc<MsiVectors>>,
}

/// Devices one kind of machine adds beside the standard ones, such as the probe's ports.
/// Installed last, so the exit counters can be sized for every device, the board's included.
pub trait Board {
    /// How many bus devices (distinct names) [`Board::install`] adds; exits at any device
    /// past that count are counted as unclaimed.
    fn bus_devices(&self) -> usize;
    /// Put the board's devices on `io`.
    fn install(&mut self, io: &mut IoBuses, parts: &BoardParts<'_>) -> Result<(), MachineError>;
}

/// A machine built and ready to run once.
pub struct Machine {
    // Every memslot's memory is owned by whoever deletes the slot (the VM, or the ECAM
    // shadow), so the order these fields drop in does not matter.
    vm: Arc<Vm>,
    io: Arc<IoBuses>,
    layout: MemoryLayout,
    /// Device threads, stopped when the machine is dropped.
    _workers: Vec<Worker>,
    /// The console input thread, if any, stopped when the machine is dropped.
    _console_input: Option<ConsoleInput>,
    /// The userspace IOAPIC's input thread under a split irqchip, stopped when dropped.
    ioapic: Option<PinWatcher>,
    vcpus: u8,
    cpu: CpuTemplate,
    control: Arc<RunControl>,
    counters: Arc<ExitCounters>,
    console: Arc<std::sync::Mutex<Vec<u8>>>,
    iommu: Option<Arc<Iommu>>,
    /// Saves it (`vm.snapshot`).
    snapshotter: Arc<snapshot::Snapshotter>,
}

/// How a run went.
#[derive(Debug)]
pub struct Ran {
    /// What ended it.
    pub end: RunEnd,
    /// The boot vCPU's TSC frequency in kHz, if KVM reported it.
    pub tsc_khz: Option<u32>,
}

/// What a control channel (`exitless run --api-socket`) sees of a machine: what it is made
/// of, its exit counters, and the run's control, which pauses, resumes and stops it.
#[derive(Clone)]
pub struct MachineView {
    /// Stops, pauses and resumes the run.
    pub control: Arc<RunControl>,
    /// The exit counters, by kind and by device.
    pub counters: Arc<ExitCounters>,
    /// The devices' names, indexed as the counters' devices are.
    pub devices: Vec<String>,
    /// How many vCPUs it has.
    pub vcpus: u8,
    /// Guest RAM in bytes.
    pub ram_bytes: u64,
    /// Saves the paused machine (`vm.snapshot`).
    pub snapshot: Arc<dyn snapshot::TakeSnapshot>,
    /// Sends the machine to another exitless (`vm.send-migration`).
    pub migrate: Arc<dyn migration::SendMigration>,
}

/// A machine's VM and guest RAM, made before its devices: a migration's target fills RAM
/// while the source still runs, and builds the devices (which open images and taps the
/// source holds until then) at the switch-over.
pub(crate) struct Ram {
    vm: Vm,
    layout: MemoryLayout,
    /// Another exitless's guest RAM, handed over (`migrate local:`): its pages are there.
    handed: bool,
}

impl Ram {
    /// The VM and RAM of the machine `cfg` describes, RAM loaded from `memory` if given.
    pub(crate) fn new(
        cfg: &MachineConfig,
        memory: Option<crate::vm::state::memory::SavedMemory>,
    ) -> Result<Self, MachineError> {
        wiring::check_vhost(cfg)?;
        let layout = MemoryLayout::new(cfg.ram_size, cfg.ecam.is_some())?;
        let irqchip = irqchip(cfg);
        let (ram, dump, backing) = (
            layout.ram_regions(),
            cfg.dump_guest_memory,
            ram_backing(cfg),
        );
        let vm = match memory {
            Some(saved) => Vm::restored(&ram, dump, irqchip, backing, saved)?,
            None => Vm::with_irqchip(&ram, dump, irqchip, backing)?,
        };
        Ok(Ram {
            vm,
            layout,
            handed: false,
        })
    }

    /// The VM of the machine `cfg` describes, its RAM the memfd another exitless handed over
    /// (`migrate local:`).
    pub(crate) fn handed(cfg: &MachineConfig, memfd: std::fs::File) -> Result<Self, MachineError> {
        wiring::check_vhost(cfg)?;
        let layout = MemoryLayout::new(cfg.ram_size, cfg.ecam.is_some())?;
        let vm = Vm::on_memfd(
            &layout.ram_regions(),
            cfg.dump_guest_memory,
            irqchip(cfg),
            memfd,
        )?;
        Ok(Ram {
            vm,
            layout,
            handed: true,
        })
    }

    /// Whether it is another exitless's, handed over.
    pub(crate) fn handed_over(&self) -> bool {
        self.handed
    }

    /// Guest RAM.
    pub(crate) fn memory(&self) -> &vm_memory::GuestMemoryMmap {
        self.vm.memory()
    }
}

impl Machine {
    /// Build the machine `cfg` describes, with `board`'s devices if any.
    pub fn new(cfg: &MachineConfig, board: Option<&mut dyn Board>) -> Result<Self, MachineError> {
        Self::build(cfg, board, None)
    }

    /// [`Machine::new`], guest RAM loaded from `memory` (a snapshot's memory file) if given.
    fn build(
        cfg: &MachineConfig,
        board: Option<&mut dyn Board>,
        memory: Option<crate::vm::state::memory::SavedMemory>,
    ) -> Result<Self, MachineError> {
        Self::assemble(cfg, board, Ram::new(cfg, memory)?, Default::default())
    }

    /// The machine `cfg` describes, its devices built and wired around `ram` (made for `cfg`)
    /// on the host files `files` gives.
    fn assemble(
        cfg: &MachineConfig,
        board: Option<&mut dyn Board>,
        ram: Ram,
        files: wiring::files::FileSource,
    ) -> Result<Self, MachineError> {
        let Ram {
            mut vm, mut layout, ..
        } = ram;
        let control = Arc::new(RunControl::default());
        control.set_vcpus(cfg.vcpus);
        let mut devices = wiring::wire(&mut vm, &mut layout, cfg, &control, files)?;
        let extra = board.as_ref().map_or(0, |b| b.bus_devices());
        let counters = Arc::new(ExitCounters::new(devices.io.names.len() + extra));
        for (id, log) in std::mem::take(&mut devices.logs) {
            counters.attach_log(id, log);
        }
        if let Some(board) = board {
            let parts = BoardParts {
                counters: &counters,
                control: &control,
                routing: &devices.routing,
                msix: &devices.msix,
            };
            board.install(&mut devices.io, &parts)?;
        }
        let vm = Arc::new(vm);
        let snapshotter = Arc::new(snapshot::Snapshotter {
            vm: vm.clone(),
            control: control.clone(),
            persist: std::mem::take(&mut devices.persist),
            config: cfg.clone(),
            routing: devices.routing.clone(),
            image_locks: std::mem::take(&mut devices.image_locks),
            files: std::mem::take(&mut devices.files),
            backends: std::mem::take(&mut devices.backends),
        });
        Ok(Machine {
            vm,
            io: Arc::new(devices.io),
            layout,
            _workers: devices.workers,
            _console_input: devices.console_input,
            ioapic: devices.ioapic,
            vcpus: cfg.vcpus,
            cpu: cfg.cpu.clone(),
            control,
            counters,
            console: devices.console,
            iommu: devices.iommu,
            snapshotter,
        })
    }

    /// Load the guest with `loader`, run every vCPU until the run stops or `timeout` passes,
    /// and stop them all. Once per machine.
    pub fn run(&self, loader: &dyn Loader, timeout: Duration) -> Result<Ran, MachineError> {
        let vcpus = vcpus::Vcpus::create(&self.vm, self.vcpus, &self.cpu)?;
        let tsc_khz = vcpus.tsc_khz();
        // The VMM's IOAPIC is in the unit's scope (and its entries remappable); KVM's is not.
        let ioapic = self.ioapic.as_ref().map(|_| IoapicScope {
            id: IOAPIC_ID,
            source_id: IOAPIC_SOURCE_ID,
        });
        let dmar: Vec<Vec<u8>> = self
            .iommu
            .as_ref()
            .map(|_| dmar_table(layout::IOMMU_BASE, vm::cpuid::host_phys_bits(), ioapic))
            .into_iter()
            .collect();
        let info = MachineInfo {
            layout: &self.layout,
            vcpus: vcpus.count(),
            tsc_khz,
            acpi_tables: &dmar,
            pics: self.ioapic.is_none(),
        };
        let entry = loader.load(self.vm.memory(), &info)?;
        vcpus.set_entries(&entry, loader)?;
        self.run_vcpus(vcpus, timeout)
    }

    /// Run `vcpus` (this machine's, their entry or restored state set) until the run stops or
    /// `timeout` passes, and stop them all.
    pub fn run_vcpus(&self, vcpus: vcpus::Vcpus, timeout: Duration) -> Result<Ran, MachineError> {
        let tsc_khz = vcpus.tsc_khz();
        let end = vcpus
            .run(
                &self.io,
                &self.counters,
                &self.control,
                self.vm.memory(),
                timeout,
            )
            .map_err(host_err("spawn a vCPU thread"))?;
        Ok(Ran { end, tsc_khz })
    }

    /// What a control channel sees of the machine.
    pub fn view(&self) -> MachineView {
        MachineView {
            control: self.control.clone(),
            counters: self.counters.clone(),
            devices: self.io.names.clone(),
            vcpus: self.vcpus.max(1),
            ram_bytes: self.layout.ram_size() as u64,
            snapshot: self.snapshotter.clone(),
            migrate: Arc::new(migration::send::Sender::new(self.snapshotter.clone())),
        }
    }

    /// Save the machine, which must be paused, into `dir` ([`snapshot::take`]).
    pub fn snapshot(&self, dir: &std::path::Path) -> Result<(), snapshot::SnapshotError> {
        snapshot::TakeSnapshot::take(self.snapshotter.as_ref(), dir)
    }

    /// Guest RAM, for reading what the guest left in it.
    pub fn memory(&self) -> &vm_memory::GuestMemoryMmap {
        self.vm.memory()
    }

    /// The buses, with every device's name.
    pub fn io(&self) -> &IoBuses {
        &self.io
    }

    /// The exit counters.
    pub fn counters(&self) -> &ExitCounters {
        &self.counters
    }

    /// The IOMMU, if the machine has one.
    pub fn iommu(&self) -> Option<&Arc<Iommu>> {
        self.iommu.as_ref()
    }

    /// The guest-physical map.
    pub fn layout(&self) -> &MemoryLayout {
        &self.layout
    }

    /// What the guest wrote to its console (empty when it went to stdout).
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&self.console.lock().unwrap()).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vhost_user_device_behind_the_iommu_is_refused_before_anything_is_built() {
        let mut cfg = MachineConfig::default();
        cfg.disks
            .push(DiskConfig::vhost_user("/nonexistent/qsd.sock".into()));
        cfg.iommu = true;
        let refused = Machine::new(&cfg, None).err();
        assert!(matches!(refused, Some(MachineError::VhostUserBehindIommu)));
    }

    #[test]
    fn a_vhost_user_nic_with_more_than_one_queue_pair_goes_to_its_backend() {
        let mut cfg = MachineConfig::default();
        let mut vu = config::VhostUserConfig::new("/nonexistent/tp.sock".into());
        vu.queues = 2;
        let mut nic = config::VirtioNetConfig::new(
            config::Transport::Pci,
            crate::virtio::notify::NotifyPath::Address,
        );
        nic.backend = config::NetBackendKind::VhostUser(vu);
        cfg.virtio.push(nic);
        // Not refused for its pairs: the backend is asked (and is not there).
        let refused = Machine::new(&cfg, None).err();
        assert!(
            matches!(
                refused,
                Some(MachineError::VhostUser(
                    crate::virtio::vhost_user::VhostUserError::Connect { .. }
                ))
            ),
            "{refused:?}"
        );
    }

    /// A config built in code, not through `--net`'s parser, gets `vectors=`'s check too.
    #[test]
    fn a_nic_with_vectors_on_virtio_mmio_is_refused_when_wired() {
        let mut cfg = MachineConfig::default();
        cfg.virtio.push(VirtioNetConfig {
            vectors: Some(65),
            ..VirtioNetConfig::new(
                Transport::Mmio,
                crate::virtio::notify::NotifyPath::Datamatch,
            )
        });
        let refused = Machine::new(&cfg, None).err();
        assert!(
            matches!(refused, Some(MachineError::NetVectors(_))),
            "{refused:?}"
        );
    }
}
