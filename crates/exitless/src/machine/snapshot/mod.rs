//! A machine's snapshot on disk, and the errors taking or restoring one gives.
//!
//! A snapshot is a directory: guest memory's file (`memory-ID`, [`MEMORY_FILE_PREFIX`]) and the
//! description ([`description::DESCRIPTION_FILE`]: the configuration, the vCPUs', the VM's and
//! every device's state), written last. The order of operations is `crate::persist`'s; the
//! format and its checks are [`description`]'s. Described for users in docs/snapshot.md.

pub mod description;
mod directory;
mod kvm;
pub mod restore;
pub mod take;

use std::path::{Path, PathBuf};

pub use description::{
    DESCRIPTION_FILE, Description, FORMAT_VERSION, MEMORY_FILE_PREFIX, MachineState, MemoryFile,
    StateRef, check_config,
};
pub use restore::{Restorable, RestoreTimes};
pub use take::Snapshotter;

/// Why a snapshot cannot be taken or restored. Each message is one line, naming what.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A file of the snapshot cannot be made, written or read.
    #[error("cannot {what} {path}: {source}", path = .path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The host's error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot's directory that is not this user's alone, or that another snapshot holds.
    #[error("cannot use {path} for a snapshot: {why}", path = .path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why not, and what to do.
        why: String,
    },
    /// The description is not JSON with a format version, a checksum and a content.
    #[error("the snapshot's description is not one exitless wrote: {0}")]
    NotOne(serde_json::Error),
    /// Another format than this exitless reads.
    #[error(
        "the snapshot's format is version {0}; this exitless reads version {FORMAT_VERSION} \
         only (restore it with the exitless that took it)"
    )]
    FormatVersion(u32),
    /// The content does not match its checksum.
    #[error("the snapshot's description is corrupt: its content does not match its checksum")]
    Checksum,
    /// The content, although its checksum matches, is not a description.
    #[error("the snapshot's description does not hold what a snapshot holds: {0}")]
    Content(serde_json::Error),
    /// Taken by another exitless.
    #[error(
        "the snapshot was taken by exitless {0}; this is exitless {this} (restore it with the \
         exitless that took it)",
        this = env!("CARGO_PKG_VERSION")
    )]
    ExitlessVersion(String),
    /// A value of the description that no machine has, or parts that disagree.
    #[error("the snapshot's {0} is wrong: {1}")]
    Field(String, String),
    /// Guest memory's file is not as long as the machine's RAM: cut short, or another's.
    #[error(
        "the snapshot's memory file {path} is {length} bytes, not the {expected} its \
         description says (truncated, or from another snapshot)",
        path = .path.display()
    )]
    MemoryLength {
        /// The file.
        path: PathBuf,
        /// Its length.
        length: u64,
        /// The machine's RAM.
        expected: u64,
    },
    /// A disk image the machine had is gone.
    #[error(
        "the snapshot's machine had the disk {path}: {source} (put the image back where it was)",
        path = .path.display()
    )]
    Disk {
        /// The image.
        path: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: std::io::Error,
    },
    /// A device's state that cannot be saved or restored.
    #[error("device state: {0}")]
    State(crate::persist::StateError),
    /// A snapshot of a machine that is not paused.
    #[error("the VM must be paused for a snapshot")]
    NotPaused,
    /// The description could not be encoded (a host path that is not UTF-8, say).
    #[error("cannot write the snapshot's description: {0}")]
    Encode(serde_json::Error),
}

/// The path of the memory file of the snapshot in `dir`, as its description names it.
pub fn memory_path(dir: &Path) -> Result<PathBuf, SnapshotError> {
    Ok(dir.join(Description::read(dir)?.memory.file))
}

/// The error of the file operation `what` on `path`.
pub(crate) fn io_error(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.to_owned();
    move |source| SnapshotError::Io { what, path, source }
}

/// What saves a running machine into a directory: the machine's own, or a test's stand-in.
pub trait TakeSnapshot: Send + Sync {
    /// Save the machine, which must be paused, into `dir` (made if absent). The machine is
    /// as it was after, whatever happened: still paused, every device serving again.
    fn take(&self, dir: &Path) -> Result<(), SnapshotError>;
}
