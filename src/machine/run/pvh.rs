//! The PVH boot ABI: an ELF kernel (Linux's uncompressed vmlinux) with a Xen ELF note that
//! names its 32-bit entry point, loaded by its program headers and entered there in 32-bit
//! protected mode with paging off and EBX = the `hvm_start_info` (xen
//! include/public/arch-x86/hvm/start_info.h; xen docs/misc/pvh.pandoc).
//!
//! Entering the uncompressed kernel skips the bzImage's decompressor, minutes of emulated
//! ring-0 code on this project's hosts (PLATFORM.md). Written by hand, like the bzImage
//! loader: the ELF parsing is the multiboot loader's, the start info is four small structs.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zerocopy::{Immutable, IntoBytes};

use crate::machine::loader::{CpuMode, EntryState, LoadError, Loader, MachineInfo};
use crate::machine::run::acpi::AcpiTables;
use crate::machine::run::memmap::{BOOT_DATA, e820};
use crate::machine::run::multiboot::{
    MultibootError, Segment, check_segments_fit, elf_segments, write_segments,
};

/// `XEN_ELFNOTE_PHYS32_ENTRY` (xen include/public/elfnote.h): the physical 32-bit entry.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// The notes' owner name, NUL-terminated.
const XEN_NOTE_NAME: &[u8] = b"Xen\0";
/// `hvm_start_info.magic` ("xEn3" with the top bit of the last byte set).
const START_INFO_MAGIC: u32 = 0x336e_c578;
/// The start info's version: 1 has the memory map.
const START_INFO_VERSION: u32 = 1;
/// `PT_NOTE` (System V ABI, program header types).
const PT_NOTE: u32 = 4;
// The ELF64 fields the note search reads (System V ABI, "ELF Header" and "Program Header").
const E_PHOFF: usize = 32;
const E_PHENTSIZE: usize = 54;
const E_PHNUM: usize = 56;
const P_OFFSET: usize = 8;
const P_FILESZ: usize = 32;

/// `struct hvm_start_info`.
#[repr(C)]
#[derive(Default, IntoBytes, Immutable)]
struct StartInfo {
    magic: u32,
    version: u32,
    flags: u32,
    nr_modules: u32,
    modlist_paddr: u64,
    cmdline_paddr: u64,
    rsdp_paddr: u64,
    memmap_paddr: u64,
    memmap_entries: u32,
    reserved: u32,
}

/// `struct hvm_modlist_entry`: the initrd.
#[repr(C)]
#[derive(IntoBytes, Immutable)]
struct ModlistEntry {
    paddr: u64,
    size: u64,
    cmdline_paddr: u64,
    reserved: u64,
}

/// `struct hvm_memmap_table_entry`: one e820 range (the types are e820's).
#[repr(C)]
#[derive(IntoBytes, Immutable)]
struct MemmapEntry {
    addr: u64,
    size: u64,
    kind: u32,
    reserved: u32,
}

// The start info and what it points at, in the boot data area.
const START_INFO_ADDR: u64 = BOOT_DATA.start;
const MODLIST_ADDR: u64 = START_INFO_ADDR + 0x40;
const MEMMAP_ADDR: u64 = MODLIST_ADDR + 0x40;
const CMDLINE_ADDR: u64 = BOOT_DATA.start + 0x1000;
/// The longest command line, its NUL excluded: the rest of the boot data area.
const MAX_CMDLINE: usize = 0x6fff;
const _: () = assert!(size_of::<StartInfo>() as u64 <= MODLIST_ADDR - START_INFO_ADDR);
const _: () = assert!(MEMMAP_ADDR + 16 * size_of::<MemmapEntry>() as u64 <= CMDLINE_ADDR);
const _: () = assert!(CMDLINE_ADDR + MAX_CMDLINE as u64 + 1 == BOOT_DATA.end);

/// Why a PVH kernel cannot be booted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PvhError {
    /// Its ELF segments.
    #[error(transparent)]
    Elf(#[from] MultibootError),
    /// An entry point past 4 GiB.
    #[error("the PVH entry point {0:#x} is not below 4 GiB")]
    EntryAbove4G(u64),
    /// A command line with a NUL.
    #[error("the command line contains a NUL byte")]
    CmdlineNul,
    /// A command line too long for its room.
    #[error("the command line is {0} bytes; at most {MAX_CMDLINE} fit")]
    CmdlineTooLong(usize),
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

/// The `N` bytes at `at`, if the file has them (`at` comes from the file: it may be anywhere).
fn bytes_at<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    bytes_at(b, at).map(u16::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    bytes_at(b, at).map(u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    bytes_at(b, at).map(u64::from_le_bytes)
}

/// The PVH entry point of a 64-bit ELF `image`: the descriptor of its Xen
/// `XEN_ELFNOTE_PHYS32_ENTRY` note (4 or 8 bytes: Linux writes it with `_ASM_PTR`), found in
/// its `PT_NOTE` segments. `None` for a file that is no such ELF or has no such note.
pub fn pvh_entry(image: &[u8]) -> Option<u64> {
    if image.get(..5) != Some(b"\x7fELF\x02") {
        return None;
    }
    let phoff = usize::try_from(u64_at(image, E_PHOFF)?).ok()?;
    let phentsize = usize::from(u16_at(image, E_PHENTSIZE)?);
    let phnum = usize::from(u16_at(image, E_PHNUM)?);
    (0..phnum).find_map(|i| {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(image, ph)? != PT_NOTE {
            return None;
        }
        let start = usize::try_from(u64_at(image, ph.checked_add(P_OFFSET)?)?).ok()?;
        let len = usize::try_from(u64_at(image, ph.checked_add(P_FILESZ)?)?).ok()?;
        find_note(image.get(start..start.checked_add(len)?)?)
    })
}

/// The entry note in one note segment: entries of namesz, descsz, type, then the name and the
/// descriptor, each padded to 4 bytes (System V ABI, "Note Section").
fn find_note(mut notes: &[u8]) -> Option<u64> {
    let pad = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let namesz = usize::try_from(u32_at(notes, 0)?).ok()?;
        let descsz = usize::try_from(u32_at(notes, 4)?).ok()?;
        let kind = u32_at(notes, 8)?;
        let desc_at = 12 + pad(namesz)?;
        let desc = notes.get(desc_at..desc_at.checked_add(descsz)?)?;
        if notes.get(12..12 + namesz)? == XEN_NOTE_NAME && kind == XEN_ELFNOTE_PHYS32_ENTRY {
            return match descsz {
                4 => u32_at(desc, 0).map(u64::from),
                8 => u64_at(desc, 0),
                _ => None,
            };
        }
        notes = notes.get(desc_at + pad(descsz)?..)?;
    }
    None
}

/// A PVH kernel, checked and ready to load.
#[derive(Debug)]
pub struct PvhKernel {
    image: Vec<u8>,
    segments: Vec<Segment>,
    entry: u32,
    /// The command line, NUL-terminated.
    cmdline: Vec<u8>,
    initrd: Option<Vec<u8>>,
}

impl PvhKernel {
    /// Check `image`, whose PVH entry is `entry` ([`pvh_entry`]), and make it ready to load
    /// with `cmdline` and `initrd`.
    pub fn parse(
        image: Vec<u8>,
        entry: u64,
        cmdline: &str,
        initrd: Option<Vec<u8>>,
    ) -> Result<Self, PvhError> {
        if cmdline.contains('\0') {
            return Err(PvhError::CmdlineNul);
        }
        if cmdline.len() > MAX_CMDLINE {
            return Err(PvhError::CmdlineTooLong(cmdline.len()));
        }
        let (segments, _) = elf_segments(&image)?;
        let entry = u32::try_from(entry).map_err(|_| PvhError::EntryAbove4G(entry))?;
        let mut cmdline = cmdline.as_bytes().to_vec();
        cmdline.push(0);
        Ok(PvhKernel {
            image,
            segments,
            entry,
            cmdline,
            initrd,
        })
    }

    /// Where the initrd goes in `ram` bytes: page-aligned at the top of RAM, above the kernel.
    fn initrd_addr(&self, initrd: &[u8], ram: u64) -> Result<u64, PvhError> {
        let kernel_end = self
            .segments
            .iter()
            .map(|s| s.range().end)
            .max()
            .unwrap_or(0);
        let size = initrd.len() as u64;
        ram.checked_sub(size)
            .map(|a| a & !0xfff)
            .filter(|&a| a >= kernel_end)
            .ok_or(PvhError::InitrdNoRoom {
                size,
                kernel_end,
                ram,
            })
    }

    /// Check that the segments and the initrd fit `ram` bytes of RAM, clear of the firmware's.
    pub fn check_fits(&self, ram: u64) -> Result<(), PvhError> {
        check_segments_fit(&self.segments, ram)?;
        if let Some(initrd) = &self.initrd {
            self.initrd_addr(initrd, ram)?;
        }
        Ok(())
    }
}

impl Loader for PvhKernel {
    fn load(
        &self,
        mem: &GuestMemoryMmap,
        machine: &MachineInfo<'_>,
    ) -> Result<EntryState, LoadError> {
        let ram = machine.layout.ram_size() as u64;
        self.check_fits(ram)?;
        write_segments(mem, &self.image, &self.segments)?;
        let mut info = StartInfo {
            magic: START_INFO_MAGIC,
            version: START_INFO_VERSION,
            cmdline_paddr: CMDLINE_ADDR,
            memmap_paddr: MEMMAP_ADDR,
            ..Default::default()
        };
        if let Some(initrd) = &self.initrd {
            let addr = self.initrd_addr(initrd, ram)?;
            mem.write_slice(initrd, GuestAddress(addr))?;
            let module = ModlistEntry {
                paddr: addr,
                size: initrd.len() as u64,
                cmdline_paddr: 0,
                reserved: 0,
            };
            mem.write_slice(module.as_bytes(), GuestAddress(MODLIST_ADDR))?;
            (info.nr_modules, info.modlist_paddr) = (1, MODLIST_ADDR);
        }
        let map: Vec<MemmapEntry> = e820(machine.layout)
            .iter()
            .map(|e| MemmapEntry {
                addr: e.range.start,
                size: e.range.len(),
                kind: e.kind as u32,
                reserved: 0,
            })
            .collect();
        mem.write_slice(map.as_bytes(), GuestAddress(MEMMAP_ADDR))?;
        info.memmap_entries = u32::try_from(map.len()).expect("a handful");
        mem.write_slice(&self.cmdline, GuestAddress(CMDLINE_ADDR))?;
        info.rsdp_paddr = AcpiTables {
            layout: machine.layout,
            vcpus: machine.vcpus,
            extra: machine.acpi_tables,
        }
        .write(mem)?;
        mem.write_slice(info.as_bytes(), GuestAddress(START_INFO_ADDR))?;
        Ok(EntryState {
            mode: CpuMode::Protected32,
            regs: kvm_bindings::kvm_regs {
                rip: self.entry.into(),
                rbx: START_INFO_ADDR,
                rflags: crate::vm::boot::RFLAGS_BOOT,
                ..Default::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::layout::MemoryLayout;

    const NOTE_AT: usize = 0x100;
    const CODE_AT: usize = 0x1000;
    const LOAD: u64 = 0x100_0000;
    const ENTRY: u64 = LOAD + 0x10;

    /// One ELF note.
    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut n = Vec::new();
        for word in [name.len(), desc.len()] {
            n.extend_from_slice(&u32::try_from(word).unwrap().to_le_bytes());
        }
        n.extend_from_slice(&kind.to_le_bytes());
        for part in [name, desc] {
            n.extend_from_slice(part);
            n.resize(n.len().next_multiple_of(4), 0);
        }
        n
    }

    /// A 64-bit x86 ELF executable: a PT_NOTE segment of `notes` and 0x100 bytes of code
    /// (0xcc) loaded at LOAD with a page of bss.
    fn vmlinux(notes: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; CODE_AT + 0x100];
        f[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        f[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        f[24..32].copy_from_slice(&(0xffff_ffff_8100_0000u64).to_le_bytes()); // virtual entry
        f[E_PHOFF..E_PHOFF + 8].copy_from_slice(&64u64.to_le_bytes());
        f[E_PHENTSIZE..E_PHENTSIZE + 2].copy_from_slice(&56u16.to_le_bytes());
        f[E_PHNUM..E_PHNUM + 2].copy_from_slice(&2u16.to_le_bytes());
        let phdrs: [(u32, u64, u64, u64, u64); 2] = [
            (
                PT_NOTE,
                NOTE_AT as u64,
                0,
                notes.len() as u64,
                notes.len() as u64,
            ),
            (1, CODE_AT as u64, LOAD, 0x100, 0x1100),
        ];
        for (i, (kind, offset, paddr, filesz, memsz)) in phdrs.into_iter().enumerate() {
            let at = 64 + 56 * i;
            f[at..at + 4].copy_from_slice(&kind.to_le_bytes());
            for (field, v) in [
                (8, offset),
                (16, paddr | 0xffff_ffff_0000_0000),
                (24, paddr),
            ] {
                f[at + field..at + field + 8].copy_from_slice(&v.to_le_bytes());
            }
            f[at + 32..at + 40].copy_from_slice(&filesz.to_le_bytes());
            f[at + 40..at + 48].copy_from_slice(&memsz.to_le_bytes());
        }
        f[NOTE_AT..NOTE_AT + notes.len()].copy_from_slice(notes);
        f[CODE_AT..].fill(0xcc);
        f
    }

    fn entry_note() -> Vec<u8> {
        let mut notes = note(b"GNU\0", 3, &[1; 20]);
        notes.extend(note(
            XEN_NOTE_NAME,
            XEN_ELFNOTE_PHYS32_ENTRY,
            &ENTRY.to_le_bytes(),
        ));
        notes
    }

    #[test]
    fn the_entry_comes_from_the_xen_note_of_either_width() {
        assert_eq!(pvh_entry(&vmlinux(&entry_note())), Some(ENTRY));
        let narrow = note(
            XEN_NOTE_NAME,
            XEN_ELFNOTE_PHYS32_ENTRY,
            &0x20_0000u32.to_le_bytes(),
        );
        assert_eq!(pvh_entry(&vmlinux(&narrow)), Some(0x20_0000));
        // Another Xen note, a note cut short, no ELF: no PVH entry.
        assert_eq!(pvh_entry(&vmlinux(&note(XEN_NOTE_NAME, 1, &[0; 8]))), None);
        assert_eq!(pvh_entry(&vmlinux(&entry_note()[..30])), None);
        assert_eq!(pvh_entry(b"MZ not an ELF file"), None);
    }

    /// Found by the `pvh` fuzz target: a program header table placed at the very end of the
    /// address space overflowed the offset arithmetic.
    #[test]
    fn program_headers_anywhere_are_no_entry_not_a_panic() {
        let mut f = vmlinux(&entry_note());
        f[E_PHOFF..E_PHOFF + 8].copy_from_slice(&(u64::MAX - 4).to_le_bytes());
        assert_eq!(pvh_entry(&f), None);
        let mut f = vmlinux(&entry_note());
        f[E_PHENTSIZE..E_PHENTSIZE + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        f[E_PHOFF..E_PHOFF + 8].copy_from_slice(&(u64::MAX - 0x1_0000).to_le_bytes());
        assert_eq!(pvh_entry(&f), None);
    }

    #[test]
    fn refusals_are_one_line() {
        let image = vmlinux(&entry_note());
        let e = PvhKernel::parse(image.clone(), 1 << 32, "", None).expect_err("above 4 GiB");
        assert_eq!(
            e.to_string(),
            "the PVH entry point 0x100000000 is not below 4 GiB"
        );
        let e = PvhKernel::parse(image.clone(), ENTRY, "a\0", None).expect_err("NUL");
        assert_eq!(e, PvhError::CmdlineNul);
        let long = "x".repeat(MAX_CMDLINE + 1);
        let e = PvhKernel::parse(image.clone(), ENTRY, &long, None).expect_err("long");
        assert_eq!(e, PvhError::CmdlineTooLong(MAX_CMDLINE + 1));
        let k = PvhKernel::parse(image.clone(), ENTRY, "", None).unwrap();
        let e = k.check_fits(16 << 20).expect_err("past RAM");
        assert!(
            e.to_string().contains("does not fit the machine's 16 MiB"),
            "{e}"
        );
        let k = PvhKernel::parse(image, ENTRY, "", Some(vec![0; 0x10_0000])).unwrap();
        let e = k.check_fits(17 << 20).expect_err("no room for the initrd");
        assert!(e.to_string().contains("initrd does not fit"), "{e}");
        k.check_fits(18 << 20).unwrap();
    }

    #[test]
    fn it_enters_at_the_note_with_ebx_the_start_info() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        let layout = MemoryLayout::new(64 << 20, true).unwrap();
        let info = MachineInfo::one_vcpu(&layout);
        let k = PvhKernel::parse(
            vmlinux(&entry_note()),
            ENTRY,
            "console=hvc0",
            Some(vec![7; 10]),
        )
        .unwrap();
        let entry = k.load(&mem, &info).unwrap();
        assert_eq!(entry.mode, CpuMode::Protected32);
        assert_eq!((entry.regs.rip, entry.regs.rbx), (ENTRY, START_INFO_ADDR));
        assert_eq!(mem.read_obj::<u8>(GuestAddress(LOAD)).unwrap(), 0xcc);
        let word = |a: u64| mem.read_obj::<u32>(GuestAddress(a)).unwrap();
        let quad = |a: u64| mem.read_obj::<u64>(GuestAddress(a)).unwrap();
        let s = START_INFO_ADDR;
        assert_eq!(
            (word(s), word(s + 4), word(s + 12)),
            (START_INFO_MAGIC, 1, 1)
        );
        let module = quad(s + 16);
        assert_eq!((quad(module), quad(module + 8)), ((64 << 20) - 0x1000, 10));
        let mut cmdline = [0u8; 13];
        mem.read_slice(&mut cmdline, GuestAddress(quad(s + 24)))
            .unwrap();
        assert_eq!(&cmdline, b"console=hvc0\0");
        let mut rsdp = [0u8; 8];
        mem.read_slice(&mut rsdp, GuestAddress(quad(s + 32)))
            .unwrap();
        assert_eq!(&rsdp, b"RSD PTR ");
        let (map, entries) = (quad(s + 40), word(s + 48));
        assert_eq!(entries as usize, e820(&layout).len());
        // The RAM above 1 MiB: the fourth entry, type 1.
        let e = map + 3 * 24;
        assert_eq!(
            (quad(e), quad(e + 8), word(e + 16)),
            (0x10_0000, (63 << 20), 1)
        );
    }
}
