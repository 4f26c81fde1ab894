//! The probe machine: a VM with the serial console, the probe's ports, PCI bus 0 reachable by
//! CF8/CFC and ECAM (trapped or shadowed), and the embedded probe guest, run once for a list
//! of ops.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use vmm_sys_util::signal::Killable;
use zerocopy::{FromBytes, IntoBytes};

use crate::bus::{BusError, DeviceTable, IoBuses};
use crate::contract::{
    BOOT_INFO_ADDR, BOOT_INFO_MAGIC, BootInfo, ENUM_ADDR, EnumRecord, MAX_ENUM_RECORDS, MAX_OPS,
    MAX_VIRTIO_MMIO, OPS_ADDR, Op, OpResult, PORT_SERIAL, PROBE_LOAD_ADDR, PROBE_MAX_SIZE,
    RESULTS_ADDR,
};
use crate::devices::probe_ports::{PROBE_PORTS_BASE, PROBE_PORTS_LEN, PhaseRecord, ProbePorts};
use crate::devices::serial::{ConsoleOutput, SERIAL_PORT_LEN, SerialConsole};
use crate::irq::{CommitStrategy, GsiRouting, IrqError};
use crate::pci::cf8::{PCI_CONFIG_IO_LEN, PciConfigIo};
use crate::pci::ecam::PciConfigMmio;
use crate::pci::function::{HostBridge, TestDevice};
use crate::pci::regs::PCI_CONFIG_ADDRESS_PORT;
use crate::pci::root::{BarBuses, BarWindows, PciError};
use crate::pci::{EcamMode, PciAddress, PciRoot};
use crate::stats::{ExitCounters, ExitSnapshot};
use crate::virtio::VirtioError;
use crate::virtio::device::VirtioDevice;
use crate::virtio::mmio::{MmioPlacement, MmioTransport};
use crate::virtio::net::{NetBackend, RequestResponse, VirtioNet};
use crate::virtio::notify::NotifyPath;
use crate::virtio::pci::VirtioPci;
use crate::virtio::regs::{VIRTIO_ID_NET, VIRTIO_MMIO_WINDOW_SIZE};
use crate::virtio::worker::Worker;
use crate::vm::run_control::{RunControl, StopReason};
use crate::vm::vcpu::{self, Vcpu};
use crate::vm::{Vm, VmError, boot};

/// The probe guest image, built by build.rs from guest/.
pub static PROBE_IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe.bin"));

/// Guest-physical memory map of the probe machine.
pub mod layout {
    /// Guest RAM, from address 0.
    pub const RAM_SIZE: usize = 16 << 20;
    /// Memory BARs are placed in this 32-bit hole.
    pub const PCI_MMIO_WINDOW: (u64, u64) = (0xc000_0000, 0xe000_0000);
    /// ECAM window for bus 0 (1 MiB: 32 devices × 8 functions × 4 KiB).
    pub const ECAM_BASE: u64 = 0xe000_0000;
    /// I/O BARs are placed in ports `PCI_IO_BASE..PCI_IO_BASE + PCI_IO_LEN`.
    pub const PCI_IO_BASE: u16 = 0xc000;
    /// Length of the I/O BAR window.
    pub const PCI_IO_LEN: u16 = 0x4000;
    /// IOAPIC pin of the serial console (COM1's ISA IRQ).
    pub const SERIAL_GSI: u32 = 4;
    /// virtio-mmio devices, one `VIRTIO_MMIO_WINDOW_SIZE` window each, after the ECAM window.
    pub const VIRTIO_MMIO_BASE: u64 = 0xe010_0000;
    /// IOAPIC pin of the first virtio-mmio device's line; the next ones follow. Pins 16..23
    /// have no 8259 PIC input behind them, so a line can only arrive through the IOAPIC.
    pub const VIRTIO_MMIO_GSI_BASE: u32 = 16;
    /// PCI device number of the first virtio-pci function; the next ones follow.
    pub const VIRTIO_PCI_FIRST_DEVICE: u8 = 3;
    /// MAC address of the first virtio-net device; the last byte counts up.
    pub const VIRTIO_NET_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x7e, 0x57, 0x00];
}

/// Errors building or running the probe machine.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    /// KVM or memory.
    #[error(transparent)]
    Vm(#[from] VmError),
    /// PCI model.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// Address map.
    #[error(transparent)]
    Bus(#[from] BusError),
    /// Interrupt routing.
    #[error(transparent)]
    Irq(#[from] IrqError),
    /// A virtio device.
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    /// More virtio devices than the probe machine has room for.
    #[error(
        "too many virtio devices: the probe machine takes at most {MAX_VIRTIO_MMIO} virtio-mmio \
         and {MAX_VIRTIO_PCI} virtio-pci ones"
    )]
    TooManyDevices,
    /// A queue-pair count virtio-pci's MSI-X table cannot give vectors to.
    #[error("{0} queue pairs: a virtio-net device here has 1 to {MAX_QUEUE_PAIRS}")]
    QueuePairs(usize),
    /// More ops than the contract holds.
    #[error("{0} ops requested; the probe holds at most {MAX_OPS}")]
    TooManyOps(usize),
    /// Writing or reading guest memory.
    #[error("guest memory access failed: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    /// A host resource.
    #[error("{what}: {source}{hint}", hint = crate::resource_hint(source))]
    Host {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The guest did not finish.
    #[error("the probe guest did not finish within {0:?}; its console said:\n{1}")]
    Timeout(Duration, String),
    /// The guest stopped abnormally.
    #[error("the probe guest stopped abnormally ({0:?}); its console said:\n{1}")]
    GuestFailed(StopReason, String),
}

/// Most virtio-pci devices: PCI device numbers from `VIRTIO_PCI_FIRST_DEVICE` to 31.
pub const MAX_VIRTIO_PCI: usize = 32 - layout::VIRTIO_PCI_FIRST_DEVICE as usize;
/// Most queue pairs per virtio-net device: two MSI-X vectors each and one for configuration
/// changes must fit the MSI-X table.
pub const MAX_QUEUE_PAIRS: usize = (crate::virtio::pci::MAX_VECTORS - 1) / 2;

/// What to run.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// The ops, in order.
    pub ops: Vec<Op>,
    /// How ECAM is served; `None` leaves it undescribed (the guest then falls back to PIO).
    pub ecam: Option<EcamMode>,
    /// vCPUs; the probe runs on vCPU 0, the others park in `hlt`.
    pub vcpus: u8,
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
}

/// Which transport a virtio device sits behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// virtio-mmio (the guest picks the legacy line or the MSI extension).
    Mmio,
    /// Modern virtio-pci with MSI-X.
    Pci,
}

/// A virtio-net device of the probe machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioNetConfig {
    /// Its transport.
    pub transport: Transport,
    /// How its doorbells reach it.
    pub notify: NotifyPath,
    /// Receive/transmit queue pairs (more than one adds the control queue and
    /// VIRTIO_NET_F_MQ); each has its own request/response backend and MSI-X vectors.
    pub queue_pairs: u16,
}

impl VirtioNetConfig {
    /// A single-pair device on `transport` with doorbells on `notify`.
    pub fn new(transport: Transport, notify: NotifyPath) -> Self {
        VirtioNetConfig {
            transport,
            notify,
            queue_pairs: 1,
        }
    }
}

impl ProbeConfig {
    /// Where the `n`th virtio-pci device of `virtio` sits.
    pub fn virtio_pci_address(n: usize) -> PciAddress {
        let device = layout::VIRTIO_PCI_FIRST_DEVICE + u8::try_from(n).expect("few devices");
        PciAddress::new(0, device, 0).expect("device number < 32")
    }
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            ops: Vec::new(),
            ecam: Some(EcamMode::Shadow),
            vcpus: 1,
            timeout: Duration::from_secs(600),
            console_to_stdout: false,
            virtio: Vec::new(),
            response_size: 1024,
            gsi_commits: CommitStrategy::default(),
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
    /// The vCPU's TSC frequency.
    pub tsc_khz: Option<u32>,
    /// Device names by id, for reading exit snapshots.
    pub devices: DeviceTable,
    /// All exits of the run.
    pub total_exits: ExitSnapshot,
    /// Guest console output (empty when it went to stdout).
    pub console: String,
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
        self.devices
            .iter()
            .position(|n| n == name)
            .map_or(0, |id| self.exits(i).of_device(id))
    }
}

/// Device names used on the buses (and in exit reports).
pub mod names {
    /// Ports 0xCF8..=0xCFF.
    pub const PCI_PIO: &str = "pci-cf8";
    /// The ECAM window.
    pub const PCI_ECAM: &str = "pci-ecam";
    /// Every decoded BAR (each its own bus range).
    pub const PCI_BARS: &str = "pci-bars";
    /// The console.
    pub const SERIAL: &str = "serial";
    /// The probe's phase ports.
    pub const PROBE_PORTS: &str = "probe-ports";
}

/// The functions of bus 0: a host bridge, a test endpoint, and a two-function test device.
pub fn populate_bus0(root: &PciRoot) -> Result<(), PciError> {
    let at = |d, f| PciAddress::new(0, d, f).expect("valid address");
    root.add(at(0, 0), &HostBridge::layout(), Box::new(HostBridge))?;
    root.add(
        at(1, 0),
        &TestDevice::layout(0x0001),
        Box::<TestDevice>::default(),
    )?;
    root.add(
        at(2, 0),
        &TestDevice::layout(0x0002),
        Box::<TestDevice>::default(),
    )?;
    root.add(
        at(2, 1),
        &TestDevice::layout(0x0003),
        Box::<TestDevice>::default(),
    )?;
    Ok(())
}

struct Machine {
    vm: Vm,
    io: IoBuses,
    /// Device threads, stopped when the machine is dropped.
    _workers: Vec<Worker>,
    virtio_mmio: Vec<(u64, u32)>,
    probe_ports: Arc<ProbePorts>,
    control: Arc<RunControl>,
    counters: Arc<ExitCounters>,
    console: Arc<Mutex<Vec<u8>>>,
}

fn host_err(what: &'static str) -> impl FnOnce(std::io::Error) -> MachineError {
    move |source| MachineError::Host { what, source }
}

impl Machine {
    fn new(cfg: &ProbeConfig) -> Result<Self, MachineError> {
        let (ecam, console_to_stdout) = (cfg.ecam, cfg.console_to_stdout);
        let mut vm = Vm::new(layout::RAM_SIZE)?;
        let mut io = IoBuses::default();
        let control = Arc::new(RunControl::default());
        let console = Arc::new(Mutex::new(Vec::new()));

        let routing = Arc::new(GsiRouting::new(vm.shared_fd(), cfg.gsi_commits)?);
        let serial_irq =
            EventFd::new(EFD_NONBLOCK).map_err(host_err("create the serial eventfd"))?;
        routing.bind_pin(layout::SERIAL_GSI, &serial_irq, None)?;
        let out = if console_to_stdout {
            ConsoleOutput::Stdout
        } else {
            ConsoleOutput::Buffer(console.clone())
        };
        let serial = SerialConsole::new(serial_irq, out);
        io.add_pio(
            names::SERIAL,
            PORT_SERIAL,
            SERIAL_PORT_LEN,
            Arc::new(serial),
        )?;

        // Each decoded BAR is a range of its own on these buses, all counted as PCI_BARS.
        let bar_buses = BarBuses {
            mmio: io.mmio.downgrade(),
            pio: io.pio.downgrade(),
            id: io.id_for(names::PCI_BARS),
            name: names::PCI_BARS.into(),
        };
        let windows = BarWindows {
            mmio: layout::PCI_MMIO_WINDOW,
            io: (
                layout::PCI_IO_BASE.into(),
                u64::from(layout::PCI_IO_BASE) + u64::from(layout::PCI_IO_LEN),
            ),
        };
        let pci = Arc::new(PciRoot::new(windows, bar_buses)?);
        populate_bus0(&pci)?;
        let mut workers = Vec::new();
        let mut virtio_mmio = Vec::new();
        let mut msix = BTreeMap::new();
        for (i, dev) in cfg.virtio.iter().enumerate() {
            let mut mac = layout::VIRTIO_NET_MAC;
            mac[5] = u8::try_from(i).map_err(|_| MachineError::TooManyDevices)?;
            let pairs = usize::from(dev.queue_pairs);
            if !(1..=MAX_QUEUE_PAIRS).contains(&pairs) {
                return Err(MachineError::QueuePairs(pairs));
            }
            let backends = (0..pairs)
                .map(|_| Box::new(RequestResponse::new(cfg.response_size)) as Box<dyn NetBackend>)
                .collect();
            let net = Box::new(VirtioNet::new(mac, backends));
            let queues = net.queue_max_sizes().len();
            // One MSI-X vector per receive and transmit queue and one for configuration
            // changes; the control queue needs none (drivers poll it, as Linux does).
            let vectors = 2 * pairs + 1;
            let mem = vm.memory().clone();
            match dev.transport {
                Transport::Mmio => {
                    let n = virtio_mmio.len();
                    if n as u64 >= MAX_VIRTIO_MMIO {
                        return Err(MachineError::TooManyDevices);
                    }
                    let at = MmioPlacement {
                        base: layout::VIRTIO_MMIO_BASE
                            + n as u64 * u64::from(VIRTIO_MMIO_WINDOW_SIZE),
                        gsi: layout::VIRTIO_MMIO_GSI_BASE
                            + u32::try_from(n).expect("< MAX_VIRTIO_MMIO"),
                        notify: dev.notify,
                    };
                    let (transport, worker) =
                        MmioTransport::new(&vm.shared_fd(), &routing, net, mem, at)?;
                    io.add_mmio(
                        &format!("virtio-mmio.{n}"),
                        at.base,
                        VIRTIO_MMIO_WINDOW_SIZE.into(),
                        Arc::new(transport),
                    )?;
                    virtio_mmio.push((at.base, at.gsi));
                    workers.push(worker);
                }
                Transport::Pci => {
                    let n = cfg.virtio[..i]
                        .iter()
                        .filter(|d| d.transport == Transport::Pci)
                        .count();
                    if n >= MAX_VIRTIO_PCI {
                        return Err(MachineError::TooManyDevices);
                    }
                    let (function, worker) =
                        VirtioPci::new(&vm.shared_fd(), &routing, net, mem, vectors, dev.notify)?;
                    let layout = VirtioPci::layout(VIRTIO_ID_NET, 0x02_00_00, queues, vectors);
                    let at = ProbeConfig::virtio_pci_address(n);
                    msix.insert(at.ecam_offset(), function.msi().clone());
                    pci.add(at, &layout, Box::new(function))?;
                    workers.push(worker);
                }
            }
        }
        io.add_pio(
            names::PCI_PIO,
            PCI_CONFIG_ADDRESS_PORT,
            PCI_CONFIG_IO_LEN,
            Arc::new(PciConfigIo::new(pci.clone())),
        )?;
        if let Some(mode) = ecam {
            let window = pci.window();
            io.add_mmio(
                names::PCI_ECAM,
                layout::ECAM_BASE,
                window.len() as u64,
                Arc::new(PciConfigMmio::new(pci.clone())),
            )?;
            if mode == EcamMode::Shadow {
                // The window is owned by the root, which the bus devices keep alive; `vm` is
                // the machine's first field, so it is dropped before them.
                vm.add_readonly_region(layout::ECAM_BASE, window.region())?;
            }
        }

        // The counters must know every device; the probe ports are the last one added.
        let counters = Arc::new(ExitCounters::new(io.names.len() + 1));
        let probe_ports = Arc::new(ProbePorts::new(
            counters.clone(),
            control.clone(),
            routing,
            msix,
        ));
        let id = io.add_pio(
            names::PROBE_PORTS,
            PROBE_PORTS_BASE,
            PROBE_PORTS_LEN,
            probe_ports.clone(),
        )?;
        probe_ports.set_device_id(id);
        Ok(Machine {
            vm,
            io,
            _workers: workers,
            virtio_mmio,
            probe_ports,
            control,
            counters,
            console,
        })
    }

    fn load(&self, cfg: &ProbeConfig, tsc_khz: Option<u32>) -> Result<(), MachineError> {
        if cfg.ops.len() as u64 > MAX_OPS {
            return Err(MachineError::TooManyOps(cfg.ops.len()));
        }
        assert!(
            PROBE_IMAGE.len() as u64 <= PROBE_MAX_SIZE,
            "probe image outgrew PROBE_MAX_SIZE"
        );
        let mem = self.vm.memory();
        boot::write_tables(mem)?;
        mem.write_slice(PROBE_IMAGE, GuestAddress(PROBE_LOAD_ADDR))?;
        let (ecam_base, ecam_bus_end) = match cfg.ecam {
            Some(_) => (layout::ECAM_BASE, 0),
            None => (0, 0),
        };
        let mut info = BootInfo {
            magic: BOOT_INFO_MAGIC,
            ecam_base,
            ecam_bus_start: 0,
            ecam_bus_end,
            op_count: cfg.ops.len() as u64,
            tsc_khz: tsc_khz.map_or(0, u64::from),
            virtio_mmio_count: self.virtio_mmio.len() as u64,
            ..Default::default()
        };
        for (i, &(base, gsi)) in self.virtio_mmio.iter().enumerate() {
            info.virtio_mmio_base[i] = base;
            info.virtio_mmio_gsi[i] = u64::from(gsi);
        }
        mem.write_slice(info.as_bytes(), GuestAddress(BOOT_INFO_ADDR))?;
        mem.write_slice(cfg.ops.as_bytes(), GuestAddress(OPS_ADDR))?;
        Ok(())
    }

    fn run(self, cfg: &ProbeConfig) -> Result<ProbeRun, MachineError> {
        vcpu::install_kick_handler()?;
        let vcpus = (0..cfg.vcpus.max(1))
            .map(|i| Vcpu::new(&self.vm, i))
            .collect::<Result<Vec<_>, _>>()?;
        let tsc_khz = vcpus[0].tsc_khz();
        self.load(cfg, tsc_khz)?;
        let io = Arc::new(self.io.clone());
        let mut threads = Vec::new();
        let mut spawn_error = None;
        for v in vcpus {
            let (io, counters, control) = (io.clone(), self.counters.clone(), self.control.clone());
            match thread::Builder::new()
                .name("vcpu".into())
                .spawn(move || v.run(&io, &counters, &control))
            {
                Ok(t) => threads.push(t),
                Err(e) => {
                    // The vCPUs already started must still be stopped and joined below.
                    spawn_error = Some(e);
                    self.control.stop(StopReason::VcpuFailed(
                        "a vCPU thread could not start".into(),
                    ));
                    break;
                }
            }
        }
        let reason = self.control.wait(cfg.timeout);
        self.control
            .stop(StopReason::VcpuFailed("stopped by the VMM".into()));
        // Kick every vCPU out of KVM_RUN until its thread ends (a kick can land before the
        // thread re-enters the guest, hence the retry).
        for t in &threads {
            while !t.is_finished() {
                let _ = t.kill(vcpu::kick_signal());
                thread::sleep(Duration::from_millis(1));
            }
        }
        for t in threads {
            let _ = t.join();
        }
        if let Some(e) = spawn_error {
            return Err(host_err("spawn a vCPU thread")(e));
        }
        let console = String::from_utf8_lossy(&self.console.lock().unwrap()).into_owned();
        match reason {
            Some(StopReason::GuestDone(0)) => {}
            Some(r) => return Err(MachineError::GuestFailed(r, console)),
            None => return Err(MachineError::Timeout(cfg.timeout, console)),
        }
        let mem = self.vm.memory();
        let results = read_blocks::<OpResult>(mem, RESULTS_ADDR, cfg.ops.len())?;
        let enum_count = results
            .iter()
            .zip(&cfg.ops)
            .rev()
            .find(|(_, op)| op.kind == crate::contract::OP_ENUMERATE)
            .map_or(0, |(r, _)| r.value.min(MAX_ENUM_RECORDS));
        let enum_count = usize::try_from(enum_count).expect("at most MAX_ENUM_RECORDS");
        let enum_records = read_blocks::<EnumRecord>(mem, ENUM_ADDR, enum_count)?;
        Ok(ProbeRun {
            results,
            phases: self.probe_ports.records(),
            enum_records,
            tsc_khz,
            devices: self.io.names.clone(),
            total_exits: self.counters.snapshot(),
            console,
        })
    }
}

fn read_blocks<T: FromBytes + Copy>(
    mem: &vm_memory::GuestMemoryMmap,
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

/// Boot the probe guest with `cfg` and return what it measured.
pub fn run_probe(cfg: &ProbeConfig) -> Result<ProbeRun, MachineError> {
    Machine::new(cfg)?.run(cfg)
}

/// Builders for the ops the probe understands.
pub mod ops {
    use crate::contract::*;
    use crate::pci::PciAddress;

    /// The ECAM-style address the contract uses for register `reg` of `function`.
    pub fn config_address(function: PciAddress, reg: u16) -> u64 {
        function.ecam_offset() + u64::from(reg)
    }

    /// Read `size` bytes of config space.
    pub fn cfg_read(method: u64, function: PciAddress, reg: u16, size: u64) -> Op {
        Op {
            kind: OP_CFG_READ,
            method,
            address: config_address(function, reg),
            size,
            ..Default::default()
        }
    }

    /// Write `size` bytes of config space.
    pub fn cfg_write(method: u64, function: PciAddress, reg: u16, size: u64, value: u64) -> Op {
        Op {
            kind: OP_CFG_WRITE,
            method,
            address: config_address(function, reg),
            size,
            value,
            ..Default::default()
        }
    }

    /// Read one config dword `count` times.
    pub fn cfg_read_loop(method: u64, function: PciAddress, reg: u16, count: u64) -> Op {
        Op {
            kind: OP_CFG_READ_LOOP,
            method,
            address: config_address(function, reg),
            size: 4,
            count,
            ..Default::default()
        }
    }

    /// Read a RAM dword `count` times.
    pub fn ram_read_loop(count: u64) -> Op {
        Op {
            kind: OP_RAM_READ_LOOP,
            count,
            ..Default::default()
        }
    }

    /// Enumerate the bus.
    pub fn enumerate(method: u64) -> Op {
        Op {
            kind: OP_ENUMERATE,
            method,
            ..Default::default()
        }
    }

    /// Guest-physical read (device MMIO).
    pub fn mmio_read(address: u64, size: u64) -> Op {
        Op {
            kind: OP_MMIO_READ,
            address,
            size,
            ..Default::default()
        }
    }

    /// Bring up a virtio-net device: `transport` is `TRANSPORT_MMIO` (`address` = index among
    /// the virtio-mmio devices) or `TRANSPORT_PCI` (`address` = ECAM-style function address).
    pub fn virtio_init(transport: u64, address: u64, flags: u64) -> Op {
        Op {
            kind: OP_VIRTIO_INIT,
            method: transport,
            address,
            value: flags,
            ..Default::default()
        }
    }

    /// `count` request/response transactions of `request_size`-byte requests.
    pub fn virtio_rr(request_size: u64, count: u64) -> Op {
        Op {
            kind: OP_VIRTIO_RR,
            size: request_size,
            count,
            ..Default::default()
        }
    }

    /// Reset the device and bring it up again.
    pub fn virtio_reset() -> Op {
        Op {
            kind: OP_VIRTIO_RESET,
            ..Default::default()
        }
    }

    /// One transaction with the receive vector masked, then unmasked.
    pub fn virtio_mask_pending(request_size: u64) -> Op {
        Op {
            kind: OP_VIRTIO_MASK_PENDING,
            size: request_size,
            ..Default::default()
        }
    }

    /// Guest-physical write (device MMIO).
    pub fn mmio_write(address: u64, size: u64, value: u64) -> Op {
        Op {
            kind: OP_MMIO_WRITE,
            address,
            size,
            value,
            ..Default::default()
        }
    }

    /// Program every MSI-X entry of `function` (data `first_vector + i`, message address
    /// `address`, 0 for the interrupt window's base) with MSI-X disabled, unmasked or not.
    pub fn msix_program(function: PciAddress, first_vector: u8, address: u32, unmask: bool) -> Op {
        Op {
            kind: OP_MSIX_PROGRAM,
            address: function.ecam_offset(),
            size: u64::from(address),
            value: u64::from(first_vector),
            count: u64::from(unmask),
            ..Default::default()
        }
    }

    /// Write MSI-X Message Control of `function` (`PCI_MSIX_FLAGS_*`), timed.
    pub fn msix_control(function: PciAddress, control: u16) -> Op {
        Op {
            kind: OP_MSIX_CONTROL,
            address: function.ecam_offset(),
            value: u64::from(control),
            ..Default::default()
        }
    }

    /// Mask or unmask every MSI-X entry of `function`, one after the other.
    pub fn msix_mask_each(function: PciAddress, masked: bool) -> Op {
        Op {
            kind: OP_MSIX_MASK_EACH,
            address: function.ecam_offset(),
            value: u64::from(masked),
            ..Default::default()
        }
    }

    /// Rewrite every MSI-X entry's data to `first_vector + i` without masking it.
    pub fn msix_retarget(function: PciAddress, first_vector: u8) -> Op {
        Op {
            kind: OP_MSIX_RETARGET,
            address: function.ecam_offset(),
            value: u64::from(first_vector),
            ..Default::default()
        }
    }

    /// Check MSI-X delivery on `function`, after asking the VMM to send every vector if `send`.
    pub fn msix_check(function: PciAddress, send: bool) -> Op {
        Op {
            kind: OP_MSIX_CHECK,
            address: function.ecam_offset(),
            count: u64::from(send),
            ..Default::default()
        }
    }
}
