//! A vector table's state in a snapshot (`crate::persist`), and its restore: each vector's
//! message, mask and pending bit, put back in one [`MsiVectors::update`] so that the routes of
//! every live vector are committed as the strategy in force says (per-vector: one commit per
//! vector; batched: one for the table; first use: staged, committed at each vector's first
//! message; direct: none), counted in the commit statistics like any guest access. A vector
//! masked at snapshot time stays masked and keeps its pending bit, which fires once at unmask.

use serde::{Deserialize, Serialize};

use super::{MsiChange, MsiVectors};
use crate::persist::StateError;

/// One vector as a snapshot keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VectorState {
    /// The message in effect: address.
    pub address: u64,
    /// The message in effect: data.
    pub data: u32,
    /// Its mask bit.
    pub masked: bool,
    /// Its pending bit.
    pub pending: bool,
}

impl MsiVectors {
    /// Every vector's message, mask and pending bit, for a snapshot. The table-wide bits
    /// (enable, function mask, Bus Master) are the transport's registers.
    pub fn save(&self) -> Vec<VectorState> {
        let st = self.state.lock().unwrap();
        st.vectors
            .iter()
            .map(|v| VectorState {
                address: v.address,
                data: v.data,
                masked: v.masked,
                pending: v.pending,
            })
            .collect()
    }

    /// Restore `saved` under the table-wide `bits` (enable, function mask, Bus Master, as the
    /// transport's registers hold them): one update, so routes are committed per the strategy
    /// in force, then the pending bits, of which only a deliverable vector's (none in a
    /// consistent snapshot) is sent now. A count that differs is an error naming `what`.
    pub fn restore(
        &self,
        what: &str,
        saved: &[VectorState],
        bits: [MsiChange; 3],
    ) -> Result<(), StateError> {
        if saved.len() != self.count {
            return Err(StateError::new(
                what,
                format_args!("{} vectors, the table has {}", saved.len(), self.count),
            ));
        }
        let mut changes = bits.to_vec();
        for (index, v) in saved.iter().enumerate() {
            // A vector never programmed keeps the zero message it starts with, unlogged.
            if (v.address, v.data) != (0, 0) {
                changes.push(MsiChange::Program {
                    index,
                    address: v.address,
                    data: v.data,
                });
            }
            changes.push(MsiChange::Mask {
                index,
                masked: v.masked,
            });
        }
        self.changing(|st| {
            self.apply(st, &changes);
            for (v, s) in st.vectors.iter_mut().zip(saved) {
                v.pending = s.pending;
            }
            self.flush_pending(st);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests;
