//! A Multiboot (version 0.6.96) loader: the format of the kernels `qemu -kernel` boots without
//! a Linux header, test kernels among them (kvm-unit-tests').
//!
//! The kernel carries a multiboot header in its first 8 KiB (§3.1). Its segments come from its
//! ELF program headers (a 32-bit ELF, or a 64-bit one), or, if the header has the address
//! fields (flags bit 16, the "a.out kludge"), from those, whatever the file's format. It is
//! entered in 32-bit protected mode with paging off (§3.2), EAX = 0x2BADB002 and EBX = the
//! multiboot information (§3.3): memory sizes, the memory map, the command line and the boot
//! loader's name. Every field of the file is checked before anything is written, and every
//! refusal is one line that names what is wrong.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::machine::layout::MemoryLayout;
use crate::machine::loader::elf::{self, ElfError, read_at};
use crate::machine::loader::file::{ImageFile, ReadError};
use crate::machine::loader::segment::{Segment, contents, contents_of, write_segments};
use crate::machine::loader::{EntryState, LoadError, Loader, MachineInfo};
use crate::machine::pc::boot::{
    CMDLINE_OFFSET, CmdlineError, PlacementError, boot_data_cmdline, check_segments_fit,
    place_boot_data, protected32_entry, segment_ranges, write_acpi,
};
use crate::machine::pc::memmap::{E820Entry, HIGH_RAM_START, LOW_RAM_END, MIN_RAM, e820};

/// The header's magic (§3.1.1).
const HEADER_MAGIC: u32 = 0x1bad_b002;
/// EAX at entry: the kernel was loaded by a multiboot loader (§3.2).
pub const BOOTLOADER_MAGIC: u32 = 0x2bad_b002;
/// The header must lie in the file's first 8192 bytes, 32-bit aligned (§3.1).
const HEADER_SEARCH: usize = 8192;

// Header flags (§3.1.2). Bits 0-15 are requirements: a loader that does not know one must
// refuse the kernel. Bits 16-31 are optional features.
/// Page-align modules: there are none, so it is met.
const FLAG_PAGE_ALIGN: u32 = 1 << 0;
/// Provide mem_lower/mem_upper and the memory map: always given.
const FLAG_MEMORY_INFO: u32 = 1 << 1;
/// Provide a video mode: there is no display.
const FLAG_VIDEO_MODE: u32 = 1 << 2;
/// The header's address fields are valid (the "a.out kludge").
const FLAG_ADDRESSES: u32 = 1 << 16;
/// The requirement bits.
const REQUIRED_MASK: u32 = 0xffff;

// Information flags (§3.3).
const INFO_MEMORY: u32 = 1 << 0;
const INFO_CMDLINE: u32 = 1 << 2;
const INFO_MODS: u32 = 1 << 3;
const INFO_MMAP: u32 = 1 << 6;
const INFO_LOADER_NAME: u32 = 1 << 9;

/// The boot loader's name the kernel is given.
const LOADER_NAME: &[u8] = b"exitless\0";

/// The multiboot header with its address fields (§3.1.1); the fields past `flags` are read
/// only when flags bit 16 says they are there.
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct Header {
    _magic: U32,
    _flags: U32,
    _checksum: U32,
    header_addr: U32,
    load_addr: U32,
    load_end_addr: U32,
    bss_end_addr: U32,
    entry_addr: U32,
}

/// Bytes of the header without its address fields.
const HEADER_BASE_LEN: usize = 12;

/// The multiboot information structure (§3.3), up to the fields this loader fills; the rest
/// (drives, APM, VBE, framebuffer) are zero and not flagged.
#[repr(C)]
#[derive(Default, IntoBytes, Immutable)]
struct Info {
    flags: u32,
    mem_lower: u32,
    mem_upper: u32,
    boot_device: u32,
    cmdline: u32,
    mods_count: u32,
    mods_addr: u32,
    syms: [u32; 4],
    mmap_length: u32,
    mmap_addr: u32,
    drives_length: u32,
    drives_addr: u32,
    config_table: u32,
    boot_loader_name: u32,
    apm_table: u32,
    vbe: [u32; 4],
}

/// `MmapEntry::size`: the bytes of an entry after its `size` field.
const MMAP_ENTRY_SIZE: u32 = 20;
const _: () = assert!(size_of::<MmapEntry>() == 4 + MMAP_ENTRY_SIZE as usize);

/// One memory map entry (§3.3): `size` counts the bytes after itself.
#[repr(C, packed)]
#[derive(IntoBytes, Immutable)]
struct MmapEntry {
    size: u32,
    base_addr: u64,
    length: u64,
    kind: u32,
}

/// Where the information pieces go in the boot data ([`place_boot_data`]): the information
/// first, then the memory map, the loader's name and the command line.
const MMAP_OFFSET: u64 = 0x100;
/// Room for 16 memory map entries.
const LOADER_NAME_OFFSET: u64 = MMAP_OFFSET + 16 * size_of::<MmapEntry>() as u64;

const _: () = assert!(size_of::<Info>() as u64 <= MMAP_OFFSET);
const _: () = assert!(LOADER_NAME_OFFSET + LOADER_NAME.len() as u64 <= CMDLINE_OFFSET);

/// Why a file is not a multiboot kernel this machine can boot.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MultibootError {
    /// No header at all.
    #[error(
        "not a multiboot kernel: no multiboot header (magic {HEADER_MAGIC:#x}) in the first \
         {HEADER_SEARCH} bytes"
    )]
    NoHeader,
    /// A header whose checksum is wrong.
    #[error("the multiboot header at offset {0:#x} has a bad checksum")]
    BadChecksum(usize),
    /// Requirements this loader does not know.
    #[error(
        "the multiboot header requires features exitless does not know (flags bits {0:#x}, \
         Multiboot 0.6.96 §3.1.2)"
    )]
    UnknownRequirements(u32),
    /// A video mode, which needs a display.
    #[error("the kernel requires a video mode (multiboot flags bit 2); exitless has no display")]
    VideoMode,
    /// The header's address fields run past the file.
    #[error("the multiboot header at offset {0:#x} is cut off before its address fields")]
    HeaderTruncated(usize),
    /// Address fields that contradict each other.
    #[error("the multiboot header's address fields are inconsistent: {0}")]
    BadAddresses(&'static str),
    /// Neither ELF nor address fields.
    #[error(
        "the kernel is not an ELF file and its multiboot header has no address fields (flags \
         bit 16): nothing says where to load it"
    )]
    NoLoadInfo,
    /// ELF headers that cannot be loaded.
    #[error(transparent)]
    Elf(#[from] ElfError),
    /// A segment past 4 GiB: unreachable with paging off.
    #[error(
        "{what} at {start:#x}..{end:#x} is not below 4 GiB, where a 32-bit kernel without paging can reach it"
    )]
    Above4G {
        /// What is loaded there.
        what: String,
        /// First address.
        start: u64,
        /// One past the last.
        end: u64,
    },
    /// The entry point is in no loaded segment.
    #[error("the entry point {0:#x} is not inside the loaded kernel")]
    EntryOutside(u64),
    /// Segments this machine has no room for where they ask.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The command line.
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
}

/// A multiboot kernel, checked and ready to load.
#[derive(Debug)]
pub struct MultibootKernel {
    segments: Vec<Segment>,
    /// The segments' file bytes.
    contents: Vec<Vec<u8>>,
    entry: u32,
    /// The command line, NUL-terminated.
    cmdline: Vec<u8>,
}

/// Find the header: 32-bit aligned in the first [`HEADER_SEARCH`] bytes, magic and checksum
/// right. Returns its offset and flags.
fn find_header(image: &[u8]) -> Result<(usize, u32), MultibootError> {
    let mut bad_checksum = None;
    let end = image.len().min(HEADER_SEARCH);
    for offset in (0..end.saturating_sub(HEADER_BASE_LEN - 1)).step_by(4) {
        let word = |i: usize| {
            let at = offset + 4 * i;
            u32::from_le_bytes(image[at..at + 4].try_into().expect("4 bytes"))
        };
        if word(0) != HEADER_MAGIC {
            continue;
        }
        let (flags, checksum) = (word(1), word(2));
        if HEADER_MAGIC.wrapping_add(flags).wrapping_add(checksum) == 0 {
            return Ok((offset, flags));
        }
        bad_checksum.get_or_insert(offset);
    }
    Err(bad_checksum.map_or(MultibootError::NoHeader, MultibootError::BadChecksum))
}

/// The segments from the header's address fields (§3.1.3), in a file of `file_len` bytes that
/// starts with `image`.
fn kludge_segments(
    image: &[u8],
    file_len: u64,
    offset: usize,
) -> Result<(Vec<Segment>, u64), MultibootError> {
    let h: Header = read_at(image, offset as u64).ok_or(MultibootError::HeaderTruncated(offset))?;
    let (header_addr, load_addr) = (u64::from(h.header_addr), u64::from(h.load_addr));
    let bad = MultibootError::BadAddresses;
    // The file offset of load_addr: the header's offset less its distance from load_addr.
    let ahead = header_addr
        .checked_sub(load_addr)
        .ok_or(bad("load_addr is above header_addr"))?;
    let start = (offset as u64)
        .checked_sub(ahead)
        .ok_or(bad("load_addr is before the start of the file"))?;
    let load_end = match u64::from(h.load_end_addr) {
        0 => load_addr + (file_len - start),
        end if end < load_addr => return Err(bad("load_end_addr is below load_addr")),
        end if start + (end - load_addr) > file_len => {
            return Err(bad("load_end_addr is past the end of the file"));
        }
        end => end,
    };
    let mem_end = match u64::from(h.bss_end_addr) {
        0 => load_end,
        end if end < load_end => return Err(bad("bss_end_addr is below load_end_addr")),
        end => end,
    };
    let segment = Segment {
        what: "the kernel".into(),
        file: usize::try_from(start).expect("in the file")
            ..usize::try_from(start + (load_end - load_addr)).expect("in the file"),
        addr: load_addr,
        mem_size: mem_end - load_addr,
    };
    Ok((vec![segment], h.entry_addr.into()))
}

impl MultibootKernel {
    /// Check `image`, the whole file, and make it ready to load with `cmdline` (given to the
    /// kernel as is).
    pub fn parse(image: Vec<u8>, cmdline: &str) -> Result<Self, MultibootError> {
        let mut kernel = Self::check(&image, image.len() as u64, cmdline)?;
        kernel.contents = contents_of(&image, &kernel.segments);
        Ok(kernel)
    }

    /// Check the kernel in `file`, which starts with `head` ([`ImageFile::kernel_head`]), and
    /// read the bytes it loads, only those.
    pub fn read(
        file: &ImageFile,
        head: &[u8],
        cmdline: &str,
    ) -> Result<Self, ReadError<MultibootError>> {
        let mut kernel = Self::check(head, file.len(), cmdline).map_err(ReadError::Format)?;
        kernel.contents =
            contents(&kernel.segments, |r| file.read_segment(r)).map_err(ReadError::Io)?;
        Ok(kernel)
    }

    /// The kernel of a `file_len`-byte file that starts with `image` (its header search area
    /// and, for an ELF file, its program headers), checked; its segments' bytes not yet read.
    fn check(image: &[u8], file_len: u64, cmdline: &str) -> Result<Self, MultibootError> {
        let cmdline = boot_data_cmdline(cmdline)?;
        let (offset, flags) = find_header(image)?;
        if flags & FLAG_VIDEO_MODE != 0 {
            return Err(MultibootError::VideoMode);
        }
        let unknown =
            flags & REQUIRED_MASK & !(FLAG_PAGE_ALIGN | FLAG_MEMORY_INFO | FLAG_VIDEO_MODE);
        if unknown != 0 {
            return Err(MultibootError::UnknownRequirements(unknown));
        }
        // With the address fields, they win over the ELF headers, as in QEMU.
        let (segments, entry) = if flags & FLAG_ADDRESSES != 0 {
            kludge_segments(image, file_len, offset)?
        } else {
            elf::segments(image, file_len).map_err(|e| match e {
                ElfError::NotElf => MultibootError::NoLoadInfo,
                e => e.into(),
            })?
        };
        if let Some(s) = segments.iter().find(|s| s.end() > 1 << 32) {
            return Err(MultibootError::Above4G {
                what: s.what.clone(),
                start: s.addr,
                end: s.end(),
            });
        }
        if !segments.iter().any(|s| s.contains(entry)) {
            return Err(MultibootError::EntryOutside(entry));
        }
        Ok(MultibootKernel {
            segments,
            contents: Vec::new(),
            entry: u32::try_from(entry).expect("inside a segment below 4 GiB"),
            cmdline,
        })
    }

    /// Check that every segment fits in RAM below `ram_end` and clear of the firmware's
    /// memory, and that the multiboot information has room beside them; returns where that goes.
    pub fn check_fits(&self, ram_end: u64) -> Result<u64, MultibootError> {
        check_segments_fit(&self.segments, ram_end)?;
        let size = CMDLINE_OFFSET + self.cmdline.len() as u64;
        Ok(place_boot_data(
            size,
            &segment_ranges(&self.segments),
            ram_end,
        )?)
    }

    /// The multiboot information for `layout` at `base`, and the memory map it points at.
    fn info(&self, layout: &MemoryLayout, base: u64) -> (Info, Vec<MmapEntry>) {
        let map: Vec<MmapEntry> = e820(layout)
            .iter()
            .map(|&E820Entry { range, kind }| MmapEntry {
                size: MMAP_ENTRY_SIZE,
                base_addr: range.start,
                length: range.len(),
                kind: kind as u32,
            })
            .collect();
        let kib = |bytes: u64| u32::try_from(bytes >> 10).expect("RAM below 4 GiB");
        let addr = |offset: u64| u32::try_from(base + offset).expect("placed below 4 GiB");
        let info = Info {
            flags: INFO_MEMORY | INFO_CMDLINE | INFO_MODS | INFO_MMAP | INFO_LOADER_NAME,
            // KiB of conventional memory, and of RAM from 1 MiB up to the first hole.
            mem_lower: kib(LOW_RAM_END),
            mem_upper: kib(layout.low_ram_end() - HIGH_RAM_START),
            cmdline: addr(CMDLINE_OFFSET),
            mmap_length: u32::try_from(map.len() * size_of::<MmapEntry>()).expect("a few"),
            mmap_addr: addr(MMAP_OFFSET),
            boot_loader_name: addr(LOADER_NAME_OFFSET),
            ..Default::default()
        };
        (info, map)
    }
}

impl Loader for MultibootKernel {
    fn load(
        &self,
        mem: &GuestMemoryMmap,
        machine: &MachineInfo<'_>,
    ) -> Result<EntryState, LoadError> {
        let ram = machine.layout.low_ram_end();
        if ram < MIN_RAM {
            return Err(LoadError::RamTooSmall {
                what: "a multiboot kernel (the first megabyte holds the firmware areas)",
                need: MIN_RAM,
                have: ram,
            });
        }
        let base = self.check_fits(ram)?;
        write_segments(mem, &self.segments, &self.contents)?;
        let (info, map) = self.info(machine.layout, base);
        mem.write_slice(info.as_bytes(), GuestAddress(base))?;
        mem.write_slice(map.as_bytes(), GuestAddress(base + MMAP_OFFSET))?;
        mem.write_slice(LOADER_NAME, GuestAddress(base + LOADER_NAME_OFFSET))?;
        mem.write_slice(&self.cmdline, GuestAddress(base + CMDLINE_OFFSET))?;
        write_acpi(mem, machine)?;
        Ok(protected32_entry(self.entry, BOOTLOADER_MAGIC, base))
    }
}

impl From<MultibootError> for LoadError {
    fn from(e: MultibootError) -> Self {
        LoadError::kernel(e)
    }
}

#[cfg(test)]
mod tests;
