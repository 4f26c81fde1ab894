//! A function's MSI-X state in a snapshot (`crate::persist`): the table as the guest wrote
//! it, and the vectors behind it (message in effect, mask, pending bit). Message Control
//! (Enable, Function Mask) and Bus Master Enable are configuration-space bytes, restored
//! before this; [`Msix::restore`] reads them there, so the vectors and the registers the guest
//! reads cannot disagree.

use serde::{Deserialize, Serialize};

use super::{Entry, Msix};
use crate::irq::MsiChange;
use crate::irq::msi::VectorState;
use crate::pci::config::ConfigSpace;
use crate::pci::regs::{
    PCI_COMMAND, PCI_COMMAND_MASTER, PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE, PCI_MSIX_FLAGS_MASKALL,
};
use crate::persist::StateError;

/// What [`Msix`] and its vectors hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsixState {
    /// Each entry's address low, address high and data dwords, as the guest wrote them.
    pub table: Vec<Entry>,
    /// Each vector.
    pub vectors: Vec<VectorState>,
}

impl Msix {
    /// The state, for a snapshot.
    pub fn save(&self) -> MsixState {
        MsixState {
            table: self.table.clone(),
            vectors: self.vectors.save(),
        }
    }

    /// Take `saved` under the MSI-X capability and command register now in `config` (restored
    /// first): the routes of every live vector committed as the strategy in force says, masked
    /// vectors still masked with their pending bits. A table of another size is an error
    /// naming `what`.
    pub fn restore(
        &mut self,
        what: &str,
        config: &ConfigSpace,
        saved: &MsixState,
    ) -> Result<(), StateError> {
        if saved.table.len() != self.table.len() {
            return Err(StateError::new(
                format!("{what}.table"),
                format_args!(
                    "{} entries, the function has {}",
                    saved.table.len(),
                    self.table.len()
                ),
            ));
        }
        let control = self
            .cap
            .map_or(0, |cap| config.get_u16(cap + PCI_MSIX_FLAGS));
        let enabled = control & PCI_MSIX_FLAGS_ENABLE != 0;
        let bits = [
            MsiChange::BusMaster(config.get_u16(PCI_COMMAND) & PCI_COMMAND_MASTER != 0),
            MsiChange::FunctionMask(control & PCI_MSIX_FLAGS_MASKALL != 0),
            MsiChange::Enable(enabled),
        ];
        self.vectors
            .restore(&format!("{what}.vectors"), &saved.vectors, bits)?;
        self.table.clone_from(&saved.table);
        // The saved vectors may hold other messages than the table: the next Enable hands
        // every unmasked entry over, as before the snapshot.
        self.stale.fill(true);
        self.enabled = enabled;
        Ok(())
    }
}
