//! The VM-wide state KVM keeps ([`VmState`]): taken from a paused VM, set on a freshly built
//! one before its vCPUs first run.

use kvm_bindings::{
    KVM_CLOCK_TSC_STABLE, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE,
    kvm_irqchip,
};

use super::{Irqchips, VmState};
use crate::vm::{Irqchip, Vm, VmError, kvm_err};

impl Vm {
    /// The in-kernel irqchip's chips (none under a split irqchip), the PIT if the VM has one,
    /// and the KVM clock. Every vCPU must be parked (`vm::pause`): a running one changes them.
    pub fn save_state(&self) -> Result<VmState, VmError> {
        let irqchip = match self.irqchip {
            Irqchip::InKernel => Some(Irqchips {
                pic_master: self.chip(KVM_IRQCHIP_PIC_MASTER)?,
                pic_slave: self.chip(KVM_IRQCHIP_PIC_SLAVE)?,
                ioapic: self.chip(KVM_IRQCHIP_IOAPIC)?,
            }),
            Irqchip::Split { .. } => None,
        };
        let pit = match self.fd.get_pit2() {
            Ok(pit) => Some(pit),
            // No PIT was created (api.rst §4.73): there is none to save.
            Err(e) if e.errno() == libc::ENXIO => None,
            Err(e) => return Err(kvm_err("get PIT state")(e)),
        };
        let mut clock = self.fd.get_clock().map_err(kvm_err("get clock"))?;
        // Whether the clock is stable is the host's to say at restore, not the snapshot's
        // (Firecracker drops it the same way).
        clock.flags &= !KVM_CLOCK_TSC_STABLE;
        Ok(VmState {
            irqchip,
            pit,
            clock,
        })
    }

    /// Set `state`, which [`Vm::save_state`] took on a VM of the same configuration: a state
    /// with chips this VM does not have in the kernel (or without the ones it has) is refused
    /// before anything is set.
    pub fn restore_state(&self, state: &VmState) -> Result<(), VmError> {
        let mismatch = |why: String| VmError::StateMismatch(why);
        match (&state.irqchip, self.irqchip) {
            (Some(_), Irqchip::Split { .. }) => {
                return Err(mismatch(
                    "the snapshot has an in-kernel irqchip, this VM a split one".into(),
                ));
            }
            (None, Irqchip::InKernel) => {
                return Err(mismatch(
                    "the snapshot has a split irqchip, this VM an in-kernel one".into(),
                ));
            }
            _ => {}
        }
        if let Some(chips) = &state.irqchip {
            for (chip, id, name) in [
                (&chips.pic_master, KVM_IRQCHIP_PIC_MASTER, "pic_master"),
                (&chips.pic_slave, KVM_IRQCHIP_PIC_SLAVE, "pic_slave"),
                (&chips.ioapic, KVM_IRQCHIP_IOAPIC, "ioapic"),
            ] {
                if chip.chip_id != id {
                    return Err(mismatch(format!(
                        "irqchip.{name} has chip id {}, not {id}",
                        chip.chip_id
                    )));
                }
            }
            for chip in [&chips.pic_master, &chips.pic_slave, &chips.ioapic] {
                self.fd.set_irqchip(chip).map_err(kvm_err("set irqchip"))?;
            }
        }
        if let Some(pit) = &state.pit {
            self.fd.set_pit2(pit).map_err(kvm_err("set PIT state"))?;
        }
        self.fd
            .set_clock(&state.clock)
            .map_err(kvm_err("set clock"))
    }

    fn chip(&self, chip_id: u32) -> Result<kvm_irqchip, VmError> {
        let mut chip = kvm_irqchip {
            chip_id,
            ..Default::default()
        };
        self.fd
            .get_irqchip(&mut chip)
            .map_err(kvm_err("get irqchip"))?;
        Ok(chip)
    }
}
