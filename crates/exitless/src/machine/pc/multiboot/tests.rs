use linux_loader::elf::{
    ELFCLASS32, ELFCLASS64, ELFDATA2LSB, ELFMAG, EM_386, EM_X86_64, ET_EXEC, EV_CURRENT, PT_LOAD,
};
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::machine::loader::CpuMode;
use crate::machine::pc::boot::MAX_CMDLINE;
use crate::machine::pc::memmap::BIOS_AREA;

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
    f[..4].copy_from_slice(ELFMAG);
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
            MultibootError::Elf(ElfError::BadHeader(why)) => assert!(why.contains(says), "{why}"),
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
        MultibootError::Elf(ElfError::ProgramHeadersTruncated {
            offset: 52,
            count: 200,
            size: 32
        })
    );
}

#[test]
fn segments_must_be_in_the_file_and_no_larger_there_than_in_memory() {
    let past = (PT_LOAD, CODE_AT as u64, LOAD, LOAD, 0x101, 0x1000);
    assert_eq!(
        refused(elf32(&[past])),
        MultibootError::Elf(ElfError::SegmentTruncated {
            index: 0,
            offset: 0x1000,
            size: 0x101
        })
    );
    let sizes = (PT_LOAD, CODE_AT as u64, LOAD, LOAD, 0x100, 0x80);
    assert_eq!(
        refused(elf32(&[sizes])),
        MultibootError::Elf(ElfError::SegmentSizes {
            index: 0,
            file: 0x100,
            mem: 0x80
        })
    );
    let note = (4, 0, 0, 0, 0x10, 0x10);
    assert_eq!(
        refused(elf32(&[note])),
        MultibootError::Elf(ElfError::NoSegments)
    );
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
        "ELF segment 0 at 0x100000..0x2100000 does not fit the machine's 16 MiB of RAM below \
         4 GiB (--memory)"
    );
    let at = 0xf_0000;
    let low = (PT_LOAD, CODE_AT as u64, at, at, 0x100, 0x100);
    let image = elf(ELFCLASS32, EM_386, at, &[low], &header(0, None));
    let kernel = MultibootKernel::parse(image, "").unwrap();
    let e = kernel.check_fits(16 << 20).expect_err("over the firmware");
    assert!(e.to_string().contains("BIOS area"), "{e}");
}

#[test]
fn a_kernel_at_0x8000_gets_its_information_after_its_end() {
    // Where the multiboot information goes when nothing is in the way: a kernel there was
    // refused before ("overlaps the multiboot information at 0x8000..0x10000").
    let at = 0x8000;
    let text = (PT_LOAD, CODE_AT as u64, at, at, 0x100, 0xa000);
    let image = elf(ELFCLASS32, EM_386, at, &[text], &header(0, None));
    let kernel = MultibootKernel::parse(image, "/k").unwrap();
    let (mem, layout) = machine(4);
    let entry = load(&kernel, &mem, &layout);
    assert_eq!(
        entry.regs.rbx, 0x1_2000,
        "the first page past the kernel's 0x8000..0x12000"
    );
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(at)).unwrap(),
        0xcc,
        "the code is intact"
    );
    let info = entry.regs.rbx;
    let cmdline = u64::from(u32_at(&mem, info + 16));
    assert_eq!(
        mem.read_obj::<[u8; 3]>(GuestAddress(cmdline)).unwrap(),
        *b"/k\0"
    );
    let map = u64::from(u32_at(&mem, info + 48));
    assert!(
        map > info && map < cmdline,
        "the map beside it, past the kernel"
    );
}

#[test]
fn a_kernel_that_leaves_no_room_for_the_information_is_refused_with_one_line() {
    // Conventional memory up to one page below the EBDA, and all of RAM from 1 MiB: no page
    // boundary has room for the information, the map and the command line.
    let low = (PT_LOAD, CODE_AT as u64, 0x1000, 0x1000, 0x100, 0x9_e000);
    let high = (PT_LOAD, CODE_AT as u64, LOAD, LOAD, 0x100, 0x10_0000);
    let image = elf(ELFCLASS32, EM_386, LOAD, &[low, high], &header(0, None));
    let kernel = MultibootKernel::parse(image, "").unwrap();
    let e = kernel.check_fits(2 << 20).expect_err("no room");
    let line = e.to_string();
    assert!(
        line.starts_with("no room for the 4097-byte boot information") && !line.contains('\n'),
        "{line}"
    );
    kernel
        .check_fits(3 << 20)
        .expect("room above the kernel once RAM goes on");
}

#[test]
fn with_ram_past_4_gib_mem_upper_stops_at_the_hole_and_the_map_goes_on() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
    let layout = MemoryLayout::new(4608 << 20, true).unwrap();
    let kernel = MultibootKernel::parse(elf32(&[TEXT]), "").unwrap();
    let info = load(&kernel, &mem, &layout).regs.rbx;
    assert_eq!(
        u32_at(&mem, info + 8),
        (3 << 20) - 1024,
        "mem_upper: 1 MiB to 3 GiB, KiB"
    );
    let (len, at) = (u32_at(&mem, info + 44), u64::from(u32_at(&mem, info + 48)));
    let last = at + u64::from(len) - 24;
    let base: u64 = mem.read_obj(GuestAddress(last + 4)).unwrap();
    let length: u64 = mem.read_obj(GuestAddress(last + 12)).unwrap();
    assert_eq!(
        (base, length, u32_at(&mem, last + 20)),
        (1 << 32, 0x6000_0000, 1)
    );
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
    assert_eq!(e, MultibootError::Cmdline(CmdlineError::Nul));
    let long = "x".repeat(MAX_CMDLINE + 1);
    let e = MultibootKernel::parse(elf32(&[TEXT]), &long).unwrap_err();
    assert_eq!(
        e,
        MultibootError::Cmdline(CmdlineError::TooLong(MAX_CMDLINE + 1))
    );
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
        pics: true,
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
