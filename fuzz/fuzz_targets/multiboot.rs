#![no_main]
//! The multiboot loader (`machine::run::multiboot`) on arbitrary files: a kernel file is not
//! guest input, but it is what a user hands `exitless run`, and every field of it is checked.
//! Beyond "no panic": every input is refused with an error or accepted, and an accepted kernel
//! that fits the machine loads into guest memory without an error, entered inside RAM, in
//! 32-bit protected mode, with the multiboot magic in EAX.

use exitless::machine::pc::multiboot::{BOOTLOADER_MAGIC, MultibootKernel};
use exitless::machine::{CpuMode, Loader, MachineInfo, MemoryLayout};
use libfuzzer_sys::fuzz_target;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// RAM of the machine the kernels load into: enough for the firmware areas and a few MiB.
const RAM: usize = 4 << 20;

thread_local! {
    static MEMORY: GuestMemoryMmap =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM)]).expect("guest memory");
}

fuzz_target!(|data: &[u8]| {
    let Ok(kernel) = MultibootKernel::parse(data.to_vec(), "fuzz cmdline") else {
        return;
    };
    if kernel.check_fits(RAM as u64).is_err() {
        return;
    }
    let layout = MemoryLayout::new(RAM, true).expect("a valid layout");
    let machine = MachineInfo::one_vcpu(&layout);
    let entry = MEMORY
        .with(|mem| kernel.load(mem, &machine))
        .expect("a kernel that fits loads");
    assert_eq!(entry.mode, CpuMode::Protected32);
    assert!(entry.regs.rip < RAM as u64, "entry {:#x}", entry.regs.rip);
    assert_eq!(entry.regs.rax, u64::from(BOOTLOADER_MAGIC));
});
