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
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::machine::layout::MemoryLayout;
use crate::machine::loader::{CpuMode, EntryState, LoadError, Loader, MachineInfo};
use crate::machine::run::acpi::AcpiTables;
use crate::machine::run::memmap::{
    BOOT_DATA, E820Entry, FIRMWARE_RANGES, HIGH_RAM_START, LOW_RAM_END, MIN_RAM, Range, e820,
};

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

/// The ELF identification and the fields common to both classes (System V ABI, ELF header).
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct ElfIdent {
    magic: [u8; 4],
    class: u8,
    data: u8,
    version: u8,
    _pad: [u8; 9],
    kind: U16,
    machine: U16,
    e_version: U32,
}

/// The 32-bit ELF header.
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct Elf32Header {
    ident: ElfIdent,
    entry: U32,
    phoff: U32,
    _shoff: U32,
    _flags: U32,
    _ehsize: U16,
    phentsize: U16,
    phnum: U16,
}

/// The 64-bit ELF header.
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct Elf64Header {
    ident: ElfIdent,
    entry: U64,
    phoff: U64,
    _shoff: U64,
    _flags: U32,
    _ehsize: U16,
    phentsize: U16,
    phnum: U16,
}

/// A 32-bit program header.
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct Elf32Phdr {
    kind: U32,
    offset: U32,
    vaddr: U32,
    paddr: U32,
    filesz: U32,
    memsz: U32,
    _flags: U32,
    _align: U32,
}

/// A 64-bit program header.
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct Elf64Phdr {
    kind: U32,
    _flags: U32,
    offset: U64,
    vaddr: U64,
    paddr: U64,
    filesz: U64,
    memsz: U64,
    _align: U64,
}

const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
const ELFCLASS32: u8 = 1;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EV_CURRENT: u8 = 1;
const ET_EXEC: u16 = 2;
const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;
/// e_phnum's escape value: the real count is elsewhere (not supported).
const PN_XNUM: u16 = 0xffff;

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

/// Where the information pieces go inside [`BOOT_DATA`].
const INFO_ADDR: u64 = BOOT_DATA.start;
const MMAP_ADDR: u64 = INFO_ADDR + 0x100;
/// Room for 16 memory map entries.
const LOADER_NAME_ADDR: u64 = MMAP_ADDR + 16 * size_of::<MmapEntry>() as u64;
const CMDLINE_ADDR: u64 = BOOT_DATA.start + 0x1000;
/// The longest command line, its NUL excluded: the rest of [`BOOT_DATA`].
pub const MAX_CMDLINE: usize = 0x6fff;
const _: () = assert!(CMDLINE_ADDR + MAX_CMDLINE as u64 + 1 == BOOT_DATA.end);

const _: () = assert!(size_of::<Info>() as u64 <= MMAP_ADDR - INFO_ADDR);
const _: () = assert!(LOADER_NAME_ADDR + LOADER_NAME.len() as u64 <= CMDLINE_ADDR);

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
    /// An ELF header field this loader cannot take.
    #[error("bad ELF header: {0}")]
    BadElf(String),
    /// A program header outside the file.
    #[error(
        "ELF program headers at {offset:#x} ({count} of {size} bytes) run past the end of the file"
    )]
    ProgramHeadersTruncated {
        /// Their file offset.
        offset: u64,
        /// How many.
        count: u16,
        /// Bytes each.
        size: u16,
    },
    /// A segment whose file bytes are not all in the file.
    #[error("ELF segment {index}: file bytes {offset:#x}+{size:#x} run past the end of the file")]
    SegmentTruncated {
        /// Its program header's index.
        index: usize,
        /// Its file offset.
        offset: u64,
        /// Its file size.
        size: u64,
    },
    /// A segment with more file bytes than memory bytes.
    #[error("ELF segment {index}: {file:#x} bytes in the file but only {mem:#x} in memory")]
    SegmentSizes {
        /// Its program header's index.
        index: usize,
        /// p_filesz.
        file: u64,
        /// p_memsz.
        mem: u64,
    },
    /// Nothing to load.
    #[error("the ELF file has no loadable segment")]
    NoSegments,
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
    /// A segment past the end of RAM.
    #[error(
        "{what} at {start:#x}..{end:#x} does not fit the machine's {ram} MiB of RAM (--memory)",
        ram = ram >> 20
    )]
    OutsideRam {
        /// What is loaded there.
        what: String,
        /// First address.
        start: u64,
        /// One past the last.
        end: u64,
        /// Bytes of RAM.
        ram: u64,
    },
    /// A segment over the firmware's own memory.
    #[error("{what} at {start:#x}..{end:#x} overlaps {firmware} at {at:#x}..{at_end:#x}")]
    OverFirmware {
        /// What is loaded there.
        what: String,
        /// First address.
        start: u64,
        /// One past the last.
        end: u64,
        /// What it would overwrite.
        firmware: &'static str,
        /// Its first address.
        at: u64,
        /// One past its last.
        at_end: u64,
    },
    /// A command line with a NUL, which would cut it short.
    #[error("the command line contains a NUL byte")]
    CmdlineNul,
    /// A command line too long for its room.
    #[error("the command line is {0} bytes; at most {MAX_CMDLINE} fit")]
    CmdlineTooLong(usize),
}

/// A piece of the kernel to put in memory: `file` bytes of the image at `addr`, zeros up to
/// `addr + mem_size`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Segment {
    /// What the errors call it.
    pub(super) what: String,
    /// Its bytes in the image.
    pub(super) file: std::ops::Range<usize>,
    /// Its guest-physical address.
    pub(super) addr: u64,
    /// Bytes in memory, zeros after the file's.
    pub(super) mem_size: u64,
}

impl Segment {
    pub(super) fn range(&self) -> Range {
        Range {
            start: self.addr,
            end: self.addr + self.mem_size,
        }
    }
}

/// A multiboot kernel, checked and ready to load.
#[derive(Debug)]
pub struct MultibootKernel {
    image: Vec<u8>,
    segments: Vec<Segment>,
    entry: u32,
    /// The command line, NUL-terminated.
    cmdline: Vec<u8>,
}

/// Read a `T` at `offset` of `image`, if it is all there.
fn read_at<T: FromBytes>(image: &[u8], offset: u64) -> Option<T> {
    let start = usize::try_from(offset).ok()?;
    let bytes = image.get(start..start.checked_add(size_of::<T>())?)?;
    T::read_from_bytes(bytes).ok()
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

/// The segments from the header's address fields (§3.1.3).
fn kludge_segments(image: &[u8], offset: usize) -> Result<(Vec<Segment>, u64), MultibootError> {
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
    let file_len = image.len() as u64;
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

/// One program header, whichever the class.
struct Phdr {
    kind: u32,
    offset: u64,
    vaddr: u64,
    paddr: u64,
    filesz: u64,
    memsz: u64,
}

/// The segments of an ELF image (its PT_LOAD program headers, at their physical addresses),
/// and its entry point, physical.
pub(super) fn elf_segments(image: &[u8]) -> Result<(Vec<Segment>, u64), MultibootError> {
    let bad = |what: String| MultibootError::BadElf(what);
    let ident: ElfIdent = read_at(image, 0).ok_or(MultibootError::NoLoadInfo)?;
    if ident.magic != ELF_MAGIC {
        return Err(MultibootError::NoLoadInfo);
    }
    if ident.data != ELFDATA2LSB {
        return Err(bad(format!(
            "data encoding {} is not little-endian",
            ident.data
        )));
    }
    if ident.version != EV_CURRENT || u32::from(ident.e_version) != u32::from(EV_CURRENT) {
        return Err(bad(format!("version {} is not 1", ident.version)));
    }
    if ident.kind.get() != ET_EXEC {
        return Err(bad(format!(
            "type {} is not an executable (2)",
            ident.kind.get()
        )));
    }
    let machine = ident.machine.get();
    let (entry, phoff, phentsize, phnum, want_size) = match (ident.class, machine) {
        (ELFCLASS32, EM_386) => {
            let h: Elf32Header = read_at(image, 0).ok_or(bad("truncated header".into()))?;
            let size = size_of::<Elf32Phdr>();
            (
                h.entry.into(),
                h.phoff.into(),
                h.phentsize.get(),
                h.phnum.get(),
                size,
            )
        }
        (ELFCLASS64, EM_X86_64) => {
            let h: Elf64Header = read_at(image, 0).ok_or(bad("truncated header".into()))?;
            let size = size_of::<Elf64Phdr>();
            (
                h.entry.get(),
                h.phoff.get(),
                h.phentsize.get(),
                h.phnum.get(),
                size,
            )
        }
        (class @ (ELFCLASS32 | ELFCLASS64), machine) => {
            return Err(bad(format!(
                "machine {machine} is not x86 (3 for 32-bit, 62 for 64-bit files; class {class})"
            )));
        }
        (class, _) => return Err(bad(format!("class {class} is neither 32- nor 64-bit"))),
    };
    if usize::from(phentsize) != want_size {
        return Err(bad(format!(
            "program header size {phentsize} is not {want_size}"
        )));
    }
    if phnum == PN_XNUM {
        return Err(bad("more than 65534 program headers".into()));
    }
    let table_end = phoff.checked_add(u64::from(phnum) * u64::from(phentsize));
    if table_end.is_none_or(|end| end > image.len() as u64) {
        return Err(MultibootError::ProgramHeadersTruncated {
            offset: phoff,
            count: phnum,
            size: phentsize,
        });
    }
    let mut segments = Vec::new();
    let mut entry_paddr = None;
    for index in 0..usize::from(phnum) {
        let at = phoff + (index * usize::from(phentsize)) as u64;
        let p = match ident.class {
            ELFCLASS32 => {
                let p: Elf32Phdr = read_at(image, at).expect("inside the checked table");
                Phdr {
                    kind: p.kind.get(),
                    offset: p.offset.into(),
                    vaddr: p.vaddr.into(),
                    paddr: p.paddr.into(),
                    filesz: p.filesz.into(),
                    memsz: p.memsz.into(),
                }
            }
            _ => {
                let p: Elf64Phdr = read_at(image, at).expect("inside the checked table");
                Phdr {
                    kind: p.kind.get(),
                    offset: p.offset.get(),
                    vaddr: p.vaddr.get(),
                    paddr: p.paddr.get(),
                    filesz: p.filesz.get(),
                    memsz: p.memsz.get(),
                }
            }
        };
        if p.kind != PT_LOAD || p.memsz == 0 {
            continue;
        }
        let file_end = p.offset.checked_add(p.filesz);
        if file_end.is_none_or(|end| end > image.len() as u64) {
            return Err(MultibootError::SegmentTruncated {
                index,
                offset: p.offset,
                size: p.filesz,
            });
        }
        if p.filesz > p.memsz {
            return Err(MultibootError::SegmentSizes {
                index,
                file: p.filesz,
                mem: p.memsz,
            });
        }
        let what = format!("ELF segment {index}");
        if p.paddr.checked_add(p.memsz).is_none() {
            return Err(MultibootError::Above4G {
                what,
                start: p.paddr,
                end: u64::MAX,
            });
        }
        // An entry point inside a segment's virtual range is translated to its physical
        // address, as GRUB does for kernels linked to run elsewhere than they load.
        if (p.vaddr..p.vaddr.saturating_add(p.memsz)).contains(&entry) {
            entry_paddr.get_or_insert(entry - p.vaddr + p.paddr);
        }
        let file_start = usize::try_from(p.offset).expect("inside the file");
        segments.push(Segment {
            what,
            file: file_start..file_start + usize::try_from(p.filesz).expect("inside the file"),
            addr: p.paddr,
            mem_size: p.memsz,
        });
    }
    if segments.is_empty() {
        return Err(MultibootError::NoSegments);
    }
    Ok((segments, entry_paddr.unwrap_or(entry)))
}

/// Check that every segment fits in `ram_size` bytes of RAM and clear of the firmware's
/// memory.
pub(super) fn check_segments_fit(
    segments: &[Segment],
    ram_size: u64,
) -> Result<(), MultibootError> {
    for s in segments {
        let r = s.range();
        if r.end > ram_size {
            return Err(MultibootError::OutsideRam {
                what: s.what.clone(),
                start: r.start,
                end: r.end,
                ram: ram_size,
            });
        }
        if let Some((firmware, f)) = FIRMWARE_RANGES.iter().find(|(_, f)| f.overlaps(&r)) {
            return Err(MultibootError::OverFirmware {
                what: s.what.clone(),
                start: r.start,
                end: r.end,
                firmware,
                at: f.start,
                at_end: f.end,
            });
        }
    }
    Ok(())
}

/// Write `segments` of `image` into `mem`, zero-filling each past its file bytes.
pub(super) fn write_segments(
    mem: &GuestMemoryMmap,
    image: &[u8],
    segments: &[Segment],
) -> Result<(), vm_memory::GuestMemoryError> {
    for s in segments {
        let bytes = &image[s.file.clone()];
        mem.write_slice(bytes, GuestAddress(s.addr))?;
        let bss = usize::try_from(s.mem_size).expect("inside RAM") - bytes.len();
        mem.write_slice(&vec![0; bss], GuestAddress(s.addr + bytes.len() as u64))?;
    }
    Ok(())
}

impl MultibootKernel {
    /// Check `image` and make it ready to load with `cmdline` (given to the kernel as is).
    pub fn parse(image: Vec<u8>, cmdline: &str) -> Result<Self, MultibootError> {
        if cmdline.contains('\0') {
            return Err(MultibootError::CmdlineNul);
        }
        if cmdline.len() > MAX_CMDLINE {
            return Err(MultibootError::CmdlineTooLong(cmdline.len()));
        }
        let (offset, flags) = find_header(&image)?;
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
            kludge_segments(&image, offset)?
        } else {
            elf_segments(&image)?
        };
        for s in &segments {
            if s.range().end > 1 << 32 {
                return Err(MultibootError::Above4G {
                    what: s.what.clone(),
                    start: s.addr,
                    end: s.range().end,
                });
            }
        }
        if !segments
            .iter()
            .any(|s| s.range().start <= entry && entry < s.range().end)
        {
            return Err(MultibootError::EntryOutside(entry));
        }
        let mut cmdline = cmdline.as_bytes().to_vec();
        cmdline.push(0);
        Ok(MultibootKernel {
            image,
            segments,
            entry: u32::try_from(entry).expect("inside a segment below 4 GiB"),
            cmdline,
        })
    }

    /// Check that every segment fits in `ram_size` bytes of RAM and clear of the firmware's
    /// memory.
    pub fn check_fits(&self, ram_size: u64) -> Result<(), MultibootError> {
        check_segments_fit(&self.segments, ram_size)
    }

    /// The multiboot information for `layout`, and the memory map it points at.
    fn info(&self, layout: &MemoryLayout) -> (Info, Vec<MmapEntry>) {
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
        let addr = |a: u64| u32::try_from(a).expect("in the boot data area");
        let info = Info {
            flags: INFO_MEMORY | INFO_CMDLINE | INFO_MODS | INFO_MMAP | INFO_LOADER_NAME,
            // KiB of conventional memory, and of RAM from 1 MiB up to the first hole.
            mem_lower: kib(LOW_RAM_END),
            mem_upper: kib(layout.ram_size() as u64 - HIGH_RAM_START),
            cmdline: addr(CMDLINE_ADDR),
            mmap_length: u32::try_from(map.len() * size_of::<MmapEntry>()).expect("a few"),
            mmap_addr: addr(MMAP_ADDR),
            boot_loader_name: addr(LOADER_NAME_ADDR),
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
        let ram = machine.layout.ram_size() as u64;
        if ram < MIN_RAM {
            return Err(LoadError::RamTooSmall {
                what: "a multiboot kernel (the first megabyte holds the firmware areas)",
                need: MIN_RAM,
                have: ram,
            });
        }
        self.check_fits(ram)?;
        write_segments(mem, &self.image, &self.segments)?;
        let (info, map) = self.info(machine.layout);
        mem.write_slice(info.as_bytes(), GuestAddress(INFO_ADDR))?;
        mem.write_slice(map.as_bytes(), GuestAddress(MMAP_ADDR))?;
        mem.write_slice(LOADER_NAME, GuestAddress(LOADER_NAME_ADDR))?;
        mem.write_slice(&self.cmdline, GuestAddress(CMDLINE_ADDR))?;
        AcpiTables {
            layout: machine.layout,
            vcpus: machine.vcpus,
            extra: machine.acpi_tables,
        }
        .write(mem)?;
        Ok(EntryState {
            mode: CpuMode::Protected32,
            regs: kvm_bindings::kvm_regs {
                rip: self.entry.into(),
                rax: BOOTLOADER_MAGIC.into(),
                rbx: INFO_ADDR,
                rflags: crate::vm::boot::RFLAGS_BOOT,
                ..Default::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::run::memmap::BIOS_AREA;

    const HEADER_AT: usize = 0x100;
    const CODE_AT: usize = 0x1000;
    const LOAD: u64 = 0x10_0000;

    /// A multiboot header with `flags`, its checksum right, and the address fields if given.
    fn header(flags: u32, addresses: Option<[u32; 5]>) -> Vec<u8> {
        let mut h = Vec::new();
        for word in [
            HEADER_MAGIC,
            flags,
            0u32.wrapping_sub(HEADER_MAGIC).wrapping_sub(flags),
        ] {
            h.extend_from_slice(&word.to_le_bytes());
        }
        for word in addresses.into_iter().flatten() {
            h.extend_from_slice(&word.to_le_bytes());
        }
        h
    }

    /// A program header: (type, offset, vaddr, paddr, filesz, memsz).
    type P = (u32, u64, u64, u64, u64, u64);

    /// An ELF executable of `class` for `machine` entered at `entry`, with `phdrs`, the
    /// multiboot `header` at `HEADER_AT` and 0x100 bytes of code (0xcc) at `CODE_AT`.
    fn elf(class: u8, machine: u16, entry: u64, phdrs: &[P], header: &[u8]) -> Vec<u8> {
        let wide = class == ELFCLASS64;
        let mut f = vec![0u8; CODE_AT + 0x100];
        f[..4].copy_from_slice(&ELF_MAGIC);
        (f[4], f[5], f[6]) = (class, ELFDATA2LSB, EV_CURRENT);
        f[16..18].copy_from_slice(&ET_EXEC.to_le_bytes());
        f[18..20].copy_from_slice(&machine.to_le_bytes());
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        let (phoff, phentsize): (u64, u16) = if wide { (64, 56) } else { (52, 32) };
        let put = |f: &mut Vec<u8>, at: usize, v: u64, wide: bool| {
            if wide {
                f[at..at + 8].copy_from_slice(&v.to_le_bytes());
            } else {
                let v = u32::try_from(v).unwrap();
                f[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
        };
        put(&mut f, 24, entry, wide);
        put(&mut f, if wide { 32 } else { 28 }, phoff, wide);
        let counts = if wide { 54 } else { 42 };
        f[counts..counts + 2].copy_from_slice(&phentsize.to_le_bytes());
        let n = u16::try_from(phdrs.len()).unwrap();
        f[counts + 2..counts + 4].copy_from_slice(&n.to_le_bytes());
        for (i, &(kind, offset, vaddr, paddr, filesz, memsz)) in phdrs.iter().enumerate() {
            let at = usize::try_from(phoff).unwrap() + i * usize::from(phentsize);
            f[at..at + 4].copy_from_slice(&kind.to_le_bytes());
            let fields = [offset, vaddr, paddr, filesz, memsz];
            for (j, v) in fields.into_iter().enumerate() {
                let o = if wide { at + 8 + 8 * j } else { at + 4 + 4 * j };
                put(&mut f, o, v, wide);
            }
        }
        f[HEADER_AT..HEADER_AT + header.len()].copy_from_slice(header);
        f[CODE_AT..].fill(0xcc);
        f
    }

    /// The code at LOAD, with 0x1000 bytes of bss after it.
    const TEXT: P = (PT_LOAD, CODE_AT as u64, LOAD, LOAD, 0x100, 0x1100);

    fn elf32(phdrs: &[P]) -> Vec<u8> {
        elf(
            ELFCLASS32,
            EM_386,
            LOAD,
            phdrs,
            &header(FLAG_MEMORY_INFO, None),
        )
    }

    fn refused(image: Vec<u8>) -> MultibootError {
        MultibootKernel::parse(image, "").expect_err("refused")
    }

    #[test]
    fn a_file_without_a_header_is_not_a_multiboot_kernel() {
        assert_eq!(refused(vec![0x90; 20_000]), MultibootError::NoHeader);
        assert_eq!(refused(Vec::new()), MultibootError::NoHeader);
        // A header past the first 8 KiB does not count.
        let mut late = vec![0u8; 9000];
        late[8192..8204].copy_from_slice(&header(0, None));
        assert_eq!(refused(late), MultibootError::NoHeader);
    }

    #[test]
    fn a_header_with_a_bad_checksum_is_named() {
        let mut h = header(0, None);
        h[8] ^= 1;
        let image = elf(ELFCLASS32, EM_386, LOAD, &[TEXT], &h);
        assert_eq!(refused(image), MultibootError::BadChecksum(HEADER_AT));
    }

    #[test]
    fn unknown_requirements_and_a_video_mode_are_refused() {
        let image = |flags| elf(ELFCLASS32, EM_386, LOAD, &[TEXT], &header(flags, None));
        assert_eq!(
            refused(image(1 << 3 | 1)),
            MultibootError::UnknownRequirements(1 << 3)
        );
        assert_eq!(refused(image(FLAG_VIDEO_MODE)), MultibootError::VideoMode);
        // Unknown optional bits are fine.
        MultibootKernel::parse(image(1 << 20 | FLAG_PAGE_ALIGN), "").unwrap();
    }

    #[test]
    fn a_non_elf_file_needs_the_address_fields() {
        let mut image = vec![0u8; 0x200];
        image[HEADER_AT..HEADER_AT + 12].copy_from_slice(&header(0, None));
        assert_eq!(refused(image), MultibootError::NoLoadInfo);
    }

    #[test]
    fn elf_header_fields_are_checked() {
        let bad = |f: &dyn Fn(&mut Vec<u8>), says: &str| {
            let mut image = elf32(&[TEXT]);
            f(&mut image);
            match refused(image) {
                MultibootError::BadElf(why) => assert!(why.contains(says), "{why}"),
                other => panic!("{other:?}"),
            }
        };
        bad(&|f| f[5] = 2, "little-endian");
        bad(&|f| f[6] = 0, "version");
        bad(&|f| f[16] = 3, "not an executable");
        bad(&|f| f[18] = 62, "machine 62 is not x86"); // a 32-bit file for x86-64
        bad(&|f| f[4] = 3, "class 3");
        bad(&|f| f[42] = 40, "program header size 40");
        bad(&|f| f[44..46].copy_from_slice(&[0xff, 0xff]), "65534");
    }

    #[test]
    fn program_headers_past_the_file_are_refused() {
        let mut image = elf32(&[TEXT]);
        image[44] = 200; // 200 program headers
        assert_eq!(
            refused(image),
            MultibootError::ProgramHeadersTruncated {
                offset: 52,
                count: 200,
                size: 32
            }
        );
    }

    #[test]
    fn segments_must_be_in_the_file_and_no_larger_there_than_in_memory() {
        let past = (PT_LOAD, CODE_AT as u64, LOAD, LOAD, 0x101, 0x1000);
        assert_eq!(
            refused(elf32(&[past])),
            MultibootError::SegmentTruncated {
                index: 0,
                offset: 0x1000,
                size: 0x101
            }
        );
        let sizes = (PT_LOAD, CODE_AT as u64, LOAD, LOAD, 0x100, 0x80);
        assert_eq!(
            refused(elf32(&[sizes])),
            MultibootError::SegmentSizes {
                index: 0,
                file: 0x100,
                mem: 0x80
            }
        );
        let note = (4, 0, 0, 0, 0x10, 0x10);
        assert_eq!(refused(elf32(&[note])), MultibootError::NoSegments);
    }

    #[test]
    fn segments_past_4_gib_are_refused() {
        let high = (PT_LOAD, CODE_AT as u64, LOAD, 0xffff_f000, 0x100, 0x2000);
        let image = elf(ELFCLASS64, EM_X86_64, LOAD, &[TEXT, high], &header(0, None));
        assert!(matches!(
            refused(image),
            MultibootError::Above4G {
                start: 0xffff_f000,
                end: 0x1_0000_1000,
                ..
            }
        ));
    }

    #[test]
    fn the_entry_point_must_be_in_the_kernel() {
        let image = elf(ELFCLASS32, EM_386, 0x5000, &[TEXT], &header(0, None));
        assert_eq!(refused(image), MultibootError::EntryOutside(0x5000));
    }

    #[test]
    fn a_kernel_outside_ram_or_over_the_firmware_is_refused() {
        let kernel = MultibootKernel::parse(elf32(&[TEXT]), "").unwrap();
        kernel.check_fits(2 << 20).unwrap();
        let big = (PT_LOAD, CODE_AT as u64, LOAD, LOAD, 0x100, 32 << 20);
        let kernel = MultibootKernel::parse(elf32(&[big]), "").unwrap();
        let e = kernel.check_fits(16 << 20).expect_err("32 MiB in 16");
        assert_eq!(
            e.to_string(),
            "ELF segment 0 at 0x100000..0x2100000 does not fit the machine's 16 MiB of RAM \
             (--memory)"
        );
        for (at, over) in [(0xf_0000, "BIOS area"), (0x9000, "multiboot information")] {
            let low = (PT_LOAD, CODE_AT as u64, at, at, 0x100, 0x100);
            let image = elf(ELFCLASS32, EM_386, at, &[low], &header(0, None));
            let kernel = MultibootKernel::parse(image, "").unwrap();
            let e = kernel.check_fits(16 << 20).expect_err("over the firmware");
            assert!(e.to_string().contains(over), "{e}");
        }
    }

    #[test]
    fn a_machine_without_room_for_the_firmware_areas_is_refused() {
        let (mem, layout) = machine(1);
        let kernel = MultibootKernel::parse(elf32(&[TEXT]), "").unwrap();
        let info = MachineInfo::one_vcpu(&layout);
        let e = kernel.load(&mem, &info).expect_err("1 MiB");
        assert!(
            matches!(e, LoadError::RamTooSmall { need: MIN_RAM, .. }),
            "{e}"
        );
    }

    #[test]
    fn command_lines_with_a_nul_or_too_long_are_refused() {
        let e = MultibootKernel::parse(elf32(&[TEXT]), "a\0b").unwrap_err();
        assert_eq!(e, MultibootError::CmdlineNul);
        let long = "x".repeat(MAX_CMDLINE + 1);
        let e = MultibootKernel::parse(elf32(&[TEXT]), &long).unwrap_err();
        assert_eq!(e, MultibootError::CmdlineTooLong(MAX_CMDLINE + 1));
        MultibootKernel::parse(elf32(&[TEXT]), &long[1..]).unwrap();
    }

    /// A flat image: the header with address fields at its start, loaded at LOAD.
    fn flat(fields: [u32; 5]) -> Vec<u8> {
        let mut image = header(FLAG_ADDRESSES, Some(fields));
        image.resize(0x200, 0xcc);
        image
    }

    #[test]
    fn inconsistent_address_fields_are_refused() {
        let load = u32::try_from(LOAD).unwrap();
        let end = load + 0x200;
        for (fields, says) in [
            (
                [load, load + 4, end, 0, load],
                "load_addr is above header_addr",
            ),
            (
                [load + 4, load, end, 0, load],
                "before the start of the file",
            ),
            (
                [load, load, load - 1, 0, load],
                "load_end_addr is below load_addr",
            ),
            ([load, load, end + 1, 0, load], "past the end of the file"),
            (
                [load, load, end, end - 1, load],
                "bss_end_addr is below load_end_addr",
            ),
        ] {
            match refused(flat(fields)) {
                MultibootError::BadAddresses(why) => assert!(why.contains(says), "{why}"),
                other => panic!("{fields:x?}: {other:?}"),
            }
        }
        let cut = header(FLAG_ADDRESSES, None);
        assert_eq!(refused(cut), MultibootError::HeaderTruncated(0));
        let outside = flat([load, load, 0, 0, end + 4]);
        assert_eq!(
            refused(outside),
            MultibootError::EntryOutside(u64::from(end + 4))
        );
    }

    /// Guest RAM and a layout of `mib` MiB, ECAM described.
    fn machine(mib: usize) -> (GuestMemoryMmap, MemoryLayout) {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), mib << 20)]).unwrap();
        (mem, MemoryLayout::new(mib << 20, true).unwrap())
    }

    fn load(kernel: &MultibootKernel, mem: &GuestMemoryMmap, layout: &MemoryLayout) -> EntryState {
        let info = MachineInfo {
            layout,
            vcpus: 2,
            tsc_khz: None,
            acpi_tables: &[],
        };
        kernel.load(mem, &info).unwrap()
    }

    fn u32_at(mem: &GuestMemoryMmap, at: u64) -> u32 {
        mem.read_obj(GuestAddress(at)).unwrap()
    }

    #[test]
    fn an_elf32_kernel_is_loaded_with_its_bss_and_the_information_it_is_owed() {
        let (mem, layout) = machine(16);
        mem.write_slice(&[0x55; 0x1100], GuestAddress(LOAD))
            .unwrap(); // stale bytes
        let kernel = MultibootKernel::parse(elf32(&[TEXT]), "/k cpus=2").unwrap();
        let entry = load(&kernel, &mem, &layout);
        assert_eq!(entry.mode, CpuMode::Protected32);
        assert_eq!((entry.regs.rip, entry.regs.rax), (LOAD, 0x2bad_b002));
        assert_eq!(entry.regs.rflags & (1 << 9), 0, "interrupts off");
        let mut loaded = [0u8; 0x1100];
        mem.read_slice(&mut loaded, GuestAddress(LOAD)).unwrap();
        assert!(loaded[..0x100].iter().all(|&b| b == 0xcc), "the code");
        assert!(loaded[0x100..].iter().all(|&b| b == 0), "the bss is zeroed");

        let info = entry.regs.rbx;
        let flags = u32_at(&mem, info);
        assert_eq!(
            flags,
            INFO_MEMORY | INFO_CMDLINE | INFO_MODS | INFO_MMAP | INFO_LOADER_NAME
        );
        assert_eq!(u32_at(&mem, info + 4), 639, "mem_lower, KiB");
        assert_eq!(
            u32_at(&mem, info + 8),
            15 * 1024,
            "mem_upper, KiB above 1 MiB"
        );
        assert_eq!(u32_at(&mem, info + 20), 0, "no modules");
        let c_string = |at: u64| {
            let mut s = vec![0u8; 64];
            mem.read_slice(&mut s, GuestAddress(at)).unwrap();
            String::from_utf8(s[..s.iter().position(|&b| b == 0).unwrap()].to_vec()).unwrap()
        };
        assert_eq!(c_string(u32_at(&mem, info + 16).into()), "/k cpus=2");
        assert_eq!(c_string(u32_at(&mem, info + 64).into()), "exitless");
        let (len, at) = (u32_at(&mem, info + 44), u64::from(u32_at(&mem, info + 48)));
        let map = e820(&layout);
        assert_eq!(len as usize, map.len() * 24);
        for (i, e) in map.iter().enumerate() {
            let at = at + 24 * i as u64;
            assert_eq!(u32_at(&mem, at), 20, "size");
            let base: u64 = mem.read_obj(GuestAddress(at + 4)).unwrap();
            let length: u64 = mem.read_obj(GuestAddress(at + 12)).unwrap();
            assert_eq!((base, length), (e.range.start, e.range.len()));
            assert_eq!(u32_at(&mem, at + 20), e.kind as u32);
        }
        let mut rsdp = [0u8; 8];
        mem.read_slice(&mut rsdp, GuestAddress(BIOS_AREA.start))
            .unwrap();
        assert_eq!(&rsdp, b"RSD PTR ", "the ACPI tables came with it");
    }

    #[test]
    fn a_64_bit_elf_kernel_loads_at_physical_addresses_and_enters_translated() {
        // Linked at a high virtual address, loaded at LOAD: the entry is translated.
        let virt = 0xffff_ffff_8010_0000;
        let text = (PT_LOAD, CODE_AT as u64, virt, LOAD, 0x100, 0x100);
        let image = elf(
            ELFCLASS64,
            EM_X86_64,
            virt + 0x10,
            &[text],
            &header(0, None),
        );
        let kernel = MultibootKernel::parse(image, "").unwrap();
        let (mem, layout) = machine(4);
        let entry = load(&kernel, &mem, &layout);
        assert_eq!(entry.regs.rip, LOAD + 0x10);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(LOAD)).unwrap(), 0xcc);
    }

    #[test]
    fn a_flat_kernel_loads_by_its_address_fields() {
        let load_at = u32::try_from(LOAD).unwrap();
        let image = flat([load_at, load_at, 0, load_at + 0x1000, load_at + 12]);
        let kernel = MultibootKernel::parse(image.clone(), "").unwrap();
        let (mem, layout) = machine(4);
        mem.write_slice(&[0x55; 0x1000], GuestAddress(LOAD))
            .unwrap();
        let entry = load(&kernel, &mem, &layout);
        assert_eq!(entry.regs.rip, LOAD + 12);
        let mut loaded = vec![0u8; 0x1000];
        mem.read_slice(&mut loaded, GuestAddress(LOAD)).unwrap();
        assert_eq!(loaded[..0x200], image[..], "the whole file");
        assert!(loaded[0x200..].iter().all(|&b| b == 0), "the bss is zeroed");
    }
}
