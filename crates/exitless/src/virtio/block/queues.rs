//! The queue work of a virtio-blk device, on the device thread: each request checked, carried
//! out against the file and answered with a status (virtio 1.2 §5.2.6).

use std::fs::File;
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, virtio_blk_outhdr,
};

use super::SECTOR_SIZE;
use crate::dma::{Access, DmaContext, DmaError, Segments};
use crate::guest_error;
use crate::logging::{Cause, DeviceLog, QueueCounters};
use crate::virtio::device::{DeviceError, Progress, QueueHandler, serve_chains};
use crate::virtio::queue::chain::{Buffer, Chain, ranges};
use crate::virtio::queue::split::ServedQueue;

/// The device ID string's length (§5.2.6: VIRTIO_BLK_T_GET_ID).
const SERIAL_LEN: usize = VIRTIO_BLK_ID_BYTES as usize;
/// `struct virtio_blk_outhdr`: type, reserved (ioprio), sector.
pub(super) const HEADER_LEN: usize = size_of::<virtio_blk_outhdr>();

/// The queue work of a [`super::VirtioBlock`]: the file and what requests are checked against,
/// and the scratch of the request being served (its chain, and its data buffers resolved to
/// host memory for `preadv`/`pwritev`: the data is not copied), reused for every request.
pub struct BlockQueues {
    disk: File,
    /// Bytes of the file the guest can reach: whole sectors, never more than the file had.
    capacity: u64,
    read_only: bool,
    serial: [u8; SERIAL_LEN],
    chain: Chain,
    io: Segments,
}

/// Why a request got no VIRTIO_BLK_S_OK.
enum Refused {
    /// The driver's request is wrong: answered with this status.
    Status(u32),
    /// The disk file failed a correct request: answered VIRTIO_BLK_S_IOERR (§5.2.6).
    Backend,
    /// Guest memory the device may not reach now: the chain is the transport's to settle
    /// (`serve_chains`: a pause, an IOMMU fault, or a broken device).
    Dma(DmaError),
}

impl From<DmaError> for Refused {
    fn from(e: DmaError) -> Self {
        Refused::Dma(e)
    }
}

/// Which way a request's data goes.
#[derive(Clone, Copy)]
enum Direction {
    /// VIRTIO_BLK_T_IN: from the file into the driver's buffers.
    ToGuest,
    /// VIRTIO_BLK_T_OUT: from the driver's buffers into the file.
    ToFile,
}

impl BlockQueues {
    /// The queue work on `disk`, of `sectors` whole sectors, answering
    /// VIRTIO_BLK_T_GET_ID with the first 20 bytes of `serial`.
    pub(super) fn new(disk: File, sectors: u64, read_only: bool, serial: &[u8]) -> Self {
        let mut id = [0u8; SERIAL_LEN];
        let n = serial.len().min(SERIAL_LEN);
        id[..n].copy_from_slice(&serial[..n]);
        BlockQueues {
            disk,
            capacity: sectors * SECTOR_SIZE,
            read_only,
            serial: id,
            chain: Chain::default(),
            io: Segments::default(),
        }
    }

    /// Serve one request; returns the bytes written into the chain, status byte included.
    fn serve(
        &mut self,
        c: &Chain,
        dma: &DmaContext,
        log: &DeviceLog,
        counters: &QueueCounters,
    ) -> Result<u32, DeviceError> {
        // The status is the chain's last writable byte (§5.2.6); data before it.
        let Some(status_at) = c.writable_len().checked_sub(1) else {
            guest_error!(
                log,
                "virtio-blk: request without a writable status byte; completed unanswered"
            );
            counters.error(Cause::Guest);
            return Ok(0);
        };
        let (status, written) = match self.request(c, status_at, dma, log) {
            Ok(written) => (VIRTIO_BLK_S_OK, written),
            Err(Refused::Status(status)) => {
                counters.error(Cause::Guest);
                (status, 0)
            }
            Err(Refused::Backend) => {
                counters.error(Cause::Backend);
                (VIRTIO_BLK_S_IOERR, 0)
            }
            Err(Refused::Dma(e)) => return Err(e.into()),
        };
        let status = u8::try_from(status).expect("a VIRTIO_BLK_S_* value");
        write_at(&c.writable, status_at, &[status], dma)?;
        Ok(u32::try_from(written + 1).expect("a checked chain holds at most 4 GiB"))
    }

    /// Carry out the request of `c`, whose writable bytes before the status are `data_in`;
    /// returns the data bytes written into the chain.
    fn request(
        &mut self,
        c: &Chain,
        data_in: u64,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<u64, Refused> {
        let Some(data_out) = c.readable_len().checked_sub(HEADER_LEN as u64) else {
            guest_error!(
                log,
                "virtio-blk: request header of {} bytes, not {HEADER_LEN}",
                c.readable_len()
            );
            return Err(Refused::Status(VIRTIO_BLK_S_IOERR));
        };
        let (kind, sector) = header(c, dma)?;
        match kind {
            VIRTIO_BLK_T_IN => {
                let offset = self.offset(sector, data_in, log)?;
                self.transfer(Direction::ToGuest, c, 0, data_in, offset, dma, log)?;
                Ok(data_in)
            }
            VIRTIO_BLK_T_OUT => {
                // §5.2.6.2: a device offering VIRTIO_BLK_F_RO answers writes IOERR and
                // writes nothing.
                if self.read_only {
                    guest_error!(log, "virtio-blk: write to a read-only disk refused");
                    return Err(Refused::Status(VIRTIO_BLK_S_IOERR));
                }
                let offset = self.offset(sector, data_out, log)?;
                let from = HEADER_LEN as u64;
                self.transfer(Direction::ToFile, c, from, data_out, offset, dma, log)?;
                Ok(0)
            }
            VIRTIO_BLK_T_FLUSH => {
                self.disk.sync_all().map_err(|e| host_error(log, &e))?;
                Ok(0)
            }
            VIRTIO_BLK_T_GET_ID => {
                // 20 bytes, without a NUL when the string fills them (§5.2.6); a shorter
                // buffer takes what fits.
                let n = usize::try_from(data_in).map_or(SERIAL_LEN, |n| n.min(SERIAL_LEN));
                write_at(&c.writable, 0, &self.serial[..n], dma)?;
                Ok(n as u64)
            }
            other => {
                guest_error!(log, "virtio-blk: request type {other} not supported");
                Err(Refused::Status(VIRTIO_BLK_S_UNSUPP))
            }
        }
    }

    /// The file offset of `len` bytes from `sector`, if they are whole sectors inside the disk
    /// (§5.2.6.1: data is a multiple of 512 bytes; no request reaches past `capacity`).
    fn offset(&self, sector: u64, len: u64, log: &DeviceLog) -> Result<u64, Refused> {
        if !len.is_multiple_of(SECTOR_SIZE) {
            guest_error!(
                log,
                "virtio-blk: {len} data bytes are not whole {SECTOR_SIZE}-byte sectors"
            );
            return Err(Refused::Status(VIRTIO_BLK_S_IOERR));
        }
        let offset = sector.checked_mul(SECTOR_SIZE);
        match offset.filter(|o| o.checked_add(len).is_some_and(|end| end <= self.capacity)) {
            Some(offset) => Ok(offset),
            None => {
                guest_error!(
                    log,
                    "virtio-blk: {len} bytes at sector {sector} are past the disk's {} sectors",
                    self.capacity / SECTOR_SIZE
                );
                Err(Refused::Status(VIRTIO_BLK_S_IOERR))
            }
        }
    }

    /// Move `len` bytes between the file at `offset` and bytes `start..` of the chain `c`'s
    /// data buffers (writable ones for [`Direction::ToGuest`], readable ones otherwise), in
    /// place: the buffers are resolved once, then `preadv` or `pwritev` moves the data.
    #[allow(clippy::too_many_arguments)] // one request's facts, each used once
    fn transfer(
        &mut self,
        direction: Direction,
        c: &Chain,
        start: u64,
        len: u64,
        offset: u64,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<(), Refused> {
        let access = match direction {
            Direction::ToGuest => Access::Write,
            Direction::ToFile => Access::Read,
        };
        c.resolve(dma, access, start, len, &mut self.io)?;
        let fd = self.disk.as_raw_fd();
        self.io
            .transfer(|iov, moved| {
                let count = libc::c_int::try_from(iov.len()).expect("at most IOV_MAX");
                let at = offset
                    .checked_add(moved)
                    .and_then(|at| libc::off_t::try_from(at).ok())
                    .ok_or(io::ErrorKind::InvalidInput)?;
                // SAFETY: the iovecs are the request's buffers, mapped guest memory that the
                // scratch keeps mapped; the kernel writes (preadv) or reads (pwritev) only
                // inside them.
                let n = unsafe {
                    match direction {
                        Direction::ToGuest => libc::preadv(fd, iov.as_ptr(), count, at),
                        Direction::ToFile => libc::pwritev(fd, iov.as_ptr(), count, at),
                    }
                };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())
            })
            .map_err(|e| host_error(log, &e))
    }
}

/// The type and first sector of the request `c`, from its header (`struct
/// virtio_blk_outhdr`, §5.2.6), whose length the caller has checked.
fn header(c: &Chain, dma: &DmaContext) -> Result<(u32, u64), DmaError> {
    let mut header = [0u8; HEADER_LEN];
    read_at(&c.readable, 0, &mut header, dma)?;
    let (kind_at, sector_at) = (
        offset_of!(virtio_blk_outhdr, type_),
        offset_of!(virtio_blk_outhdr, sector),
    );
    let kind = u32::from_le_bytes(header[kind_at..kind_at + 4].try_into().expect("4 bytes"));
    let sector = u64::from_le_bytes(
        header[sector_at..sector_at + 8]
            .try_into()
            .expect("8 bytes"),
    );
    Ok((kind, sector))
}

/// The file failed a request the guest made correctly: not the guest's error, but the
/// request's (§5.2.6: VIRTIO_BLK_S_IOERR).
fn host_error(log: &DeviceLog, e: &std::io::Error) -> Refused {
    log.warn(format_args!("virtio-blk: the disk file: {e}"));
    Refused::Backend
}

/// Read bytes `start..` of `buffers` into `buf`.
fn read_at(
    buffers: &[Buffer],
    start: u64,
    buf: &mut [u8],
    dma: &DmaContext,
) -> Result<(), DmaError> {
    let mut done = 0;
    for (addr, n) in ranges(buffers, start, buf.len() as u64) {
        let n = usize::try_from(n).expect("at most buf.len()");
        dma.read(addr, &mut buf[done..done + n])?;
        done += n;
    }
    Ok(())
}

/// Write `data` at bytes `start..` of `buffers`.
fn write_at(buffers: &[Buffer], start: u64, data: &[u8], dma: &DmaContext) -> Result<(), DmaError> {
    let mut done = 0;
    for (addr, n) in ranges(buffers, start, data.len() as u64) {
        let n = usize::try_from(n).expect("at most data.len()");
        dma.write(addr, &data[done..done + n])?;
        done += n;
    }
    Ok(())
}

impl QueueHandler for BlockQueues {
    fn process_queue(
        &mut self,
        index: usize,
        queues: &mut [ServedQueue],
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<Progress, DeviceError> {
        let mut progress = Progress::default();
        let Some(q) = queues.get_mut(index) else {
            return Ok(progress);
        };
        let mut chain = std::mem::take(&mut self.chain);
        let counters = Arc::clone(q.counters());
        let done = serve_chains(q, dma, &mut chain, |c: &Chain| {
            self.serve(c, dma, log, &counters)
        });
        self.chain = chain;
        let done = done?;
        progress.mark(index, done.used);
        progress.more = done.more;
        Ok(progress)
    }

    /// Nothing is in flight between kicks: every request completes in the call that takes it.
    fn reset(&mut self) {}
}
