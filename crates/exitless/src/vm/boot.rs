//! Puts a vCPU straight into the mode a guest starts in, knowing no guest.
//!
//! - segment descriptors, as the GDT and KVM both describe them, and the control-register
//!   bits of long mode, for the machine's long-mode tables (`machine::loader::long_mode`);
//! - 32-bit protected mode with paging off and flat segments (multiboot kernels, Multiboot
//!   0.6.96 §3.2): no tables in guest memory at all;
//! - real mode at a segment, as after a reset (an S3 waking vector).

use kvm_bindings::{kvm_segment, kvm_sregs};

/// Selectors of the flat 32-bit segments: those of QEMU's multiboot option ROM, whose GDT a
/// kernel must not rely on either (Multiboot 0.6.96 §3.2: "GDTR may be invalid").
const FLAT32_CS: u16 = 0x08;
const FLAT32_DS: u16 = 0x10;

// Control register bits (Intel SDM vol. 3 §2.5).
/// RFLAGS with nothing set but bit 1, which is reserved and always 1 (Intel SDM Vol. 1 §3.4.3):
/// interrupts off, the state every boot protocol enters with.
pub const RFLAGS_BOOT: u64 = 0x2;

pub(crate) const CR0_PE: u64 = 1 << 0;
pub(crate) const CR0_MP: u64 = 1 << 1;
pub(crate) const CR0_ET: u64 = 1 << 4;
pub(crate) const CR0_NE: u64 = 1 << 5;
pub(crate) const CR0_WP: u64 = 1 << 16;
pub(crate) const CR0_PG: u64 = 1 << 31;
pub(crate) const CR4_PAE: u64 = 1 << 5;
pub(crate) const EFER_LME: u64 = 1 << 8;
pub(crate) const EFER_LMA: u64 = 1 << 10;

/// A segment as the GDT and `kvm_segment` both describe it.
#[derive(Clone, Copy)]
pub(crate) struct Segment {
    pub(crate) selector: u16,
    pub(crate) type_: u8,
    pub(crate) dpl: u8,
    pub(crate) code_or_data: bool,
    pub(crate) long: bool,
    pub(crate) big: bool,
}

impl Segment {
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

    pub(crate) const fn code(selector: u16, dpl: u8) -> Segment {
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

    pub(crate) const fn data(selector: u16, dpl: u8) -> Segment {
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
    pub(crate) fn descriptor(&self, base: u64, limit: u32) -> u64 {
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

    pub(crate) fn kvm(&self, base: u64, limit: u32) -> kvm_segment {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_mode_at_a_waking_vector_is_the_reset_state_with_cs_at_its_segment() {
        let long_mode = kvm_sregs {
            cr0: CR0_PE | CR0_PG,
            cr3: 0x1000,
            cr4: CR4_PAE,
            efer: EFER_LME | EFER_LMA,
            ..Default::default()
        };
        let sregs = real_mode_sregs(long_mode, 0x700);
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
}
