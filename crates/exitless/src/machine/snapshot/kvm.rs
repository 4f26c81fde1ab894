//! The snapshot's KVM parts, through `vm`'s interfaces: each parked vCPU's state, the VM's
//! (irqchip, PIT, clock) and guest memory, saved as the description and the memory file hold
//! them, and read back from a description (every value checked: it is untrusted JSON).

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use crate::machine::snapshot::SnapshotError;
use crate::persist::{StateError, from_state, to_state};
use crate::vm::run_control::RunControl;
use crate::vm::state::{VcpuState, VmState};
use crate::vm::{Vm, VmError};

/// Longest the vCPUs may take to give their state: each is parked, so answers at once.
const CAPTURE_DEADLINE: Duration = Duration::from_secs(5);

/// Each parked vCPU's state, in index order, and the VM's, as the description holds them.
pub fn save_states(
    vm: &Vm,
    control: &RunControl,
) -> Result<(Vec<serde_json::Value>, serde_json::Value), SnapshotError> {
    let vcpus = control
        .pause()
        .save_vcpus(CAPTURE_DEADLINE)
        .map_err(|e| SnapshotError::State(StateError::new("vcpus", e)))?;
    let vcpus = vcpus
        .iter()
        .enumerate()
        .map(|(i, state)| to_state(&format!("vcpus[{i}]"), state))
        .collect::<Result<Vec<_>, _>>()
        .map_err(SnapshotError::State)?;
    let state = vm.save_state().map_err(vm_error("vm"))?;
    let state = to_state("vm", &state).map_err(SnapshotError::State)?;
    Ok((vcpus, state))
}

/// Guest memory into `file` (at `path`); its checksum.
pub fn save_memory(vm: &Vm, file: &mut File, path: &Path) -> Result<u32, SnapshotError> {
    vm.save_memory(file).map_err(|e| match e {
        VmError::MemoryFile { what, source } => SnapshotError::Io {
            what,
            path: path.to_owned(),
            source,
        },
        e => SnapshotError::State(StateError::new("memory", e)),
    })
}

/// The description's vCPU and VM states, read back.
pub fn read_states(
    vcpus: &[serde_json::Value],
    vm: &serde_json::Value,
) -> Result<(Vec<VcpuState>, VmState), SnapshotError> {
    let vcpus = vcpus
        .iter()
        .enumerate()
        .map(|(i, state)| from_state(&format!("vcpus[{i}]"), state.clone()))
        .collect::<Result<Vec<VcpuState>, _>>()
        .map_err(SnapshotError::State)?;
    let vm = from_state("vm", vm.clone()).map_err(SnapshotError::State)?;
    Ok((vcpus, vm))
}

/// A KVM refusal of the state of `what`, as a snapshot error naming it.
pub fn vm_error(what: &'static str) -> impl Fn(VmError) -> SnapshotError {
    move |e| SnapshotError::State(StateError::new(what, e))
}
