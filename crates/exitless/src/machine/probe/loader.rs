//! The probe as a [`Loader`]: long-mode tables, the embedded image, the boot-info block and
//! the ops, entered at CPL 0 in long mode (the image drops to CPL 3 at once).

use kvm_bindings::kvm_regs;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use zerocopy::IntoBytes;

use crate::contract::{
    BOOT_INFO_ADDR, BOOT_INFO_MAGIC, BOOT_PD_COUNT, BootInfo, DMA_ADDR, ENUM_ADDR,
    EXPOSURE_BUCKETS, EnumRecord, HIGH_PD_ADDR, HIGH_PD_COUNT, IOMMU_REPORT_ADDR,
    IOMMU_TABLES_ADDR, IOMMU_TABLES_SIZE, IommuReport, MAX_ENUM_RECORDS, MAX_IOMMU_REPORTS,
    MAX_OPS, MAX_VIRTIO_MMIO, OPS_ADDR, Op, OpResult, PROBE_LOAD_ADDR, PROBE_MAX_SIZE,
    PROBE_STACK_TOP, RAM_SCRATCH_ADDR, RAM_SCRATCH_SIZE, RESULTS_ADDR,
};
use crate::machine::layout::VIRTIO_MMIO_SLOTS;
use crate::machine::loader::long_mode;
use crate::machine::loader::{CpuMode, EntryState, LoadError, Loader, MachineInfo};
use crate::vm::boot::RFLAGS_BOOT;

pub use exitless_guest::PROBE_IMAGE;

// The op and result arrays fit between their neighbours in the contract's map.
const _: () = assert!(
    OPS_ADDR + MAX_OPS * size_of::<Op>() as u64 <= RESULTS_ADDR
        && RESULTS_ADDR + MAX_OPS * size_of::<OpResult>() as u64 <= ENUM_ADDR
        && ENUM_ADDR + MAX_ENUM_RECORDS * size_of::<EnumRecord>() as u64 <= IOMMU_REPORT_ADDR
        && IOMMU_REPORT_ADDR + MAX_IOMMU_REPORTS * size_of::<IommuReport>() as u64
            <= PROBE_LOAD_ADDR
);
// The probe's own page directories for 4–64 GiB under QEMU lie after the IOMMU report slots
// and end below the EBDA (at 0x9FC00 in QEMU's map), one per GiB.
const _: () = assert!(
    IOMMU_REPORT_ADDR + MAX_IOMMU_REPORTS * size_of::<IommuReport>() as u64 <= HIGH_PD_ADDR
        && HIGH_PD_ADDR + HIGH_PD_COUNT * 0x1000 <= 0x9_f000
        && BOOT_PD_COUNT + HIGH_PD_COUNT == 64
);
// The VT-d structures sit between the RAM scratch page and the driver area; the report's
// histogram has the contract's bucket count.
const _: () = assert!(
    RAM_SCRATCH_ADDR + RAM_SCRATCH_SIZE <= IOMMU_TABLES_ADDR
        && IOMMU_TABLES_ADDR + IOMMU_TABLES_SIZE <= DMA_ADDR
        && size_of::<IommuReport>() as u64 == (11 + EXPOSURE_BUCKETS) * 8
);

pub use crate::contract::PROBE_MIN_RAM;

// Every virtio-mmio slot the layout can give out has a place in the boot info.
const _: () = assert!(VIRTIO_MMIO_SLOTS as u64 <= MAX_VIRTIO_MMIO);

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

/// Check that `ram_size` bytes of RAM hold the probe.
pub fn check_ram(ram_size: usize) -> Result<(), LoadError> {
    let have = ram_size as u64;
    if have < PROBE_MIN_RAM {
        return Err(LoadError::RamTooSmall {
            what: "the probe guest",
            need: PROBE_MIN_RAM,
            have,
        });
    }
    Ok(())
}

/// Loads the probe with a list of ops.
#[derive(Debug)]
pub struct ProbeLoader<'a> {
    /// The ops, in order.
    pub ops: &'a [Op],
}

impl Loader for ProbeLoader<'_> {
    fn load(
        &self,
        mem: &GuestMemoryMmap,
        machine: &MachineInfo<'_>,
    ) -> Result<EntryState, LoadError> {
        check_ram(machine.layout.ram_size())?;
        if self.ops.len() as u64 > MAX_OPS {
            return Err(LoadError::Invalid(format!(
                "{} ops requested; the probe holds at most {MAX_OPS}",
                self.ops.len()
            )));
        }
        if PROBE_IMAGE.len() as u64 > PROBE_MAX_SIZE {
            return Err(LoadError::ImageTooLarge {
                what: "probe",
                size: PROBE_IMAGE.len() as u64,
                max: PROBE_MAX_SIZE,
            });
        }
        long_mode::write_tables(mem)?;
        mem.write_slice(PROBE_IMAGE, GuestAddress(PROBE_LOAD_ADDR))?;
        mem.write_slice(
            boot_info(machine, self.ops.len()).as_bytes(),
            GuestAddress(BOOT_INFO_ADDR),
        )?;
        mem.write_slice(self.ops.as_bytes(), GuestAddress(OPS_ADDR))?;
        Ok(EntryState {
            mode: CpuMode::LongMode,
            regs: entry_regs(0),
        })
    }

    /// The other vCPUs enter the probe too, which parks them in `hlt`.
    fn secondary_entry(&self, index: u8) -> Option<EntryState> {
        Some(EntryState {
            mode: CpuMode::LongMode,
            regs: entry_regs(index.into()),
        })
    }
}

/// The boot-info block: where ECAM, the IOMMU and the virtio-mmio devices are, and the op
/// count.
fn boot_info(machine: &MachineInfo<'_>, ops: usize) -> BootInfo {
    let layout = machine.layout;
    let slots = layout.virtio_mmio();
    let mut info = BootInfo {
        magic: BOOT_INFO_MAGIC,
        ecam_base: layout.ecam_base().unwrap_or(0),
        ecam_bus_start: 0,
        ecam_bus_end: 0,
        op_count: ops as u64,
        tsc_khz: machine.tsc_khz.map_or(0, u64::from),
        virtio_mmio_count: slots.len() as u64,
        iommu_base: layout.iommu_base().unwrap_or(0),
        ..Default::default()
    };
    for (i, slot) in slots.iter().enumerate() {
        info.virtio_mmio_base[i] = slot.base;
        info.virtio_mmio_gsi[i] = u64::from(slot.gsi);
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::layout::{DEFAULT_RAM_SIZE, MemoryLayout};

    #[test]
    fn the_default_ram_holds_the_probe_and_a_small_one_is_refused_clearly() {
        check_ram(DEFAULT_RAM_SIZE).unwrap();
        let e = check_ram(8 << 20).expect_err("8 MiB is too small");
        assert_eq!(
            e.to_string(),
            "the probe guest needs at least 0xf00000 bytes (15 MiB) of RAM; the machine has 0x800000"
        );
    }

    #[test]
    fn boot_info_describes_ecam_the_iommu_and_every_virtio_mmio_slot() {
        let mut layout = MemoryLayout::new(DEFAULT_RAM_SIZE, true).unwrap();
        let iommu = layout.place_iommu();
        let a = layout.allocate_virtio_mmio().unwrap();
        let b = layout.allocate_virtio_mmio().unwrap();
        let info = boot_info(
            &MachineInfo {
                layout: &layout,
                vcpus: 1,
                tsc_khz: Some(2_000_000),
                acpi_tables: &[],
                pics: true,
            },
            3,
        );
        assert_eq!(info.magic, BOOT_INFO_MAGIC);
        assert_eq!(info.ecam_base, crate::machine::layout::ECAM_BASE);
        assert_eq!((info.op_count, info.tsc_khz), (3, 2_000_000));
        assert_eq!(info.virtio_mmio_count, 2);
        assert_eq!(info.iommu_base, iommu);
        assert_eq!(info.virtio_mmio_base[..2], [a.base, b.base]);
        assert_eq!(
            info.virtio_mmio_gsi[..2],
            [u64::from(a.gsi), u64::from(b.gsi)]
        );
    }
}
