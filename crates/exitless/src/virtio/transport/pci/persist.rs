//! A virtio-pci function in a snapshot (`crate::persist`), beside its configuration space
//! (which the root saves): the common registers, interrupt state and queue positions
//! ([`crate::virtio::transport::persist`]) and the MSI-X table with its vectors. At restore the
//! configuration space is back first, so Bus Master Enable and MSI-X Enable / Function Mask
//! are read there; the doorbells follow BAR 0 when the root places it.

use serde::{Deserialize, Serialize};

use super::VirtioPci;
use crate::pci::config::ConfigSpace;
use crate::pci::msix::MsixState;
use crate::pci::regs::{PCI_COMMAND, PCI_COMMAND_MASTER};
use crate::persist::{StateError, from_state, to_state};
use crate::virtio::state::StatusChange;
use crate::virtio::transport::persist::CommonState;

/// What a virtio-pci function saves.
#[derive(Serialize, Deserialize)]
struct PciState {
    common: CommonState,
    msix: MsixState,
}

impl VirtioPci {
    /// The name errors about pause and save give: the function's log's.
    fn what(&self) -> String {
        self.core.log.name().to_owned()
    }

    pub(super) fn snapshot_pause(&mut self) -> Result<(), StateError> {
        let what = self.what();
        self.phase.pause(&what, &self.core.worker)
    }

    pub(super) fn snapshot_save(&self) -> Result<Option<serde_json::Value>, StateError> {
        let what = self.what();
        let st = self.core.state.lock().unwrap();
        let state = PciState {
            common: self.phase.save(&what, &st, &self.core.interrupts)?,
            msix: self.msix.save(),
        };
        to_state(&what, &state).map(Some)
    }

    pub(super) fn snapshot_restore(
        &mut self,
        what: &str,
        config: &ConfigSpace,
        state: Option<serde_json::Value>,
    ) -> Result<(), StateError> {
        let state = state.ok_or_else(|| StateError::new(what, "no virtio-pci state"))?;
        let saved: PciState = from_state(what, state)?;
        let mut st = self.core.state.lock().unwrap();
        self.phase.restore(
            what,
            &mut st,
            &self.core.worker,
            &self.core.interrupts,
            &saved.common,
        )?;
        drop(st);
        // Without Bus Master Enable the device thread leaves the rings alone (PCI 3.0 §6.2.2).
        let master = config.get_u16(PCI_COMMAND) & PCI_COMMAND_MASTER != 0;
        self.core.dma.bus_master().set(master);
        self.msix
            .restore(&format!("{what}.msix"), config, &saved.msix)?;
        // A reset the device thread was late for when the snapshot was taken: done now, as
        // the driver, reading the status until it is 0, waits for it.
        if saved.common.registers.reset_pending {
            let mut st = self.core.state.lock().unwrap();
            if self.core.write_status(&mut st, 0) == StatusChange::Reset {
                self.after_reset();
            }
        }
        Ok(())
    }

    pub(super) fn snapshot_resume(&mut self) {
        let st = self.core.state.lock().unwrap();
        self.phase.resume(&st, &self.core.worker, &self.core.dma);
    }
}

#[cfg(test)]
mod tests;
