//! What the run machine's kernel loaders share: where a kernel's pieces may go in this
//! machine's memory (its segments clear of the firmware's ranges, an initrd at the top, the
//! boot information and command line where neither lies), the ACPI tables every kernel is
//! given, and the 32-bit protected-mode entry of multiboot and PVH.

use kvm_bindings::kvm_regs;
use vm_memory::GuestMemoryMmap;

use crate::machine::loader::segment::Segment;
use crate::machine::loader::{CpuMode, EntryState, LoadError, MachineInfo};
use crate::machine::pc::acpi::AcpiTables;
use crate::machine::pc::memmap::{BOOT_DATA, FIRMWARE_RANGES, Range};
use crate::vm::boot::RFLAGS_BOOT;

/// The boot data's first page holds the protocol's information (multiboot's, PVH's start
/// info, and the memory map); the command line follows it.
pub const CMDLINE_OFFSET: u64 = 0x1000;
/// The longest command line, its NUL excluded: what fills the default boot data area.
pub const MAX_CMDLINE: usize = 0x6fff;
const _: () = assert!(CMDLINE_OFFSET + MAX_CMDLINE as u64 + 1 == BOOT_DATA.end - BOOT_DATA.start);
/// Boot data is placed on page boundaries, never in page 0 (the real-mode IVT and BDA).
const PAGE: u64 = 0x1000;

/// Why a kernel's segments cannot go where they ask.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlacementError {
    /// A segment past the end of RAM below 4 GiB (the PCI hole ends it past 3 GiB).
    #[error(
        "{what} at {start:#x}..{end:#x} does not fit the machine's {ram} MiB of RAM below 4 GiB \
         (--memory)",
        ram = ram >> 20
    )]
    OutsideRam {
        /// What is loaded there.
        what: String,
        /// First address.
        start: u64,
        /// One past the last.
        end: u64,
        /// Bytes of RAM below 4 GiB.
        ram: u64,
    },
    /// A segment over the firmware's own memory.
    #[error("{what} at {start:#x}..{end:#x} overlaps {firmware} at {at:#x}..{at_end:#x}")]
    OverFirmware {
        /// What is loaded there.
        what: String,
        /// First address.
        start: u64,
        /// One past the last.
        end: u64,
        /// What it would overwrite.
        firmware: &'static str,
        /// Its first address.
        at: u64,
        /// One past its last.
        at_end: u64,
    },
    /// No room for the boot information anywhere the kernel leaves free.
    #[error(
        "no room for the {size}-byte boot information (memory map, command line) in RAM below \
         {limit:#x} clear of what the kernel loads: a shorter --cmdline or more --memory may help"
    )]
    NoRoomForBootData {
        /// Bytes it needs.
        size: u64,
        /// Where the RAM it may use ends.
        limit: u64,
    },
}

/// Check that every segment fits in `ram_size` bytes of RAM and clear of the firmware's
/// memory ([`FIRMWARE_RANGES`]).
pub fn check_segments_fit(segments: &[Segment], ram_size: u64) -> Result<(), PlacementError> {
    for s in segments {
        let r = Range {
            start: s.addr,
            end: s.end(),
        };
        if r.end > ram_size {
            return Err(PlacementError::OutsideRam {
                what: s.what.clone(),
                start: r.start,
                end: r.end,
                ram: ram_size,
            });
        }
        if let Some((firmware, f)) = FIRMWARE_RANGES.iter().find(|(_, f)| f.overlaps(&r)) {
            return Err(PlacementError::OverFirmware {
                what: s.what.clone(),
                start: r.start,
                end: r.end,
                firmware,
                at: f.start,
                at_end: f.end,
            });
        }
    }
    Ok(())
}

/// The guest-physical ranges `segments` load into.
pub fn segment_ranges(segments: &[Segment]) -> Vec<Range> {
    segments
        .iter()
        .map(|s| Range {
            start: s.addr,
            end: s.end(),
        })
        .collect()
}

/// Where `size` bytes of boot information go (the protocol's information, memory map and
/// command line), in RAM below `ram_end` and 4 GiB (the protocols pass 32-bit addresses),
/// clear of `taken` (the kernel's segments, an initrd) and of [`FIRMWARE_RANGES`]. The loader
/// owns no low memory a kernel may use: the default area [`BOOT_DATA`] when it is free, else
/// the first page boundary past one of the obstacles where the data fits (QEMU puts its
/// multiboot information after the kernel too).
pub fn place_boot_data(size: u64, taken: &[Range], ram_end: u64) -> Result<u64, PlacementError> {
    let limit = ram_end.min(1 << 32);
    let obstacles = || taken.iter().chain(FIRMWARE_RANGES.iter().map(|(_, r)| r));
    let mut after: Vec<u64> = obstacles()
        .map(|r| r.end.next_multiple_of(PAGE).max(PAGE))
        .collect();
    after.sort_unstable();
    std::iter::once(BOOT_DATA.start)
        .chain(after)
        .find(|&start| {
            let r = Range {
                start,
                end: start.saturating_add(size),
            };
            r.end <= limit && !obstacles().any(|o| o.overlaps(&r))
        })
        .ok_or(PlacementError::NoRoomForBootData { size, limit })
}

/// Where an initrd of `size` bytes goes: as high as it fits below `limit`, page-aligned, at or
/// above `kernel_end` (Linux's boot.rst: "the initrd should typically be located as high in
/// memory as possible"). `None` when there is no such room.
pub fn place_initrd(size: u64, kernel_end: u64, limit: u64) -> Option<u64> {
    limit
        .checked_sub(size)
        .map(|a| a & !0xfff)
        .filter(|&a| a >= kernel_end)
}

/// Why a command line cannot go in the boot data area.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CmdlineError {
    /// A NUL, which would cut it short.
    #[error("the command line contains a NUL byte")]
    Nul,
    /// Longer than its room.
    #[error("the command line is {0} bytes; at most {MAX_CMDLINE} fit")]
    TooLong(usize),
}

/// `cmdline`, NUL-terminated, checked to fit after the boot information ([`MAX_CMDLINE`]).
pub fn boot_data_cmdline(cmdline: &str) -> Result<Vec<u8>, CmdlineError> {
    if cmdline.contains('\0') {
        return Err(CmdlineError::Nul);
    }
    if cmdline.len() > MAX_CMDLINE {
        return Err(CmdlineError::TooLong(cmdline.len()));
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    Ok(bytes)
}

/// Write the machine's ACPI tables (its devices' own among them) into the BIOS area; returns
/// the RSDP's address.
pub fn write_acpi(mem: &GuestMemoryMmap, machine: &MachineInfo<'_>) -> Result<u64, LoadError> {
    AcpiTables {
        layout: machine.layout,
        vcpus: machine.vcpus,
        extra: machine.acpi_tables,
        pics: machine.pics,
    }
    .write(mem)
    .map_err(LoadError::kernel)
}

/// The entry of multiboot (Multiboot 0.6.96 §3.2) and PVH (xen docs/misc/pvh.pandoc): 32-bit
/// protected mode, paging and interrupts off, at `entry` with EAX = `eax` and EBX = `ebx`.
pub fn protected32_entry(entry: u32, eax: u32, ebx: u64) -> EntryState {
    EntryState {
        mode: CpuMode::Protected32,
        regs: kvm_regs {
            rip: entry.into(),
            rax: eax.into(),
            rbx: ebx,
            rflags: RFLAGS_BOOT,
            ..Default::default()
        },
    }
}
