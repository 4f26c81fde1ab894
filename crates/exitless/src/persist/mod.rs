//! Snapshot and restore, the part every layer shares: the trait a stateful device implements
//! and the error a state that cannot be taken or loaded gives.
//!
//! A snapshot is taken of a paused machine (every vCPU parked, `crate::vm::pause`): the machine
//! asks every [`Persist`] to [`Persist::pause`] (its threads stop touching guest memory and
//! raising interrupts, work in flight completes first), then to [`Persist::save`], writes guest
//! memory, and [`Persist::resume`]s them. A restore builds the same machine from the saved
//! configuration, maps guest memory, calls [`Persist::restore`] on each freshly built device and
//! then [`Persist::resume`] before any vCPU runs. The state is JSON: a snapshot is untrusted
//! input (a file anyone may have edited), so `restore` checks every value as it would a guest's.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A piece of the machine whose state a snapshot holds: a device, a function's MSI-X table, the
/// routing table. Each is registered under an id unique in its machine (its bus name or PCI
/// address), which names its state in the snapshot.
pub trait Persist: Send + Sync {
    /// Stop touching guest memory and raising interrupts, after finishing the work in flight.
    /// Most devices do nothing off a vCPU thread, so there is nothing to stop.
    fn pause(&self) -> Result<(), StateError> {
        Ok(())
    }
    /// The state, as it stands (the machine is paused).
    fn save(&self) -> Result<serde_json::Value, StateError>;
    /// Take `state`, which [`Persist::save`] wrote for a device built from the same
    /// configuration, into this device, freshly built and not yet run. Every value is checked:
    /// a bad one is an error naming it, never a panic.
    fn restore(&self, state: serde_json::Value) -> Result<(), StateError>;
    /// Start again after [`Persist::pause`] or [`Persist::restore`]: threads serve their
    /// queues from the saved positions.
    fn resume(&self) {}
}

/// A state that cannot be saved or restored: what, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {why}")]
pub struct StateError {
    /// The device and field, as `serial.ier` or `virtio-pci.00:03.0.queue[1].size`.
    pub what: String,
    /// Why it cannot be taken.
    pub why: String,
}

impl StateError {
    /// An error about `what`.
    pub fn new(what: impl Into<String>, why: impl std::fmt::Display) -> Self {
        StateError {
            what: what.into(),
            why: why.to_string(),
        }
    }
}

/// `state` as JSON; a type whose serialization fails is a bug, reported rather than panicking.
pub fn to_state<T: Serialize>(what: &str, state: &T) -> Result<serde_json::Value, StateError> {
    serde_json::to_value(state).map_err(|e| StateError::new(what, e))
}

/// `state` read back as `T`: a missing field or a value of the wrong type is an error naming
/// `what` (range checks are the caller's).
pub fn from_state<T: DeserializeOwned>(
    what: &str,
    state: serde_json::Value,
) -> Result<T, StateError> {
    serde_json::from_value(state).map_err(|e| StateError::new(what, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Regs {
        ier: u8,
        lcr: u8,
    }

    #[test]
    fn state_round_trips_and_a_bad_one_names_what() {
        let saved = to_state("serial", &Regs { ier: 1, lcr: 3 }).unwrap();
        assert_eq!(
            from_state::<Regs>("serial", saved).unwrap(),
            Regs { ier: 1, lcr: 3 }
        );
        let err =
            from_state::<Regs>("serial", serde_json::json!({"ier": 300, "lcr": 3})).unwrap_err();
        assert_eq!(err.what, "serial");
        assert!(err.why.contains("300"), "{err}");
    }
}
