#![no_main]
//! The bzImage loader (`machine::run::bzimage`) on arbitrary files, with or without an initrd.
//! A kernel file is not guest input, but it is what a user hands `exitless run`, and every
//! header field is checked. Beyond "no panic": an accepted image that fits the machine loads
//! without an error and is entered in 64-bit mode with RSI at a zero page that says what the
//! loader put where, read back here at the offsets of Documentation/arch/x86/boot.rst
//! (an independent reading, not the loader's constants): the "HdrS" magic, the command line
//! through cmd_line_ptr, the initrd's bytes through ramdisk_image/ramdisk_size, an e820 map.
//!
//! Input: see [`linux_loader::split`].

use exitless::machine::run::bzimage::BzImage;
use exitless::machine::{CpuMode, Loader, MachineInfo};
use libfuzzer_sys::fuzz_target;

mod linux_loader;
use linux_loader::{CMDLINE, MEMORY, RAM, layout, split};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fn read_u32(mem: &GuestMemoryMmap, at: u64) -> u32 {
    mem.read_obj(GuestAddress(at)).expect("inside RAM")
}

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
    let layout = layout();
    let machine = MachineInfo::one_vcpu(&layout);
    MEMORY.with(|mem| {
        let entry = image.load(mem, &machine).expect("an image that fits loads");
        assert_eq!(entry.mode, CpuMode::LongMode);
        assert!(entry.regs.rip < RAM as u64, "entry {:#x}", entry.regs.rip);
        let zero_page = entry.regs.rsi;
        assert!(zero_page + 0x1000 <= RAM as u64);
        assert_eq!(read_u32(mem, zero_page + 0x202).to_le_bytes(), *b"HdrS");
        let cmdline_at = u64::from(read_u32(mem, zero_page + 0x228));
        let mut cmdline = vec![0u8; CMDLINE.len() + 1];
        mem.read_slice(&mut cmdline, GuestAddress(cmdline_at))
            .expect("the command line in RAM");
        assert_eq!(&cmdline[..CMDLINE.len()], CMDLINE.as_bytes());
        assert_eq!(cmdline[CMDLINE.len()], 0, "NUL-terminated");
        let (ramdisk, ramdisk_size) = (
            u64::from(read_u32(mem, zero_page + 0x218)),
            read_u32(mem, zero_page + 0x21c),
        );
        match &initrd {
            Some(bytes) => {
                assert_eq!(ramdisk_size as usize, bytes.len());
                let mut there = vec![0u8; bytes.len()];
                mem.read_slice(&mut there, GuestAddress(ramdisk))
                    .expect("the initrd in RAM");
                assert_eq!(&there, bytes);
            }
            None => assert_eq!((ramdisk, ramdisk_size), (0, 0)),
        }
        let e820_entries = mem
            .read_obj::<u8>(GuestAddress(zero_page + 0x1e8))
            .expect("inside RAM");
        assert!(e820_entries > 0, "an e820 map");
    });
});
