//! PCI bus 0: the host bridge (and the probe's test endpoints where a machine asks for them),
//! the BAR windows, and the ways into configuration space: CF8/CFC, and ECAM trapped or
//! shadowed.

use std::sync::Arc;

use super::{Device, Devices, Kept, Place, names};
use crate::bus::BusDevice;
use crate::machine::MachineError;
use crate::machine::layout::{self, MemoryLayout};
use crate::pci::cf8::{PCI_CONFIG_IO_LEN, PciConfigIo};
use crate::pci::ecam::PciConfigMmio;
use crate::pci::regs::PCI_CONFIG_ADDRESS_PORT;
use crate::pci::root::{BarBuses, BarWindows};
use crate::pci::{EcamMode, PciAddress, PciRoot};
use crate::vm::Vm;

/// The host bridge and bus 0's root, its BAR windows from `layout`, with the probe's test
/// endpoints if `test_endpoints`. Bus 0's state is registered by the caller.
pub fn add_root(
    devices: &mut Devices,
    layout: &MemoryLayout,
    test_endpoints: bool,
) -> Result<Arc<PciRoot>, MachineError> {
    // Each decoded BAR is a range of its own on these buses, all counted as PCI_BARS.
    let bar_buses = BarBuses::on(&mut devices.io, names::PCI_BARS);
    let windows = BarWindows {
        mmio: layout::PCI_MMIO_WINDOW,
        io: (
            layout::PCI_IO_BASE.into(),
            u64::from(layout::PCI_IO_BASE) + u64::from(layout::PCI_IO_LEN),
        ),
    };
    let root = Arc::new(PciRoot::new(windows, bar_buses)?.with_mmio64(layout.mmio64_window()));
    root.add_host_bridge()?;
    if test_endpoints {
        root.add_test_endpoints()?;
    }
    let bars = Device::new(
        names::PCI_BARS,
        Place::Behind,
        Kept::Within(names::PCI_ROOT),
    );
    devices.add(bars.counted(root.log().clone()))?;
    Ok(root)
}

/// Where the `n`th virtio-pci device sits: 00:03.0, 00:04.0, ….
pub fn virtio_pci_address(n: usize) -> Option<PciAddress> {
    let device = u8::try_from(n)
        .ok()?
        .checked_add(layout::VIRTIO_PCI_FIRST_DEVICE)?;
    PciAddress::new(0, device, 0)
}

/// The ways into bus 0: CF8/CFC (sharing its ports with `reset_control` at 0xCF9, if the
/// machine has one), and ECAM if described, trapped or shadowed.
pub fn add_windows(
    devices: &mut Devices,
    vm: &mut Vm,
    root: &Arc<PciRoot>,
    ecam: Option<EcamMode>,
    reset_control: Option<Arc<dyn BusDevice>>,
) -> Result<(), MachineError> {
    let ports = PciConfigIo::new(root.clone());
    let ports = match reset_control {
        Some(reset) => ports.with_reset_control(reset),
        None => ports,
    };
    let place = Place::Pio {
        base: PCI_CONFIG_ADDRESS_PORT,
        len: PCI_CONFIG_IO_LEN,
        device: Arc::new(ports),
    };
    let kept = Kept::Within(names::PCI_ROOT);
    devices.add(Device::new(names::PCI_PIO, place, kept.clone()))?;
    let Some(mode) = ecam else {
        return Ok(());
    };
    let window = root.window();
    assert_eq!(
        window.len() as u64,
        layout::ECAM_SIZE,
        "the window is the ECAM range"
    );
    let place = Place::Mmio {
        base: layout::ECAM_BASE,
        len: layout::ECAM_SIZE,
        device: Arc::new(PciConfigMmio::new(root.clone())),
    };
    devices.add(Device::new(names::PCI_ECAM, place, kept))?;
    if mode == EcamMode::Shadow {
        // The shadow keeps the window until its slots are deleted; the root can take a
        // function's page out of it (its reads then exit).
        let shadow =
            vm.add_readonly_region(layout::ECAM_BASE, root.shared_window(), |w| w.region())?;
        root.set_shadow(shadow);
    }
    Ok(())
}
