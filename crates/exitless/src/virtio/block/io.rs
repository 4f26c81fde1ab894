//! How a request's data moves between the disk file and the driver's buffers (resolved to host
//! memory, [`Segments`]): on an io_uring ([`Ring`], io_uring(7)), where a pass over a request
//! queue submits the reads and writes of every request it takes and waits for them together,
//! or one request at a time with `preadv`/`pwritev` ([`move_now`]), where the kernel refuses
//! io_uring (`kernel.io_uring_disabled`, a seccomp policy, an old kernel) and to finish a short
//! transfer.
//!
//! A seccomp filter does not see what a ring does, so the ring is narrowed to what the device
//! needs before it is enabled, as Firecracker narrows its own: the disk file is its only file,
//! registered, and every submission must name it by index (`IOSQE_FIXED_FILE`); only vectored
//! reads and writes may be submitted; nothing more may be registered
//! (`IORING_REGISTER_RESTRICTIONS`, Linux 5.10).
//!
//! The ring's file is the image opened again, not the descriptor that holds the image's
//! locks (`super::image`): a ring's registered files are let go of asynchronously after the
//! process ends, and an open file description's locks last as long as it does, so the image
//! would stay locked for a moment after exitless is gone (seen: QEMU, or the next exitless,
//! refused the image).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::register::Restriction;
use io_uring::{IoUring, opcode, squeue, types};

use crate::dma::Segments;

/// Which way a request's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// VIRTIO_BLK_T_IN: from the file into the driver's buffers.
    ToGuest,
    /// VIRTIO_BLK_T_OUT: from the driver's buffers into the file.
    ToFile,
}

/// Move all of `data`'s bytes between the file `fd` at `offset` and the buffers, now: a short
/// transfer goes on from where it stopped. The pieces are used up.
pub fn move_now(
    fd: RawFd,
    direction: Direction,
    data: &mut Segments,
    offset: u64,
) -> io::Result<()> {
    data.transfer(|iov, moved| {
        let count = libc::c_int::try_from(iov.len()).expect("at most IOV_MAX");
        let at = offset
            .checked_add(moved)
            .and_then(|at| libc::off_t::try_from(at).ok())
            .ok_or(io::ErrorKind::InvalidInput)?;
        // SAFETY: the iovecs are the request's buffers, mapped guest memory that the scratch
        // keeps mapped; the kernel writes (preadv) or reads (pwritev) only inside them.
        let n = unsafe {
            match direction {
                Direction::ToGuest => libc::preadv(fd, iov.as_ptr(), count, at),
                Direction::ToFile => libc::pwritev(fd, iov.as_ptr(), count, at),
            }
        };
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    })
}

/// An io_uring on one disk file (see the module's comment).
pub struct Ring {
    ring: IoUring,
    /// The image, opened again for the ring (see the module's comment).
    _file: File,
    /// Submissions whose completion has not been taken.
    in_flight: usize,
}

/// The registered files' index of the disk file.
const DISK: types::Fixed = types::Fixed(0);

impl Ring {
    /// A ring of `entries` submissions on the image `disk` (read-only unless `writable`),
    /// confined to vectored reads and writes of it; the error says why the kernel would not
    /// make one.
    pub fn new(disk: &File, writable: bool, entries: u32) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .open(format!("/proc/self/fd/{}", disk.as_raw_fd()))?;
        let ring = IoUring::builder().setup_r_disabled().build(entries)?;
        let submitter = ring.submitter();
        submitter.register_files(&[file.as_raw_fd()])?;
        submitter.register_restrictions(&mut [
            Restriction::sqe_op(opcode::Readv::CODE),
            Restriction::sqe_op(opcode::Writev::CODE),
            Restriction::sqe_flags_required(squeue::Flags::FIXED_FILE.bits()),
        ])?;
        submitter.register_enable_rings()?;
        Ok(Ring {
            ring,
            _file: file,
            in_flight: 0,
        })
    }

    /// Start moving `data`'s bytes between the disk file at `offset` and the buffers; `tag`
    /// comes back with its completion ([`Ring::complete_all`]). Nothing is moved until then.
    ///
    /// # Safety
    ///
    /// `data`'s iovecs, and the memory they point into, must stay as they are until
    /// [`Ring::complete_all`] has returned: the kernel reads the iovecs, and reads or writes
    /// the memory, meanwhile.
    pub unsafe fn start(
        &mut self,
        direction: Direction,
        data: &Segments,
        offset: u64,
        tag: u64,
    ) -> io::Result<()> {
        let iov = data.iovecs();
        let count = u32::try_from(iov.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
        let entry = match direction {
            Direction::ToGuest => opcode::Readv::new(DISK, iov.as_ptr(), count)
                .offset(offset)
                .build(),
            Direction::ToFile => opcode::Writev::new(DISK, iov.as_ptr(), count)
                .offset(offset)
                .build(),
        }
        .flags(squeue::Flags::FIXED_FILE)
        .user_data(tag);
        if self.ring.submission().is_full() {
            self.ring.submit()?;
        }
        // SAFETY: the caller keeps the iovecs and their memory as they are until the
        // completion is taken.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::from(io::ErrorKind::WouldBlock))?;
        self.in_flight += 1;
        Ok(())
    }

    /// Submit what was started and wait until all of it is done: `done` gets each one's tag
    /// and the bytes it moved (or the file's error). An error of the ring itself stops the
    /// wait; the submissions not yet done are then the ring's, to finish on its own.
    pub fn complete_all(&mut self, mut done: impl FnMut(u64, io::Result<usize>)) -> io::Result<()> {
        while self.in_flight > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    self.in_flight = 0;
                    return Err(e);
                }
            }
            for cqe in self.ring.completion() {
                self.in_flight -= 1;
                let result = usize::try_from(cqe.result())
                    .map_err(|_| io::Error::from_raw_os_error(-cqe.result()));
                done(cqe.user_data(), result);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // fixtures: a few small numbers
mod tests {
    use super::*;
    use std::io::Write;

    /// A temporary file (removed when dropped) and a ring on it.
    struct OnRing {
        path: std::path::PathBuf,
        file: File,
        ring: Ring,
    }

    impl Drop for OnRing {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    /// A file holding `bytes` and a ring on it; None (said on stdout) where the kernel makes
    /// no ring.
    fn on_ring(bytes: &[u8]) -> Option<OnRing> {
        let path = std::env::temp_dir().join(format!(
            "exitless-ring-{}-{}",
            std::process::id(),
            bytes.len()
        ));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        match Ring::new(&file, true, 8) {
            Ok(ring) => Some(OnRing { path, file, ring }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                println!("skipped: no io_uring here ({e})");
                None
            }
        }
    }

    /// Host memory as the device's scratch sees guest memory: one region at 0.
    fn memory() -> vm_memory::GuestMemoryMmap {
        vm_memory::GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 0x10000)]).unwrap()
    }

    /// Reads and writes started together complete together, each with its tag and length;
    /// the writes reach the file.
    #[test]
    fn started_reads_and_writes_complete_together_with_their_tags() {
        let Some(OnRing { path, ring, .. }) = &mut on_ring(&[7u8; 4096]) else {
            return;
        };
        let mem = memory();
        let dma = crate::dma::DmaContext::platform(mem.clone());
        let mut pieces: Vec<Segments> = (0..3).map(|_| Segments::default()).collect();
        for (k, data) in pieces.iter_mut().enumerate() {
            let at = 0x1000 * k as u64;
            vm_memory::Bytes::write_slice(&mem, &[k as u8 + 1; 512], vm_memory::GuestAddress(at))
                .unwrap();
            dma.resolve(
                vm_memory::GuestAddress(at),
                512,
                crate::dma::Access::Read,
                data,
            )
            .unwrap();
        }
        let mut read = Segments::default();
        dma.resolve(
            vm_memory::GuestAddress(0x8000),
            1024,
            crate::dma::Access::Write,
            &mut read,
        )
        .unwrap();
        for (k, data) in pieces.iter().enumerate() {
            // SAFETY: the pieces and guest memory outlive complete_all below.
            unsafe { ring.start(Direction::ToFile, data, 512 * k as u64, k as u64) }.unwrap();
        }
        // SAFETY: as above.
        unsafe { ring.start(Direction::ToGuest, &read, 3072, 9) }.unwrap();
        let mut done = Vec::new();
        ring.complete_all(|tag, moved| done.push((tag, moved.unwrap())))
            .unwrap();
        done.sort_unstable();
        assert_eq!(done, vec![(0, 512), (1, 512), (2, 512), (9, 1024)]);
        let bytes = std::fs::read(path).unwrap();
        for k in 0..3 {
            assert!(
                bytes[512 * k..512 * (k + 1)]
                    .iter()
                    .all(|&b| b == k as u8 + 1)
            );
        }
        let mut got = [0u8; 1024];
        vm_memory::Bytes::read_slice(&mem, &mut got, vm_memory::GuestAddress(0x8000)).unwrap();
        assert_eq!(got, [7u8; 1024]);
    }

    /// The ring does only what the device needs: a read of any other file (here, by its
    /// descriptor rather than the registered index) and any other operation are refused by
    /// the kernel, whatever the process's seccomp filter would say.
    #[test]
    fn the_ring_refuses_other_files_and_other_operations() {
        let Some(OnRing { file, ring, .. }) = &mut on_ring(&[1u8; 512]) else {
            return;
        };
        let mut buf = [0u8; 16];
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let by_descriptor = opcode::Readv::new(types::Fd(file.as_raw_fd()), &iov, 1)
            .build()
            .user_data(1);
        let fsync = opcode::Fsync::new(DISK)
            .build()
            .flags(squeue::Flags::FIXED_FILE)
            .user_data(2);
        for entry in [by_descriptor, fsync] {
            // SAFETY: `iov` and `buf` outlive the wait below.
            unsafe { ring.ring.submission().push(&entry) }.unwrap();
            ring.in_flight += 1;
        }
        let mut done = Vec::new();
        ring.complete_all(|tag, moved| done.push((tag, moved.map_err(|e| e.raw_os_error()))))
            .unwrap();
        done.sort_unstable();
        assert_eq!(
            done,
            vec![(1, Err(Some(libc::EACCES))), (2, Err(Some(libc::EACCES)))]
        );
        assert_eq!(buf, [0u8; 16], "nothing was read");
    }
}
