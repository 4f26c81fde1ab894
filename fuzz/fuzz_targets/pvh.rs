#![no_main]
//! The PVH loader (`machine::run::pvh`) on arbitrary files: the ELF note search, the segment
//! checks and the load, with or without an initrd. Beyond "no panic": a file whose note is found
//! and that fits the machine loads without an error, entered in 32-bit protected mode at the
//! note's address with EBX at an `hvm_start_info` (xen/include/public/arch-x86/hvm/start_info.h,
//! read back here at its own offsets) that carries the magic, the command line and the initrd as
//! module 0.
//!
//! Input: see [`linux_boot::split`].

use exitless::machine::CpuMode;
use exitless::machine::pc::pvh::{PvhKernel, pvh_entry};
use libfuzzer_sys::fuzz_target;

mod linux_boot;
use linux_boot::{CMDLINE, RAM, assert_cmdline, assert_initrd, load_and_check, read, split};

/// `XEN_HVM_START_MAGIC_VALUE`.
const START_INFO_MAGIC: u32 = 0x336e_c578;

fuzz_target!(|data: &[u8]| {
    let Some((initrd, kernel)) = split(data) else {
        return;
    };
    let Some(entry_point) = pvh_entry(kernel) else {
        return;
    };
    let Ok(image) = PvhKernel::parse(kernel.to_vec(), entry_point, CMDLINE, initrd.clone()) else {
        return;
    };
    if image.check_fits(RAM as u64).is_err() {
        return;
    }
    load_and_check(&image, |mem, entry| {
        assert_eq!(entry.mode, CpuMode::Protected32);
        assert_eq!(entry.regs.rip, entry_point);
        let info = entry.regs.rbx;
        assert!(info + 56 <= RAM as u64);
        assert_eq!(read::<u32>(mem, info), START_INFO_MAGIC);
        // cmdline_paddr at 24; nr_modules at 12, modlist_paddr at 16; a module is paddr,
        // size, cmdline, reserved.
        assert_cmdline(mem, read(mem, info + 24));
        let modules: u32 = read(mem, info + 12);
        match &initrd {
            Some(bytes) => {
                assert_eq!(modules, 1);
                let module: u64 = read(mem, info + 16);
                assert_initrd(mem, read(mem, module), read(mem, module + 8), bytes);
            }
            None => assert_eq!(modules, 0),
        }
    });
});
