//! Device wiring: which devices a machine has, where each sits on the buses, and which
//! interrupt it raises. The serial console, PCI bus 0 (CF8/CFC, the BAR windows, ECAM trapped
//! or shadowed), the PC platform devices if the machine has them, the VT-d remapping unit if
//! configured, and the virtio-net and virtio-blk devices behind virtio-mmio or virtio-pci.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::bus::{BusDevice, DeviceId, IoBuses};
use crate::contract::PORT_SERIAL;
use crate::devices::acpi_pm::{AcpiPm, PM_BASE, PM_BLOCK_LEN};
use crate::devices::debug_exit::{DEBUG_EXIT_LEN, DEBUG_EXIT_PORT, DebugExit};
use crate::devices::fw_cfg::{FW_CFG_PORT, FW_CFG_PORTS_LEN, FwCfg, FwCfgContents};
use crate::devices::i8042::{I8042, I8042_COMMAND_PORT};
use crate::devices::reset_control::ResetControl;
use crate::devices::rtc::{RTC_IRQ, RTC_PORT, RTC_PORTS_LEN, Rtc, host_clock, memory_bytes};
use crate::devices::serial::{ConsoleInput, ConsoleOutput, SERIAL_PORT_LEN, SerialConsole};
use crate::iommu::Iommu;
use crate::iommu::regs::{VTD_IQT_REG, VTD_REG_SIZE};
use crate::irq::ioapic::pins::PinInputs;
use crate::irq::ioapic::{IOAPIC_SOURCE_ID, Ioapic, MMIO_LEN, PinWatcher};
use crate::irq::regs::IOAPIC_BASE;
use crate::irq::{GsiRouting, InterruptRoutes, MsiVectors};
use crate::logging::DeviceLog;
use crate::machine::config::{
    Console, DiskConfig, MAX_QUEUE_PAIRS, MAX_VIRTIO_PCI, MachineConfig, NetBackendKind, Platform,
    Transport, VhostUserConfig, VirtioNetConfig, tap_mac,
};
use crate::machine::console as machine_console;
use crate::machine::layout::{self, MemoryLayout};
use crate::machine::run::acpi::FACS_ADDR;
use crate::machine::{MachineError, host_err};
use crate::pci::cf8::{PCI_CONFIG_IO_LEN, PciConfigIo};
use crate::pci::ecam::PciConfigMmio;
use crate::pci::function::{HostBridge, TestDevice};
use crate::pci::regs::PCI_CONFIG_ADDRESS_PORT;
use crate::pci::root::{BarBuses, BarWindows, PciError};
use crate::pci::{EcamMode, PciAddress, PciRoot};
use crate::snapshot::Persist;
use crate::virtio::block::VirtioBlock;
use crate::virtio::block::image::Images;
use crate::virtio::net::tap::Tap;
use crate::virtio::net::{NetBackend, RequestResponse, Sink, VirtioNet};
use crate::virtio::notify::NotifyPath;
use crate::virtio::transport::mmio::{MmioPlacement, MmioTransport};
use crate::virtio::transport::pci::VirtioPci;
use crate::virtio::vhost_user::{self, VhostUserKind, VhostUserSpec};
use crate::virtio::worker::Worker;
use crate::virtio::{DeviceParts, TransportEnv};
use crate::vm::Vm;
use crate::vm::run_control::RunControl;

/// Device names used on the buses (and in exit reports).
pub mod names {
    /// Ports 0xCF8..=0xCFF.
    pub const PCI_PIO: &str = "pci-cf8";
    /// The ECAM window.
    pub const PCI_ECAM: &str = "pci-ecam";
    /// Every decoded BAR (each its own bus range).
    pub const PCI_BARS: &str = "pci-bars";
    /// Bus 0 in a snapshot: every function's configuration space and state, by address.
    pub const PCI_ROOT: &str = "pci";
    /// The console.
    pub const SERIAL: &str = "serial";
    /// The probe's phase ports.
    pub const PROBE_PORTS: &str = "probe-ports";
    /// The VT-d remapping unit's register page.
    pub const IOMMU: &str = "iommu";
    /// The userspace IOAPIC, under a split irqchip.
    pub const IOAPIC: &str = "ioapic";

    /// A virtio-pci function: its guest errors and its thread's CPU time are counted under
    /// this name (its registers are reached through `PCI_BARS`).
    pub fn virtio_pci(at: crate::pci::PciAddress) -> String {
        format!("virtio-pci.{at}")
    }
    /// QEMU's test exit.
    pub const DEBUG_EXIT: &str = "debug-exit";
    /// QEMU's firmware configuration ports.
    pub const FW_CFG: &str = "fw-cfg";
    /// The ACPI power-management block.
    pub const ACPI_PM: &str = "acpi-pm";
    /// The RTC and CMOS at ports 0x70 and 0x71.
    pub const RTC: &str = "rtc";
    /// The keyboard controller's command port.
    pub const I8042: &str = "i8042";
    /// The Reset Control Register at 0xCF9 (its state in a snapshot).
    pub const RESET_CONTROL: &str = "reset-control";
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

/// Where the `n`th virtio-pci device sits: 00:03.0, 00:04.0, ….
pub fn virtio_pci_address(n: usize) -> Option<PciAddress> {
    let device = u8::try_from(n)
        .ok()?
        .checked_add(layout::VIRTIO_PCI_FIRST_DEVICE)?;
    PciAddress::new(0, device, 0)
}

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
}

/// A device that counts its guest errors: its bus id and its log.
pub type CountedLog = (DeviceId, Arc<DeviceLog>);

/// What a snapshot saves, each under its id.
pub type PersistList = Vec<(String, Arc<dyn Persist>)>;

/// Wire every device `cfg` asks for onto `vm`, placing virtio-mmio ones through `layout`;
/// the platform devices end the run through `control`.
pub fn wire(
    vm: &mut Vm,
    layout: &mut MemoryLayout,
    cfg: &MachineConfig,
    control: &Arc<RunControl>,
) -> Result<Devices, MachineError> {
    let mut io = IoBuses::default();
    let mut persist = Vec::new();
    let (pins, routing) = interrupt_routing(vm, cfg)?;
    let console = Arc::new(Mutex::new(Vec::new()));
    let (out, truncate) = machine_console::open(&cfg.console, &cfg.disks, &console)?;
    let (serial_log, console_input) =
        add_serial(&mut io, &routing, cfg, out, control, &mut persist)?;
    let mut logs = vec![serial_log];
    let reset_control = match &cfg.platform {
        Some(platform) => {
            let pm = add_platform(&mut io, cfg, platform, control, vm, &mut persist)?;
            logs.push((pm.0, pm.1.log().clone()));
            logs.push(add_rtc(&mut io, &routing, layout, pm.1, &mut persist)?);
            let reset = Arc::new(ResetControl::new(control.clone()));
            persist.push((names::RESET_CONTROL.into(), reset.clone()));
            Some(reset as Arc<dyn BusDevice>)
        }
        None => None,
    };

    let pci = add_pci_root(&mut io, layout)?;
    logs.push((pci.0, pci.1.log().clone()));
    let pci = pci.1;
    let iommu = if cfg.iommu {
        let (iommu, id) = add_iommu(vm, layout, &mut io, &routing, &mut persist)?;
        logs.push((id, iommu.log().clone()));
        Some(iommu)
    } else {
        None
    };
    let ioapic = match pins {
        Some(pins) => {
            let (watcher, log) = add_ioapic(&mut io, &routing, iommu.as_ref(), pins, &mut persist)?;
            logs.push(log);
            Some(watcher)
        }
        None => None,
    };
    let mut devices = Devices {
        io,
        routing,
        msix: BTreeMap::new(),
        workers: Vec::new(),
        console,
        console_input,
        logs,
        iommu,
        ioapic,
        persist,
    };
    devices.persist.push((names::PCI_ROOT.into(), pci.clone()));
    let mut slots = VirtioSlots::default();
    add_virtio_net(vm, layout, cfg, &pci, &mut devices, &mut slots)?;
    add_virtio_blk(vm, layout, cfg, &pci, &mut devices, &mut slots)?;
    add_pci_windows(vm, &mut devices.io, &pci, cfg.ecam, reset_control)?;
    // Every option has been checked: the last run's console log may go.
    if let Some(truncate) = truncate {
        truncate.now()?;
    }
    Ok(devices)
}

/// The GSI routing of `vm`, and under a split irqchip the IOAPIC's inputs, to which the
/// devices' pins are then bound and which the IOAPIC watches once it exists (after the unit
/// it sends through).
fn interrupt_routing(
    vm: &Vm,
    cfg: &MachineConfig,
) -> Result<(Option<Arc<PinInputs>>, Arc<GsiRouting>), MachineError> {
    let pins = match cfg.split_irqchip {
        true => Some(Arc::new(
            PinInputs::new().map_err(host_err("create the IOAPIC's inputs"))?,
        )),
        false => None,
    };
    let routing = Arc::new(match &pins {
        Some(pins) => GsiRouting::split(vm.shared_fd(), cfg.gsi_commits, pins.clone())?,
        None => GsiRouting::new(vm.shared_fd(), cfg.gsi_commits)?,
    });
    Ok((pins, routing))
}

/// The PCI host bridge and bus 0's functions, its BAR windows from `layout`; returns the bus
/// id its BARs are counted under, and the root.
fn add_pci_root(
    io: &mut IoBuses,
    layout: &MemoryLayout,
) -> Result<(DeviceId, Arc<PciRoot>), MachineError> {
    // Each decoded BAR is a range of its own on these buses, all counted as PCI_BARS.
    let bar_buses = BarBuses::on(io, names::PCI_BARS);
    let windows = BarWindows {
        mmio: layout::PCI_MMIO_WINDOW,
        io: (
            layout::PCI_IO_BASE.into(),
            u64::from(layout::PCI_IO_BASE) + u64::from(layout::PCI_IO_LEN),
        ),
    };
    let bars_id = bar_buses.id;
    let pci = Arc::new(PciRoot::new(windows, bar_buses)?.with_mmio64(layout.mmio64_window()));
    populate_bus0(&pci)?;
    Ok((bars_id, pci))
}

/// The console, writing to `out` as `cfg` says when its writer is behind; returns its bus id
/// and log, and its input thread if stdin feeds it.
fn add_serial(
    io: &mut IoBuses,
    routing: &GsiRouting,
    cfg: &MachineConfig,
    out: ConsoleOutput,
    control: &Arc<RunControl>,
    persist: &mut PersistList,
) -> Result<(CountedLog, Option<ConsoleInput>), MachineError> {
    let irq = EventFd::new(EFD_NONBLOCK).map_err(host_err("create the serial eventfd"))?;
    routing.bind_pin(layout::SERIAL_GSI, &irq, None)?;
    let serial = Arc::new(
        SerialConsole::new(
            irq,
            out,
            cfg.console_overflow,
            DeviceLog::new(names::SERIAL),
        )
        .map_err(host_err("start the console thread"))?,
    );
    // A key wakes the machine from S3 (a no-op while it runs).
    let control = control.clone();
    let wake = move || {
        control.sleep().wake();
    };
    let input = match cfg.console {
        Console::Stdio => Some(
            serial
                .spawn_input_with(std::io::stdin(), wake)
                .map_err(host_err("start the console input thread"))?,
        ),
        _ => None,
    };
    let log = serial.log().clone();
    persist.push((names::SERIAL.into(), serial.clone()));
    let id = io.add_pio(names::SERIAL, PORT_SERIAL, SERIAL_PORT_LEN, serial)?;
    Ok(((id, log), input))
}

/// The PC platform devices but the reset control register (which sits behind the PCI ports)
/// and the RTC; returns the bus id of the one that counts guest errors, the ACPI PM block,
/// and the block (S3 finds the waking vector in the FACS in `vm`'s memory).
fn add_platform(
    io: &mut IoBuses,
    cfg: &MachineConfig,
    platform: &Platform,
    control: &Arc<RunControl>,
    vm: &Vm,
    persist: &mut PersistList,
) -> Result<(DeviceId, Arc<AcpiPm>), MachineError> {
    let fw_cfg = Arc::new(FwCfg::new(FwCfgContents {
        ram_size: cfg.ram_size as u64,
        cpus: cfg.vcpus.into(),
        files: platform.fw_cfg_files.clone(),
    })?);
    persist.push((names::FW_CFG.into(), fw_cfg.clone()));
    io.add_pio(names::FW_CFG, FW_CFG_PORT, FW_CFG_PORTS_LEN, fw_cfg)?;
    let debug_exit = Arc::new(DebugExit::new(control.clone()));
    io.add_pio(
        names::DEBUG_EXIT,
        DEBUG_EXIT_PORT,
        DEBUG_EXIT_LEN,
        debug_exit,
    )?;
    let i8042 = Arc::new(I8042::new(control.clone()));
    io.add_pio(names::I8042, I8042_COMMAND_PORT, 1, i8042)?;
    let pm = Arc::new(
        AcpiPm::new(control.clone(), DeviceLog::new(names::ACPI_PM))
            .with_facs(vm.memory().clone(), FACS_ADDR),
    );
    persist.push((names::ACPI_PM.into(), pm.clone()));
    let id = io.add_pio(names::ACPI_PM, PM_BASE, PM_BLOCK_LEN, pm.clone())?;
    Ok((id, pm))
}

/// The RTC and CMOS on IRQ 8, its alarm a wake source of `pm`; returns its bus id and log.
fn add_rtc(
    io: &mut IoBuses,
    routing: &GsiRouting,
    layout: &MemoryLayout,
    pm: Arc<AcpiPm>,
    persist: &mut PersistList,
) -> Result<CountedLog, MachineError> {
    let irq = EventFd::new(EFD_NONBLOCK).map_err(host_err("create the RTC eventfd"))?;
    routing.bind_pin(RTC_IRQ, &irq, None)?;
    let above_4g = layout.high_ram().map_or(0, |(_, bytes)| bytes);
    let rtc = Rtc::new(
        host_clock(),
        &memory_bytes(layout.low_ram_end(), above_4g),
        irq,
        pm,
        DeviceLog::new(names::RTC),
    )
    .map_err(host_err("start the RTC timer thread"))?;
    let (log, rtc) = (rtc.log().clone(), Arc::new(rtc));
    persist.push((names::RTC.into(), rtc.clone()));
    let id = io.add_pio(names::RTC, RTC_PORT, RTC_PORTS_LEN, rtc)?;
    Ok((id, log))
}

/// The VT-d remapping unit, placed by the layout; returns it and its bus id.
fn add_iommu(
    vm: &Vm,
    layout: &mut MemoryLayout,
    io: &mut IoBuses,
    routing: &Arc<GsiRouting>,
    persist: &mut PersistList,
) -> Result<(Arc<Iommu>, DeviceId), MachineError> {
    let log = DeviceLog::new(names::IOMMU);
    let iommu = Arc::new(Iommu::new(vm.memory().clone(), routing.clone(), log));
    persist.push((names::IOMMU.into(), iommu.clone()));
    let base = layout.place_iommu();
    let id = io.add_mmio(names::IOMMU, base, VTD_REG_SIZE, iommu.clone())?;
    iommu
        .attach_doorbells(vm.shared_fd(), base + VTD_IQT_REG)
        .map_err(MachineError::IommuDoorbells)?;
    Ok((iommu, id))
}

/// The userspace IOAPIC on `pins`, sending through `iommu`'s interrupt remapping for its
/// source-id if the machine has the unit; returns its input thread, bus id and log.
fn add_ioapic(
    io: &mut IoBuses,
    routing: &Arc<GsiRouting>,
    iommu: Option<&Arc<Iommu>>,
    pins: Arc<PinInputs>,
    persist: &mut PersistList,
) -> Result<(PinWatcher, CountedLog), MachineError> {
    let routes = match iommu {
        Some(unit) => unit.interrupt_routes(IOAPIC_SOURCE_ID),
        None => routing.clone(),
    };
    let ioapic = Arc::new(Ioapic::new(routes, pins, DeviceLog::new(names::IOAPIC)));
    let log = ioapic.log().clone();
    persist.push((names::IOAPIC.into(), ioapic.clone()));
    let id = io.add_mmio(names::IOAPIC, IOAPIC_BASE, MMIO_LEN, ioapic.clone())?;
    let watcher = ioapic
        .spawn()
        .map_err(host_err("start the IOAPIC's thread"))?;
    Ok((watcher, (id, log)))
}

/// Where the next virtio device goes: virtio-pci functions take 00:03.0, 00:04.0, … in turn
/// (network devices first, then disks), virtio-mmio ones the layout's next window.
#[derive(Default)]
struct VirtioSlots {
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

/// The virtio-net devices of `cfg`, each with its backends (one per queue pair), behind its
/// transport.
fn add_virtio_net(
    vm: &Vm,
    layout: &mut MemoryLayout,
    cfg: &MachineConfig,
    pci: &PciRoot,
    devices: &mut Devices,
    slots: &mut VirtioSlots,
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
            NetBackendKind::Tap(name) => in_process(
                Tap::open_queues(name, pairs)?
                    .into_iter()
                    .map(|tap| Box::new(tap) as _)
                    .collect(),
            ),
            NetBackendKind::VhostUser(vu) => {
                let spec = vhost_user_spec(vu, VhostUserKind::Net { mac });
                vhost_user::connect(&spec, vm.memory())?
            }
        };
        add_virtio(vm, layout, pci, devices, slots, parts, &placement)?;
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

/// Refuse, before anything is built, the vhost-user devices exitless cannot serve: any behind
/// the IOMMU (no vhost-user IOTLB).
pub fn check_vhost_user(cfg: &MachineConfig) -> Result<(), MachineError> {
    if cfg.has_vhost_user() && cfg.iommu {
        return Err(MachineError::VhostUserBehindIommu);
    }
    Ok(())
}

/// The virtio-blk devices of `cfg`, each on its image, opened for reading (and writing unless
/// the disk is read-only) and locked unless the disk says otherwise; no image serves two.
fn add_virtio_blk(
    vm: &Vm,
    layout: &mut MemoryLayout,
    cfg: &MachineConfig,
    pci: &PciRoot,
    devices: &mut Devices,
    slots: &mut VirtioSlots,
) -> Result<(), MachineError> {
    let mut images = Images::default();
    for disk in &cfg.disks {
        if let Some(vu) = &disk.vhost_user {
            let parts =
                vhost_user::connect(&vhost_user_spec(vu, VhostUserKind::Block), vm.memory())?;
            let placement = Placement {
                vectors: usize::from(vu.queues) + 1,
                ..disk_placement(disk)
            };
            add_virtio(vm, layout, pci, devices, slots, parts, &placement)?;
            continue;
        }
        let image = images.open(&disk.path, disk.read_only, disk.locking)?;
        // The serial (VIRTIO_BLK_T_GET_ID) is the file's name, as far as 20 bytes hold it.
        let serial = disk.path.file_name().map(|n| n.as_encoded_bytes());
        let blk = VirtioBlock::parts(image, serial.unwrap_or_default());
        add_virtio(vm, layout, pci, devices, slots, blk, &disk_placement(disk))?;
    }
    Ok(())
}

/// Where a virtio-blk device goes.
fn disk_placement(disk: &DiskConfig) -> Placement {
    Placement {
        transport: disk.transport,
        // Doorbells that never exit where every driver uses them: virtio-pci's per-queue
        // notification addresses, and virtio-mmio's QueueNotify with its queue index
        // (the per-queue pages are the MSI extension's, which a standard driver lacks).
        notify: match disk.transport {
            Transport::Pci => NotifyPath::Address,
            Transport::Mmio => NotifyPath::Datamatch,
        },
        // The request queue's and the configuration change's.
        vectors: 2,
        // Class 01/80/00: other mass storage controller, as virtio-blk functions are
        // elsewhere (PCI Code and ID Assignment §1.2).
        class: 0x01_80_00,
    }
}

/// Put a virtio device behind its transport: virtio-mmio in the layout's next window,
/// virtio-pci at the next free function of bus 0; its thread joins the machine's.
fn add_virtio(
    vm: &Vm,
    layout: &mut MemoryLayout,
    pci: &PciRoot,
    devices: &mut Devices,
    slots: &mut VirtioSlots,
    parts: DeviceParts,
    placement: &Placement,
) -> Result<(), MachineError> {
    match placement.transport {
        Transport::Mmio => {
            let slot = layout
                .allocate_virtio_mmio()
                .map_err(|_| MachineError::TooManyDevices)?;
            let n = layout.virtio_mmio().len() - 1;
            let at = MmioPlacement {
                base: slot.base,
                gsi: slot.gsi,
                notify: placement.notify,
            };
            let name = format!("virtio-mmio.{n}");
            let log = DeviceLog::new(name.as_str());
            let source = VIRTIO_MMIO_SOURCE_IDS + u16::try_from(n).expect("few devices");
            let env = transport_env(vm, devices, log.clone(), source);
            let (transport, worker) = MmioTransport::new(env, parts, at)?;
            let transport = Arc::new(transport);
            let id = devices
                .io
                .add_mmio(&name, slot.base, slot.size, transport.clone())?;
            devices.persist.push((name, transport));
            devices.logs.push((id, log));
            devices.workers.push(worker);
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
            let env = transport_env(vm, devices, log.clone(), at.requester_id());
            let (function, worker) = VirtioPci::new(
                env,
                parts,
                at.requester_id(),
                placement.vectors,
                placement.notify,
            )?;
            let id = devices.io.id_for(&name);
            devices.logs.push((id, log));
            let layout = function.config_layout(placement.class);
            devices
                .msix
                .insert(at.ecam_offset(), function.msi().clone());
            pci.add(at, &layout, Box::new(function))?;
            devices.workers.push(worker);
        }
    }
    Ok(())
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

/// The ways into bus 0: CF8/CFC (sharing its ports with `reset_control` at 0xCF9, if the
/// machine has one), the memory and I/O BAR windows, and ECAM if described.
fn add_pci_windows(
    vm: &mut Vm,
    io: &mut IoBuses,
    pci: &Arc<PciRoot>,
    ecam: Option<EcamMode>,
    reset_control: Option<Arc<dyn BusDevice>>,
) -> Result<(), MachineError> {
    let ports = PciConfigIo::new(pci.clone());
    let ports = match reset_control {
        Some(reset) => ports.with_reset_control(reset),
        None => ports,
    };
    io.add_pio(
        names::PCI_PIO,
        PCI_CONFIG_ADDRESS_PORT,
        PCI_CONFIG_IO_LEN,
        Arc::new(ports),
    )?;
    if let Some(mode) = ecam {
        let window = pci.window();
        assert_eq!(
            window.len() as u64,
            layout::ECAM_SIZE,
            "the window is the ECAM range"
        );
        io.add_mmio(
            names::PCI_ECAM,
            layout::ECAM_BASE,
            layout::ECAM_SIZE,
            Arc::new(PciConfigMmio::new(pci.clone())),
        )?;
        if mode == EcamMode::Shadow {
            // The shadow keeps the window until its slots are deleted; the root can take a
            // function's page out of it (its reads then exit).
            let shadow =
                vm.add_readonly_region(layout::ECAM_BASE, pci.shared_window(), |w| w.region())?;
            pci.set_shadow(shadow);
        }
    }
    Ok(())
}
