//! Taking a snapshot of a paused machine, in `crate::persist`'s order: every device stops
//! (its work in flight done), the vCPUs', the VM's and the devices' states are read, guest
//! memory is written, the description last; then every device goes on.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::irq::GsiRouting;
use crate::machine::config::MachineConfig;
use crate::machine::snapshot::{
    DESCRIPTION_FILE, Description, MEMORY_FILE, MemoryFile, SnapshotError, TakeSnapshot, kvm,
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
}

/// The error of the file operation `what` on `path`.
pub(crate) fn io_error(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.to_owned();
    move |source| SnapshotError::Io { what, path, source }
}

/// A temporary name in `dir` for the file `name` while it is written, then renamed into place:
/// this process's and this moment's, so two snapshots into one directory never write the same
/// file, and a name someone else prepared there is not one [`create_new`] will open.
pub(crate) fn temporary(dir: &Path, name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    dir.join(format!(".{name}.{}-{nanos}.tmp", std::process::id()))
}

/// Create the snapshot's file at `path`, which must not exist, owner-only (0600): it holds the
/// guest's memory or state, as private as the guest's RAM. Nothing already there is followed
/// or opened: a symlink, a FIFO or a file of someone else's at that name is an error (O_EXCL,
/// O_NOFOLLOW; O_NONBLOCK so that no open can wait).
pub(crate) fn create_new(path: &Path) -> Result<File, SnapshotError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .mode(0o600)
        .open(path)
        .map_err(io_error("create", path))
}

/// Open the snapshot's file at `path` to read, refused unless it is a regular file. Opened
/// with O_NONBLOCK: a FIFO put in a snapshot's place must not hang the open (the flag changes
/// nothing for a regular file's reads).
pub(crate) fn open_regular(path: &Path) -> Result<File, SnapshotError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io_error("open", path))?;
    let meta = file.metadata().map_err(io_error("read", path))?;
    if !meta.is_file() {
        let source = std::io::Error::other("not a regular file");
        return Err(io_error("use", path)(source));
    }
    Ok(file)
}

impl Snapshotter {
    /// Stop every device; if one cannot, those stopped go on and the error is returned.
    fn pause_devices(&self) -> Result<(), SnapshotError> {
        for (i, (_, device)) in self.persist.iter().enumerate() {
            if let Err(e) = device.pause() {
                self.persist[..i].iter().for_each(|(_, d)| d.resume());
                return Err(SnapshotError::State(e));
            }
        }
        Ok(())
    }

    /// Every state, memory, then the description, into `dir`.
    fn save(&self, dir: &Path) -> Result<(), SnapshotError> {
        let (vcpus, vm) = kvm::save_states(&self.vm, &self.control)?;
        let devices = self
            .persist
            .iter()
            .map(|(id, device)| Ok((id.clone(), device.save()?)))
            .collect::<Result<BTreeMap<_, _>, crate::persist::StateError>>()
            .map_err(SnapshotError::State)?;
        // Written beside and renamed into place: a machine restored from this directory maps
        // its memory file MAP_PRIVATE and reads the pages it has not touched from it, so that
        // file must never change; renamed over, it lives on (unlinked) for that machine.
        let temp = temporary(dir, MEMORY_FILE);
        let mut memory = create_new(&temp)?;
        let written = kvm::save_memory(&self.vm, &mut memory, &temp)
            .and_then(|()| memory.sync_all().map_err(io_error("sync", &temp)));
        if let Err(e) = written {
            // A partial memory file is no use to anyone: it goes.
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        let path = dir.join(MEMORY_FILE);
        std::fs::rename(&temp, &path).map_err(io_error("rename into place", &path))?;
        Description {
            exitless_version: env!("CARGO_PKG_VERSION").into(),
            config: self.config.clone(),
            vcpus,
            vm,
            devices,
            memory: MemoryFile {
                file: MEMORY_FILE.into(),
                length: self.config.ram_size as u64,
            },
        }
        .write(dir)
    }
}

impl TakeSnapshot for Snapshotter {
    fn take(&self, dir: &Path) -> Result<(), SnapshotError> {
        if !self.control.pause().paused() {
            return Err(SnapshotError::NotPaused);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_error("make the directory", dir))?;
        // An older snapshot's description goes first: from here until the new one is
        // written, the directory holds no description that its memory file would belie.
        let old = dir.join(DESCRIPTION_FILE);
        match std::fs::remove_file(&old) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io_error("remove the older", &old)(e));
            }
            _ => {}
        }
        self.pause_devices()?;
        let saved = self.save(dir);
        self.persist.iter().for_each(|(_, device)| device.resume());
        saved
    }
}
