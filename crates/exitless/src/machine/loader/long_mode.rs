//! The long-mode tables the probe and a 64-bit Linux entry start on: identity-mapped page
//! tables, a GDT with ring-0 and ring-3 segments, and a 64-bit TSS whose I/O permission bitmap
//! lets ring-3 code use port I/O (Intel SDM vol. 1 §19.5.2). `RFLAGS.IOPL` is not honoured on
//! this host, so the bitmap is the only way to give CPL-3 code the ports (see
//! docs/host-kvm.md). The tables' places and selectors are in the contract: the probe's
//! multiboot entry (crates/exitless-guest/probe/entry.S) builds the same tables at the same
//! places when QEMU boots it.

use kvm_bindings::kvm_sregs;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::contract::{
    BOOT_GDT_ADDR, BOOT_PD_ADDR, BOOT_PD_COUNT, BOOT_PDPT_ADDR, BOOT_PML4_ADDR, BOOT_TSS_ADDR,
    INTERRUPT_STACK_TOP, KERNEL_CS, KERNEL_DS, PTE_HUGE, PTE_PRESENT, PTE_USER, PTE_WRITABLE,
    TSS_IOMAP_BASE, TSS_IOMAP_LEN, TSS_SELECTOR, USER_CS, USER_DS,
};

// The tables' places are in the contract: the probe's multiboot entry (crates/exitless-guest/probe/entry.S) builds
// the same tables at the same places when QEMU boots it.

use crate::vm::boot::{
    CR0_ET, CR0_MP, CR0_NE, CR0_PE, CR0_PG, CR0_WP, CR4_PAE, EFER_LMA, EFER_LME, Segment,
};

/// TSS limit: covers the bitmap and its terminating byte.
const TSS_LIMIT: u32 = (TSS_IOMAP_BASE + TSS_IOMAP_LEN) as u32;
/// Bytes of the TSS with its bitmap, terminating byte excluded.
const TSS_SIZE: usize = (TSS_IOMAP_BASE + TSS_IOMAP_LEN) as usize;

/// The segments of the GDT [`write_tables`] writes.
struct Gdt;

impl Gdt {
    const KERNEL_CODE: Segment = Segment::code(KERNEL_CS, 0);
    const KERNEL_DATA: Segment = Segment::data(KERNEL_DS, 0);
    const USER_CODE: Segment = Segment::code(USER_CS & !3, 3);
    const USER_DATA: Segment = Segment::data(USER_DS & !3, 3);
    /// 64-bit TSS, busy (type 0xB), as the CPU holds it once loaded in TR.
    const TSS: Segment = Segment {
        selector: TSS_SELECTOR,
        type_: 0xb,
        dpl: 0,
        code_or_data: false,
        long: false,
        big: false,
    };
}

/// Write the GDT, TSS and page tables into guest memory. Done once per VM.
pub fn write_tables(mem: &GuestMemoryMmap) -> Result<(), vm_memory::GuestMemoryError> {
    let code_limit = 0xf_ffff; // 4 GiB with 4 KiB granularity; ignored in long mode
    let gdt = [
        0,
        Gdt::KERNEL_CODE.descriptor(0, code_limit),
        Gdt::KERNEL_DATA.descriptor(0, code_limit),
        Gdt::USER_CODE.descriptor(0, code_limit),
        Gdt::USER_DATA.descriptor(0, code_limit),
        Gdt::TSS.descriptor(BOOT_TSS_ADDR, TSS_LIMIT),
        BOOT_TSS_ADDR >> 32, // high half of the 16-byte system descriptor
    ];
    for (i, d) in gdt.iter().enumerate() {
        mem.write_obj(*d, GuestAddress(BOOT_GDT_ADDR + 8 * i as u64))?;
    }

    // TSS: RSP0 (the stack an interrupt at CPL 3 switches to), the bitmap offset, a zero bitmap
    // (every port allowed) and the terminating 0xFF byte (Intel SDM vol. 3A §8.7).
    mem.write_slice(&[0u8; TSS_SIZE], GuestAddress(BOOT_TSS_ADDR))?;
    mem.write_obj(INTERRUPT_STACK_TOP, GuestAddress(BOOT_TSS_ADDR + 4))?;
    mem.write_obj(TSS_IOMAP_BASE, GuestAddress(BOOT_TSS_ADDR + 0x66))?;
    mem.write_obj(
        0xffu8,
        GuestAddress(BOOT_TSS_ADDR + u64::from(TSS_IOMAP_BASE + TSS_IOMAP_LEN)),
    )?;

    let table = PTE_PRESENT | PTE_WRITABLE | PTE_USER;
    mem.write_obj(BOOT_PDPT_ADDR | table, GuestAddress(BOOT_PML4_ADDR))?;
    for pd in 0..BOOT_PD_COUNT {
        let pd_addr = BOOT_PD_ADDR + pd * 0x1000;
        mem.write_obj(pd_addr | table, GuestAddress(BOOT_PDPT_ADDR + pd * 8))?;
        for i in 0..512u64 {
            let page = ((pd << 30) + (i << 21)) | table | PTE_HUGE;
            mem.write_obj(page, GuestAddress(pd_addr + i * 8))?;
        }
    }
    Ok(())
}

/// Special registers for 64-bit mode at CPL 0 with the tables of [`write_tables`].
pub fn long_mode_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let code = Gdt::KERNEL_CODE.kvm(0, 0);
    let data = Gdt::KERNEL_DATA.kvm(0, 0);
    sregs.cs = code;
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = Gdt::TSS.kvm(BOOT_TSS_ADDR, TSS_LIMIT);
    sregs.gdt.base = BOOT_GDT_ADDR;
    sregs.gdt.limit = 7 * 8 - 1;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = BOOT_PML4_ADDR;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
    sregs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_match_the_sdm_encoding() {
        // Well-known flat 64-bit code and data descriptors, and our TSS.
        let expected = [
            (Gdt::KERNEL_CODE, 0, 0xf_ffff, 0x00af_9b00_0000_ffff),
            (Gdt::KERNEL_DATA, 0, 0xf_ffff, 0x00cf_9300_0000_ffff),
            (Gdt::USER_CODE, 0, 0xf_ffff, 0x00af_fb00_0000_ffff),
            (Gdt::USER_DATA, 0, 0xf_ffff, 0x00cf_f300_0000_ffff),
            (Gdt::TSS, 0x2000, 0x2068, 0x0000_8b00_2000_2068),
        ];
        for (segment, base, limit, descriptor) in expected {
            assert_eq!(
                segment.descriptor(base, limit),
                descriptor,
                "{:#x}",
                segment.selector
            );
        }
    }

    #[test]
    fn user_selectors_carry_rpl_3() {
        assert_eq!(Gdt::USER_CODE.kvm(0, 0).selector, USER_CS);
        assert_eq!(Gdt::USER_DATA.kvm(0, 0).selector, USER_DS);
    }
}
