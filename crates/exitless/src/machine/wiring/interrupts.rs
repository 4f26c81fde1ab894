//! Where interrupts go: the GSI routing table's owner, the userspace IOAPIC of a split
//! irqchip, and the VT-d remapping unit, whose interrupt remapping the IOAPIC and the virtio
//! devices send through when the machine has it.

use std::sync::Arc;

use super::{Device, Devices, Kept, Place, names};
use crate::iommu::Iommu;
use crate::iommu::regs::{VTD_IQT_REG, VTD_REG_SIZE};
use crate::irq::GsiRouting;
use crate::irq::ioapic::pins::PinInputs;
use crate::irq::ioapic::{IOAPIC_SOURCE_ID, Ioapic, MMIO_LEN};
use crate::irq::regs::IOAPIC_BASE;
use crate::logging::DeviceLog;
use crate::machine::config::MachineConfig;
use crate::machine::layout::MemoryLayout;
use crate::machine::{MachineError, host_err};
use crate::vm::Vm;

/// The GSI routing of `vm`, and under a split irqchip the IOAPIC's inputs, to which the
/// devices' pins are then bound and which the IOAPIC watches once it exists (after the unit
/// it sends through).
pub fn routing(
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

/// The VT-d remapping unit, placed by the layout, its IQT doorbells on `vm`.
pub fn add_iommu(
    devices: &mut Devices,
    vm: &Vm,
    layout: &mut MemoryLayout,
) -> Result<(), MachineError> {
    let log = DeviceLog::new(names::IOMMU);
    let routing = devices.routing.clone();
    let iommu = Arc::new(Iommu::new(vm.memory().clone(), routing, log.clone()));
    let base = layout.place_iommu();
    let place = Place::Mmio {
        base,
        len: VTD_REG_SIZE,
        device: iommu.clone(),
    };
    devices.add(Device::new(names::IOMMU, place, Kept::Saved(iommu.clone())).counted(log))?;
    iommu
        .attach_doorbells(vm.shared_fd(), base + VTD_IQT_REG)
        .map_err(MachineError::IommuDoorbells)?;
    devices.iommu = Some(iommu);
    Ok(())
}

/// The userspace IOAPIC on `pins`, sending through the unit's interrupt remapping for its
/// source-id if the machine has one, and its input thread.
pub fn add_ioapic(devices: &mut Devices, pins: Arc<PinInputs>) -> Result<(), MachineError> {
    let routes = match &devices.iommu {
        Some(unit) => unit.interrupt_routes(IOAPIC_SOURCE_ID),
        None => devices.routing.clone(),
    };
    let ioapic = Arc::new(Ioapic::new(routes, pins, DeviceLog::new(names::IOAPIC)));
    let place = Place::Mmio {
        base: IOAPIC_BASE,
        len: MMIO_LEN,
        device: ioapic.clone(),
    };
    let (log, kept) = (ioapic.log().clone(), Kept::Saved(ioapic.clone()));
    devices.add(Device::new(names::IOAPIC, place, kept).counted(log))?;
    let watcher = ioapic
        .spawn()
        .map_err(host_err("start the IOAPIC's thread"))?;
    devices.ioapic = Some(watcher);
    Ok(())
}
