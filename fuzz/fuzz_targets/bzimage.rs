#![no_main]
//! The bzImage loader (`machine::run::bzimage`) on arbitrary files, with or without an initrd.
//! A kernel file is not guest input, but it is what a user hands `exitless run`, and every
//! header field is checked. Beyond "no panic": an accepted image that fits the machine loads
//! without an error and is entered in 64-bit mode with RSI at a zero page that says what the
//! loader put where, read back here at the offsets of Documentation/arch/x86/boot.rst
//! (an independent reading, not the loader's constants): the "HdrS" magic, the command line
//! through cmd_line_ptr, the initrd's bytes through ramdisk_image/ramdisk_size, an e820 map.
//!
//! Input: see [`linux_boot::split`].

use exitless::machine::CpuMode;
use exitless::machine::pc::bzimage::BzImage;
use libfuzzer_sys::fuzz_target;

mod linux_boot;
use linux_boot::{CMDLINE, RAM, assert_cmdline, assert_initrd, load_and_check, read, split};

fuzz_target!(|data: &[u8]| {
    let Some((initrd, kernel)) = split(data) else {
        return;
    };
    let Ok(image) = BzImage::parse(kernel.to_vec(), CMDLINE, initrd.clone()) else {
        return;
    };
    if image.check_fits(RAM as u64).is_err() {
        return;
    }
    load_and_check(&image, |mem, entry| {
        assert_eq!(entry.mode, CpuMode::LongMode);
        assert!(entry.regs.rip < RAM as u64, "entry {:#x}", entry.regs.rip);
        let zero_page = entry.regs.rsi;
        assert!(zero_page + 0x1000 <= RAM as u64);
        assert_eq!(read::<u32>(mem, zero_page + 0x202).to_le_bytes(), *b"HdrS");
        assert_cmdline(mem, read::<u32>(mem, zero_page + 0x228).into());
        let ramdisk = read::<u32>(mem, zero_page + 0x218).into();
        let ramdisk_size = read::<u32>(mem, zero_page + 0x21c).into();
        match &initrd {
            Some(bytes) => assert_initrd(mem, ramdisk, ramdisk_size, bytes),
            None => assert_eq!((ramdisk, ramdisk_size), (0, 0)),
        }
        assert!(read::<u8>(mem, zero_page + 0x1e8) > 0, "an e820 map");
    });
});
