//! A disk image on the host: opened, checked, locked, sized and its blocks described before a
//! virtio-blk device takes it.
//!
//! An image is a regular file or a block device; anything else (a directory, a character
//! device such as `/dev/null`, a FIFO, a socket) is refused by name, and opening never blocks
//! (a FIFO's `open(2)` waits for a writer unless `O_NONBLOCK` is given, fifo(7)). A block
//! device's size comes from `BLKGETSIZE64`, a file's from its length; a block device's
//! physical block and I/O sizes from its own ioctls, a file's from the host's page (see
//! [`Topology`]).
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
use crate::seccomp::{BLKALIGNOFF, BLKGETSIZE64};

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
    /// Whether it is a block device (else a regular file): discarding differs (`BLKDISCARD`
    /// against punching a hole).
    pub block_device: bool,
    /// Its blocks, as the host says.
    pub topology: Topology,
}

/// The sizes a driver should align its I/O to (virtio 1.2 §5.2.4, `struct
/// virtio_blk_topology`; Linux's `physical_block_size`, `alignment_offset`, `minimum_io_size`
/// and `optimal_io_size` of a queue), in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    /// The smallest unit the host writes without reading around it: a power of two, at
    /// least 512.
    pub physical_block: u32,
    /// Bytes from the start of the disk to its first physical-block boundary.
    pub alignment_offset: u32,
    /// The smallest I/O the host prefers.
    pub min_io: u32,
    /// The I/O size the host prefers at most, 0 if it says none.
    pub optimal_io: u32,
}

/// The host's page: a file's image lives in the page cache, where a write of part of a page
/// not cached makes the kernel read the rest of it first.
const HOST_PAGE: u32 = 4096;

impl Topology {
    /// A regular file's: the page cache's page, or the file system's block if smaller.
    fn of_file(meta: &Metadata) -> Self {
        let block = u32::try_from(meta.blksize()).unwrap_or(HOST_PAGE);
        Self::clamped(block.min(HOST_PAGE), 0, block.min(HOST_PAGE), 0)
    }

    /// What a block device says of itself (`BLKPBSZGET`, `BLKALIGNOFF`, `BLKIOMIN`,
    /// `BLKIOOPT`: linux/fs.h), made sane: a device that reports nonsense, or refuses to say,
    /// gets 512-byte blocks (said once) rather than a refused disk: the topology is a hint.
    fn of_block_device(file: &File) -> Self {
        let get = |request| -> io::Result<u32> {
            let mut value: libc::c_uint = 0;
            // SAFETY: each of these ioctls writes one int (unsigned but for BLKALIGNOFF,
            // whose -1 "misaligned" reads as a huge offset and is dropped by `clamped`) to
            // the variable passed, which outlives the call.
            let ret = unsafe { vmm_sys_util::ioctl::ioctl_with_mut_ref(file, request, &mut value) };
            if ret < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(value)
        };
        let said = (|| {
            Ok::<_, io::Error>(Self::clamped(
                get(libc::BLKPBSZGET)?,
                get(BLKALIGNOFF)?,
                get(libc::BLKIOMIN)?,
                get(libc::BLKIOOPT)?,
            ))
        })();
        said.unwrap_or_else(|e| {
            log::warn!(
                "a disk's block device did not say its block sizes ({e}): 512-byte blocks offered"
            );
            Self::clamped(0, 0, 0, 0)
        })
    }

    /// The topology these sizes give, each made one virtio-blk's configuration can carry (a
    /// physical block of 2^0..2^255 sectors, an offset of under 256 sectors inside it, a
    /// minimum of at most 65,535 sectors): what it cannot carry is left at 512 or 0.
    fn clamped(physical: u32, alignment_offset: u32, min_io: u32, optimal_io: u32) -> Self {
        let sector = 512;
        let physical_block = if physical.is_power_of_two() && physical >= sector {
            physical
        } else {
            sector
        };
        let whole = |bytes: u32, most: u32| {
            if bytes.is_multiple_of(sector) && bytes / sector <= most {
                bytes
            } else {
                0
            }
        };
        Topology {
            physical_block,
            alignment_offset: whole(alignment_offset % physical_block, u32::from(u8::MAX)),
            min_io: match whole(min_io, u32::from(u16::MAX)) {
                0 => physical_block,
                n => n,
            },
            optimal_io: whole(optimal_io, u32::MAX),
        }
    }
}

impl DiskImage {
    /// `file`, opened already (read-only if `read_only`), sized: no kind checks, no locks.
    pub fn from_file(file: File, read_only: bool) -> io::Result<Self> {
        let meta = file.metadata()?;
        Self::described(file, &meta, read_only)
    }

    /// The image of `file`, whose metadata is `meta`: its size read (the only error), its
    /// blocks described.
    fn described(file: File, meta: &Metadata, read_only: bool) -> io::Result<Self> {
        let block_device = meta.file_type().is_block_device();
        let topology = if block_device {
            Topology::of_block_device(&file)
        } else {
            Topology::of_file(meta)
        };
        Ok(DiskImage {
            bytes: size(&file, meta)?,
            file,
            read_only,
            block_device,
            topology,
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
    /// A handle on each image locked, for a migration's hand-over.
    locks: Vec<ImageLock>,
    /// A duplicate of each image's file, for a same-host live update's hand-over.
    files: Vec<File>,
}

/// An image's locks, held on its open file description, given up and taken again through a
/// duplicate of its descriptor (the locks belong to the description, not the descriptor): a
/// migration's source gives them up at the switch-over so that its target, on the same host or
/// the same shared storage, can take them, and takes them back if the target does not run.
#[derive(Debug)]
pub struct ImageLock {
    file: File,
    read_only: bool,
    path: PathBuf,
}

impl ImageLock {
    /// Give up every lock byte (QEMU's `raw_inactivate` does the same at a migration's end).
    pub fn release(&self) -> io::Result<()> {
        let all = libc::flock {
            l_len: SHARED_BASE + 100 - PERM_BASE,
            ..byte_lock(PERM_BASE, libc::F_UNLCK)
        };
        // SAFETY: F_OFD_SETLK reads the flock passed, which outlives the call.
        if unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_SETLK, &all) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Take the locks again, as at open: refused if another took them meanwhile.
    pub fn retake(&self) -> Result<(), ImageError> {
        lock(&self.file, self.read_only, &self.path)
    }
}

impl Images {
    /// The locks of the images opened, for [`ImageLock::release`] and [`ImageLock::retake`],
    /// and a duplicate of each image's file, for a same-host live update to hand over.
    pub fn into_parts(self) -> (Vec<ImageLock>, Vec<File>) {
        (self.locks, self.files)
    }

    /// Open the image at `path` for reading (and writing unless `read_only`), check that it is
    /// one and not one opened already, and lock it unless `locking` is off.
    pub fn open(
        &mut self,
        path: &Path,
        read_only: bool,
        locking: bool,
    ) -> Result<DiskImage, ImageError> {
        let open_error = open_error(path);
        // Refused before it is opened: opening some devices acts (a tape rewinds).
        identity(path, &std::fs::metadata(path).map_err(open_error)?)?;
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(open_error)?;
        self.add(file, path, read_only, locking)
    }

    /// The image `path` names, as another exitless opened it and handed it over (`migrate
    /// local:`): checked as [`Images::open`] checks an image, and opened for writing unless
    /// `read_only`. Its locks came with it (they belong to the open file description).
    pub fn adopt(
        &mut self,
        file: File,
        path: &Path,
        read_only: bool,
        locking: bool,
    ) -> Result<DiskImage, ImageError> {
        let refused = |why: &str| {
            open_error(path)(io::Error::new(io::ErrorKind::InvalidInput, why.to_owned()))
        };
        // SAFETY: F_GETFL takes no argument.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        let mode = flags & libc::O_ACCMODE;
        let usable = match read_only {
            true => mode == libc::O_RDONLY || mode == libc::O_RDWR,
            false => mode == libc::O_RDWR,
        };
        if flags < 0 || !usable || flags & libc::O_APPEND != 0 {
            return Err(refused(
                "the file handed over is not open as the disk needs it",
            ));
        }
        // The path, where it still names a file, must name this one: a file handed over in
        // the wrong order would put one disk's data on another.
        let meta = file.metadata().map_err(open_error(path))?;
        if let Ok(named) = std::fs::metadata(path)
            && identity(path, &named).ok() != identity(path, &meta).ok()
        {
            return Err(refused(
                "the file handed over is not the one its path names",
            ));
        }
        self.add(file, path, read_only, locking)
    }

    /// An image's `file`, opened from `path`: what it is (not one seen already), its
    /// blocking mode, its locks unless `locking` is off.
    fn add(
        &mut self,
        file: File,
        path: &Path,
        read_only: bool,
        locking: bool,
    ) -> Result<DiskImage, ImageError> {
        let open_error = open_error(path);
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
            let file = file.try_clone().map_err(open_error)?;
            let path = path.into();
            self.locks.push(ImageLock {
                file,
                read_only,
                path,
            });
        }
        self.files.push(file.try_clone().map_err(open_error)?);
        let image =
            DiskImage::described(file, &meta, read_only).map_err(|source| ImageError::Size {
                path: path.into(),
                source,
            })?;
        self.opened.push((id, path.into()));
        Ok(image)
    }
}

/// How a failure to open (or to take) the image at `path` is said.
fn open_error(path: &Path) -> impl Fn(io::Error) -> ImageError + Copy + '_ {
    move |source| ImageError::Open {
        path: path.into(),
        source,
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

#[cfg(test)]
mod tests {
    use super::Topology;

    #[test]
    fn a_topology_keeps_what_virtio_blk_can_carry_and_drops_the_rest() {
        let t = |p, a, m, o| Topology::clamped(p, a, m, o);
        let topology = |physical_block, alignment_offset, min_io, optimal_io| Topology {
            physical_block,
            alignment_offset,
            min_io,
            optimal_io,
        };
        // A 4Kn-style disk with a RAID stripe.
        assert_eq!(t(4096, 0, 4096, 1 << 20), topology(4096, 0, 4096, 1 << 20));
        // Not a power of two, or under a sector: 512-byte blocks.
        assert_eq!(t(3000, 0, 0, 0), topology(512, 0, 512, 0));
        assert_eq!(t(256, 0, 0, 0), topology(512, 0, 512, 0));
        // BLKALIGNOFF's -1 (misaligned), an offset of part of a sector, sizes of part of one.
        assert_eq!(t(4096, u32::MAX, 100, 700), topology(4096, 0, 4096, 0));
        // An offset inside the block (in sectors), a minimum past u16 sectors.
        assert_eq!(t(4096, 3 * 512, 64 << 20, 0), topology(4096, 1536, 4096, 0));
    }
}
