//! A guest virtual address looked up in the guest's own page tables, for the report on a vCPU
//! that hung: whether the page its RIP is on is mapped, and the bytes there, tell a guest that
//! jumped into freed memory from one whose mapping is sound but whose fault was never taken.
//!
//! 4-level and 5-level paging only (Intel SDM Vol. 3A §4.5: IA-32e paging; AMD64 APM Vol. 2
//! §5.3): the only paging of a 64-bit guest, which is what hangs under a 64-bit kernel.

use kvm_bindings::{kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::VcpuState;

/// CR0.PG (SDM Vol. 3A §2.5), CR4.LA57 (§2.5), EFER.LMA (§2.2.1).
const CR0_PG: u64 = 1 << 31;
const CR4_LA57: u64 = 1 << 12;
const EFER_LMA: u64 = 1 << 10;
/// A paging-structure entry's present and page-size bits and its address field (bits 51:12;
/// SDM Vol. 3A §4.5.4, Tables 4-15 to 4-20).
const PRESENT: u64 = 1;
const PAGE_SIZE: u64 = 1 << 7;
const ADDRESS: u64 = 0x000f_ffff_ffff_f000;

/// What the guest's page tables say of a linear address.
#[derive(Debug, PartialEq, Eq)]
pub enum Walk {
    /// Paging is off: the linear address is the physical one.
    Unpaged(u64),
    /// Paging other than IA-32e (a 32-bit guest): not looked up.
    NotLongMode,
    /// Mapped, at this guest-physical address.
    Mapped(u64),
    /// An entry is not present.
    NotPresent {
        /// Its table: 5 the PML5, 4 the PML4, 3 the PDPT, 2 the PD, 1 the PT.
        level: u8,
        /// Its value.
        entry: u64,
    },
    /// A table is outside guest memory.
    Unreadable {
        /// Which table, as for `NotPresent`.
        level: u8,
        /// Its guest-physical address.
        table: u64,
    },
}

/// Look the linear `address` up in the page tables `sregs` names (CR3, with CR0, CR4 and EFER saying
/// which paging is on), reading them from `mem`.
pub fn translate(mem: &GuestMemoryMmap, sregs: &kvm_sregs, address: u64) -> Walk {
    if sregs.cr0 & CR0_PG == 0 {
        return Walk::Unpaged(address);
    }
    if sregs.efer & EFER_LMA == 0 {
        return Walk::NotLongMode;
    }
    let top: u8 = if sregs.cr4 & CR4_LA57 != 0 { 5 } else { 4 };
    let mut table = sregs.cr3 & ADDRESS;
    for level in (1..=top).rev() {
        // Nine bits of the address per level, above the page's 12 (SDM Vol. 3A §4.5.2).
        let index = (address >> (12 + 9 * u32::from(level - 1))) & 0x1ff;
        let Ok(entry) = mem.read_obj::<u64>(GuestAddress(table + 8 * index)) else {
            return Walk::Unreadable { level, table };
        };
        if entry & PRESENT == 0 {
            return Walk::NotPresent { level, entry };
        }
        // A 1-GiB page at the PDPT, a 2-MiB one at the PD.
        if level == 1 || (level <= 3 && entry & PAGE_SIZE != 0) {
            let offset_bits = 12 + 9 * u32::from(level - 1);
            let frame = entry & ADDRESS & !((1 << offset_bits) - 1);
            return Walk::Mapped(frame | address & ((1 << offset_bits) - 1));
        }
        table = entry & ADDRESS;
    }
    unreachable!("level 1 always ends the walk")
}

/// The linear address of `offset` in `segment`: the offset itself in 64-bit mode (SDM Vol.
/// 3A §3.2.4: CS, SS, DS and ES bases are ignored there), else the segment's base added, in 32
/// bits (a real-mode RIP is an offset from CS's base, the selector × 16).
fn linear(sregs: &kvm_sregs, segment: &kvm_segment, offset: u64) -> u64 {
    if sregs.efer & EFER_LMA != 0 && sregs.cs.l != 0 {
        offset
    } else {
        segment.base.wrapping_add(offset) & 0xffff_ffff
    }
}

/// The linear `address` said with what the page tables hold for it: its guest-physical
/// address and up to `bytes` bytes there (no further than its page's end: the next virtual
/// page need not be the next physical one), or why it has none.
pub fn describe(mem: &GuestMemoryMmap, sregs: &kvm_sregs, address: u64, bytes: usize) -> String {
    let gpa = match translate(mem, sregs, address) {
        Walk::Unpaged(gpa) | Walk::Mapped(gpa) => gpa,
        Walk::NotLongMode => return "not looked up (not in long mode)".into(),
        Walk::NotPresent { level, entry } => {
            return format!("not mapped (level-{level} entry {entry:#x} not present)");
        }
        Walk::Unreadable { level, table } => {
            return format!("not mapped (level-{level} table at {table:#x} outside guest memory)");
        }
    };
    let to_page_end = usize::try_from(0x1000 - (address & 0xfff)).expect("at most a page");
    let mut buf = vec![0u8; bytes.min(to_page_end)];
    match mem.read_slice(&mut buf, GuestAddress(gpa)) {
        Ok(()) => {
            let hex: Vec<String> = buf.iter().map(|b| format!("{b:02x}")).collect();
            let cut = if buf.len() < bytes {
                " (its page ends)"
            } else {
                ""
            };
            format!("at {gpa:#x}: {}{cut}", hex.join(" "))
        }
        Err(_) => format!("at {gpa:#x}, outside guest memory"),
    }
}

impl VcpuState {
    /// Where the vCPU's code and stack are in guest memory, through its own page tables: 16
    /// bytes at CS:RIP and at SS:RSP, or why there are none.
    pub fn in_memory(&self, mem: &GuestMemoryMmap) -> String {
        let s = &self.sregs;
        format!(
            "RIP {}; RSP {}",
            describe(mem, s, linear(s, &s.cs, self.regs.rip), 16),
            describe(mem, s, linear(s, &s.ss, self.regs.rsp), 16),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tables at 0x1000 (PML4), 0x2000 (PDPT), 0x3000 (PD), 0x4000 (PT); RIP's page at
    /// 0x5000 holds `ud2`.
    fn guest() -> (GuestMemoryMmap, kvm_sregs) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let put = |at: u64, v: u64| mem.write_obj(v, GuestAddress(at)).unwrap();
        // 0xffff_ffff_c000_0000: PML4 511, PDPT 511, PD 0, PT 0..
        put(0x1000 + 8 * 511, 0x2000 | PRESENT);
        put(0x2000 + 8 * 511, 0x3000 | PRESENT);
        put(0x3000, 0x4000 | PRESENT);
        put(0x4000, 0x5000 | PRESENT);
        // PT entry 1 not present; PD entry 1 a 2-MiB page at 0x20_0000 (outside memory).
        put(0x3000 + 8, 0x20_0000 | PAGE_SIZE | PRESENT);
        mem.write_slice(&[0x0f, 0x0b], GuestAddress(0x520c))
            .unwrap();
        let sregs = kvm_sregs {
            cr0: CR0_PG | 1,
            cr3: 0x1000,
            efer: EFER_LMA,
            ..Default::default()
        };
        (mem, sregs)
    }

    #[test]
    fn a_mapped_address_reads_its_bytes_and_an_unmapped_one_names_its_level() {
        let (mem, sregs) = guest();
        let base = 0xffff_ffff_c000_0000;
        assert_eq!(translate(&mem, &sregs, base + 0x20c), Walk::Mapped(0x520c));
        assert_eq!(describe(&mem, &sregs, base + 0x20c, 2), "at 0x520c: 0f 0b");
        assert_eq!(
            translate(&mem, &sregs, base + 0x120c),
            Walk::NotPresent { level: 1, entry: 0 }
        );
        // The 2-MiB page: the offset inside it kept; its frame outside guest memory.
        assert_eq!(
            translate(&mem, &sregs, base + 0x20_1234),
            Walk::Mapped(0x20_1234)
        );
        assert_eq!(
            describe(&mem, &sregs, base + 0x20_1234, 4),
            "at 0x201234, outside guest memory"
        );
        // Another PML4 slot: not present at the top.
        assert_eq!(
            describe(&mem, &sregs, 0x1000, 4),
            "not mapped (level-4 entry 0x0 not present)"
        );
    }

    #[test]
    fn bytes_stop_at_their_page_and_a_real_mode_rip_counts_from_cs() {
        let (mem, sregs) = guest();
        mem.write_slice(&[0xaa; 4], GuestAddress(0x5ffe)).unwrap();
        assert_eq!(
            describe(&mem, &sregs, 0xffff_ffff_c000_0ffe, 4),
            "at 0x5ffe: aa aa (its page ends)"
        );
        // Real mode: CS base 0xf0000 (selector 0xf000), RIP 0xfff0.
        let mut real = kvm_sregs::default();
        real.cs.base = 0xf_0000;
        assert_eq!(linear(&real, &real.cs, 0xfff0), 0xf_fff0);
        // 64-bit mode ignores the base.
        let mut long = sregs;
        (long.cs.l, long.cs.base) = (1, 0x1000);
        assert_eq!(linear(&long, &long.cs, 0x20c), 0x20c);
    }

    #[test]
    fn paging_off_is_physical_and_5_level_paging_walks_one_more_table() {
        let (mem, mut sregs) = guest();
        let physical = kvm_sregs { cr0: 1, ..sregs };
        assert_eq!(translate(&mem, &physical, 0x520c), Walk::Unpaged(0x520c));
        // A PML5 at 0x6000 whose entry 511 is the PML4 above.
        mem.write_obj(0x1000 | PRESENT, GuestAddress(0x6000 + 8 * 511))
            .unwrap();
        sregs.cr3 = 0x6000;
        sregs.cr4 = CR4_LA57;
        // The same address: with 5 levels its bits 56:48 (all ones) index the PML5.
        assert_eq!(
            translate(&mem, &sregs, 0xffff_ffff_c000_020c),
            Walk::Mapped(0x520c)
        );
        sregs.cr4 = 0;
        assert_eq!(
            translate(&mem, &sregs, 0xffff_ffff_c000_020c),
            Walk::NotPresent { level: 2, entry: 0 },
            "4 levels from the PML5 read each table one level off"
        );
        sregs.cr4 = CR4_LA57;
        sregs.efer = 0;
        assert_eq!(translate(&mem, &sregs, 0), Walk::NotLongMode);
    }
}
