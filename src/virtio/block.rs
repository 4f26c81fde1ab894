//! virtio-blk (virtio 1.2 §5.2) on a raw file: sector `n` of the disk is bytes `512 n ..` of
//! the file. [`VirtioBlock`] is the register side (identity, features, configuration space);
//! [`BlockQueues`] serves the request queue on the device thread with `pread`/`pwrite` at
//! offsets and `fsync`, so a request never moves the file's position or its size.
//!
//! Every request a driver can build gets a status, never a panic: a request is a header
//! (`struct virtio_blk_outhdr`), its data, and one writable status byte last (§5.2.6). Data
//! outside the disk, lengths that are not whole sectors, headers too short and writes to a
//! read-only disk are answered VIRTIO_BLK_S_IOERR, unknown types VIRTIO_BLK_S_UNSUPP, and all
//! are counted as guest errors. A chain with no writable byte cannot be answered: it completes
//! with nothing written. Guest memory is reached only through the device's DMA context, the
//! file only inside its capacity.

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::unix::fs::FileExt;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT, virtio_blk_config,
    virtio_blk_outhdr,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::Queue;
use vm_memory::{Address, GuestAddress};

use super::DeviceParts;
use super::chain::{Buffer, Chain};
use super::device::{
    DeviceError, Progress, QueueHandler, VirtioDevice, read_config_bytes, serve_chains,
};
use crate::dma::{DmaContext, DmaError};
use crate::guest_error;
use crate::logging::DeviceLog;

/// Size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// The unit of `capacity` and of a request's `sector`, whatever `blk_size` says (§5.2.4).
pub const SECTOR_SIZE: u64 = 512;
/// Data buffers a request may have (`seg_max`, §5.2.4): the queue's descriptors less the
/// header's and the status byte's.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// The device ID string's length (§5.2.6: VIRTIO_BLK_T_GET_ID).
const SERIAL_LEN: usize = VIRTIO_BLK_ID_BYTES as usize;
/// `struct virtio_blk_outhdr`: type, reserved (ioprio), sector.
const HEADER_LEN: usize = size_of::<virtio_blk_outhdr>();
/// Configuration space through `blk_size`, the last field offered.
const CONFIG_LEN: usize = offset_of!(virtio_blk_config, blk_size) + 4;
/// Bytes moved between the file and guest memory at a time: a request's size does not decide
/// how much host memory the device uses.
const CHUNK: usize = 64 << 10;

/// The register side of a virtio-blk device: its capacity and whether it is read-only.
pub struct VirtioBlock {
    /// Capacity in sectors.
    sectors: u64,
    read_only: bool,
}

/// The queue work of a [`VirtioBlock`]: the file and what requests are checked against.
pub struct BlockQueues {
    disk: File,
    /// Bytes of the file the guest can reach: whole sectors, never more than the file had.
    capacity: u64,
    read_only: bool,
    serial: [u8; SERIAL_LEN],
    /// The buffer data moves through, [`CHUNK`] bytes.
    scratch: Vec<u8>,
}

impl VirtioBlock {
    /// A device on `disk` (opened read-only if `read_only`), its capacity the file's whole
    /// sectors, answering VIRTIO_BLK_T_GET_ID with the first 20 bytes of `serial`.
    pub fn new(disk: File, read_only: bool, serial: &[u8]) -> std::io::Result<(Self, BlockQueues)> {
        let sectors = disk.metadata()?.len() / SECTOR_SIZE;
        let mut id = [0u8; SERIAL_LEN];
        let n = serial.len().min(SERIAL_LEN);
        id[..n].copy_from_slice(&serial[..n]);
        let queues = BlockQueues {
            disk,
            capacity: sectors * SECTOR_SIZE,
            read_only,
            serial: id,
            scratch: vec![0; CHUNK],
        };
        Ok((VirtioBlock { sectors, read_only }, queues))
    }

    /// The same, as the [`DeviceParts`] a transport takes.
    pub fn parts(disk: File, read_only: bool, serial: &[u8]) -> std::io::Result<DeviceParts> {
        let (device, queues) = VirtioBlock::new(disk, read_only, serial)?;
        Ok(DeviceParts {
            device: Box::new(device),
            queues: Box::new(queues),
        })
    }
}

impl VirtioDevice for VirtioBlock {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let ro = if self.read_only {
            1 << VIRTIO_BLK_F_RO
        } else {
            0
        };
        ro | 1 << VIRTIO_BLK_F_FLUSH | 1 << VIRTIO_BLK_F_SEG_MAX | 1 << VIRTIO_BLK_F_BLK_SIZE
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_blk_config: capacity, size_max (not offered: 0), seg_max, geometry
        // (not offered: 0), blk_size.
        let mut config = [0u8; CONFIG_LEN];
        let mut put = |at: usize, bytes: &[u8]| config[at..at + bytes.len()].copy_from_slice(bytes);
        put(
            offset_of!(virtio_blk_config, capacity),
            &self.sectors.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, seg_max),
            &SEG_MAX.to_le_bytes(),
        );
        let blk_size = u32::try_from(SECTOR_SIZE).expect("512");
        put(
            offset_of!(virtio_blk_config, blk_size),
            &blk_size.to_le_bytes(),
        );
        read_config_bytes(&config, offset, data);
    }
}

/// Why a request got no VIRTIO_BLK_S_OK.
enum Refused {
    /// Answered with this status.
    Status(u32),
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
    /// Serve one request; returns the bytes written into the chain, status byte included.
    fn serve(&mut self, c: &Chain, dma: &DmaContext, log: &DeviceLog) -> Result<u32, DeviceError> {
        // The status is the chain's last writable byte (§5.2.6); data before it.
        let Some(status_at) = c.writable_len().checked_sub(1) else {
            guest_error!(
                log,
                "virtio-blk: request without a writable status byte; completed unanswered"
            );
            return Ok(0);
        };
        let (status, written) = match self.request(c, status_at, dma, log) {
            Ok(written) => (VIRTIO_BLK_S_OK, written),
            Err(Refused::Status(status)) => (status, 0),
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
        match kind {
            VIRTIO_BLK_T_IN => {
                let offset = self.offset(sector, data_in, log)?;
                self.transfer(
                    Direction::ToGuest,
                    &c.writable,
                    0,
                    data_in,
                    offset,
                    dma,
                    log,
                )?;
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
                self.transfer(
                    Direction::ToFile,
                    &c.readable,
                    from,
                    data_out,
                    offset,
                    dma,
                    log,
                )?;
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

    /// Move `len` bytes between the file at `offset` and bytes `start..` of `buffers`, a chunk
    /// at a time.
    #[allow(clippy::too_many_arguments)] // one request's facts, each used once
    fn transfer(
        &mut self,
        direction: Direction,
        buffers: &[Buffer],
        start: u64,
        len: u64,
        mut offset: u64,
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<(), Refused> {
        for (addr, piece) in pieces(buffers, start, len) {
            let mut done = 0u64;
            while done < piece {
                let n = usize::try_from(piece - done).map_or(CHUNK, |n| n.min(CHUNK));
                let at = addr.unchecked_add(done);
                let buf = &mut self.scratch[..n];
                match direction {
                    Direction::ToGuest => {
                        self.disk
                            .read_exact_at(buf, offset)
                            .map_err(|e| host_error(log, &e))?;
                        dma.write(at, buf)?;
                    }
                    Direction::ToFile => {
                        dma.read(at, buf)?;
                        self.disk
                            .write_all_at(buf, offset)
                            .map_err(|e| host_error(log, &e))?;
                    }
                }
                done += n as u64;
                offset += n as u64;
            }
        }
        Ok(())
    }
}

/// The file failed a request the guest made correctly: not the guest's error, but the
/// request's (§5.2.6: VIRTIO_BLK_S_IOERR).
fn host_error(log: &DeviceLog, e: &std::io::Error) -> Refused {
    log.warn(format_args!("virtio-blk: the disk file: {e}"));
    Refused::Status(VIRTIO_BLK_S_IOERR)
}

/// The guest ranges that hold bytes `start..start + len` of `buffers` taken end to end.
fn pieces(buffers: &[Buffer], start: u64, len: u64) -> impl Iterator<Item = (GuestAddress, u64)> {
    let end = start.saturating_add(len);
    let mut at = 0u64;
    buffers.iter().filter_map(move |b| {
        let (lo, hi) = (at, at + u64::from(b.len));
        at = hi;
        let (from, to) = (lo.max(start), hi.min(end));
        // A checked chain's buffers lie in memory the device may reach: no overflow.
        (from < to).then(|| (b.addr.unchecked_add(from - lo), to - from))
    })
}

/// Read bytes `start..` of `buffers` into `buf`.
fn read_at(
    buffers: &[Buffer],
    start: u64,
    buf: &mut [u8],
    dma: &DmaContext,
) -> Result<(), DmaError> {
    let mut done = 0;
    for (addr, n) in pieces(buffers, start, buf.len() as u64) {
        let n = usize::try_from(n).expect("at most buf.len()");
        dma.read(addr, &mut buf[done..done + n])?;
        done += n;
    }
    Ok(())
}

/// Write `data` at bytes `start..` of `buffers`.
fn write_at(buffers: &[Buffer], start: u64, data: &[u8], dma: &DmaContext) -> Result<(), DmaError> {
    let mut done = 0;
    for (addr, n) in pieces(buffers, start, data.len() as u64) {
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
        queues: &mut [Queue],
        dma: &DmaContext,
        log: &DeviceLog,
    ) -> Result<Progress, DeviceError> {
        let mut progress = Progress::default();
        let Some(q) = queues.get_mut(index) else {
            return Ok(progress);
        };
        let done = serve_chains(q, dma, |c: &Chain| self.serve(c, dma, log))?;
        progress.mark(index, done.used);
        progress.more = done.more;
        Ok(progress)
    }

    /// Nothing is in flight between kicks: every request completes in the call that takes it.
    fn reset(&mut self) {}
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // fixtures
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::virtio::device::{DeviceHealth, Notification};
    use crate::virtio::engine::QueueEngine;
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::RawDescriptor;
    use virtio_queue::desc::split::Descriptor;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestMemoryMmap};

    /// Room for 16 requests of up to 4 descriptors each.
    const QSIZE: u16 = 64;
    /// Where requests' headers, data and status bytes live, above the rings.
    const HEADER: u64 = 0x8_0000;
    const DATA: u64 = 0x9_0000;
    const STATUS: u64 = 0xa_0000;
    /// The disk: 8 sectors.
    const DISK: u64 = 8 * SECTOR_SIZE;

    /// A file in the temporary directory, removed when dropped.
    struct TempDisk(PathBuf);

    impl TempDisk {
        /// `len` bytes, byte `i` = `i / 512` (each sector holds its number).
        fn new(len: u64) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let name = format!(
                "exitless-blk-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            let path = std::env::temp_dir().join(name);
            let bytes: Vec<u8> = (0..len).map(|i| (i / SECTOR_SIZE) as u8).collect();
            std::fs::write(&path, bytes).unwrap();
            TempDisk(path)
        }

        fn open(&self, read_only: bool) -> File {
            std::fs::OpenOptions::new()
                .read(true)
                .write(!read_only)
                .open(&self.0)
                .unwrap()
        }

        fn bytes(&self) -> Vec<u8> {
            std::fs::read(&self.0).unwrap()
        }
    }

    impl Drop for TempDisk {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap()
    }

    /// A buffer: address, length, `VRING_DESC_F_*` flags (links are added by [`publish`]).
    type Buf = (u64, u32, u32);

    /// Publish one chain of `bufs`, linked in order, at descriptors 4 × its ring position.
    fn publish(vq: &MockSplitQueue<'_, GuestMemoryMmap>, bufs: &[Buf]) {
        let first = vq.avail().idx().load() * 4;
        let descs: Vec<RawDescriptor> = bufs
            .iter()
            .enumerate()
            .map(|(j, &(addr, len, flags))| {
                let next = first + j as u16 + 1;
                let flags = if j + 1 < bufs.len() {
                    flags | VRING_DESC_F_NEXT
                } else {
                    flags
                };
                RawDescriptor::from(Descriptor::new(addr, len, flags as u16, next))
            })
            .collect();
        vq.add_desc_chains(&descs, first).unwrap();
    }

    /// The device on `disk`, its queue live on the driver side `vq`.
    fn engine(
        disk: &TempDisk,
        read_only: bool,
        vq: &MockSplitQueue<'_, GuestMemoryMmap>,
        mem: &GuestMemoryMmap,
    ) -> (QueueEngine, Arc<DeviceHealth>, Arc<DeviceLog>) {
        let (_, handler) =
            VirtioBlock::new(disk.open(read_only), read_only, b"exitless-test-disk").unwrap();
        let log = DeviceLog::new("test");
        let health = Arc::new(DeviceHealth::new(log.clone()));
        let mut engine = QueueEngine::new(Box::new(handler), health.clone());
        engine.activate(
            vec![vq.create_queue().unwrap()],
            DmaContext::platform(mem.clone()),
        );
        (engine, health, log)
    }

    /// Publish a request: a header of `kind` and `sector`, then `bufs` (data and status).
    fn request(
        mem: &GuestMemoryMmap,
        vq: &MockSplitQueue<'_, GuestMemoryMmap>,
        kind: u32,
        sector: u64,
        bufs: &[Buf],
    ) {
        let mut header = [0u8; HEADER_LEN];
        header[..4].copy_from_slice(&kind.to_le_bytes());
        header[8..].copy_from_slice(&sector.to_le_bytes());
        mem.write_slice(&header, GuestAddress(HEADER)).unwrap();
        mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        let mut chain = vec![(HEADER, HEADER_LEN as u32, 0)];
        chain.extend_from_slice(bufs);
        publish(vq, &chain);
    }

    fn status_desc() -> Buf {
        (STATUS, 1, VRING_DESC_F_WRITE)
    }

    /// The status byte and the used length of completed chain `i`.
    fn answer(
        mem: &GuestMemoryMmap,
        vq: &MockSplitQueue<'_, GuestMemoryMmap>,
        i: usize,
    ) -> (u32, u32) {
        let status = mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap();
        (
            u32::from(status),
            vq.used().ring().ref_at(i).unwrap().load().len(),
        )
    }

    #[test]
    fn a_read_copies_sectors_into_the_drivers_buffers() {
        let (mem, disk) = (memory(), TempDisk::new(DISK));
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let (mut engine, health, log) = engine(&disk, false, &vq, &mem);
        // Two data buffers across sectors 2..5, split mid-sector.
        let w = VRING_DESC_F_WRITE;
        request(
            &mem,
            &vq,
            VIRTIO_BLK_T_IN,
            2,
            &[
                (DATA, 700, w),
                (DATA + 0x1000, 3 * 512 - 700, w),
                status_desc(),
            ],
        );
        assert_eq!(
            engine.process(0).notifications,
            vec![Notification::Queue(0)]
        );
        assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_OK, 3 * 512 + 1));
        let mut got = vec![0u8; 3 * 512];
        mem.read_slice(&mut got[..700], GuestAddress(DATA)).unwrap();
        mem.read_slice(&mut got[700..], GuestAddress(DATA + 0x1000))
            .unwrap();
        assert_eq!(got, disk.bytes()[2 * 512..5 * 512]);
        assert!(!health.needs_reset());
        assert_eq!(log.guest_errors(), 0);
    }

    #[test]
    fn a_write_reaches_the_file_and_a_flush_is_answered() {
        let (mem, disk) = (memory(), TempDisk::new(DISK));
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let (mut engine, _, log) = engine(&disk, false, &vq, &mem);
        let data: Vec<u8> = (0..1024).map(|i| (i * 7) as u8).collect();
        mem.write_slice(&data, GuestAddress(DATA)).unwrap();
        request(
            &mem,
            &vq,
            VIRTIO_BLK_T_OUT,
            6,
            &[(DATA, 1024, 0), status_desc()],
        );
        engine.process(0);
        assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_OK, 1));
        let file = disk.bytes();
        assert_eq!(&file[6 * 512..], &data[..]);
        assert_eq!(file[6 * 512 - 1], 5, "the sector before is untouched");
        assert_eq!(file.len() as u64, DISK);
        request(&mem, &vq, VIRTIO_BLK_T_FLUSH, 0, &[status_desc()]);
        engine.process(0);
        assert_eq!(answer(&mem, &vq, 1), (VIRTIO_BLK_S_OK, 1));
        assert_eq!(log.guest_errors(), 0);
    }

    #[test]
    fn get_id_answers_the_serial() {
        let (mem, disk) = (memory(), TempDisk::new(DISK));
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let (mut engine, _, _) = engine(&disk, false, &vq, &mem);
        request(
            &mem,
            &vq,
            VIRTIO_BLK_T_GET_ID,
            0,
            &[(DATA, 20, VRING_DESC_F_WRITE), status_desc()],
        );
        engine.process(0);
        assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_OK, 21));
        let mut id = [0u8; 20];
        mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
        assert_eq!(&id[..18], b"exitless-test-disk");
        assert_eq!(&id[18..], [0, 0]);
    }

    #[test]
    fn a_read_only_disk_refuses_writes_with_ioerr_and_keeps_its_bytes() {
        let (mem, disk) = (memory(), TempDisk::new(DISK));
        let before = disk.bytes();
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let (mut engine, health, log) = engine(&disk, true, &vq, &mem);
        request(
            &mem,
            &vq,
            VIRTIO_BLK_T_OUT,
            0,
            &[(DATA, 512, 0), status_desc()],
        );
        engine.process(0);
        assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_IOERR, 1));
        assert_eq!(disk.bytes(), before);
        assert_eq!(log.guest_errors(), 1);
        // Reads still work.
        request(
            &mem,
            &vq,
            VIRTIO_BLK_T_IN,
            0,
            &[(DATA, 512, VRING_DESC_F_WRITE), status_desc()],
        );
        engine.process(0);
        assert_eq!(answer(&mem, &vq, 1), (VIRTIO_BLK_S_OK, 513));
        assert!(!health.needs_reset());
    }

    #[test]
    fn requests_outside_the_disk_or_of_partial_sectors_get_ioerr() {
        let (mem, disk) = (memory(), TempDisk::new(DISK + 100));
        let before = disk.bytes();
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let (mut engine, health, log) = engine(&disk, false, &vq, &mem);
        let cases: [(u32, u64, u32); 6] = [
            (VIRTIO_BLK_T_IN, 8, 512),   // the sector after the last whole one
            (VIRTIO_BLK_T_OUT, 7, 1024), // runs past the end
            (VIRTIO_BLK_T_OUT, u64::MAX / 256, 512), // sector × 512 overflows
            (VIRTIO_BLK_T_IN, u64::MAX, 512),
            (VIRTIO_BLK_T_IN, 0, 100), // not whole sectors
            (VIRTIO_BLK_T_OUT, 0, 513),
        ];
        for (i, &(kind, sector, len)) in cases.iter().enumerate() {
            let flags = if kind == VIRTIO_BLK_T_IN {
                VRING_DESC_F_WRITE
            } else {
                0
            };
            request(
                &mem,
                &vq,
                kind,
                sector,
                &[(DATA, len, flags), status_desc()],
            );
            engine.process(0);
            assert_eq!(answer(&mem, &vq, i), (VIRTIO_BLK_S_IOERR, 1), "case {i}");
        }
        assert_eq!(
            disk.bytes(),
            before,
            "the trailing partial sector is never reached"
        );
        assert_eq!(log.guest_errors(), cases.len() as u64);
        assert!(!health.needs_reset());
    }

    #[test]
    fn unknown_types_are_unsupported_and_short_headers_ioerr() {
        let (mem, disk) = (memory(), TempDisk::new(DISK));
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let (mut engine, _, log) = engine(&disk, false, &vq, &mem);
        request(&mem, &vq, 11, 0, &[status_desc()]); // VIRTIO_BLK_T_DISCARD: not offered
        engine.process(0);
        assert_eq!(answer(&mem, &vq, 0), (VIRTIO_BLK_S_UNSUPP, 1));
        // An 8-byte header.
        publish(&vq, &[(HEADER, 8, 0), status_desc()]);
        engine.process(0);
        assert_eq!(answer(&mem, &vq, 1), (VIRTIO_BLK_S_IOERR, 1));
        assert_eq!(log.guest_errors(), 2);
    }

    #[test]
    fn a_chain_without_a_status_byte_completes_unanswered_and_a_malformed_one_breaks_the_device() {
        let (mem, disk) = (memory(), TempDisk::new(DISK));
        let vq = MockSplitQueue::create(&mem, GuestAddress(0x1000), QSIZE);
        let (mut engine, health, log) = engine(&disk, false, &vq, &mem);
        request(&mem, &vq, VIRTIO_BLK_T_OUT, 0, &[(DATA, 512, 0)]);
        assert_eq!(
            engine.process(0).notifications,
            vec![Notification::Queue(0)]
        );
        assert_eq!(answer(&mem, &vq, 0), (0xff, 0), "nothing written");
        assert_eq!(log.guest_errors(), 1);
        assert!(!health.needs_reset());
        // A data buffer outside guest memory: the chain is malformed.
        request(
            &mem,
            &vq,
            VIRTIO_BLK_T_IN,
            0,
            &[(0xff_fe00, 0x1000, VRING_DESC_F_WRITE), status_desc()],
        );
        assert_eq!(engine.process(0).notifications, vec![Notification::Config]);
        assert!(health.needs_reset());
    }

    #[test]
    fn the_configuration_space_holds_capacity_seg_max_and_blk_size() {
        let disk = TempDisk::new(DISK + 511);
        let (blk, _) = VirtioBlock::new(disk.open(true), true, b"").unwrap();
        let mut config = [0xffu8; 28];
        blk.read_config(0, &mut config);
        assert_eq!(config[..8], 8u64.to_le_bytes(), "whole sectors only");
        assert_eq!(config[12..16], SEG_MAX.to_le_bytes());
        assert_eq!(config[20..24], 512u32.to_le_bytes());
        assert_eq!(config[24..], [0; 4], "past the end reads zero");
        assert_eq!(blk.device_type(), 2);
        assert_ne!(blk.features() & 1 << VIRTIO_BLK_F_RO, 0);
    }
}
