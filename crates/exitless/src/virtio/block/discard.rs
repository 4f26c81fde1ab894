//! VIRTIO_BLK_T_DISCARD and VIRTIO_BLK_T_WRITE_ZEROES (virtio 1.2 §5.2.6): a request's data is
//! an array of `struct virtio_blk_discard_write_zeroes` (a first sector, a number of sectors,
//! flags), every segment checked before any is carried out.
//!
//! A discard is a hint (the device "MAY deallocate"): a file gets a hole punched
//! (`FALLOC_FL_PUNCH_HOLE`), a block device a `BLKDISCARD`, and a host that can do neither
//! answers it done, said once. A write of zeroes must read back as zeroes: with the driver's
//! `unmap` flag a hole is punched where the host can (a hole reads as zeroes, on a block device
//! too), else or failing that the range is zeroed in place (`FALLOC_FL_ZERO_RANGE`), and where
//! the host cannot (tmpfs, 9p) zeroes are written.

use std::fs::File;
use std::io;
use std::mem::size_of;
use std::os::fd::AsRawFd;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
    virtio_blk_discard_write_zeroes,
};

use super::SECTOR_SIZE;
use crate::dma::IOV_MAX;
use crate::guest_error;
use crate::logging::DeviceLog;

/// One segment: `struct virtio_blk_discard_write_zeroes` (le64 sector, le32 num_sectors, le32
/// flags).
pub(super) const SEGMENT_LEN: usize = size_of::<virtio_blk_discard_write_zeroes>();
/// Segments a discard may have (`max_discard_seg`): Linux merges at most 256
/// (`MAX_DISCARD_SEGMENTS`), and each costs one system call.
pub(super) const MAX_DISCARD_SEGMENTS: u32 = 256;
/// Segments a write of zeroes may have (`max_write_zeroes_seg`): one, as Linux sends them, so
/// that a request's cost is bounded by [`MAX_SECTORS`] where zeroes must be written.
pub(super) const MAX_WRITE_ZEROES_SEGMENTS: u32 = 1;
/// Sectors one segment may cover (`max_discard_sectors`, `max_write_zeroes_sectors`): 64 MiB,
/// so that a host without `FALLOC_FL_ZERO_RANGE` writes at most that much per request on the
/// device thread (a few tens of milliseconds) while the others wait.
pub(super) const MAX_SECTORS: u32 = 64 << (20 - 9);

/// Which of the two requests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Discard,
    WriteZeroes,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Discard => "discard",
            Kind::WriteZeroes => "write-zeroes",
        }
    }

    fn max_segments(self) -> u32 {
        match self {
            Kind::Discard => MAX_DISCARD_SEGMENTS,
            Kind::WriteZeroes => MAX_WRITE_ZEROES_SEGMENTS,
        }
    }
}

/// One checked segment: a byte range inside the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Range {
    pub(super) offset: u64,
    pub(super) len: u64,
    /// The driver lets the device deallocate (write zeroes only).
    pub(super) unmap: bool,
}

/// Why a request was refused: the status to answer (§5.2.6).
pub(super) type Status = u32;

/// How many segments a `kind` request with `len` data bytes has: UNSUPP for more than offered,
/// IOERR for data that is not whole segments. Checked before the data is read.
pub(super) fn segment_count(kind: Kind, len: u64, log: &DeviceLog) -> Result<usize, Status> {
    let name = kind.name();
    if !len.is_multiple_of(SEGMENT_LEN as u64) {
        guest_error!(
            log,
            "virtio-blk: {name} data of {len} bytes is not whole {SEGMENT_LEN}-byte segments"
        );
        return Err(VIRTIO_BLK_S_IOERR);
    }
    let count = len / SEGMENT_LEN as u64;
    if count > u64::from(kind.max_segments()) {
        guest_error!(
            log,
            "virtio-blk: {name} of {count} segments, more than the {} offered",
            kind.max_segments()
        );
        return Err(VIRTIO_BLK_S_UNSUPP);
    }
    Ok(usize::try_from(count).expect("at most MAX_DISCARD_SEGMENTS"))
}

/// The segments of a `kind` request, whose data (whole segments, as many as
/// [`segment_count`] allows) is `data`, checked against a disk of `capacity` bytes: UNSUPP for
/// a flag the request may not have (`unmap` on a discard, any unknown bit) in any segment,
/// whatever else is wrong (§5.2.6.2 makes it a MUST); then IOERR for a segment larger than
/// offered or outside the disk.
pub(super) fn parse(
    kind: Kind,
    data: &[u8],
    capacity: u64,
    log: &DeviceLog,
    out: &mut Vec<Range>,
) -> Result<(), Status> {
    out.clear();
    let name = kind.name();
    let allowed = match kind {
        Kind::Discard => 0,
        Kind::WriteZeroes => VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
    };
    let segments = data.chunks_exact(SEGMENT_LEN).map(|raw| {
        let sector = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
        let sectors = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes"));
        let flags = u32::from_le_bytes(raw[12..].try_into().expect("4 bytes"));
        (sector, sectors, flags)
    });
    if let Some((_, _, flags)) = segments.clone().find(|&(_, _, f)| f & !allowed != 0) {
        guest_error!(
            log,
            "virtio-blk: {name} with flags {flags:#x} not supported"
        );
        return Err(VIRTIO_BLK_S_UNSUPP);
    }
    for (sector, sectors, flags) in segments {
        if sectors > MAX_SECTORS {
            guest_error!(
                log,
                "virtio-blk: {name} of {sectors} sectors, more than the {MAX_SECTORS} offered"
            );
            return Err(VIRTIO_BLK_S_IOERR);
        }
        let len = u64::from(sectors) * SECTOR_SIZE;
        let offset = sector
            .checked_mul(SECTOR_SIZE)
            .filter(|o| o.checked_add(len).is_some_and(|end| end <= capacity));
        let Some(offset) = offset else {
            guest_error!(
                log,
                "virtio-blk: {name} of {sectors} sectors at sector {sector} is past the disk's {} sectors",
                capacity / SECTOR_SIZE
            );
            return Err(VIRTIO_BLK_S_IOERR);
        };
        out.push(Range {
            offset,
            len,
            unmap: flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0,
        });
    }
    Ok(())
}

/// The disk the ranges are carried out on, and what its host has shown it cannot do.
pub(super) struct Eraser {
    disk_is_block_device: bool,
    /// Discards are answered without touching the disk: the host refused one (said once).
    no_discard: bool,
}

impl Eraser {
    pub(super) fn new(disk_is_block_device: bool) -> Self {
        Eraser {
            disk_is_block_device,
            no_discard: false,
        }
    }

    /// Carry out `range` of a `kind` request on `disk`.
    pub(super) fn erase(
        &mut self,
        disk: &File,
        kind: Kind,
        range: Range,
        log: &DeviceLog,
    ) -> io::Result<()> {
        if range.len == 0 {
            return Ok(());
        }
        match kind {
            Kind::Discard => self.discard(disk, range, log),
            Kind::WriteZeroes => {
                // A hole reads as zeroes; on a block device the kernel zeroes the range by the
                // device's own means or refuses (blkdev_fallocate), and then it is zeroed the
                // next way.
                if range.unmap {
                    match fallocate(disk, libc::FALLOC_FL_PUNCH_HOLE, range) {
                        Err(e) if cannot_here(&e) => {}
                        done => return done,
                    }
                }
                match fallocate(disk, libc::FALLOC_FL_ZERO_RANGE, range) {
                    Err(e) if cannot_here(&e) => write_zeroes(disk, range),
                    done => done,
                }
            }
        }
    }

    fn discard(&mut self, disk: &File, range: Range, log: &DeviceLog) -> io::Result<()> {
        if self.no_discard {
            return Ok(());
        }
        let done = if self.disk_is_block_device {
            let span = [range.offset, range.len];
            // SAFETY: BLKDISCARD reads two u64s (offset, length) from the array passed, which
            // outlives the call.
            let ret = unsafe {
                vmm_sys_util::ioctl::ioctl_with_ref(disk, crate::seccomp::BLKDISCARD, &span)
            };
            if ret < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        } else {
            fallocate(disk, libc::FALLOC_FL_PUNCH_HOLE, range)
        };
        match done {
            // A discard the host refuses for its alignment is one it may skip.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            Err(e) if unsupported(&e) => {
                log.warn(format_args!(
                    "virtio-blk: the disk cannot discard ({e}); discards are answered without freeing space from now on"
                ));
                self.no_discard = true;
                Ok(())
            }
            done => done,
        }
    }
}

/// Whether `e` says the host cannot do this at all (rather than failed this time).
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::ENODEV | libc::ENOTTY)
    )
}

/// Whether `e` says the host cannot do this here (at all, or not at this alignment).
fn cannot_here(e: &io::Error) -> bool {
    unsupported(e) || e.raw_os_error() == Some(libc::EINVAL)
}

/// `fallocate(2)` of `range` with `mode`, the file's size kept.
fn fallocate(disk: &File, mode: libc::c_int, range: Range) -> io::Result<()> {
    let (offset, len) = (
        libc::off_t::try_from(range.offset).map_err(|_| io::ErrorKind::InvalidInput)?,
        libc::off_t::try_from(range.len).map_err(|_| io::ErrorKind::InvalidInput)?,
    );
    loop {
        // SAFETY: fallocate only acts on the open file; no memory is passed.
        let ret = unsafe {
            libc::fallocate(
                disk.as_raw_fd(),
                mode | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        };
        if ret == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Zeroes the host cannot make otherwise, written: one zeroed page as every iovec.
fn write_zeroes(disk: &File, range: Range) -> io::Result<()> {
    static ZEROS: [u8; 4096] = [0; 4096];
    let page = ZEROS.len() as u64;
    let (mut offset, end) = (range.offset, range.offset + range.len);
    while offset < end {
        let left = end - offset;
        let iovecs: Vec<libc::iovec> = (0..IOV_MAX as u64)
            .map_while(|k| {
                (k * page < left).then(|| libc::iovec {
                    iov_base: ZEROS.as_ptr().cast_mut().cast(),
                    iov_len: usize::try_from((left - k * page).min(page)).expect("a page"),
                })
            })
            .collect();
        // SAFETY: the iovecs point into a static zeroed page, which pwritev only reads.
        let ret = unsafe {
            libc::pwritev(
                disk.as_raw_fd(),
                iovecs.as_ptr(),
                libc::c_int::try_from(iovecs.len()).expect("at most IOV_MAX"),
                libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?,
            )
        };
        match ret {
            n if n > 0 => offset += n as u64,
            0 => return Err(io::ErrorKind::WriteZero.into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    /// The fallback where the host can neither punch nor zero a range: zeroes written, more
    /// than one `pwritev` of them, exactly over the range.
    #[test]
    fn zeroes_written_cover_the_range_and_nothing_else() {
        let path = std::env::temp_dir().join(format!("exitless-zeroes-{}", std::process::id()));
        let len = (IOV_MAX as u64 + 3) * 4096;
        std::fs::write(&path, vec![0xffu8; usize::try_from(len).unwrap()]).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let range = Range {
            offset: 512,
            len: (IOV_MAX as u64 + 1) * 4096 + 1024,
            unmap: false,
        };
        write_zeroes(&file, range).unwrap();
        let mut bytes = vec![0u8; usize::try_from(len).unwrap()];
        file.read_exact_at(&mut bytes, 0).unwrap();
        let end = usize::try_from(range.offset + range.len).unwrap();
        assert!(bytes[..512].iter().all(|&b| b == 0xff));
        assert!(bytes[512..end].iter().all(|&b| b == 0));
        assert!(bytes[end..].iter().all(|&b| b == 0xff));
        assert_eq!(file.metadata().unwrap().len(), len, "the size is kept");
    }
}
