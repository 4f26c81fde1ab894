//! The low memory of `exitless run`'s machine, laid out as on a PC, and the map of guest
//! physical memory the guest is given (the BIOS's INT 15h E820 map, ACPI 6.5 §15).
//!
//! RAM runs from 0 to the 32-bit PCI hole and, past 3 GiB, resumes at 4 GiB
//! ([`MemoryLayout::ram_regions`]); a PC's first megabyte is not all RAM to its OS: the top of
//! conventional memory (639 KiB, then the 1 KiB extended BIOS data area), the VGA window and
//! the BIOS area are not. The ACPI tables live in the BIOS area (where the RSDP must be, ACPI
//! 6.5 §5.2.5.1); kernels may load anywhere else in RAM, and the loaders put their boot
//! information where the kernel is not ([`crate::machine::pc::boot::place_boot_data`]).

use crate::machine::layout::{ECAM_SIZE, MemoryLayout};

/// The end of conventional memory as PC firmware reports it (639 KiB): the EBDA follows.
pub const LOW_RAM_END: u64 = 0x9_fc00;
/// The BIOS read-only area, where the ACPI tables go (ACPI 6.5 §5.2.5.1: the RSDP is found
/// "in the BIOS read-only memory space between 0E0000h and 0FFFFFh").
pub const BIOS_AREA: Range = Range {
    start: 0xe_0000,
    end: 0x10_0000,
};
/// Where the boot loader's data goes when the kernel leaves it free: the multiboot (or PVH)
/// information, its memory map, the command line and the loader's name, clear of the
/// real-mode IVT and BIOS data area below. A kernel may load over it: the data then moves.
pub const BOOT_DATA: Range = Range {
    start: 0x8000,
    end: 0x1_0000,
};
const _: () = assert!(BOOT_DATA.end <= LOW_RAM_END);

/// RAM from here up is "upper memory" (Multiboot 0.6.96 §3.3, `mem_upper`).
pub const HIGH_RAM_START: u64 = 0x10_0000;
/// The least RAM `exitless run` gives a machine: the first megabyte and one more for a kernel.
pub const MIN_RAM: u64 = 2 << 20;

/// A half-open range of guest-physical addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// First address.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

impl Range {
    /// Whether the two share an address.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// Bytes in the range.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether it holds no address.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// Ranges below 1 MiB a kernel must not load over: what is not RAM on a PC (the EBDA, the
/// VGA window, the BIOS area, which holds the ACPI tables). Each with the name an error gives it.
pub const FIRMWARE_RANGES: [(&str, Range); 1] = [(
    "the EBDA, VGA window and BIOS area (ACPI tables)",
    Range {
        start: LOW_RAM_END,
        end: HIGH_RAM_START,
    },
)];

/// The kind of an E820 range (ACPI 6.5 §15, table 15.312); multiboot's memory map uses the
/// same numbers (Multiboot 0.6.96 §3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum E820Kind {
    /// AddressRangeMemory: usable RAM.
    Ram = 1,
    /// AddressRangeReserved: not for the OS.
    Reserved = 2,
}

/// One range of the map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Entry {
    /// The range.
    pub range: Range,
    /// What it is.
    pub kind: E820Kind,
}

/// The memory map of `layout`, in address order: conventional memory, the EBDA and BIOS area
/// (reserved; the ACPI tables are in the latter), RAM from 1 MiB to the PCI hole, the ECAM
/// window if one is described (reserved, as PCI Firmware 3.3 §4.1.2 asks of the MCFG's
/// ranges), and RAM from 4 GiB if there is more.
pub fn e820(layout: &MemoryLayout) -> Vec<E820Entry> {
    let entry = |start, end, kind| E820Entry {
        range: Range { start, end },
        kind,
    };
    let mut map = vec![
        entry(0, LOW_RAM_END, E820Kind::Ram),
        entry(LOW_RAM_END, 0xa_0000, E820Kind::Reserved),
        entry(BIOS_AREA.start, BIOS_AREA.end, E820Kind::Reserved),
        entry(HIGH_RAM_START, layout.low_ram_end(), E820Kind::Ram),
    ];
    if let Some(base) = layout.ecam_base() {
        map.push(entry(base, base + ECAM_SIZE, E820Kind::Reserved));
    }
    if let Some((base, len)) = layout.high_ram() {
        map.push(entry(base, base + len, E820Kind::Ram));
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_is_ordered_disjoint_and_covers_ram_above_1_mib() {
        let layout = MemoryLayout::new(64 << 20, true).unwrap();
        let map = e820(&layout);
        for pair in map.windows(2) {
            assert!(pair[0].range.end <= pair[1].range.start, "{map:?}");
        }
        let ram: u64 = map
            .iter()
            .filter(|e| e.kind == E820Kind::Ram)
            .map(|e| e.range.len())
            .sum();
        assert_eq!(ram, (64 << 20) - HIGH_RAM_START + LOW_RAM_END);
        assert_eq!(map.last().unwrap().kind, E820Kind::Reserved, "ECAM");
        assert_eq!(e820(&MemoryLayout::new(64 << 20, false).unwrap()).len(), 4);
    }

    #[test]
    fn ram_past_the_hole_is_listed_from_4_gib_after_the_ecam_window() {
        let layout = MemoryLayout::new(4608 << 20, true).unwrap();
        let map = e820(&layout);
        for pair in map.windows(2) {
            assert!(pair[0].range.end <= pair[1].range.start, "{map:?}");
        }
        let ram = |start, end| E820Entry {
            range: Range { start, end },
            kind: E820Kind::Ram,
        };
        assert_eq!(map[3], ram(HIGH_RAM_START, 0xc000_0000), "up to the hole");
        assert_eq!(map[5], ram(1 << 32, 0x1_6000_0000), "the rest from 4 GiB");
        assert_eq!(map.len(), 6);
        let total: u64 = map
            .iter()
            .filter(|e| e.kind == E820Kind::Ram)
            .map(|e| e.range.len())
            .sum();
        assert_eq!(total, (4608 << 20) - HIGH_RAM_START + LOW_RAM_END);
    }

    #[test]
    fn the_firmware_ranges_are_not_usable_ram_or_hold_the_boot_data() {
        let layout = MemoryLayout::new(usize::try_from(MIN_RAM).unwrap(), false).unwrap();
        let map = e820(&layout);
        let (_, bios) = FIRMWARE_RANGES[0];
        assert!(
            map.iter()
                .all(|e| e.kind != E820Kind::Ram || !e.range.overlaps(&bios))
        );
        assert!(BIOS_AREA.start >= bios.start && BIOS_AREA.end <= bios.end);
    }
}
