//! A snapshot's directory, opened for one snapshot or one restore: checked to be this user's
//! alone and locked for the while.
//!
//! Whoever can write a directory can put links, FIFOs or files of their own where a snapshot's
//! files go, or later edit a description (resealing its checksum) to name any file as a disk
//! for the next restore; so a directory owned by another user, or writable by its group or by
//! others, is refused, for a snapshot as for a restore. The directory is opened without
//! following a link at its last component and checked on that descriptor, and every file in it
//! is then created, opened, renamed and removed relative to that descriptor (openat(2) and its
//! kin), so what was checked is what is used even if the path is moved meanwhile. By hand on
//! libc: std has no `*at` calls, and no crate of the tree wraps them.
//!
//! The lock is flock(2) on that descriptor: exclusive while a snapshot is written, shared while
//! a restore reads the description and opens the memory file it names. It is taken without
//! waiting: a second snapshot into a directory one is being written into is refused, not
//! queued behind it (the API thread serves one request at a time).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::machine::snapshot::SnapshotError;
use crate::machine::snapshot::io_error;

/// A name for the file `name` while it is written, then renamed into place: this process's
/// and this moment's, so two snapshots never write the same file, and a name someone else
/// prepared is not one [`SnapshotDir::create`] will open.
pub(crate) fn temporary(name: &str) -> String {
    format!(".{name}.{}.tmp", unique())
}

/// This process's id and this moment, in nanoseconds: `PID-NANOS`.
pub(crate) fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

/// Whether `name` names a file in a directory: never a path, nor one that leads out of it.
pub(crate) fn is_file_name(name: &str) -> bool {
    !(name.is_empty() || name.contains('/') || name == "." || name == "..")
}

/// A snapshot's directory, checked and locked until dropped.
pub(crate) struct SnapshotDir {
    path: PathBuf,
    /// The open directory, which holds the lock.
    dir: File,
}

/// What the directory is opened for: the lock each takes.
#[derive(Clone, Copy, PartialEq)]
enum Purpose {
    Snapshot,
    Restore,
}

impl SnapshotDir {
    /// The destination of a snapshot, made if absent (mode 0700), locked exclusively.
    pub(crate) fn for_snapshot(path: &Path) -> Result<Self, SnapshotError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(io_error("make the directory", path))?;
        Self::open(path, Purpose::Snapshot)
    }

    /// The snapshot to restore, locked shared: no snapshot is being written into it meanwhile.
    pub(crate) fn for_restore(path: &Path) -> Result<Self, SnapshotError> {
        Self::open(path, Purpose::Restore)
    }

    fn open(path: &Path, purpose: Purpose) -> Result<Self, SnapshotError> {
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(path)
            .map_err(io_error("open the directory", path))?;
        let meta = dir.metadata().map_err(io_error("read", path))?;
        // SAFETY: geteuid has no arguments and cannot fail.
        let user = unsafe { libc::geteuid() };
        let refuse = |why: String| {
            Err(SnapshotError::Directory {
                path: path.to_owned(),
                why,
            })
        };
        if meta.uid() != user {
            return refuse(format!(
                "it is owned by user {}, not by this one ({user}); use a directory of your own",
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return refuse(format!(
                "its group or others may write it (mode {:o}); chmod go-w it or use another",
                meta.mode() & 0o7777
            ));
        }
        let lock = match purpose {
            Purpose::Snapshot => libc::LOCK_EX,
            Purpose::Restore => libc::LOCK_SH,
        };
        // SAFETY: flock takes a descriptor this function owns; nothing else is read.
        if unsafe { libc::flock(dir.as_raw_fd(), lock | libc::LOCK_NB) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::WouldBlock {
                return refuse(match purpose {
                    Purpose::Snapshot => "another snapshot is being taken into it, or restored \
                                          from it; try again when that is done, or use another \
                                          directory"
                        .into(),
                    Purpose::Restore => "a snapshot is being taken into it; restore it when \
                                         that is done"
                        .into(),
                });
            }
            return Err(io_error("lock", path)(error));
        }
        Ok(SnapshotDir {
            path: path.to_owned(),
            dir,
        })
    }

    /// `name` as a C string, refused unless it is a [`is_file_name`] (and has no NUL).
    fn c_name(&self, name: &str) -> Result<CString, SnapshotError> {
        let bad = || io_error("use", &self.join(name))(std::io::ErrorKind::InvalidInput.into());
        if !is_file_name(name) {
            return Err(bad());
        }
        CString::new(name).map_err(|_| bad())
    }

    /// `name`'s path, for messages.
    pub(crate) fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Create the file `name`, which must not exist, owner-only (0600): it holds the guest's
    /// memory or state, as private as the guest's RAM. Nothing already there is followed or
    /// opened: a symlink, a FIFO or someone's file at that name is an error (O_EXCL,
    /// O_NOFOLLOW; O_NONBLOCK, so that no open can wait).
    pub(crate) fn create(&self, name: &str) -> Result<File, SnapshotError> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        self.open_at(name, flags | libc::O_NONBLOCK, "create")
    }

    /// Open the file `name` to read, refused unless it is a regular file (a link is not
    /// followed; O_NONBLOCK: a FIFO put in a snapshot's place must not hang the open, and the
    /// flag changes nothing for a regular file's reads).
    pub(crate) fn open_regular(&self, name: &str) -> Result<File, SnapshotError> {
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK;
        let file = self.open_at(name, flags, "open")?;
        let meta = file
            .metadata()
            .map_err(io_error("read", &self.join(name)))?;
        if !meta.is_file() {
            let source = std::io::Error::other("not a regular file");
            return Err(io_error("use", &self.join(name))(source));
        }
        Ok(file)
    }

    fn open_at(
        &self,
        name: &str,
        flags: libc::c_int,
        what: &'static str,
    ) -> Result<File, SnapshotError> {
        let c_name = self.c_name(name)?;
        // SAFETY: openat reads the NUL-terminated name; the descriptor it returns, if any, is
        // new and owned by the File made of it.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                c_name.as_ptr(),
                flags | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(io_error(what, &self.join(name))(
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Rename `from` to `to` in the directory, replacing `to` whole (rename(2)).
    pub(crate) fn rename(&self, from: &str, to: &str) -> Result<(), SnapshotError> {
        let (c_from, c_to) = (self.c_name(from)?, self.c_name(to)?);
        let fd = self.dir.as_raw_fd();
        // SAFETY: renameat reads the two NUL-terminated names.
        if unsafe { libc::renameat(fd, c_from.as_ptr(), fd, c_to.as_ptr()) } != 0 {
            let error = std::io::Error::last_os_error();
            return Err(io_error("rename into place", &self.join(to))(error));
        }
        Ok(())
    }

    /// Remove the file `name` (a link itself, never what it points to).
    pub(crate) fn remove(&self, name: &str) -> Result<(), SnapshotError> {
        let c_name = self.c_name(name)?;
        // SAFETY: unlinkat reads the NUL-terminated name.
        if unsafe { libc::unlinkat(self.dir.as_raw_fd(), c_name.as_ptr(), 0) } != 0 {
            let error = std::io::Error::last_os_error();
            return Err(io_error("remove", &self.join(name))(error));
        }
        Ok(())
    }

    /// Sync the directory: the renames and removals in it are on disk.
    pub(crate) fn sync(&self) -> Result<(), SnapshotError> {
        self.dir.sync_all().map_err(io_error("sync", &self.path))
    }
}
