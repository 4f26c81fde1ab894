use std::mem::offset_of;

use linux_loader::elf::{Elf64_Ehdr, PT_NOTE};

use super::*;
use crate::machine::layout::MemoryLayout;
use crate::machine::loader::CpuMode;
use crate::machine::pc::boot::MAX_CMDLINE;
use crate::machine::pc::memmap::BOOT_DATA;

// The ELF64 header fields the note search reads, from linux-loader's elf.h (not the loader's
// own structs, so the file built here is an independent reading).
const E_PHOFF: usize = offset_of!(Elf64_Ehdr, e_phoff);
const E_PHENTSIZE: usize = offset_of!(Elf64_Ehdr, e_phentsize);
const E_PHNUM: usize = offset_of!(Elf64_Ehdr, e_phnum);

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
    vmlinux_at(notes, LOAD)
}

/// [`vmlinux`], its code loaded at `load`.
fn vmlinux_at(notes: &[u8], load: u64) -> Vec<u8> {
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
        (1, CODE_AT as u64, load, 0x100, 0x1100),
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
    assert_eq!(e, PvhError::Cmdline(CmdlineError::Nul));
    let long = "x".repeat(MAX_CMDLINE + 1);
    let e = PvhKernel::parse(image.clone(), ENTRY, &long, None).expect_err("long");
    assert_eq!(e, PvhError::Cmdline(CmdlineError::TooLong(MAX_CMDLINE + 1)));
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
    assert_eq!((entry.regs.rip, entry.regs.rbx), (ENTRY, BOOT_DATA.start));
    assert_eq!(mem.read_obj::<u8>(GuestAddress(LOAD)).unwrap(), 0xcc);
    let word = |a: u64| mem.read_obj::<u32>(GuestAddress(a)).unwrap();
    let quad = |a: u64| mem.read_obj::<u64>(GuestAddress(a)).unwrap();
    let s = BOOT_DATA.start;
    assert_eq!(
        (word(s), word(s + 4), word(s + 12)),
        (XEN_HVM_START_MAGIC_VALUE, 1, 1)
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

#[test]
fn a_kernel_over_the_default_boot_data_gets_its_start_info_after_it() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let layout = MemoryLayout::new(16 << 20, true).unwrap();
    let info = MachineInfo::one_vcpu(&layout);
    let at = BOOT_DATA.start;
    let k = PvhKernel::parse(vmlinux_at(&entry_note(), at), at + 0x10, "x", None).unwrap();
    let entry = k.load(&mem, &info).unwrap();
    // Past the kernel's 0x8000..0x9100, its code intact.
    let code = mem.read_obj::<u8>(GuestAddress(at)).unwrap();
    assert_eq!((entry.regs.rbx, code), (0xa000, 0xcc));
    let s = entry.regs.rbx;
    assert_eq!(
        mem.read_obj::<u32>(GuestAddress(s)).unwrap(),
        XEN_HVM_START_MAGIC_VALUE
    );
    let cmdline = mem.read_obj::<u64>(GuestAddress(s + 24)).unwrap();
    assert_eq!(
        mem.read_obj::<[u8; 2]>(GuestAddress(cmdline)).unwrap(),
        *b"x\0"
    );
}
