//! Guest memory in a snapshot: one file holding every RAM region at consecutive offsets, in
//! address order (as the shared memfd lays them out, `vm::RamBacking::SharedMemfd`), with each
//! all-zero 4 KiB page left a hole, so a guest that touched little of its RAM leaves a small
//! file; and its [`MemoryChecksum`], which the snapshot's description keeps.
//!
//! A restore copies the file's pages into the new VM's own RAM and checks the checksum on the
//! way: the VM's memory is its own from the start, whatever happens to the file after (cut
//! short, written over, replaced by the next snapshot), and a file that is not the one its
//! description names (another snapshot's of the same size, or edited) is refused. Not mapped
//! `MAP_PRIVATE` as Firecracker does: pages the guest has not touched yet would be read from
//! the file when first touched, so truncating it would kill the VM with SIGBUS and writing it
//! would change the guest's RAM under it. The copy costs a read of the pages the guest had
//! written (holes cost nothing), at the restore rather than spread over the run.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MmapRegion,
    VolatileMemory,
};

use crate::vm::{Irqchip, RamBacking, Vm, VmError, map_ram};

/// The unit a hole is made of: the x86 base page (Intel SDM Vol. 3A §4.3).
pub const PAGE: usize = 4096;

/// How much guest memory is copied through the VMM at a time.
const CHUNK: usize = 1 << 20;

fn file_error(what: &'static str) -> impl FnOnce(std::io::Error) -> VmError {
    move |source| VmError::MemoryFile { what, source }
}

/// What a memory file holds, in 32 bits: the CRC-32 (IEEE) of each page that is not all zero,
/// in file order, each preceded by its offset in the file (8 bytes, little-endian). Zero pages,
/// holes or not, count for nothing, so the memfd a snapshot reads (whose zero pages may be
/// allocated) and the sparse file a restore reads give the same sum.
#[derive(Default)]
pub struct MemoryChecksum(crc32fast::Hasher);

impl MemoryChecksum {
    /// Count the page `page`, at `offset` in the file.
    fn page(&mut self, offset: u64, page: &[u8]) {
        self.0.update(&offset.to_le_bytes());
        self.0.update(page);
    }

    /// The sum of the pages counted.
    pub fn value(self) -> u32 {
        self.0.finalize()
    }
}

/// A snapshot's memory file, open, and the [`MemoryChecksum`] its description gives it.
pub struct SavedMemory {
    /// The file, as [`Vm::save_memory`] wrote it.
    pub file: File,
    /// Its pages' checksum when it was written.
    pub checksum: u32,
}

/// Whether `page` is all zero: a hole in the file.
fn is_zero(page: &[u8]) -> bool {
    page.iter().all(|&b| b == 0)
}

/// Write the pages of `data` that are not all zero at `offset` in `file`, a run of them in one
/// write, each counted in `sum`.
fn write_nonzero_pages(
    file: &File,
    data: &[u8],
    offset: u64,
    sum: &mut MemoryChecksum,
) -> Result<(), VmError> {
    let pages: Vec<&[u8]> = data.chunks(PAGE).collect();
    let mut i = 0;
    while i < pages.len() {
        if is_zero(pages[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < pages.len() && !is_zero(pages[i]) {
            sum.page(offset + (i * PAGE) as u64, pages[i]);
            i += 1;
        }
        let run = &data[start * PAGE..(i * PAGE).min(data.len())];
        file.write_all_at(run, offset + (start * PAGE) as u64)
            .map_err(file_error("write the memory file"))?;
    }
    Ok(())
}

/// The `len` bytes of `region` from `at` into `buf` (a guest-memory read: volatile).
fn copy_out(region: &MmapRegion, at: usize, buf: &mut [u8]) -> Result<(), VmError> {
    let slice = region
        .get_slice(at, buf.len())
        .map_err(|e| VmError::Memory {
            size: region.size(),
            reason: e.to_string(),
        })?;
    slice.copy_to(buf);
    Ok(())
}

/// Where `len` bytes at `start` in `file` may hold data, relative to `start`: the rest are
/// holes (lseek(2) SEEK_DATA, SEEK_HOLE), which read as zeros. Skipping them keeps a snapshot
/// from reading (and so allocating) the pages of a memfd the guest never touched, and a
/// restore from reading the file's holes. By hand: two libc calls no crate in the tree wraps.
fn data_ranges(file: &File, start: u64, len: usize) -> Result<Vec<Range<usize>>, VmError> {
    let seek = |at: u64, whence: libc::c_int| -> Result<Option<u64>, VmError> {
        let at = libc::off_t::try_from(at)
            .map_err(|_| VmError::StateMismatch(format!("offset {at}")))?;
        // SAFETY: lseek reads nothing from memory; a bad descriptor or offset is an error.
        let found = unsafe { libc::lseek(file.as_raw_fd(), at, whence) };
        match u64::try_from(found) {
            Ok(found) => Ok(Some(found)),
            // No data past `at`.
            Err(_) if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) => {
                Ok(None)
            }
            Err(_) => Err(file_error("find the data in a memory file")(
                std::io::Error::last_os_error(),
            )),
        }
    };
    let end = start + len as u64;
    let mut ranges = Vec::new();
    let mut at = start;
    while at < end {
        let Some(data) = seek(at, libc::SEEK_DATA)?.filter(|&d| d < end) else {
            break;
        };
        // The end of the file counts as a hole, so there is always one.
        let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(end).min(end);
        let relative = |o: u64| usize::try_from(o - start).expect("within `len`");
        ranges.push(relative(data)..relative(hole));
        at = hole;
    }
    Ok(ranges)
}

/// `ranges` cut in pieces of at most [`CHUNK`] bytes: (offset, length).
fn chunks(ranges: Vec<Range<usize>>) -> impl Iterator<Item = (usize, usize)> {
    ranges.into_iter().flat_map(|r| {
        r.clone()
            .step_by(CHUNK)
            .map(move |at| (at, CHUNK.min(r.end - at)))
    })
}

impl Vm {
    /// Write guest RAM to `file` (emptied first): every region at consecutive offsets in
    /// address order, all-zero pages left as holes, the file as long as the RAM; the file's
    /// [`MemoryChecksum`] is returned. Every vCPU must be parked and every device paused, or
    /// the file is no one moment's memory.
    pub fn save_memory(&self, file: &mut File) -> Result<u32, VmError> {
        let mut sum = MemoryChecksum::default();
        file.set_len(0)
            .map_err(file_error("empty the memory file"))?;
        let mut buf = vec![0u8; CHUNK];
        let mut base = 0;
        for region in self.memory.iter() {
            let data = match region.file_offset() {
                Some(memfd) => data_ranges(memfd.file(), memfd.start(), region.size())?,
                None => std::iter::once(0..region.size()).collect(),
            };
            for (at, len) in chunks(data) {
                let chunk = &mut buf[..len];
                copy_out(region, at, chunk)?;
                write_nonzero_pages(file, chunk, base + at as u64, &mut sum)?;
            }
            base += region.len();
        }
        file.set_len(base)
            .map_err(file_error("size the memory file"))?;
        Ok(sum.value())
    }

    /// A VM as [`Vm::with_irqchip`] makes one, its RAM `ram` loaded from `file`, which
    /// [`Vm::save_memory`] wrote for the same layout (`saved`): the
    /// file's pages are copied into the VM's own RAM (private or the memfd, as `backing`
    /// says), so nothing done to the file afterwards reaches the VM. A file of another length
    /// than the RAM, or whose pages do not sum to its checksum, is refused.
    pub fn restored(
        ram: &[(u64, usize)],
        in_core_dumps: bool,
        irqchip: Irqchip,
        backing: RamBacking,
        saved: SavedMemory,
    ) -> Result<Self, VmError> {
        let SavedMemory { file, checksum } = saved;
        let total: usize = ram.iter().map(|r| r.1).sum();
        let len = file
            .metadata()
            .map_err(file_error("read the memory file's size"))?
            .len();
        if len != total as u64 {
            return Err(VmError::StateMismatch(format!(
                "the memory file is {len} bytes, the machine's RAM {total}"
            )));
        }
        Self::build(in_core_dumps, irqchip, || {
            let memory = map_ram(ram, backing)?;
            if copy_in(&memory, &file)? != checksum {
                return Err(VmError::MemoryChecksum);
            }
            Ok(memory)
        })
    }
}

/// Copy the pages of `file` (`total` bytes, laid out as [`Vm::save_memory`] writes it) that are
/// not all zero into `memory`, whose pages are all zero yet: the holes cost nothing. Returns
/// the pages' [`MemoryChecksum`]. Read with pread(2), not through a mapping: a file cut short
/// meanwhile is a read error, not a SIGBUS.
fn copy_in(memory: &GuestMemoryMmap, file: &File) -> Result<u32, VmError> {
    let mut buf = vec![0u8; CHUNK];
    let mut base = 0;
    let mut sum = MemoryChecksum::default();
    for region in memory.iter() {
        for (at, len) in chunks(data_ranges(file, base as u64, region.size())?) {
            let chunk = &mut buf[..len];
            let offset = (base + at) as u64;
            file.read_exact_at(chunk, offset)
                .map_err(file_error("read the memory file"))?;
            copy_nonzero_pages(
                memory,
                chunk,
                region.start_addr().0 + at as u64,
                offset,
                &mut sum,
            )?;
        }
        base += region.size();
    }
    Ok(sum.value())
}

/// Write the pages of `data` that are not all zero into `memory`, from `gpa` on, each counted
/// in `sum` at its offset in the file (`data` is from `offset` on).
fn copy_nonzero_pages(
    memory: &GuestMemoryMmap,
    data: &[u8],
    gpa: u64,
    offset: u64,
    sum: &mut MemoryChecksum,
) -> Result<(), VmError> {
    let nonzero = data.chunks(PAGE).zip(0u64..).filter(|(p, _)| !is_zero(p));
    for (page, i) in nonzero {
        sum.page(offset + i * PAGE as u64, page);
        memory
            .write_slice(page, GuestAddress(gpa + i * PAGE as u64))
            .map_err(|e| VmError::Memory {
                size: data.len(),
                reason: e.to_string(),
            })?;
    }
    Ok(())
}
