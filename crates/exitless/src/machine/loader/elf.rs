//! The ELF image format (System V ABI, "ELF Header", "Program Header", "Note Section"): the
//! loadable segments of a 32- or 64-bit x86 executable at their physical addresses, and its
//! notes. Multiboot and PVH kernels are ELF files; each protocol places and enters them its own
//! way. Every field read comes from the file, so every offset is checked before it is used.
//!
//! The constants are linux-loader's (rust-vmm's translation of elf.h); the headers are read
//! through the little-endian structs below, which stop at the last field read so that a file
//! is held to no more bytes than it must have.

use linux_loader::elf::{
    EI_NIDENT, ELFCLASS32, ELFCLASS64, ELFDATA2LSB, ELFMAG, EM_386, EM_X86_64, ET_EXEC, EV_CURRENT,
    PN_XNUM, PT_LOAD, PT_NOTE,
};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, KnownLayout};

use crate::machine::loader::segment::Segment;

/// The identification and the fields common to both classes (System V ABI, "ELF Header").
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct Ident {
    magic: [u8; 4],
    class: u8,
    data: u8,
    version: u8,
    _pad: [u8; EI_NIDENT - 7],
    kind: U16,
    machine: U16,
    e_version: U32,
}

/// The 32-bit ELF header, up to `e_phnum`.
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct Elf32Header {
    ident: Ident,
    entry: U32,
    phoff: U32,
    _shoff: U32,
    _flags: U32,
    _ehsize: U16,
    phentsize: U16,
    phnum: U16,
}

/// The 64-bit ELF header, up to `e_phnum`.
#[repr(C)]
#[derive(FromBytes, KnownLayout, Immutable)]
struct Elf64Header {
    ident: Ident,
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

/// Why a file's ELF headers cannot be loaded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    /// No ELF magic: another format (multiboot then needs its address fields).
    #[error("not an ELF file: no \\x7fELF magic")]
    NotElf,
    /// An ELF header field this loader cannot take.
    #[error("bad ELF header: {0}")]
    BadHeader(String),
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
        /// Its bytes in the file (p_filesz).
        file: u64,
        /// Its bytes in memory (p_memsz).
        mem: u64,
    },
    /// A segment whose end is past the 64-bit address space.
    #[error(
        "ELF segment {index} at {start:#x}..{end:#x} is not below 4 GiB, where a 32-bit kernel \
         without paging can reach it", end = u64::MAX
    )]
    SegmentWraps {
        /// Its program header's index.
        index: usize,
        /// Its physical address.
        start: u64,
    },
    /// Nothing to load.
    #[error("the ELF file has no loadable segment")]
    NoSegments,
}

/// Read a `T` at `offset` of `image`, if it is all there.
pub(crate) fn read_at<T: FromBytes>(image: &[u8], offset: u64) -> Option<T> {
    let start = usize::try_from(offset).ok()?;
    let bytes = image.get(start..start.checked_add(size_of::<T>())?)?;
    T::read_from_bytes(bytes).ok()
}

/// The header fields the segments are found with, whichever the class.
struct FileHeader {
    class: u8,
    entry: u64,
    phoff: u64,
    phentsize: u16,
    phnum: u16,
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

fn bad(what: String) -> ElfError {
    ElfError::BadHeader(what)
}

/// The identification's checks: an ELF file, little-endian, version 1, an executable.
fn ident(image: &[u8]) -> Result<Ident, ElfError> {
    let ident: Ident = read_at(image, 0).ok_or(ElfError::NotElf)?;
    if ident.magic != *ELFMAG {
        return Err(ElfError::NotElf);
    }
    if ident.data != ELFDATA2LSB {
        return Err(bad(format!(
            "data encoding {} is not little-endian",
            ident.data
        )));
    }
    if ident.version != EV_CURRENT || ident.e_version.get() != u32::from(EV_CURRENT) {
        return Err(bad(format!("version {} is not 1", ident.version)));
    }
    if ident.kind.get() != ET_EXEC {
        return Err(bad(format!(
            "type {} is not an executable (2)",
            ident.kind.get()
        )));
    }
    Ok(ident)
}

/// The header of a 32-bit i386 or a 64-bit x86-64 executable, its program header table
/// checked to be of its class's entries and inside the file.
fn file_header(image: &[u8]) -> Result<FileHeader, ElfError> {
    let ident = ident(image)?;
    let truncated = || bad("truncated header".into());
    let (h, want_size) = match (ident.class, ident.machine.get()) {
        (ELFCLASS32, EM_386) => {
            let h: Elf32Header = read_at(image, 0).ok_or_else(truncated)?;
            let h = FileHeader {
                class: ELFCLASS32,
                entry: h.entry.into(),
                phoff: h.phoff.into(),
                phentsize: h.phentsize.get(),
                phnum: h.phnum.get(),
            };
            (h, size_of::<Elf32Phdr>())
        }
        (ELFCLASS64, EM_X86_64) => {
            let h: Elf64Header = read_at(image, 0).ok_or_else(truncated)?;
            let h = FileHeader {
                class: ELFCLASS64,
                entry: h.entry.get(),
                phoff: h.phoff.get(),
                phentsize: h.phentsize.get(),
                phnum: h.phnum.get(),
            };
            (h, size_of::<Elf64Phdr>())
        }
        (class @ (ELFCLASS32 | ELFCLASS64), machine) => {
            return Err(bad(format!(
                "machine {machine} is not x86 (3 for 32-bit, 62 for 64-bit files; class {class})"
            )));
        }
        (class, _) => return Err(bad(format!("class {class} is neither 32- nor 64-bit"))),
    };
    let phentsize = h.phentsize;
    if usize::from(phentsize) != want_size {
        return Err(bad(format!(
            "program header size {phentsize} is not {want_size}"
        )));
    }
    if h.phnum == PN_XNUM {
        return Err(bad("more than 65534 program headers".into()));
    }
    let table_end = h
        .phoff
        .checked_add(u64::from(h.phnum) * u64::from(phentsize));
    if table_end.is_none_or(|end| end > image.len() as u64) {
        return Err(ElfError::ProgramHeadersTruncated {
            offset: h.phoff,
            count: h.phnum,
            size: phentsize,
        });
    }
    Ok(h)
}

/// Program header `index` of the table `h` describes, which [`file_header`] checked.
fn program_header(image: &[u8], h: &FileHeader, index: usize) -> Phdr {
    let at = h.phoff + (index * usize::from(h.phentsize)) as u64;
    if h.class == ELFCLASS32 {
        let p: Elf32Phdr = read_at(image, at).expect("inside the checked table");
        Phdr {
            kind: p.kind.get(),
            offset: p.offset.into(),
            vaddr: p.vaddr.into(),
            paddr: p.paddr.into(),
            filesz: p.filesz.into(),
            memsz: p.memsz.into(),
        }
    } else {
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
}

/// The segment program header `index` loads, at its physical address: `None` for one that
/// loads nothing (not `PT_LOAD`, or empty in memory).
fn load_segment(file_len: u64, index: usize, p: &Phdr) -> Result<Option<Segment>, ElfError> {
    if p.kind != PT_LOAD || p.memsz == 0 {
        return Ok(None);
    }
    let file_end = p.offset.checked_add(p.filesz);
    if file_end.is_none_or(|end| end > file_len) {
        return Err(ElfError::SegmentTruncated {
            index,
            offset: p.offset,
            size: p.filesz,
        });
    }
    if p.filesz > p.memsz {
        return Err(ElfError::SegmentSizes {
            index,
            file: p.filesz,
            mem: p.memsz,
        });
    }
    if p.paddr.checked_add(p.memsz).is_none() {
        return Err(ElfError::SegmentWraps {
            index,
            start: p.paddr,
        });
    }
    let file_start = usize::try_from(p.offset).expect("inside the file");
    Ok(Some(Segment {
        what: format!("ELF segment {index}"),
        file: file_start..file_start + usize::try_from(p.filesz).expect("inside the file"),
        addr: p.paddr,
        mem_size: p.memsz,
    }))
}

/// The segments of an ELF file of `file_len` bytes (its `PT_LOAD` program headers, at their
/// physical addresses), and its entry point, physical. `image` is the file's start, up to at
/// least [`headers_end`] where the file has that much: the segments' bytes need not be in it.
pub fn segments(image: &[u8], file_len: u64) -> Result<(Vec<Segment>, u64), ElfError> {
    let h = file_header(image)?;
    let mut segments = Vec::new();
    let mut entry_paddr = None;
    for index in 0..usize::from(h.phnum) {
        let p = program_header(image, &h, index);
        let Some(segment) = load_segment(file_len, index, &p)? else {
            continue;
        };
        // An entry point inside a segment's virtual range is translated to its physical
        // address, as GRUB does for kernels linked to run elsewhere than they load.
        if (p.vaddr..p.vaddr.saturating_add(p.memsz)).contains(&h.entry) {
            entry_paddr.get_or_insert(h.entry - p.vaddr + p.paddr);
        }
        segments.push(segment);
    }
    if segments.is_empty() {
        return Err(ElfError::NoSegments);
    }
    Ok((segments, entry_paddr.unwrap_or(h.entry)))
}

/// One past the program header table of the ELF file that starts with `image` (its header's
/// `e_phoff + e_phnum * e_phentsize`): how much of the file [`segments`] and
/// [`note_ranges64`] read. `None` for no ELF file, or a header cut short.
pub fn headers_end(image: &[u8]) -> Option<u64> {
    let (phoff, phentsize, phnum) = match ident(image).ok()?.class {
        ELFCLASS32 => {
            let h: Elf32Header = read_at(image, 0)?;
            (h.phoff.into(), h.phentsize.get(), h.phnum.get())
        }
        ELFCLASS64 => {
            let h: Elf64Header = read_at(image, 0)?;
            (h.phoff.get(), h.phentsize.get(), h.phnum.get())
        }
        _ => return None,
    };
    phoff.checked_add(u64::from(phnum) * u64::from(phentsize))
}

/// A little-endian field of type `T` at `at` of `b`, if the file has it (`at` comes from the
/// file: it may be anywhere).
fn field<T: FromBytes>(b: &[u8], at: usize) -> Option<T> {
    read_at(b, at as u64)
}

/// The file range of each `PT_NOTE` segment of a 64-bit ELF file that starts with `image`
/// (up to its program header table's end), in program header order; the ranges may run past
/// the file. `None` for a file that is no 64-bit ELF or whose header is cut short. Only the
/// fields read are needed: the rest of the file is not checked.
pub fn note_ranges64(image: &[u8]) -> Option<impl Iterator<Item = std::ops::Range<usize>>> {
    if image.get(..5) != Some(&[ELFMAG[0], ELFMAG[1], ELFMAG[2], ELFMAG[3], ELFCLASS64]) {
        return None;
    }
    let header = |at| field::<U64>(image, at).map(U64::get);
    let phoff = usize::try_from(header(std::mem::offset_of!(Elf64Header, phoff))?).ok()?;
    let phentsize = usize::from(field::<U16>(
        image,
        std::mem::offset_of!(Elf64Header, phentsize),
    )?);
    let phnum = usize::from(field::<U16>(
        image,
        std::mem::offset_of!(Elf64Header, phnum),
    )?);
    Some((0..phnum).filter_map(move |i| {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let at = |offset: usize| ph.checked_add(offset);
        if field::<U32>(image, ph)?.get() != PT_NOTE {
            return None;
        }
        let phdr_u64 = |offset| field::<U64>(image, at(offset)?).map(U64::get);
        let start = usize::try_from(phdr_u64(std::mem::offset_of!(Elf64Phdr, offset))?).ok()?;
        let len = usize::try_from(phdr_u64(std::mem::offset_of!(Elf64Phdr, filesz))?).ok()?;
        Some(start..start.checked_add(len)?)
    }))
}

/// The bytes of each `PT_NOTE` segment of a 64-bit ELF `image` ([`note_ranges64`]), skipping
/// any that is not all in the file.
pub fn note_segments64(image: &[u8]) -> Option<impl Iterator<Item = &[u8]>> {
    Some(note_ranges64(image)?.filter_map(|r| image.get(r)))
}

/// The descriptor of the first note in `notes` (one note segment) named `name` (with its NUL)
/// of type `kind`: entries of namesz, descsz, type, then the name and the descriptor, each
/// padded to 4 bytes (System V ABI, "Note Section"). `None` when there is none, or the
/// segment is cut short before it.
pub fn find_note<'a>(mut notes: &'a [u8], name: &[u8], kind: u32) -> Option<&'a [u8]> {
    let pad = |n: usize| n.checked_add(3).map(|n| n & !3);
    let word = |b: &[u8], at| field::<U32>(b, at).map(U32::get);
    while notes.len() >= 12 {
        let namesz = usize::try_from(word(notes, 0)?).ok()?;
        let descsz = usize::try_from(word(notes, 4)?).ok()?;
        let this_kind = word(notes, 8)?;
        let desc_at = 12 + pad(namesz)?;
        let desc = notes.get(desc_at..desc_at.checked_add(descsz)?)?;
        if notes.get(12..12 + namesz)? == name && this_kind == kind {
            return Some(desc);
        }
        notes = notes.get(desc_at + pad(descsz)?..)?;
    }
    None
}
