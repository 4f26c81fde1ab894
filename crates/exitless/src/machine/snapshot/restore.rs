//! Restoring a snapshot: opening it (the description read and checked, guest memory's file
//! open and of the right length, the disk images the machine had still there: everything a
//! restore can be refused for before anything is built), building the machine from it and
//! setting its state in `crate::persist`'s order.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::irq::IrqError;
use crate::machine::config::MachineConfig;
use crate::machine::snapshot::directory::SnapshotDir;
use crate::machine::snapshot::io_error;
use crate::machine::snapshot::{Description, SnapshotError, Snapshotter, StateRef, kvm};
use crate::machine::vcpus::Vcpus;
use crate::machine::{Board, Machine, MachineError, Ran};
use crate::persist::StateError;
use crate::vm::state::memory::SavedMemory;

/// How long each step of [`Machine::restore_state_timed`] took.
#[derive(Clone, Copy, Debug, Default)]
pub struct RestoreTimes {
    /// The VM's state read from the description and set (irqchip, PIT, clock).
    pub vm: Duration,
    /// The vCPUs created and their states set.
    pub vcpus: Duration,
    /// Every device's state set and every device resumed (routes and irqfds included).
    pub devices: Duration,
}

/// A snapshot read and checked, its memory file open: what a machine is restored from.
pub struct Restorable {
    /// What the snapshot holds.
    pub description: Description,
    /// Guest memory's file, of the description's length, and its checksum.
    pub memory: SavedMemory,
}

impl Restorable {
    /// Read the snapshot in `dir`, refusing it (one line naming what) if the directory is not
    /// this user's alone or a snapshot is being taken into it, its description is of another
    /// version or corrupt, its memory file missing or not of the machine's RAM, or a disk image
    /// of the machine's gone. The memory file, once open, is this restore's whatever is done
    /// to the directory after; its pages are checked against the checksum as they are copied.
    pub fn open(dir: &Path) -> Result<Self, SnapshotError> {
        let dir = SnapshotDir::for_restore(dir)?;
        let description = Description::read_from(&dir)?;
        let path = dir.join(&description.memory.file);
        let memory = dir.open_regular(&description.memory.file)?;
        let meta = memory.metadata().map_err(io_error("read", &path))?;
        if meta.len() != description.memory.length {
            return Err(SnapshotError::MemoryLength {
                path,
                length: meta.len(),
                expected: description.memory.length,
            });
        }
        // A vhost-user disk's image is its backend's; an image exitless opens must be there.
        let images = description.config.disks.iter();
        for disk in images.filter(|d| d.vhost_user.is_none()) {
            std::fs::metadata(&disk.path).map_err(|source| SnapshotError::Disk {
                path: disk.path.clone(),
                source,
            })?;
        }
        let checksum = description.memory.crc32;
        Ok(Restorable {
            description,
            memory: SavedMemory {
                file: memory,
                checksum,
            },
        })
    }
}

impl Machine {
    /// Build the machine `cfg` describes (a snapshot's configuration), with `board`'s devices
    /// if any (the same board as the snapshot's machine), guest RAM copied from `memory`, the
    /// snapshot's memory file; [`Machine::restore_state`] then sets its state.
    pub fn restore(
        cfg: &MachineConfig,
        board: Option<&mut dyn Board>,
        memory: SavedMemory,
    ) -> Result<Self, MachineError> {
        Self::build(cfg, board, Some(memory))
    }

    /// Set `saved`'s states on the machine [`Machine::restore`] built, in `crate::persist`'s
    /// order: the VM's interrupt controllers, PIT and clock; each vCPU (created here); each
    /// device, then every device resumes. The vCPUs are returned for
    /// [`Machine::run_vcpus`]. Once per machine.
    pub fn restore_state(&self, saved: StateRef<'_>) -> Result<Vcpus, MachineError> {
        self.restore_state_timed(saved).map(|(vcpus, _)| vcpus)
    }

    /// [`Machine::restore_state`], and how long each step took (`exitless bench restore`).
    pub fn restore_state_timed(
        &self,
        saved: StateRef<'_>,
    ) -> Result<(Vcpus, RestoreTimes), MachineError> {
        let (vcpus, mut times) = self.set_state(saved)?;
        let resumed = Instant::now();
        self.resume_devices();
        times.devices += resumed.elapsed();
        Ok((vcpus, times))
    }

    /// Every device goes on from the state [`Machine::set_state`] gave it: their threads
    /// serve their queues (a vhost-user backend its rings).
    pub(crate) fn resume_devices(&self) {
        let devices = &self.snapshotter.persist;
        devices.iter().for_each(|(_, device)| device.resume());
    }

    /// [`Machine::restore_state`] but for the devices' resume, which a migration's target
    /// holds back until the source has let the machine go: on the same host its devices may
    /// share the source's tap, images and memory.
    pub(crate) fn set_state(
        &self,
        saved: StateRef<'_>,
    ) -> Result<(Vcpus, RestoreTimes), MachineError> {
        let start = Instant::now();
        let (vcpu_states, vm_state) = kvm::read_states(saved.vcpus, saved.vm)?;
        self.vm
            .restore_state(&vm_state)
            .map_err(kvm::vm_error("vm"))?;
        let vm = start.elapsed();
        let vcpus = Vcpus::create(&self.vm, self.vcpus, &self.cpu)?;
        vcpus
            .set_states(&vcpu_states)
            .map_err(kvm::vm_error("vcpus"))?;
        let vcpus_done = start.elapsed();
        self.snapshotter.restore_devices(saved.devices)?;
        let times = RestoreTimes {
            vm,
            vcpus: vcpus_done - vm,
            devices: start.elapsed() - vcpus_done,
        };
        Ok((vcpus, times))
    }

    /// [`Machine::restore_state`], then run the vCPUs on from where the snapshot left them
    /// until the run stops or `timeout` passes. Once per machine.
    pub fn run_restored(
        &self,
        saved: &Description,
        timeout: Duration,
    ) -> Result<Ran, MachineError> {
        let vcpus = self.restore_state(saved.state())?;
        self.run_vcpus(vcpus, timeout)
    }
}

impl Snapshotter {
    /// Give every device its saved state: a state for a device this machine lacks, or a
    /// device with none, is refused before any is set.
    fn restore_devices(
        &self,
        saved: &BTreeMap<String, serde_json::Value>,
    ) -> Result<(), SnapshotError> {
        let field = |why: String| SnapshotError::Field("devices".into(), why);
        let has = |id: &String| self.persist.iter().any(|(d, _)| d == id);
        if let Some(id) = saved.keys().find(|id| !has(id)) {
            return Err(field(format!(
                "a state for `{id}`, which the machine lacks"
            )));
        }
        if let Some((id, _)) = self.persist.iter().find(|(id, _)| !saved.contains_key(id)) {
            return Err(field(format!("no state for `{id}`")));
        }
        // Every vector table's routes in one commit (`GsiRouting::commit_once`).
        let restored = self.routing.commit_once(|| {
            self.persist
                .iter()
                .try_for_each(|(id, device)| device.restore(saved[id].clone()))
        });
        let routing = |e: IrqError| StateError::new("gsi-routing", format_args!("{e}"));
        restored
            .map_err(routing)
            .and_then(|r| r)
            .map_err(SnapshotError::State)?;
        Ok(())
    }
}
