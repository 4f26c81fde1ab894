//! Guest memory in a snapshot: one file holding every RAM region at consecutive offsets, in
//! address order (as the shared memfd lays them out, `vm::RamBacking::SharedMemfd`), with each
//! all-zero 4 KiB page left a hole, so a guest that touched little of its RAM leaves a small
//! file. A restore maps the file MAP_PRIVATE (Firecracker's way): pages are read in when the
//! guest first touches them and the guest's writes never reach the file. Where another process
//! must map guest RAM (a vhost-user backend), the file's pages are copied into a fresh memfd.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
    GuestRegionMmap, MmapRegion, VolatileMemory,
};

use crate::vm::{Irqchip, RamBacking, Vm, VmError, map_ram};

/// The unit a hole is made of: the x86 base page (Intel SDM Vol. 3A §4.3).
pub const PAGE: usize = 4096;

/// How much guest memory is copied through the VMM at a time.
const CHUNK: usize = 1 << 20;

fn file_error(what: &'static str) -> impl FnOnce(std::io::Error) -> VmError {
    move |source| VmError::MemoryFile { what, source }
}

/// Write the pages of `data` that are not all zero at `offset` in `file`, a run of them in one
/// write.
fn write_nonzero_pages(file: &File, data: &[u8], offset: u64) -> Result<(), VmError> {
    let pages: Vec<&[u8]> = data.chunks(PAGE).collect();
    let mut i = 0;
    while i < pages.len() {
        if pages[i].iter().all(|&b| b == 0) {
            i += 1;
            continue;
        }
        let start = i;
        while i < pages.len() && pages[i].iter().any(|&b| b != 0) {
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
    /// address order, all-zero pages left as holes, the file as long as the RAM. Every vCPU
    /// must be parked and every device paused, or the file is no one moment's memory.
    pub fn save_memory(&self, file: &mut File) -> Result<(), VmError> {
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
                write_nonzero_pages(file, chunk, base + at as u64)?;
            }
            base += region.len();
        }
        file.set_len(base)
            .map_err(file_error("size the memory file"))
    }

    /// A VM as [`Vm::with_irqchip`] makes one, its RAM `ram` loaded from `file`, which
    /// [`Vm::save_memory`] wrote for the same layout: mapped MAP_PRIVATE for
    /// [`RamBacking::Private`] (the file must not change while the VM lives: pages the guest
    /// has not touched yet are read from it), copied into the memfd for
    /// [`RamBacking::SharedMemfd`]. A file of another length than the RAM is refused.
    pub fn restored(
        ram: &[(u64, usize)],
        in_core_dumps: bool,
        irqchip: Irqchip,
        backing: RamBacking,
        file: File,
    ) -> Result<Self, VmError> {
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
        Self::build(in_core_dumps, irqchip, || match backing {
            RamBacking::Private => map_private(ram, Arc::new(file)),
            RamBacking::SharedMemfd => {
                let memory = map_ram(ram, backing)?;
                copy_in(&memory, &file, total)?;
                Ok(memory)
            }
        })
    }
}

/// `ram`'s regions mapped MAP_PRIVATE from `file` at consecutive offsets.
fn map_private(ram: &[(u64, usize)], file: Arc<File>) -> Result<GuestMemoryMmap, VmError> {
    let size = ram.iter().map(|r| r.1).sum();
    let memory_error = |reason: String| VmError::Memory { size, reason };
    let mut offset = 0;
    let mut regions = Vec::with_capacity(ram.len());
    for &(base, len) in ram {
        let mapping = MmapRegionBuilder::new(len)
            .with_file_offset(FileOffset::from_arc(file.clone(), offset))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_NORESERVE | libc::MAP_PRIVATE)
            .build()
            .map_err(|e| memory_error(format!("map the memory file: {e}")))?;
        let region = GuestRegionMmap::new(mapping, GuestAddress(base))
            .ok_or_else(|| memory_error(format!("region at {base:#x} wraps")))?;
        regions.push(region);
        offset += len as u64;
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| memory_error(e.to_string()))
}

/// Copy the pages of `file` (`total` bytes, laid out as [`Vm::save_memory`] writes it) that are
/// not all zero into `memory`, whose pages are all zero yet: the holes cost nothing.
fn copy_in(memory: &GuestMemoryMmap, file: &File, total: usize) -> Result<(), VmError> {
    let source = MmapRegionBuilder::new(total)
        .with_file_offset(FileOffset::new(
            file.try_clone()
                .map_err(file_error("duplicate the memory file"))?,
            0,
        ))
        .with_mmap_prot(libc::PROT_READ)
        .with_mmap_flags(libc::MAP_NORESERVE | libc::MAP_PRIVATE)
        .build()
        .map_err(|e| VmError::Memory {
            size: total,
            reason: format!("map the memory file: {e}"),
        })?;
    let mut buf = vec![0u8; CHUNK];
    let mut base = 0;
    for region in memory.iter() {
        for (at, len) in chunks(data_ranges(file, base as u64, region.size())?) {
            let chunk = &mut buf[..len];
            copy_out(&source, base + at, chunk)?;
            copy_nonzero_pages(memory, chunk, region.start_addr().0 + at as u64)?;
        }
        base += region.size();
    }
    Ok(())
}

/// Write the pages of `data` that are not all zero into `memory`, from `gpa` on.
fn copy_nonzero_pages(memory: &GuestMemoryMmap, data: &[u8], gpa: u64) -> Result<(), VmError> {
    let nonzero = data
        .chunks(PAGE)
        .zip(0u64..)
        .filter(|(p, _)| p.iter().any(|&b| b != 0));
    for (page, i) in nonzero {
        memory
            .write_slice(page, GuestAddress(gpa + i * PAGE as u64))
            .map_err(|e| VmError::Memory {
                size: data.len(),
                reason: e.to_string(),
            })?;
    }
    Ok(())
}
