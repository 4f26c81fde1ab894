//! Bus 0 in a snapshot (`crate::persist`): every function's configuration space and its own
//! state, under its address. At restore the functions were built by the same configuration
//! (same addresses, same layouts); each takes its configuration space, then its state (MSI-X,
//! a virtio transport's registers), and only then are the BARs placed where the guest had
//! programmed them, all functions' at once, so that BARs that traded places find their
//! ranges free. A BAR whose decoding is on outside the host bridge's windows is refused: no
//! guest's would decode there, so the snapshot was edited.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Function, FunctionState, PciRoot};
use crate::pci::regs::{PCI_COMMAND, PCI_COMMAND_IO, PCI_COMMAND_MEMORY};
use crate::persist::{Persist, StateError, from_state, to_state};

/// The snapshot's id and the first part of every error's field name.
const ID: &str = "pci";

/// One function.
#[derive(Serialize, Deserialize)]
struct SavedFunction {
    /// Its 4 KiB of configuration space.
    config: Vec<u8>,
    /// Its own state, if it has any.
    state: Option<serde_json::Value>,
}

impl PciRoot {
    /// Every function, in address order, with its address as the snapshot names it.
    fn all(&self) -> Vec<(String, Arc<Function>)> {
        let functions = self.functions.read().unwrap();
        functions
            .values()
            .map(|f| (f.lock().unwrap().address.to_string(), f.clone()))
            .collect()
    }

    /// Check that every BAR whose decoding is enabled lies inside its window.
    fn check_bars(&self, what: &str, st: &FunctionState) -> Result<(), StateError> {
        let command = st.config.get_u16(PCI_COMMAND);
        for placed in &st.bars {
            let enable = if placed.bar.is_io() {
                PCI_COMMAND_IO
            } else {
                PCI_COMMAND_MEMORY
            };
            let base = st.config.bar_address(placed.slot, &placed.bar);
            if command & enable != 0 && !self.forwards(&placed.bar, base) {
                return Err(StateError::new(
                    format!("{what}.bar[{}]", placed.slot),
                    format_args!(
                        "{base:#x} (+{:#x}) decodes outside the host bridge's windows",
                        placed.bar.size()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn restore_function(
        &self,
        what: &str,
        function: &Function,
        saved: SavedFunction,
    ) -> Result<(), StateError> {
        let mut st = function.lock().unwrap();
        st.config.restore(what, &saved.config)?;
        self.check_bars(what, &st)?;
        let FunctionState {
            config, function, ..
        } = &mut *st;
        function.restore(what, config, saved.state)
    }
}

impl Persist for PciRoot {
    fn pause(&self) -> Result<(), StateError> {
        for (_, f) in self.all() {
            f.lock().unwrap().function.pause()?;
        }
        Ok(())
    }

    fn save(&self) -> Result<serde_json::Value, StateError> {
        let mut saved = BTreeMap::new();
        for (address, f) in self.all() {
            let st = f.lock().unwrap();
            let function = SavedFunction {
                config: st.config.save(),
                state: st.function.save()?,
            };
            saved.insert(address, function);
        }
        to_state(ID, &saved)
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let mut saved: BTreeMap<String, SavedFunction> = from_state(ID, state)?;
        let functions = self.all();
        for (address, _) in &functions {
            if !saved.contains_key(address) {
                return Err(StateError::new(
                    format!("{ID}.{address}"),
                    "missing from the snapshot",
                ));
            }
        }
        if let Some(extra) = saved
            .keys()
            .find(|a| !functions.iter().any(|(address, _)| address == *a))
        {
            return Err(StateError::new(
                format!("{ID}.{extra}"),
                "no such function in this machine",
            ));
        }
        for (address, f) in &functions {
            let state = saved.remove(address).expect("checked above");
            self.restore_function(&format!("{ID}.{address}"), f, state)?;
        }
        for (_, f) in &functions {
            let mut st = f.lock().unwrap();
            let devfn = st.address.devfn();
            self.update_read_hook(devfn, st.function.read_hooked());
            self.sync_decoding(&mut st);
        }
        self.retry_refused();
        Ok(())
    }

    fn resume(&self) {
        for (_, f) in self.all() {
            f.lock().unwrap().function.resume();
        }
    }
}

#[cfg(test)]
mod tests;
