//! Opening a snapshot to restore: the description read and checked, guest memory's file open
//! and of the right length, the host files the machine had still there. Everything a restore
//! can be refused for is found here, before anything is built.

use std::fs::File;
use std::path::Path;

use crate::machine::snapshot::take::io_error;
use crate::machine::snapshot::{Description, SnapshotError};

/// A snapshot read and checked, its memory file open: what a machine is restored from.
pub struct Restorable {
    /// What the snapshot holds.
    pub description: Description,
    /// Guest memory's file, of the description's length.
    pub memory: File,
}

impl Restorable {
    /// Read the snapshot in `dir`, refusing it (one line naming what) if its description is of
    /// another version or corrupt, its memory file missing or not of the machine's RAM, or a
    /// disk image of the machine's gone.
    pub fn open(dir: &Path) -> Result<Self, SnapshotError> {
        let description = Description::read(dir)?;
        let path = dir.join(&description.memory.file);
        let memory = File::open(&path).map_err(io_error("open", &path))?;
        let meta = memory.metadata().map_err(io_error("read", &path))?;
        if !meta.is_file() || meta.len() != description.memory.length {
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
        Ok(Restorable {
            description,
            memory,
        })
    }
}
