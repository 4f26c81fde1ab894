//! The queue work of a virtio-blk device, on the device thread: each request checked, carried
//! out against the file and answered with a status (virtio 1.2 §5.2.6). A pass over a queue
//! starts the reads and writes of every request it takes on the disk's io_uring
//! ([`super::io`]), and answers them all together once they are done ([`ChainServer::settle`]):
//! requests in flight up to the queue's size, one notification for the batch, and nothing in
//! flight between passes (so a reset, a pause, a snapshot or an IOMMU invalidation never meets
//! a request half done). A flush waits for the writes started before it.

use std::fs::File;
use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES, virtio_blk_outhdr,
};

use super::discard::{self, Eraser, Kind, Range};
use super::io::{Direction, Ring, move_now};
use super::{DiskImage, QUEUE_SIZE, SECTOR_SIZE};
use crate::dma::{Access, DmaContext, DmaError, IOV_MAX, Segments};
use crate::guest_error;
use crate::logging::{Cause, DeviceLog, QueueCounters};
use crate::virtio::device::{ChainServer, DeviceError, Progress, QueueHandler, serve_chains};
use crate::virtio::queue::chain::{Buffer, Chain, ranges};
use crate::virtio::queue::split::ServedQueue;

/// The device ID string's length (§5.2.6: VIRTIO_BLK_T_GET_ID).
const SERIAL_LEN: usize = VIRTIO_BLK_ID_BYTES as usize;
/// `struct virtio_blk_outhdr`: type, reserved (ioprio), sector.
pub(super) const HEADER_LEN: usize = size_of::<virtio_blk_outhdr>();

/// The queue work of a [`super::VirtioBlock`]: the file and what requests are checked against,
/// the ring its data moves on, and the scratch of the requests being served (the chain, and
/// data buffers resolved to host memory: the data is not copied), reused for every request.
pub struct BlockQueues {
    disk: File,
    /// Bytes of the file the guest can reach: whole sectors, never more than the file had.
    capacity: u64,
    read_only: bool,
    serial: [u8; SERIAL_LEN],
    chain: Chain,
    /// The ring; None where the kernel refused one: then each request's data moves before
    /// the next is taken, in `io`.
    ring: Option<Ring>,
    io: Segments,
    /// The reads and writes of this pass on the ring (`flights[..started]`), and the scratch
    /// of earlier passes' (reused).
    flights: Vec<Flight>,
    started: usize,
    /// Discards and writes of zeroes: how they are carried out here, and the segments of the
    /// one being served, raw and checked.
    eraser: Eraser,
    segments: Vec<u8>,
    ranges: Vec<Range>,
}

/// A read or write started on the ring, answered at the end of its pass.
#[derive(Default)]
struct Flight {
    head: u16,
    direction: Option<Direction>,
    offset: u64,
    /// Data bytes.
    len: u64,
    /// The data buffers, resolved: the ring's iovecs.
    data: Segments,
    /// The status byte, resolved when the request was taken.
    status: Segments,
    /// What the ring said: bytes moved, or the file's error; None until it has.
    moved: Option<io::Result<u64>>,
}

/// How a request that got VIRTIO_BLK_S_OK is answered.
enum Answer {
    /// Now, with this many data bytes written into the chain.
    Now(u64),
    /// At the end of the pass: its data is moving on the ring.
    Later,
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

impl BlockQueues {
    /// The queue work on the image `disk` (its whole sectors), answering
    /// VIRTIO_BLK_T_GET_ID with the first 20 bytes of `serial`.
    /// Its data moves on an io_uring if `io_uring` and the kernel makes one (else, said
    /// once, a request at a time).
    pub(super) fn new(disk: DiskImage, serial: &[u8], io_uring: bool) -> Self {
        let (sectors, read_only) = (disk.bytes / SECTOR_SIZE, disk.read_only);
        let eraser = Eraser::new(disk.block_device);
        let disk = disk.file;
        let ring = io_uring
            .then(|| Ring::new(&disk, !read_only, u32::from(QUEUE_SIZE)))
            .and_then(|made| {
                made.inspect_err(|e| {
                    log::warn!(
                        "virtio-blk: no io_uring here ({e}): each request's data moves before the next is taken (,aio=sync says so without this line)"
                    );
                })
                .ok()
            });
        let mut id = [0u8; SERIAL_LEN];
        let n = serial.len().min(SERIAL_LEN);
        id[..n].copy_from_slice(&serial[..n]);
        BlockQueues {
            disk,
            capacity: sectors * SECTOR_SIZE,
            read_only,
            serial: id,
            chain: Chain::default(),
            ring,
            io: Segments::default(),
            flights: Vec::new(),
            started: 0,
            eraser,
            segments: Vec::new(),
            ranges: Vec::new(),
        }
    }

    /// Serve one request; returns the bytes written into the chain, status byte included, or
    /// None if the request's data is moving on the ring (answered in [`BlockQueues::settle`]).
    fn serve(
        &mut self,
        c: &Chain,
        dma: &DmaContext,
        log: &DeviceLog,
        counters: &QueueCounters,
    ) -> Result<Option<u32>, DeviceError> {
        // The status is the chain's last writable byte (§5.2.6); data before it.
        let Some(status_at) = c.writable_len().checked_sub(1) else {
            guest_error!(
                log,
                "virtio-blk: request without a writable status byte; completed unanswered"
            );
            counters.error(Cause::Guest);
            return Ok(Some(0));
        };
        let (status, written) = match self.request(c, status_at, dma, log) {
            Ok(Answer::Now(written)) => (VIRTIO_BLK_S_OK, written),
            Ok(Answer::Later) => return Ok(None),
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
        Ok(Some(used_len(written)))
    }

    /// Carry out the request of `c`, whose writable bytes before the status are `data_in`:
    /// now, saying how many data bytes were written into the chain, or later.
    fn request(
        &mut self,
        c: &Chain,
        data_in: u64,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<Answer, Refused> {
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
                let data = Data {
                    direction: Direction::ToGuest,
                    start: 0,
                    len: data_in,
                    offset,
                };
                self.transfer(&data, c, data_in, dma, log)
            }
            VIRTIO_BLK_T_OUT => {
                // §5.2.6.2: a device offering VIRTIO_BLK_F_RO answers writes IOERR and
                // writes nothing.
                if self.read_only {
                    guest_error!(log, "virtio-blk: write to a read-only disk refused");
                    return Err(Refused::Status(VIRTIO_BLK_S_IOERR));
                }
                let offset = self.offset(sector, data_out, log)?;
                let data = Data {
                    direction: Direction::ToFile,
                    start: HEADER_LEN as u64,
                    len: data_out,
                    offset,
                };
                self.transfer(&data, c, data_in, dma, log)
            }
            VIRTIO_BLK_T_FLUSH => {
                // What the flush makes durable is what completed before it (§5.2.6.3): the
                // writes started in this pass first.
                self.finish_started(log);
                self.disk.sync_all().map_err(|e| host_error(log, &e))?;
                Ok(Answer::Now(0))
            }
            VIRTIO_BLK_T_DISCARD => self.erase(Kind::Discard, c, data_out, dma, log),
            VIRTIO_BLK_T_WRITE_ZEROES => self.erase(Kind::WriteZeroes, c, data_out, dma, log),
            VIRTIO_BLK_T_GET_ID => {
                // 20 bytes, without a NUL when the string fills them (§5.2.6); a shorter
                // buffer takes what fits.
                let n = usize::try_from(data_in).map_or(SERIAL_LEN, |n| n.min(SERIAL_LEN));
                write_at(&c.writable, 0, &self.serial[..n], dma)?;
                Ok(Answer::Now(n as u64))
            }
            other => {
                guest_error!(log, "virtio-blk: request type {other} not supported");
                Err(Refused::Status(VIRTIO_BLK_S_UNSUPP))
            }
        }
    }

    /// Discard, or write zeroes on, the ranges of `c`'s `len` data bytes (§5.2.6), every
    /// segment checked before any is carried out, after the writes started before it.
    fn erase(
        &mut self,
        kind: Kind,
        c: &Chain,
        len: u64,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<Answer, Refused> {
        // §5.2.6.2: a read-only disk writes nothing (neither is offered on one).
        if self.read_only {
            guest_error!(
                log,
                "virtio-blk: discard or write-zeroes on a read-only disk"
            );
            return Err(Refused::Status(VIRTIO_BLK_S_IOERR));
        }
        let count = discard::segment_count(kind, len, log).map_err(Refused::Status)?;
        self.segments.resize(count * discard::SEGMENT_LEN, 0);
        read_at(&c.readable, HEADER_LEN as u64, &mut self.segments, dma)?;
        discard::parse(kind, &self.segments, self.capacity, log, &mut self.ranges)
            .map_err(Refused::Status)?;
        self.finish_started(log);
        for &range in &self.ranges {
            self.eraser
                .erase(&self.disk, kind, range, log)
                .map_err(|e| host_error(log, &e))?;
        }
        Ok(Answer::Now(0))
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

    /// Move `data` between the file and the chain `c`'s data buffers (writable ones for
    /// [`Direction::ToGuest`], readable ones otherwise), in place: started on the ring, its
    /// status byte (at `status_at` of the writable bytes) resolved now to be written when it
    /// is done, or moved now without a ring.
    fn transfer(
        &mut self,
        data: &Data,
        c: &Chain,
        status_at: u64,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<Answer, Refused> {
        let access = match data.direction {
            Direction::ToGuest => Access::Write,
            Direction::ToFile => Access::Read,
        };
        let Some(ring) = self.ring.as_mut().filter(|_| data.len > 0) else {
            c.resolve(dma, access, data.start, data.len, &mut self.io)?;
            return answer_now(&self.disk, data, &mut self.io, log);
        };
        if self.started == self.flights.len() {
            self.flights.push(Flight::default());
        }
        let flight = &mut self.flights[self.started];
        c.resolve(dma, Access::Write, status_at, 1, &mut flight.status)?;
        c.resolve(dma, access, data.start, data.len, &mut flight.data)?;
        if flight.data.iovecs().len() > IOV_MAX {
            // More pieces than one request takes: moved now, a window at a time.
            return answer_now(&self.disk, data, &mut flight.data, log);
        }
        let tag = self.started as u64;
        // SAFETY: `flights[..started]` are not touched until `finish_started` has taken every
        // completion (a flight pushed meanwhile moves the `Segments`, not their iovecs), and
        // guest memory stays mapped while the scratch holds it.
        match unsafe { ring.start(data.direction, &flight.data, data.offset, tag) } {
            Ok(()) => {
                flight.head = c.head;
                flight.direction = Some(data.direction);
                flight.offset = data.offset;
                flight.len = data.len;
                flight.moved = None;
                self.started += 1;
                Ok(Answer::Later)
            }
            Err(e) => {
                log.warn(format_args!(
                    "virtio-blk: io_uring refused a request ({e}); moved now"
                ));
                answer_now(&self.disk, data, &mut flight.data, log)
            }
        }
    }

    /// Wait for the reads and writes started on the ring in this pass, finishing a short one
    /// now. A ring that fails is given up for the rest of the device's life (said once); what
    /// it had not finished is answered VIRTIO_BLK_S_IOERR.
    fn finish_started(&mut self, log: &DeviceLog) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        let started = &mut self.flights[..self.started];
        let waited = ring.complete_all(|tag, moved| {
            if let Some(flight) = usize::try_from(tag).ok().and_then(|k| started.get_mut(k)) {
                flight.moved = Some(moved.map(|n| n as u64));
            }
        });
        if let Err(e) = waited {
            log.warn(format_args!(
                "virtio-blk: the io_uring failed ({e}); each request's data moves before the next is taken from now on"
            ));
            self.ring = None;
        }
        let fd = self.disk.as_raw_fd();
        for flight in started.iter_mut() {
            let (Some(Ok(n)), Some(direction)) = (&flight.moved, flight.direction) else {
                continue;
            };
            let n = *n;
            if n < flight.len {
                flight
                    .data
                    .skip(usize::try_from(n).expect("less than the request's length"));
                let rest = move_now(fd, direction, &mut flight.data, flight.offset + n);
                flight.moved = Some(rest.map(|()| flight.len));
            }
        }
    }

    /// Finish this pass's requests on the ring and answer each: its status byte written, its
    /// head and used length given to `complete`.
    fn settle(
        &mut self,
        log: &DeviceLog,
        counters: &QueueCounters,
        complete: &mut dyn FnMut(u16, u32),
    ) {
        self.finish_started(log);
        for flight in &mut self.flights[..std::mem::take(&mut self.started)] {
            let written = match flight.moved.take() {
                Some(Ok(_)) if flight.direction == Some(Direction::ToGuest) => Some(flight.len),
                Some(Ok(_)) => Some(0),
                Some(Err(e)) => {
                    host_error(log, &e);
                    None
                }
                None => None,
            };
            let status = match written {
                Some(_) => VIRTIO_BLK_S_OK,
                None => {
                    counters.error(Cause::Backend);
                    VIRTIO_BLK_S_IOERR
                }
            };
            let status = u8::try_from(status).expect("a VIRTIO_BLK_S_* value");
            flight.status.scatter(0, &[status]);
            complete(flight.head, used_len(written.unwrap_or(0)));
        }
    }
}

/// A request's data: which way it goes, from which byte of the chain's buffers (of that
/// way), how many bytes, at which offset of the file.
struct Data {
    direction: Direction,
    start: u64,
    len: u64,
    offset: u64,
}

/// Move `data` now through its buffers, resolved in `segments`, and answer at once.
fn answer_now(
    disk: &File,
    data: &Data,
    segments: &mut Segments,
    log: &DeviceLog,
) -> Result<Answer, Refused> {
    move_now(disk.as_raw_fd(), data.direction, segments, data.offset)
        .map_err(|e| host_error(log, &e))?;
    Ok(Answer::Now(match data.direction {
        Direction::ToGuest => data.len,
        Direction::ToFile => 0,
    }))
}

/// The used length of a request answered with `written` data bytes: they and the status byte.
fn used_len(written: u64) -> u32 {
    u32::try_from(written + 1).expect("a checked chain holds at most 4 GiB")
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
        let requests = Requests {
            queues: self,
            dma,
            log,
            counters: &counters,
            later: false,
        };
        let done = serve_chains(q, dma, &mut chain, requests);
        self.chain = chain;
        let done = done?;
        progress.mark(index, done.used);
        progress.more = done.more;
        Ok(progress)
    }

    /// Nothing is in flight between passes: every request completes in the pass that takes it.
    fn reset(&mut self) {}
}

/// The requests of one pass, as [`serve_chains`] hands them over.
struct Requests<'a> {
    queues: &'a mut BlockQueues,
    dma: &'a DmaContext,
    log: &'a DeviceLog,
    counters: &'a QueueCounters,
    /// The request just served is answered later.
    later: bool,
}

impl ChainServer for Requests<'_> {
    fn serve(&mut self, c: &Chain) -> Result<u32, DeviceError> {
        let answered = self.queues.serve(c, self.dma, self.log, self.counters)?;
        self.later = answered.is_none();
        Ok(answered.unwrap_or(0))
    }

    fn in_flight(&self) -> bool {
        self.later
    }

    fn settle(&mut self, complete: &mut dyn FnMut(u16, u32)) {
        self.queues.settle(self.log, self.counters, complete);
    }
}
