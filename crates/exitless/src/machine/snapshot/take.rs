//! Taking a snapshot of a paused machine, in `crate::persist`'s order: every device stops
//! (its work in flight done), the vCPUs', the VM's and the devices' states are read, guest
//! memory is written, the description last; then every device goes on.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::irq::GsiRouting;
use crate::machine::config::MachineConfig;
use crate::machine::snapshot::directory::{SnapshotDir, unique};
use crate::machine::snapshot::{
    Description, MEMORY_FILE_PREFIX, MachineState, MemoryFile, SnapshotError, TakeSnapshot,
    io_error, kvm,
};
use crate::persist::Persist;
use crate::vm::Vm;
use crate::vm::run_control::RunControl;

/// What a snapshot is taken of: the machine's VM, its run's control (which holds the parked
/// vCPUs), every stateful device, and the configuration it was built from.
pub struct Snapshotter {
    pub(crate) vm: Arc<Vm>,
    pub(crate) control: Arc<RunControl>,
    pub(crate) persist: Vec<(String, Arc<dyn Persist>)>,
    pub(crate) config: MachineConfig,
    /// The machine's GSI routing, whose commits a restore makes once for every device.
    pub(crate) routing: Arc<GsiRouting>,
    /// Its disk images' locks, which a migration hands over.
    pub(crate) image_locks: Vec<crate::virtio::block::image::ImageLock>,
    /// Its disk images' and taps' files, which a live update hands over.
    pub(crate) files: crate::machine::wiring::files::HostFiles,
    /// Its vhost-user devices' threads, whose backends a migration hands over.
    pub(crate) backends: Vec<crate::virtio::worker::WorkerHandle>,
}

impl Snapshotter {
    /// The paused machine's state: each parked vCPU's, the VM's, every stopped device's.
    pub(crate) fn save_state(&self) -> Result<MachineState, SnapshotError> {
        let (vcpus, vm) = kvm::save_states(&self.vm, &self.control)?;
        let devices = self
            .persist
            .iter()
            .map(|(id, device)| Ok((id.clone(), device.save()?)))
            .collect::<Result<BTreeMap<_, _>, crate::persist::StateError>>()
            .map_err(SnapshotError::State)?;
        Ok(MachineState { vcpus, vm, devices })
    }

    /// Stop every device; if one cannot, those stopped go on and the error is returned.
    pub(crate) fn pause_devices(&self) -> Result<(), SnapshotError> {
        for (i, (_, device)) in self.persist.iter().enumerate() {
            if let Err(e) = device.pause() {
                self.persist[..i].iter().for_each(|(_, d)| d.resume());
                return Err(SnapshotError::State(e));
            }
        }
        Ok(())
    }

    /// Every state, memory, then the description, into `dir`. The memory goes to a file of
    /// this snapshot's own name, which nothing names until the new description is renamed
    /// into place: until then the directory's older snapshot, if any, is whole and restores.
    /// Then the older snapshot's memory file goes. On failure, what was written goes.
    fn save(&self, dir: &SnapshotDir) -> Result<(), SnapshotError> {
        let MachineState { vcpus, vm, devices } = self.save_state()?;
        // What the directory held: the memory file to remove once the new snapshot is whole
        // (a description of another version, or none, names nothing exitless removes).
        let older = Description::read_from(dir).ok().map(|d| d.memory.file);
        let name = format!("{MEMORY_FILE_PREFIX}{}", unique());
        let mut memory = dir.create(&name)?;
        let path = dir.join(&name);
        let written = kvm::save_memory(&self.vm, &mut memory, &path).and_then(|crc32| {
            memory.sync_all().map_err(io_error("sync", &path))?;
            Description {
                exitless_version: env!("CARGO_PKG_VERSION").into(),
                config: self.config.clone(),
                vcpus,
                vm,
                devices,
                memory: MemoryFile {
                    file: name.clone(),
                    length: self.config.ram_size as u64,
                    crc32,
                },
            }
            .write_to(dir)
        });
        if let Err(e) = written {
            // A partial memory file is no use to anyone: it goes.
            let _ = dir.remove(&name);
            return Err(e);
        }
        if let Some(older) = older.filter(|o| *o != name) {
            // The snapshot is whole: failing to tidy the older one's file changes nothing.
            if let Err(e) = dir.remove(&older).and_then(|()| dir.sync()) {
                log::warn!("snapshot: {e}");
            }
        }
        Ok(())
    }
}

impl TakeSnapshot for Snapshotter {
    fn take(&self, dir: &Path) -> Result<(), SnapshotError> {
        if !self.control.pause().paused() {
            return Err(SnapshotError::NotPaused);
        }
        let dir = SnapshotDir::for_snapshot(dir)?;
        self.pause_devices()?;
        let saved = self.save(&dir);
        self.persist.iter().for_each(|(_, device)| device.resume());
        saved
    }
}
