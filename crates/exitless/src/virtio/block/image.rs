//! A disk image on the host: opened, checked, locked and sized before a virtio-blk device
//! takes it.
//!
//! An image is a regular file or a block device; anything else (a directory, a character
//! device such as `/dev/null`, a FIFO, a socket) is refused by name, and opening never blocks
//! (a FIFO's `open(2)` waits for a writer unless `O_NONBLOCK` is given, fifo(7)). A block
//! device's size comes from `BLKGETSIZE64`, a file's from its length.
//!
//! Images are locked as QEMU locks them (block/file-posix.c), so that two VMs, exitless or
//! QEMU, never write one image at once: open file description locks (fcntl(2), "Open file
//! description locks"), each a shared lock on one byte. Byte 100 + n is held by every user of
//! permission n, byte 200 + n by every user that does not let others have permission n
//! (`RAW_LOCK_PERM_BASE`, `RAW_LOCK_SHARED_BASE`); an opener takes its own bytes, then looks
//! for another's lock on the bytes that conflict with its own (`raw_check_lock_bytes`).

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::host_file;
use crate::seccomp::BLKGETSIZE64;

/// QEMU's permissions on an image, by bit (include/block/block-common.h, `BLK_PERM_*`), with
/// the names its messages give them.
const PERMISSIONS: [&str; 4] = ["consistent read", "write", "write unchanged", "resize"];
const CONSISTENT_READ: u32 = 1 << 0;
const WRITE: u32 = 1 << 1;
const RESIZE: u32 = 1 << 3;
/// Byte `PERM_BASE + n`: held by each user of permission `n`.
const PERM_BASE: i64 = 100;
/// Byte `SHARED_BASE + n`: held by each user that does not share permission `n`.
const SHARED_BASE: i64 = 200;

/// Why a disk image cannot be used. Each message is one line that says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The path cannot be opened (or its kind read).
    #[error("cannot open the disk {path}: {source}")]
    Open {
        /// The path.
        path: PathBuf,
        /// The error opening it.
        #[source]
        source: io::Error,
    },
    /// Not a regular file or a block device.
    #[error("the disk {path} is {what}, not a disk image: give a regular file or a block device")]
    NotAnImage {
        /// The path.
        path: PathBuf,
        /// What it is.
        what: &'static str,
    },
    /// The image of an earlier disk of the same machine, maybe through another path.
    #[error(
        "the disk {path} is the same image as the disk {first}: each disk needs an image of \
         its own"
    )]
    Twice {
        /// The path.
        path: PathBuf,
        /// The earlier disk's path.
        first: PathBuf,
    },
    /// Another process's lock conflicts with this use of the image.
    #[error(
        "the disk {path} is in use by another process (its \"{permission}\" lock): stop that \
         process first, or add ,locking=off if the two may share the image"
    )]
    InUse {
        /// The path.
        path: PathBuf,
        /// The permission, by QEMU's name, that the other process holds or denies.
        permission: &'static str,
    },
    /// The locks cannot be taken or tested (a file system without them).
    #[error("cannot lock the disk {path}: {source} (add ,locking=off to use it unlocked)")]
    Lock {
        /// The path.
        path: PathBuf,
        /// The error from fcntl(2).
        #[source]
        source: io::Error,
    },
    /// Its size cannot be read.
    #[error("cannot read the size of the disk {path}: {source}")]
    Size {
        /// The path.
        path: PathBuf,
        /// The error reading it.
        #[source]
        source: io::Error,
    },
}

/// An open image and what the device needs to know of it.
#[derive(Debug)]
pub struct DiskImage {
    /// The file or block device, opened read-only if `read_only`.
    pub file: File,
    /// Its size in bytes.
    pub bytes: u64,
    /// Whether the guest may only read it.
    pub read_only: bool,
}

impl DiskImage {
    /// `file`, opened already (read-only if `read_only`), sized: no kind checks, no locks.
    pub fn from_file(file: File, read_only: bool) -> io::Result<Self> {
        let bytes = size(&file, &file.metadata()?)?;
        Ok(DiskImage {
            file,
            bytes,
            read_only,
        })
    }
}

/// Which image a file is: two paths to one file (links, `..`), or two nodes of one block
/// device, are one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Identity {
    File { dev: u64, ino: u64 },
    BlockDevice { rdev: u64 },
}

/// The images of one machine, opened in turn: each is refused if an earlier one is the same.
#[derive(Debug, Default)]
pub struct Images {
    opened: Vec<(Identity, PathBuf)>,
}

impl Images {
    /// Open the image at `path` for reading (and writing unless `read_only`), check that it is
    /// one and not one opened already, and lock it unless `locking` is off.
    pub fn open(
        &mut self,
        path: &Path,
        read_only: bool,
        locking: bool,
    ) -> Result<DiskImage, ImageError> {
        let open_error = |source| ImageError::Open {
            path: path.into(),
            source,
        };
        // Refused before it is opened: opening some devices acts (a tape rewinds).
        identity(path, &std::fs::metadata(path).map_err(open_error)?)?;
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(open_error)?;
        // What was opened counts: the path may name something else by now.
        let meta = file.metadata().map_err(open_error)?;
        let id = identity(path, &meta)?;
        if let Some((_, first)) = self.opened.iter().find(|(seen, _)| *seen == id) {
            return Err(ImageError::Twice {
                path: path.into(),
                first: first.clone(),
            });
        }
        // Reads and writes of the device thread wait for the disk, as a driver expects.
        host_file::set_blocking(&file).map_err(open_error)?;
        if locking {
            lock(&file, read_only, path)?;
        }
        let bytes = size(&file, &meta).map_err(|source| ImageError::Size {
            path: path.into(),
            source,
        })?;
        self.opened.push((id, path.into()));
        Ok(DiskImage {
            file,
            bytes,
            read_only,
        })
    }
}

/// Which image `meta` describes, or why it is none.
fn identity(path: &Path, meta: &Metadata) -> Result<Identity, ImageError> {
    let kind = meta.file_type();
    let what = if kind.is_file() {
        return Ok(Identity::File {
            dev: meta.dev(),
            ino: meta.ino(),
        });
    } else if kind.is_block_device() {
        return Ok(Identity::BlockDevice { rdev: meta.rdev() });
    } else {
        host_file::kind(kind)
    };
    Err(ImageError::NotAnImage {
        path: path.into(),
        what,
    })
}

/// `file`'s size in bytes: a block device's from `BLKGETSIZE64` (its length is 0), a file's
/// length.
fn size(file: &File, meta: &Metadata) -> io::Result<u64> {
    if !meta.file_type().is_block_device() {
        return Ok(meta.len());
    }
    let mut bytes = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 (linux/fs.h: `_IOR(0x12, 114, size_t)`) to the
    // variable passed, which outlives the call.
    let ret = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(file, BLKGETSIZE64, &mut bytes) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes)
}

/// Take QEMU's locks for a guest disk, as its virtio-blk takes them with `share-rw=off`
/// (hw/block/block.c, `blkconf_apply_backend_options`): reading, and writing unless
/// `read_only`; others may read, but neither write nor resize the image (exitless reads the
/// size once). Ours first, then theirs are looked for, as QEMU orders it: of two openers at the
/// same moment, each sees the other and both refuse, and never do both write.
fn lock(file: &File, read_only: bool, path: &Path) -> Result<(), ImageError> {
    let used = if read_only {
        CONSISTENT_READ
    } else {
        CONSISTENT_READ | WRITE
    };
    let unshared = WRITE | RESIZE;
    let fail = |fault| match fault {
        LockFault::Held(permission) => ImageError::InUse {
            path: path.into(),
            permission,
        },
        LockFault::Failed(source) => ImageError::Lock {
            path: path.into(),
            source,
        },
    };
    let mine = bits(used)
        .map(|n| PERM_BASE + n)
        .chain(bits(unshared).map(|n| SHARED_BASE + n));
    for byte in mine {
        share_byte(file, byte).map_err(fail)?;
    }
    // Another's use of what we do not share, another's refusal of what we use.
    let theirs = bits(unshared)
        .map(|n| PERM_BASE + n)
        .chain(bits(used).map(|n| SHARED_BASE + n));
    for byte in theirs {
        test_byte(file, byte).map_err(fail)?;
    }
    Ok(())
}

/// Why a lock byte could not be taken or tested.
enum LockFault {
    /// Another open file holds it: the permission of that byte.
    Held(&'static str),
    /// fcntl(2) failed otherwise.
    Failed(io::Error),
}

/// The bit numbers set in `mask`.
fn bits(mask: u32) -> impl Iterator<Item = i64> {
    (0_i64..)
        .zip(PERMISSIONS)
        .map(|(n, _)| n)
        .filter(move |&n| mask & 1 << n != 0)
}

/// The name of the permission lock byte `byte` stands for.
fn permission(byte: i64) -> &'static str {
    PERMISSIONS[usize::try_from(byte % 100).expect("a lock byte")]
}

/// One byte at `byte`, locked as `l_type`.
fn byte_lock(byte: i64, l_type: libc::c_int) -> libc::flock {
    let short = |v| libc::c_short::try_from(v).expect("fcntl's lock constants are small");
    libc::flock {
        l_type: short(l_type),
        l_whence: short(libc::SEEK_SET),
        l_start: byte,
        l_len: 1,
        l_pid: 0,
    }
}

/// Take a shared lock on `byte` (QEMU's `qemu_lock_fd(fd, byte, 1, false)`). Only an exclusive
/// lock stops it: a VMM that locks the whole file for writing (Cloud Hypervisor's).
fn share_byte(file: &File, byte: i64) -> Result<(), LockFault> {
    let lock = byte_lock(byte, libc::F_RDLCK);
    // SAFETY: F_OFD_SETLK reads the flock passed, which outlives the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &lock) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => LockFault::Held(permission(byte)),
        _ => LockFault::Failed(e),
    })
}

/// Whether another open file holds a lock on `byte` (QEMU's `qemu_lock_fd_test(fd, byte, 1,
/// true)`): F_OFD_GETLK with an exclusive lock reports any lock but this file's own.
fn test_byte(file: &File, byte: i64) -> Result<(), LockFault> {
    let mut lock = byte_lock(byte, libc::F_WRLCK);
    // SAFETY: F_OFD_GETLK reads and rewrites the flock passed, which outlives the call.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut lock) } != 0 {
        return Err(LockFault::Failed(io::Error::last_os_error()));
    }
    if libc::c_int::from(lock.l_type) == libc::F_UNLCK {
        Ok(())
    } else {
        Err(LockFault::Held(permission(byte)))
    }
}
