//! The PVH boot ABI: an ELF kernel (Linux's uncompressed vmlinux) with a Xen ELF note that
//! names its 32-bit entry point, loaded by its program headers and entered there in 32-bit
//! protected mode with paging off and EBX = the `hvm_start_info` (xen
//! include/public/arch-x86/hvm/start_info.h; xen docs/misc/pvh.pandoc).
//!
//! Entering the uncompressed kernel skips the bzImage's decompressor, minutes of emulated
//! ring-0 code on this project's hosts (docs/host-kvm.md). The ELF reading is
//! [`loader::elf`](crate::machine::loader::elf)'s; the start info's structs are linux-loader's
//! translation of start_info.h.

use linux_loader::start_info::{
    XEN_HVM_START_MAGIC_VALUE, hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::loader::elf::{self, ElfError};
use crate::machine::loader::file::{ImageFile, ReadError};
use crate::machine::loader::segment::{Segment, contents, contents_of, kernel_end, write_segments};
use crate::machine::loader::{EntryState, LoadError, Loader, MachineInfo};
use crate::machine::pc::boot::{
    CMDLINE_OFFSET, CmdlineError, PlacementError, boot_data_cmdline, check_segments_fit,
    place_boot_data, place_initrd, protected32_entry, segment_ranges, write_acpi,
};
use crate::machine::pc::memmap::{Range, e820};

/// `XEN_ELFNOTE_PHYS32_ENTRY` (xen include/public/elfnote.h): the physical 32-bit entry.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// The notes' owner name, NUL-terminated.
const XEN_NOTE_NAME: &[u8] = b"Xen\0";
/// The start info's version: 1 has the memory map.
const START_INFO_VERSION: u32 = 1;

// The start info and what it points at, in the boot data's first page ([`place_boot_data`]).
const MODLIST_OFFSET: u64 = 0x40;
const MEMMAP_OFFSET: u64 = MODLIST_OFFSET + 0x40;
const _: () = assert!(size_of::<hvm_start_info>() as u64 <= MODLIST_OFFSET);
const _: () =
    assert!(MEMMAP_OFFSET + 16 * size_of::<hvm_memmap_table_entry>() as u64 <= CMDLINE_OFFSET);

/// Why a PVH kernel cannot be booted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PvhError {
    /// Its ELF headers.
    #[error(transparent)]
    Elf(#[from] ElfError),
    /// Segments this machine has no room for where they ask.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// An entry point past 4 GiB.
    #[error("the PVH entry point {0:#x} is not below 4 GiB")]
    EntryAbove4G(u64),
    /// The command line.
    #[error(transparent)]
    Cmdline(#[from] CmdlineError),
    /// No room for the initrd above the kernel.
    #[error(
        "the {size}-byte initrd does not fit between the kernel's end {kernel_end:#x} and the end of RAM {ram:#x} (--memory)"
    )]
    InitrdNoRoom {
        /// Its size.
        size: u64,
        /// One past the kernel's last segment.
        kernel_end: u64,
        /// Bytes of RAM.
        ram: u64,
    },
}

/// The PVH entry point of a 64-bit ELF `image`: the descriptor of its Xen
/// `XEN_ELFNOTE_PHYS32_ENTRY` note (4 or 8 bytes: Linux writes it with `_ASM_PTR`), found in
/// its `PT_NOTE` segments. `None` for a file that is no such ELF or has no such note.
pub fn pvh_entry(image: &[u8]) -> Option<u64> {
    elf::note_segments64(image)?.find_map(entry_note)
}

/// [`pvh_entry`] of the kernel in `file`, which starts with `head`
/// ([`ImageFile::kernel_head`]): its note segments read from the file, those inside it only.
pub fn read_pvh_entry(file: &ImageFile, head: &[u8]) -> std::io::Result<Option<u64>> {
    let Some(ranges) = elf::note_ranges64(head) else {
        return Ok(None);
    };
    for range in ranges.filter(|r| r.end as u64 <= file.len()) {
        if let Some(entry) = entry_note(&file.read_segment(range)?) {
            return Ok(Some(entry));
        }
    }
    Ok(None)
}

/// The entry point in the `XEN_ELFNOTE_PHYS32_ENTRY` note of `notes`, one note segment.
fn entry_note(notes: &[u8]) -> Option<u64> {
    let desc = elf::find_note(notes, XEN_NOTE_NAME, XEN_ELFNOTE_PHYS32_ENTRY)?;
    match *desc {
        [a, b, c, d] => Some(u32::from_le_bytes([a, b, c, d]).into()),
        [a, b, c, d, e, f, g, h] => Some(u64::from_le_bytes([a, b, c, d, e, f, g, h])),
        _ => None,
    }
}

/// A PVH kernel, checked and ready to load.
#[derive(Debug)]
pub struct PvhKernel {
    segments: Vec<Segment>,
    /// The segments' file bytes.
    contents: Vec<Vec<u8>>,
    entry: u32,
    /// The command line, NUL-terminated.
    cmdline: Vec<u8>,
    initrd: Option<Vec<u8>>,
}

impl PvhKernel {
    /// Check `image`, the whole file, whose PVH entry is `entry` ([`pvh_entry`]), and make it
    /// ready to load with `cmdline` and `initrd`.
    pub fn parse(
        image: Vec<u8>,
        entry: u64,
        cmdline: &str,
        initrd: Option<Vec<u8>>,
    ) -> Result<Self, PvhError> {
        let mut kernel = Self::check(&image, image.len() as u64, entry, cmdline, initrd)?;
        kernel.contents = contents_of(&image, &kernel.segments);
        Ok(kernel)
    }

    /// [`PvhKernel::parse`] of the kernel in `file`, which starts with `head`
    /// ([`ImageFile::kernel_head`]): only the bytes it loads are read.
    pub fn read(
        file: &ImageFile,
        head: &[u8],
        entry: u64,
        cmdline: &str,
        initrd: Option<Vec<u8>>,
    ) -> Result<Self, ReadError<PvhError>> {
        let mut kernel =
            Self::check(head, file.len(), entry, cmdline, initrd).map_err(ReadError::Format)?;
        kernel.contents =
            contents(&kernel.segments, |r| file.read_segment(r)).map_err(ReadError::Io)?;
        Ok(kernel)
    }

    /// The kernel of a `file_len`-byte file that starts with `image` (up to its program
    /// headers' end), checked; its segments' bytes not yet read.
    fn check(
        image: &[u8],
        file_len: u64,
        entry: u64,
        cmdline: &str,
        initrd: Option<Vec<u8>>,
    ) -> Result<Self, PvhError> {
        let cmdline = boot_data_cmdline(cmdline)?;
        let (segments, _) = elf::segments(image, file_len)?;
        let entry = u32::try_from(entry).map_err(|_| PvhError::EntryAbove4G(entry))?;
        Ok(PvhKernel {
            segments,
            contents: Vec::new(),
            entry,
            cmdline,
            initrd,
        })
    }

    /// Where the initrd goes in `ram` bytes: page-aligned at the top of RAM, above the kernel.
    fn initrd_addr(&self, initrd: &[u8], ram: u64) -> Result<u64, PvhError> {
        let kernel_end = kernel_end(&self.segments);
        let size = initrd.len() as u64;
        place_initrd(size, kernel_end, ram).ok_or(PvhError::InitrdNoRoom {
            size,
            kernel_end,
            ram,
        })
    }

    /// Check that the segments and the initrd fit in RAM below `ram`, clear of the firmware's,
    /// and that the start info has room beside them; returns where the start info and the
    /// initrd go.
    pub fn check_fits(&self, ram: u64) -> Result<(u64, Option<u64>), PvhError> {
        check_segments_fit(&self.segments, ram)?;
        let mut taken = segment_ranges(&self.segments);
        let initrd = match &self.initrd {
            Some(initrd) => {
                let addr = self.initrd_addr(initrd, ram)?;
                taken.push(Range {
                    start: addr,
                    end: addr + initrd.len() as u64,
                });
                Some(addr)
            }
            None => None,
        };
        let size = CMDLINE_OFFSET + self.cmdline.len() as u64;
        Ok((place_boot_data(size, &taken, ram)?, initrd))
    }
}

impl Loader for PvhKernel {
    fn load(
        &self,
        mem: &GuestMemoryMmap,
        machine: &MachineInfo<'_>,
    ) -> Result<EntryState, LoadError> {
        let (base, initrd_addr) = self.check_fits(machine.layout.low_ram_end())?;
        write_segments(mem, &self.segments, &self.contents)?;
        let mut info = hvm_start_info {
            magic: XEN_HVM_START_MAGIC_VALUE,
            version: START_INFO_VERSION,
            cmdline_paddr: base + CMDLINE_OFFSET,
            memmap_paddr: base + MEMMAP_OFFSET,
            ..Default::default()
        };
        if let (Some(initrd), Some(addr)) = (&self.initrd, initrd_addr) {
            mem.write_slice(initrd, GuestAddress(addr))?;
            let module = hvm_modlist_entry {
                paddr: addr,
                size: initrd.len() as u64,
                ..Default::default()
            };
            mem.write_obj(module, GuestAddress(base + MODLIST_OFFSET))?;
            (info.nr_modules, info.modlist_paddr) = (1, base + MODLIST_OFFSET);
        }
        let map = e820(machine.layout);
        for (i, e) in map.iter().enumerate() {
            // The memory map's types are e820's (start_info.h: XEN_HVM_MEMMAP_TYPE_RAM is 1).
            let entry = hvm_memmap_table_entry {
                addr: e.range.start,
                size: e.range.len(),
                type_: e.kind as u32,
                reserved: 0,
            };
            let at = base + MEMMAP_OFFSET + (i * size_of::<hvm_memmap_table_entry>()) as u64;
            mem.write_obj(entry, GuestAddress(at))?;
        }
        info.memmap_entries = u32::try_from(map.len()).expect("a handful");
        mem.write_slice(&self.cmdline, GuestAddress(base + CMDLINE_OFFSET))?;
        info.rsdp_paddr = write_acpi(mem, machine)?;
        mem.write_obj(info, GuestAddress(base))?;
        Ok(protected32_entry(self.entry, 0, base))
    }
}

impl From<PvhError> for LoadError {
    fn from(e: PvhError) -> Self {
        LoadError::kernel(e)
    }
}

#[cfg(test)]
mod tests;
