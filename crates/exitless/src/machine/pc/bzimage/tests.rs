use super::*;
use crate::machine::layout::MemoryLayout;
use crate::machine::pc::memmap::E820Kind;

/// Setup sectors of the synthetic image, and its protected-mode kernel's size.
const SECTS: u8 = 3;
const PAYLOAD: usize = 0x1000;

/// A bzImage of protocol 2.15, relocatable-looking, with a 64-bit entry, init_size 4 MiB,
/// initrd_addr_max 0x7fffffff and cmdline_size 2047, its payload 0xcc.
fn image() -> Vec<u8> {
    let setup = (usize::from(SECTS) + 1) * 512;
    let mut f = vec![0u8; setup + PAYLOAD];
    f[SETUP_SECTS] = SECTS;
    f[HEADER_JUMP_OFFSET] = 0x6a; // the header of protocol 2.15 ends at 0x26c
    put(&mut f, HEADER_MAGIC_AT, &HEADER_MAGIC);
    put(&mut f, VERSION, &0x020fu16.to_le_bytes());
    f[LOADFLAGS] = LOADED_HIGH;
    put(&mut f, XLOADFLAGS, &XLF_KERNEL_64.to_le_bytes());
    put(&mut f, INIT_SIZE, &(4u32 << 20).to_le_bytes());
    put(&mut f, INITRD_ADDR_MAX, &0x7fff_ffffu32.to_le_bytes());
    put(&mut f, CMDLINE_SIZE, &2047u32.to_le_bytes());
    f[setup..].fill(0xcc);
    f
}

fn parse(f: Vec<u8>) -> Result<BzImage, BzImageError> {
    BzImage::parse(f, "console=ttyS0", None)
}

#[test]
fn every_bad_header_field_is_refused_with_one_line() {
    let with = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut f = image();
        edit(&mut f);
        parse(f).expect_err("a bad field")
    };
    let cases = [
        (
            with(&|f| f.truncate(0x200)),
            "too short for its setup header",
        ),
        (with(&|f| f[HEADER_MAGIC_AT] = b'X'), "no \"HdrS\""),
        (
            with(&|f| put(f, VERSION, &0x0206u16.to_le_bytes())),
            "boot protocol 2.06",
        ),
        (with(&|f| f[LOADFLAGS] = 0), "lack LOADED_HIGH"),
        (
            with(&|f| put(f, XLOADFLAGS, &0u16.to_le_bytes())),
            "lack XLF_KERNEL_64",
        ),
        (with(&|f| f.truncate(0x900)), "runs past the"),
        (with(&|f| f[HEADER_JUMP_OFFSET] = 0xff), "runs past the"),
        (with(&|f| f[SETUP_SECTS] = 0x7f), "runs past the"),
        (
            with(&|f| f[HEADER_JUMP_OFFSET] = 0),
            "setup header ends at 0x202, before the fields of boot protocol 2.12 (to 0x264)",
        ),
    ];
    for (e, says) in cases {
        let line = e.to_string();
        assert!(
            line.contains(says) && !line.contains('\n'),
            "{line}: {says}"
        );
    }
    assert_eq!(with(&|f| f[LOADFLAGS] = 0), BzImageError::NotLoadedHigh(0));
}

#[test]
fn zero_setup_sects_means_four() {
    let mut f = image();
    f[SETUP_SECTS] = 0;
    assert_eq!(parse(f).unwrap().setup_len, 5 * 512);
}

#[test]
fn the_command_line_is_checked_against_cmdline_size() {
    let e = BzImage::parse(image(), "a\0b", None).expect_err("NUL");
    assert_eq!(e, BzImageError::CmdlineNul);
    let e = BzImage::parse(image(), &"x".repeat(2048), None).expect_err("too long");
    assert_eq!(
        e.to_string(),
        "the command line is 2048 bytes; this kernel takes at most 2047 (cmdline_size)"
    );
    assert!(BzImage::parse(image(), &"x".repeat(2047), None).is_ok());
}

#[test]
fn the_kernel_and_initrd_must_fit_ram() {
    let k = parse(image()).unwrap();
    let e = k.check_fits(4 << 20).expect_err("init_size from 1 MiB");
    assert!(
        e.to_string().contains("needs 0x400000 bytes from 0x100000"),
        "{e}"
    );
    k.check_fits(5 << 20).unwrap();
    let k = BzImage::parse(image(), "", Some(vec![1; 2 << 20])).unwrap();
    let e = k.check_fits(6 << 20).expect_err("no room above the kernel");
    assert!(e.to_string().contains("initrd does not fit"), "{e}");
    k.check_fits(7 << 20).unwrap();
    assert_eq!(
        k.initrd_addr(&[1; 0x1800], 64 << 20).unwrap(),
        (64 << 20) - 0x2000
    );
    // initrd_addr_max caps it below the end of RAM.
    let mut f = image();
    put(&mut f, INITRD_ADDR_MAX, &((16u32 << 20) - 1).to_le_bytes());
    let k = parse(f).unwrap();
    assert_eq!(
        k.initrd_addr(&[1; 0x1000], 64 << 20).unwrap(),
        (16 << 20) - 0x1000
    );
}

#[test]
fn it_loads_at_1_mib_with_a_zero_page_of_the_header_e820_cmdline_and_initrd() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
    let layout = MemoryLayout::new(64 << 20, true).unwrap();
    let info = MachineInfo::one_vcpu(&layout);
    let k = BzImage::parse(image(), "console=ttyS0", Some(vec![0xab; 0x3000])).unwrap();
    let entry = k.load(&mem, &info).unwrap();
    assert_eq!(entry.mode, CpuMode::LongMode);
    assert_eq!(entry.regs.rip, 0x10_0200, "startup_64");
    assert_eq!(entry.regs.rsi, BOOT_PARAMS_ADDR);
    let mut p = vec![0u8; BOOT_PARAMS_SIZE];
    mem.read_slice(&mut p, GuestAddress(BOOT_PARAMS_ADDR))
        .unwrap();
    let f = image();
    // The header, copied, but for the fields the loader fills.
    assert_eq!(
        p[SETUP_HEADER..TYPE_OF_LOADER],
        f[SETUP_HEADER..TYPE_OF_LOADER]
    );
    assert_eq!(p[LOADFLAGS..RAMDISK_IMAGE], f[LOADFLAGS..RAMDISK_IMAGE]);
    assert_eq!(p[INITRD_ADDR_MAX..0x26c], f[INITRD_ADDR_MAX..0x26c]);
    assert_eq!(p[TYPE_OF_LOADER], 0xff);
    assert_eq!(u32_at(&p, CMD_LINE_PTR), 0x2_0000);
    let mut cmdline = [0u8; 14];
    mem.read_slice(&mut cmdline, GuestAddress(CMDLINE_ADDR))
        .unwrap();
    assert_eq!(&cmdline, b"console=ttyS0\0");
    let (initrd, size) = (u32_at(&p, RAMDISK_IMAGE), u32_at(&p, RAMDISK_SIZE));
    assert_eq!((initrd, size), ((64 << 20) - 0x3000, 0x3000));
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(initrd.into())).unwrap(),
        0xab
    );
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0x10_0000)).unwrap(), 0xcc);
    let map = e820(&layout);
    assert_eq!(usize::from(p[E820_ENTRIES]), map.len());
    let last = E820_TABLE + 20 * (map.len() - 1);
    assert_eq!(u32_at(&p, last + 16), E820Kind::Reserved as u32, "ECAM");
    let rsdp = u64::from_le_bytes(p[ACPI_RSDP_ADDR..ACPI_RSDP_ADDR + 8].try_into().unwrap());
    let mut sig = [0u8; 8];
    mem.read_slice(&mut sig, GuestAddress(rsdp)).unwrap();
    assert_eq!(&sig, b"RSD PTR ");
}

/// Found by the `bzimage` fuzz target: the file's own ramdisk fields reached the kernel.
#[test]
fn without_an_initrd_the_kernel_sees_none_whatever_the_file_says() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
    let layout = MemoryLayout::new(64 << 20, true).unwrap();
    let info = MachineInfo::one_vcpu(&layout);
    let mut f = image();
    put(&mut f, RAMDISK_IMAGE, &0xc1c1_c1c1u32.to_le_bytes());
    put(&mut f, RAMDISK_SIZE, &0xc1c1_c1c1u32.to_le_bytes());
    BzImage::parse(f, "", None)
        .unwrap()
        .load(&mem, &info)
        .unwrap();
    let mut p = vec![0u8; BOOT_PARAMS_SIZE];
    mem.read_slice(&mut p, GuestAddress(BOOT_PARAMS_ADDR))
        .unwrap();
    assert_eq!(
        (u32_at(&p, RAMDISK_IMAGE), u32_at(&p, RAMDISK_SIZE)),
        (0, 0)
    );
}
