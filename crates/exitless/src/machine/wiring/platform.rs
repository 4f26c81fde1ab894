//! The console and the PC platform devices: QEMU's fw_cfg and debug exit, the i8042's reset
//! command, the ACPI PM block, the RTC and CMOS, and the Reset Control Register.

use std::sync::Arc;

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::{Device, Devices, Kept, Place, names};
use crate::bus::BusDevice;
use crate::contract::PORT_SERIAL;
use crate::devices::acpi_pm::{AcpiPm, PM_BASE, PM_BLOCK_LEN};
use crate::devices::debug_exit::{DEBUG_EXIT_LEN, DEBUG_EXIT_PORT, DebugExit};
use crate::devices::floating_ports::{
    ABSENT_UART_PORTS, DMA_PAGE_CHANNEL0_PORT, FloatingPorts, SUPER_IO_CONFIG_LEN,
    SUPER_IO_CONFIG_PORTS,
};
use crate::devices::fw_cfg::{FW_CFG_PORT, FW_CFG_PORTS_LEN, FwCfg, FwCfgContents};
use crate::devices::i8042::{I8042, I8042_COMMAND_PORT};
use crate::devices::pit::{PIT_GSI, PIT_PORT, PIT_PORTS_LEN, PORT_B, Pit, monotonic_clock};
use crate::devices::pvpanic::{PVPANIC_LEN, PVPANIC_PORT, PvPanic};
use crate::devices::reset_control::ResetControl;
use crate::devices::rtc::{RTC_IRQ, RTC_PORT, RTC_PORTS_LEN, Rtc, host_clock, memory_bytes};
use crate::devices::serial::{ConsoleOutput, SERIAL_PORT_LEN, SerialConsole};
use crate::irq::InterruptRoutes;
use crate::logging::DeviceLog;
use crate::machine::config::{Console, MachineConfig, Platform};
use crate::machine::layout::{self, MemoryLayout};
use crate::machine::pc::acpi::FACS_ADDR;
use crate::machine::{MachineError, host_err};
use crate::vm::Vm;
use crate::vm::run_control::RunControl;

/// The console, writing to `out` as `cfg` says when its writer is behind, and its input
/// thread if stdin feeds it.
pub fn add_serial(
    devices: &mut Devices,
    cfg: &MachineConfig,
    out: ConsoleOutput,
    control: &Arc<RunControl>,
) -> Result<(), MachineError> {
    let irq = EventFd::new(EFD_NONBLOCK).map_err(host_err("create the serial eventfd"))?;
    devices.routing.bind_pin(layout::SERIAL_GSI, &irq, None)?;
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
    devices.console_input = match cfg.console {
        Console::Stdio => Some(
            serial
                .spawn_input_with(std::io::stdin(), wake)
                .map_err(host_err("start the console input thread"))?,
        ),
        _ => None,
    };
    let place = Place::Pio {
        base: PORT_SERIAL,
        len: SERIAL_PORT_LEN,
        device: serial.clone(),
    };
    let log = serial.log().clone();
    devices.add(Device::new(names::SERIAL, place, Kept::Saved(serial)).counted(log))?;
    Ok(())
}

/// The PC platform devices: fw_cfg, the debug exit, the i8042, the pvpanic port, an i8254 PIT
/// where KVM has none, the ports Linux probes that
/// have no chip behind them, the ACPI PM block (S3 finds
/// the waking vector in the FACS in `vm`'s memory), the RTC and the Reset Control Register,
/// which is returned for CF8/CFC to serve beside bus 0's ports.
pub fn add_platform(
    devices: &mut Devices,
    cfg: &MachineConfig,
    platform: &Platform,
    control: &Arc<RunControl>,
    vm: &Vm,
    layout: &MemoryLayout,
) -> Result<Arc<dyn BusDevice>, MachineError> {
    let fw_cfg = Arc::new(FwCfg::new(FwCfgContents {
        ram_size: cfg.ram_size as u64,
        cpus: cfg.vcpus.into(),
        files: platform.fw_cfg_files.clone(),
    })?);
    let place = Place::Pio {
        base: FW_CFG_PORT,
        len: FW_CFG_PORTS_LEN,
        device: fw_cfg.clone(),
    };
    devices.add(Device::new(names::FW_CFG, place, Kept::Saved(fw_cfg)))?;
    let place = Place::Pio {
        base: DEBUG_EXIT_PORT,
        len: DEBUG_EXIT_LEN,
        device: Arc::new(DebugExit::new(control.clone())),
    };
    devices.add(Device::new(names::DEBUG_EXIT, place, Kept::Nothing))?;
    let place = Place::Pio {
        base: I8042_COMMAND_PORT,
        len: 1,
        device: Arc::new(I8042::new(control.clone())),
    };
    devices.add(Device::new(names::I8042, place, Kept::Nothing))?;
    let log = DeviceLog::new(names::PVPANIC);
    let place = Place::Pio {
        base: PVPANIC_PORT,
        len: PVPANIC_LEN,
        device: Arc::new(PvPanic::new(control.clone(), log.clone())),
    };
    devices.add(Device::new(names::PVPANIC, place, Kept::Nothing).counted(log))?;
    let absent_uarts = names::ABSENT_UARTS
        .into_iter()
        .zip(ABSENT_UART_PORTS)
        .map(|(name, base)| (name, base, SERIAL_PORT_LEN));
    let floating = [
        (names::DMA_PAGE, DMA_PAGE_CHANNEL0_PORT, 1),
        (
            names::SUPER_IO,
            SUPER_IO_CONFIG_PORTS[0],
            SUPER_IO_CONFIG_LEN,
        ),
        (
            names::SUPER_IO_ALTERNATE,
            SUPER_IO_CONFIG_PORTS[1],
            SUPER_IO_CONFIG_LEN,
        ),
    ];
    for (name, base, len) in floating.into_iter().chain(absent_uarts) {
        let place = Place::Pio {
            base,
            len,
            device: Arc::new(FloatingPorts),
        };
        devices.add(Device::new(name, place, Kept::Nothing))?;
    }
    let pm = Arc::new(
        AcpiPm::new(control.clone(), DeviceLog::new(names::ACPI_PM))
            .with_facs(vm.memory().clone(), FACS_ADDR),
    );
    let place = Place::Pio {
        base: PM_BASE,
        len: PM_BLOCK_LEN,
        device: pm.clone(),
    };
    let log = pm.log().clone();
    devices.add(Device::new(names::ACPI_PM, place, Kept::Saved(pm.clone())).counted(log))?;
    add_rtc(devices, layout, pm)?;
    if !vm.has_kernel_pit() {
        add_pit(devices)?;
    }
    let reset = Arc::new(ResetControl::new(control.clone()));
    let kept = Kept::Saved(reset.clone());
    devices.add(Device::new(names::RESET_CONTROL, Place::Unlisted, kept))?;
    Ok(reset)
}

/// exitless's i8254 PIT, IRQ 0 on GSI 2, and port B beside it: for a VM KVM gives no PIT.
fn add_pit(devices: &mut Devices) -> Result<(), MachineError> {
    let irq = EventFd::new(EFD_NONBLOCK).map_err(host_err("create the PIT eventfd"))?;
    devices.routing.bind_pin(PIT_GSI, &irq, None)?;
    let pit = Pit::new(monotonic_clock(), irq, DeviceLog::new(names::PIT))
        .map_err(host_err("start the PIT timer thread"))?;
    let (log, pit) = (pit.log().clone(), Arc::new(pit));
    let place = Place::Pio {
        base: PORT_B,
        len: 1,
        device: Arc::new(pit.port_b()),
    };
    devices.add(Device::new(names::PORT_B, place, Kept::Within(names::PIT)))?;
    let place = Place::Pio {
        base: PIT_PORT,
        len: PIT_PORTS_LEN,
        device: pit.clone(),
    };
    devices.add(Device::new(names::PIT, place, Kept::Saved(pit)).counted(log))?;
    Ok(())
}

/// The RTC and CMOS on IRQ 8, its alarm a wake source of `pm`.
fn add_rtc(
    devices: &mut Devices,
    layout: &MemoryLayout,
    pm: Arc<AcpiPm>,
) -> Result<(), MachineError> {
    let irq = EventFd::new(EFD_NONBLOCK).map_err(host_err("create the RTC eventfd"))?;
    devices.routing.bind_pin(RTC_IRQ, &irq, None)?;
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
    let place = Place::Pio {
        base: RTC_PORT,
        len: RTC_PORTS_LEN,
        device: rtc.clone(),
    };
    devices.add(Device::new(names::RTC, place, Kept::Saved(rtc)).counted(log))?;
    Ok(())
}
