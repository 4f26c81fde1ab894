//! Puts a vCPU straight into the mode a guest starts in.
//!
//! - 64-bit long mode (the probe): identity-mapped page tables, a GDT with ring-0 and ring-3
//!   segments, and a 64-bit TSS whose I/O permission bitmap lets ring-3 code use port I/O (Intel
//!   SDM vol. 1 §19.5.2). `RFLAGS.IOPL` is not honoured on this host, so the bitmap is the only
//!   way to give CPL-3 code the ports (see docs/host-kvm.md).
//! - 32-bit protected mode with paging off and flat segments (multiboot kernels, Multiboot
//!   0.6.96 §3.2): no tables in guest memory at all.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::contract::{
    BOOT_GDT_ADDR, BOOT_PD_ADDR, BOOT_PD_COUNT, BOOT_PDPT_ADDR, BOOT_PML4_ADDR, BOOT_TSS_ADDR,
    INTERRUPT_STACK_TOP, KERNEL_CS, KERNEL_DS, PROBE_LOAD_ADDR, PROBE_STACK_TOP, PTE_HUGE,
    PTE_PRESENT, PTE_USER, PTE_WRITABLE, TSS_IOMAP_BASE, TSS_IOMAP_LEN, TSS_SELECTOR, USER_CS,
    USER_DS,
};

// The tables' places are in the contract: the probe's multiboot entry (crates/exitless-guest/probe/entry.S) builds
// the same tables at the same places when QEMU boots it.

/// TSS limit: covers the bitmap and its terminating byte.
const TSS_LIMIT: u32 = (TSS_IOMAP_BASE + TSS_IOMAP_LEN) as u32;
/// Bytes of the TSS with its bitmap, terminating byte excluded.
const TSS_SIZE: usize = (TSS_IOMAP_BASE + TSS_IOMAP_LEN) as usize;

/// Selectors of the flat 32-bit segments: those of QEMU's multiboot option ROM, whose GDT a
/// kernel must not rely on either (Multiboot 0.6.96 §3.2: "GDTR may be invalid").
const FLAT32_CS: u16 = 0x08;
const FLAT32_DS: u16 = 0x10;

// Control register bits (Intel SDM vol. 3 §2.5).
/// RFLAGS with nothing set but bit 1, which is reserved and always 1 (Intel SDM Vol. 1 §3.4.3):
/// interrupts off, the state every boot protocol enters with.
pub const RFLAGS_BOOT: u64 = 0x2;

const CR0_PE: u64 = 1 << 0;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// A segment as the GDT and `kvm_segment` both describe it.
#[derive(Clone, Copy)]
struct Segment {
    selector: u16,
    type_: u8,
    dpl: u8,
    code_or_data: bool,
    long: bool,
    big: bool,
}

impl Segment {
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

    /// 32-bit flat code and data at CPL 0.
    const FLAT32_CODE: Segment = Segment {
        long: false,
        big: true,
        ..Segment::code(FLAT32_CS, 0)
    };
    const FLAT32_DATA: Segment = Segment::data(FLAT32_DS, 0);
    /// A busy 32-bit TSS (type 0xB): TR must hold one in protected mode (Intel SDM vol. 3
    /// §28.3.1.2 checks on guest TR), though nothing here ever switches tasks.
    const TSS32: Segment = Segment {
        selector: 0,
        type_: 0xb,
        dpl: 0,
        code_or_data: false,
        long: false,
        big: false,
    };

    const fn code(selector: u16, dpl: u8) -> Segment {
        // Execute/read, accessed.
        Segment {
            selector,
            type_: 0xb,
            dpl,
            code_or_data: true,
            long: true,
            big: false,
        }
    }

    const fn data(selector: u16, dpl: u8) -> Segment {
        // Read/write, accessed.
        Segment {
            selector,
            type_: 0x3,
            dpl,
            code_or_data: true,
            long: false,
            big: true,
        }
    }

    /// The low 8 bytes of the descriptor (Intel SDM vol. 3 §3.4.5).
    fn descriptor(&self, base: u64, limit: u32) -> u64 {
        let access = u64::from(self.type_)
            | (u64::from(self.code_or_data) << 4)
            | (u64::from(self.dpl) << 5)
            | (1 << 7);
        let flags = (u64::from(self.long) << 1)
            | (u64::from(self.big) << 2)
            | (u64::from(self.code_or_data) << 3);
        (u64::from(limit) & 0xffff)
            | ((base & 0xff_ffff) << 16)
            | (access << 40)
            | ((u64::from(limit >> 16) & 0xf) << 48)
            | (flags << 52)
            | (((base >> 24) & 0xff) << 56)
    }

    fn kvm(&self, base: u64, limit: u32) -> kvm_segment {
        kvm_segment {
            base,
            limit: if self.code_or_data {
                0xffff_ffff
            } else {
                limit
            },
            selector: self.selector | u16::from(self.dpl),
            type_: self.type_,
            present: 1,
            dpl: self.dpl,
            db: u8::from(self.big),
            s: u8::from(self.code_or_data),
            l: u8::from(self.long),
            g: u8::from(self.code_or_data),
            avl: 0,
            unusable: 0,
            padding: 0,
        }
    }
}

/// Write the GDT, TSS and page tables into guest memory. Done once per VM.
pub fn write_tables(mem: &GuestMemoryMmap) -> Result<(), vm_memory::GuestMemoryError> {
    let code_limit = 0xf_ffff; // 4 GiB with 4 KiB granularity; ignored in long mode
    let gdt = [
        0,
        Segment::KERNEL_CODE.descriptor(0, code_limit),
        Segment::KERNEL_DATA.descriptor(0, code_limit),
        Segment::USER_CODE.descriptor(0, code_limit),
        Segment::USER_DATA.descriptor(0, code_limit),
        Segment::TSS.descriptor(BOOT_TSS_ADDR, TSS_LIMIT),
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
    let code = Segment::KERNEL_CODE.kvm(0, 0);
    let data = Segment::KERNEL_DATA.kvm(0, 0);
    sregs.cs = code;
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = Segment::TSS.kvm(BOOT_TSS_ADDR, TSS_LIMIT);
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

/// Special registers for 32-bit protected mode at CPL 0 with paging off, as Multiboot 0.6.96
/// §3.2 leaves the machine: CS a 32-bit read/execute segment and DS, ES, FS, GS, SS 32-bit
/// read/write segments, each with offset 0 and limit 0xFFFFFFFF; CR0.PG clear, CR0.PE set.
/// GDTR and IDTR are left empty: the kernel sets up its own before it loads any segment.
pub fn protected_mode_sregs(mut sregs: kvm_sregs) -> kvm_sregs {
    let code = Segment::FLAT32_CODE.kvm(0, 0);
    let data = Segment::FLAT32_DATA.kvm(0, 0);
    sregs.cs = code;
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = Segment::TSS32.kvm(0, 0xffff);
    sregs.gdt.base = 0;
    sregs.gdt.limit = 0;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PE | CR0_ET;
    sregs.cr3 = 0;
    sregs.cr4 = 0;
    sregs.efer = 0;
    sregs
}

/// Special registers for real mode with CS = `cs` (base `cs << 4`) and the other segments at 0,
/// each with a 64 KiB limit, as after a reset (Intel SDM Vol. 3A §9.1.1, table 9-1: CR0 =
/// 0x60000010, paging and protection off), with the descriptor tables at their reset values.
pub fn real_mode_sregs(mut sregs: kvm_sregs, cs: u16) -> kvm_sregs {
    let segment = |selector: u16, type_: u8| kvm_segment {
        base: u64::from(selector) << 4,
        limit: 0xffff,
        selector,
        type_,
        present: 1,
        s: 1,
        ..Default::default()
    };
    // Type 0xb: execute/read, accessed; 3: read/write, accessed.
    sregs.cs = segment(cs, 0xb);
    let data = segment(0, 3);
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.tr = kvm_segment {
        limit: 0xffff,
        type_: 0xb,
        present: 1,
        ..Default::default()
    };
    sregs.ldt = kvm_segment {
        limit: 0xffff,
        type_: 2,
        present: 1,
        ..Default::default()
    };
    (sregs.gdt.base, sregs.gdt.limit) = (0, 0xffff);
    (sregs.idt.base, sregs.idt.limit) = (0, 0xffff);
    sregs.cr0 = 0x6000_0010;
    (sregs.cr2, sregs.cr3, sregs.cr4, sregs.efer) = (0, 0, 0, 0);
    sregs
}

/// General registers at the probe's entry: `rdi` = vCPU index, the ring-0 stack below the
/// ring-3 one (the entry code only uses it for the `iretq` frame).
pub fn entry_regs(vcpu_index: u64) -> kvm_regs {
    kvm_regs {
        rip: PROBE_LOAD_ADDR,
        rsp: PROBE_STACK_TOP - 0x1000 * (vcpu_index + 1),
        rdi: vcpu_index,
        rflags: RFLAGS_BOOT,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_mode_at_a_waking_vector_is_the_reset_state_with_cs_at_its_segment() {
        let sregs = real_mode_sregs(long_mode_sregs(kvm_sregs::default()), 0x700);
        assert_eq!((sregs.cs.selector, sregs.cs.base), (0x700, 0x7000));
        assert_eq!((sregs.ds.base, sregs.ss.limit), (0, 0xffff));
        assert_eq!(sregs.cr0, 0x6000_0010, "PE and PG clear");
        assert_eq!(
            (sregs.cr3, sregs.cr4, sregs.efer),
            (0, 0, 0),
            "long mode left"
        );
    }

    #[test]
    fn descriptors_match_the_sdm_encoding() {
        // Well-known flat 64-bit code and data descriptors, and our TSS.
        let expected = [
            (Segment::KERNEL_CODE, 0, 0xf_ffff, 0x00af_9b00_0000_ffff),
            (Segment::KERNEL_DATA, 0, 0xf_ffff, 0x00cf_9300_0000_ffff),
            (Segment::USER_CODE, 0, 0xf_ffff, 0x00af_fb00_0000_ffff),
            (Segment::USER_DATA, 0, 0xf_ffff, 0x00cf_f300_0000_ffff),
            (Segment::TSS, 0x2000, 0x2068, 0x0000_8b00_2000_2068),
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
    fn protected_mode_is_flat_32_bit_with_paging_off() {
        let s = protected_mode_sregs(kvm_sregs::default());
        for seg in [s.cs, s.ds, s.es, s.fs, s.gs, s.ss] {
            assert_eq!((seg.base, seg.limit, seg.g, seg.l), (0, 0xffff_ffff, 1, 0));
            assert_eq!((seg.db, seg.present, seg.s), (1, 1, 1));
        }
        assert_eq!(s.cs.type_, 0xb, "execute/read");
        assert_eq!(s.ds.type_, 0x3, "read/write");
        assert_eq!(s.cr0 & (CR0_PE | CR0_PG), CR0_PE);
        assert_eq!((s.cr4, s.efer), (0, 0));
    }

    #[test]
    fn user_selectors_carry_rpl_3() {
        assert_eq!(Segment::USER_CODE.kvm(0, 0).selector, USER_CS);
        assert_eq!(Segment::USER_DATA.kvm(0, 0).selector, USER_DS);
    }
}
