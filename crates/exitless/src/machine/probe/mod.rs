//! The probe machine: the standard devices, the probe's board (its ports) and the probe
//! loader, run once for a list of ops; then the results the guest left in memory.

pub mod board;
pub mod loader;
pub mod ops;

use std::time::Duration;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zerocopy::FromBytes;

use crate::bus::DeviceTable;
use crate::contract::{
    ENUM_ADDR, EnumRecord, IOMMU_REPORT_ADDR, IommuReport, MAX_ENUM_RECORDS, MAX_IOMMU_REPORTS,
    MAX_OPS, OP_ENUMERATE, Op, OpResult, RESULTS_ADDR,
};
use crate::exits::ExitSnapshot;
use crate::iommu::IommuStats;
use crate::irq::CommitStrategy;
use crate::machine::config::{Console, MachineConfig, VirtioNetConfig};
use crate::machine::layout::DEFAULT_RAM_SIZE;
use crate::machine::vcpus::RunEnd;
use crate::machine::wiring::virtio_pci_address;
use crate::machine::{Machine, MachineError};
use crate::pci::{EcamMode, PciAddress};
use crate::vm::run_control::StopReason;

pub use board::{PhaseRecord, ProbeBoard};
pub use loader::{PROBE_IMAGE, PROBE_MIN_RAM, ProbeLoader};

/// Errors of a probe run: building or running its machine, or what the guest did.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The machine.
    #[error(transparent)]
    Machine(#[from] MachineError),
    /// More ops than the contract holds.
    #[error("{0} ops requested; the probe holds at most {MAX_OPS}")]
    TooManyOps(usize),
    /// The guest did not finish.
    #[error("the probe guest did not finish within {0:?}; its console said:\n{1}")]
    Timeout(Duration, String),
    /// The guest stopped abnormally.
    #[error("the probe guest stopped abnormally ({0:?}); its console said:\n{1}")]
    GuestFailed(StopReason, String),
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// The ops, in order.
    pub ops: Vec<Op>,
    /// How ECAM is served; `None` leaves it undescribed (the guest then falls back to PIO).
    pub ecam: Option<EcamMode>,
    /// vCPUs; the probe runs on vCPU 0, the others park in `hlt`.
    pub vcpus: u8,
    /// Bytes of guest RAM; at least [`PROBE_MIN_RAM`].
    pub ram_size: usize,
    /// Longest the run may take.
    pub timeout: Duration,
    /// Send the guest's console to stdout as it is written, instead of into `ProbeRun::console`.
    pub console_to_stdout: bool,
    /// virtio-net devices with the request/response backend, in order: virtio-mmio ones are
    /// `BootInfo` entries 0, 1, …; virtio-pci ones are 00:03.0, 00:04.0, ….
    pub virtio: Vec<VirtioNetConfig>,
    /// Bytes of each response frame the request/response backend sends.
    pub response_size: usize,
    /// When GSI routing changes reach KVM.
    pub gsi_commits: CommitStrategy,
    /// A VT-d remapping unit (`BootInfo::iommu_base`) that virtio-pci devices' DMA goes
    /// through when their driver negotiates VIRTIO_F_ACCESS_PLATFORM.
    pub iommu: bool,
    /// A split irqchip, as `exitless run --iommu` machines have: KVM's local APICs, exitless's
    /// IOAPIC, whose entries the unit remaps (`irq::ioapic`). Off by default: the probe's
    /// machines, and the benchmarks', keep KVM's whole irqchip.
    pub split_irqchip: bool,
}

impl ProbeConfig {
    /// Where the `n`th virtio-pci device of `virtio` sits.
    pub fn virtio_pci_address(n: usize) -> PciAddress {
        virtio_pci_address(n).expect("fewer than MAX_VIRTIO_PCI devices")
    }

    /// The machine the probe runs on.
    pub fn machine(&self) -> MachineConfig {
        MachineConfig {
            ram_size: self.ram_size,
            ecam: self.ecam,
            vcpus: self.vcpus,
            console: if self.console_to_stdout {
                Console::Stdout
            } else {
                Console::Buffer
            },
            console_overflow: Default::default(),
            platform: None,
            virtio: self.virtio.clone(),
            disks: Vec::new(),
            response_size: self.response_size,
            gsi_commits: self.gsi_commits,
            iommu: self.iommu,
            split_irqchip: self.split_irqchip,
            dump_guest_memory: false,
            shared_memory: false,
            pci_test_endpoints: true,
            cpu: Default::default(),
        }
    }
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            ops: Vec::new(),
            ecam: Some(EcamMode::Shadow),
            vcpus: 1,
            ram_size: DEFAULT_RAM_SIZE,
            timeout: Duration::from_secs(600),
            console_to_stdout: false,
            virtio: Vec::new(),
            response_size: 1024,
            gsi_commits: CommitStrategy::default(),
            iommu: false,
            split_irqchip: false,
        }
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct ProbeRun {
    /// One per op.
    pub results: Vec<OpResult>,
    /// What the VMM saw during each op (`None` if the op never completed).
    pub phases: Vec<Option<PhaseRecord>>,
    /// Records written by the last `OP_ENUMERATE`.
    pub enum_records: Vec<EnumRecord>,
    /// The `IommuReport` slots, as `OP_IOMMU_REPORT` left them (zero where none wrote).
    pub iommu_reports: Vec<IommuReport>,
    /// The vCPU's TSC frequency.
    pub tsc_khz: Option<u32>,
    /// Device names by id, for reading exit snapshots.
    pub devices: DeviceTable,
    /// All exits of the run.
    pub total_exits: ExitSnapshot,
    /// Guest console output (empty when it went to stdout).
    pub console: String,
    /// What the IOMMU did over the whole run, if the machine had one (its exits are counted
    /// under `names::IOMMU` like any device's).
    pub iommu: Option<IommuStats>,
}

impl ProbeRun {
    /// Exits op `i` caused (empty if it did not complete).
    pub fn exits(&self, i: usize) -> ExitSnapshot {
        self.phases
            .get(i)
            .cloned()
            .flatten()
            .map(|p| p.exits)
            .unwrap_or_default()
    }

    /// Exits op `i` caused at the device called `name`.
    pub fn exits_at(&self, i: usize, name: &str) -> u64 {
        self.device_id(name)
            .map_or(0, |id| self.exits(i).of_device(id))
    }

    /// CPU time the thread of the device called `name` spent during op `i`, in nanoseconds.
    pub fn thread_cpu_ns_at(&self, i: usize, name: &str) -> u64 {
        self.device_id(name)
            .map_or(0, |id| self.exits(i).thread_cpu_ns_of(id))
    }

    /// Frames with a wrong payload the backend of the device called `name` counted during
    /// op `i` (the sink checks the stream's pattern).
    pub fn bad_frames_at(&self, i: usize, name: &str) -> u64 {
        self.device_id(name)
            .map_or(0, |id| self.exits(i).bad_frames_of(id))
    }

    fn device_id(&self, name: &str) -> Option<usize> {
        self.devices.iter().position(|n| n == name)
    }
}

/// Boot the probe guest with `cfg` and return what it measured.
pub fn run_probe(cfg: &ProbeConfig) -> Result<ProbeRun, ProbeError> {
    // Refuse what the guest cannot hold before creating anything.
    if cfg.ops.len() as u64 > MAX_OPS {
        return Err(ProbeError::TooManyOps(cfg.ops.len()));
    }
    loader::check_ram(cfg.ram_size).map_err(MachineError::from)?;
    let mut board = ProbeBoard::default();
    let machine = Machine::new(&cfg.machine(), Some(&mut board))?;
    let ran = machine.run(&ProbeLoader { ops: &cfg.ops }, cfg.timeout)?;
    let console = machine.console();
    match ran.end {
        RunEnd::Stopped(StopReason::GuestDone(0)) => {}
        RunEnd::Stopped(r) => return Err(ProbeError::GuestFailed(r, console)),
        RunEnd::TimedOut => return Err(ProbeError::Timeout(cfg.timeout, console)),
    }
    let mem = machine.memory();
    let results = read_blocks::<OpResult>(mem, RESULTS_ADDR, cfg.ops.len())?;
    let enum_count = results
        .iter()
        .zip(&cfg.ops)
        .rev()
        .find(|(_, op)| op.kind == OP_ENUMERATE)
        .map_or(0, |(r, _)| r.value.min(MAX_ENUM_RECORDS));
    let enum_count = usize::try_from(enum_count).expect("at most MAX_ENUM_RECORDS");
    let enum_records = read_blocks::<EnumRecord>(mem, ENUM_ADDR, enum_count)?;
    let reports = usize::try_from(MAX_IOMMU_REPORTS).expect("a few slots");
    let iommu_reports = read_blocks::<IommuReport>(mem, IOMMU_REPORT_ADDR, reports)?;
    Ok(ProbeRun {
        results,
        phases: board.records(),
        enum_records,
        iommu_reports,
        tsc_khz: ran.tsc_khz,
        devices: machine.io().names.clone(),
        total_exits: machine.counters().snapshot(),
        console,
        iommu: machine.iommu().map(|i| i.stats()),
    })
}

/// `count` blocks of `T` from guest memory at `addr` (the guest's results, records, ...).
pub fn read_blocks<T: FromBytes + Copy>(
    mem: &GuestMemoryMmap,
    addr: u64,
    count: usize,
) -> Result<Vec<T>, MachineError> {
    let mut bytes = vec![0u8; count * size_of::<T>()];
    mem.read_slice(&mut bytes, GuestAddress(addr))?;
    Ok(bytes
        .chunks_exact(size_of::<T>())
        .map(|c| T::read_from_bytes(c).expect("chunk has the block's size"))
        .collect())
}
