//! The snapshot's KVM parts: the vCPUs' and the VM's states and guest memory, through `vm`'s
//! interfaces (issue 25's snap-vm part: `Pause::save_vcpus`, `Vm::save_state`,
//! `Vm::save_memory`). Until they are in, a snapshot is refused with that said.
// TODO(issue 25, snap-vm): replace both bodies by the calls once `vm` has them.

use std::fs::File;
use std::path::Path;

use crate::machine::snapshot::SnapshotError;
use crate::vm::Vm;
use crate::vm::run_control::RunControl;

/// Each parked vCPU's state, in index order, and the VM's.
pub fn save_states(
    _vm: &Vm,
    _control: &RunControl,
) -> Result<(Vec<serde_json::Value>, serde_json::Value), SnapshotError> {
    Err(SnapshotError::Unsupported("the vCPUs' and the VM's state"))
}

/// Guest memory into `file` (at `path`).
pub fn save_memory(_vm: &Vm, _file: &mut File, _path: &Path) -> Result<(), SnapshotError> {
    Err(SnapshotError::Unsupported("guest memory"))
}
