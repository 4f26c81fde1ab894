//! What a guest starts from: a loader fills guest memory and says how the boot vCPU enters it.
//!
//! The probe is the first loader (`machine::probe::loader`). A Linux loader (bzImage, PVH or
//! ELF through linux-loader) fits the same trait: it writes the kernel, boot parameters and
//! tables from the [`MachineInfo`], and returns the protocol's entry registers.

use kvm_bindings::{kvm_regs, kvm_sregs};
use vm_memory::GuestMemoryMmap;

use crate::machine::layout::MemoryLayout;
use crate::vm::boot;

/// What a loader may want to know about the machine it loads into.
#[derive(Debug)]
pub struct MachineInfo<'a> {
    /// The guest-physical map: RAM size, ECAM, the virtio-mmio slots.
    pub layout: &'a MemoryLayout,
    /// vCPUs the machine has.
    pub vcpus: u8,
    /// The boot vCPU's TSC frequency in kHz, when KVM reports one.
    pub tsc_khz: Option<u32>,
    /// ACPI tables the machine's devices describe themselves with (the DMAR of its IOMMU),
    /// for loaders that write ACPI tables.
    pub acpi_tables: &'a [Vec<u8>],
}

impl<'a> MachineInfo<'a> {
    /// A machine of one vCPU with `layout`, no TSC rate known and no device tables: what the
    /// loaders' tests and fuzz targets load into.
    pub fn one_vcpu(layout: &'a MemoryLayout) -> Self {
        MachineInfo {
            layout,
            vcpus: 1,
            tsc_khz: None,
            acpi_tables: &[],
        }
    }
}

/// The processor mode the boot vCPU starts in; sets its special registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuMode {
    /// 64-bit long mode at CPL 0 on the identity-mapping page tables, GDT and TSS that
    /// `vm::boot::write_tables` wrote (the loader must have called it).
    LongMode,
    /// 32-bit protected mode at CPL 0, paging off, flat segments: multiboot's entry state.
    Protected32,
}

impl CpuMode {
    /// The special registers of this mode, made from the vCPU's current ones (KVM's reset
    /// state; a mode must set every field it depends on).
    pub fn sregs(self, current: kvm_sregs) -> kvm_sregs {
        match self {
            CpuMode::LongMode => boot::long_mode_sregs(current),
            CpuMode::Protected32 => boot::protected_mode_sregs(current),
        }
    }
}

/// How the boot vCPU enters the loaded guest.
#[derive(Clone, Copy, Debug)]
pub struct EntryState {
    /// Its mode (special registers).
    pub mode: CpuMode,
    /// Its general registers: instruction pointer, stack, the protocol's arguments.
    pub regs: kvm_regs,
}

/// Why a guest could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The machine's RAM does not hold what the loader must place.
    #[error("{what} needs at least {need:#x} bytes ({} MiB) of RAM; the machine has {have:#x}",
        need.div_ceil(1 << 20))]
    RamTooSmall {
        /// What is being loaded.
        what: &'static str,
        /// Bytes it needs, from address 0.
        need: u64,
        /// Bytes the machine has.
        have: u64,
    },
    /// The image is larger than its place in memory.
    #[error("the {what} image is {size} bytes; at most {max} fit")]
    ImageTooLarge {
        /// What is being loaded.
        what: &'static str,
        /// Its size.
        size: u64,
        /// The room it has.
        max: u64,
    },
    /// The loader's input does not fit what it loads (too many entries, a limit of its format).
    #[error("{0}")]
    Invalid(String),
    /// Writing guest memory failed.
    #[error("writing guest memory failed: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    /// A multiboot kernel that cannot be loaded.
    #[error(transparent)]
    Multiboot(#[from] crate::machine::run::multiboot::MultibootError),
    /// A bzImage that cannot be loaded.
    #[error(transparent)]
    BzImage(#[from] crate::machine::run::bzimage::BzImageError),
    /// A PVH kernel that cannot be loaded.
    #[error(transparent)]
    Pvh(#[from] crate::machine::run::pvh::PvhError),
    /// The ACPI tables.
    #[error(transparent)]
    Acpi(#[from] crate::machine::run::acpi::AcpiError),
}

/// Puts a guest into memory and says how the boot vCPU enters it.
pub trait Loader {
    /// Write the guest into `mem` for the machine `machine` describes; return the boot vCPU's
    /// entry state. Called once, after the vCPUs exist and before any runs.
    fn load(
        &self,
        mem: &GuestMemoryMmap,
        machine: &MachineInfo<'_>,
    ) -> Result<EntryState, LoadError>;

    /// How vCPU `index` (1 and up) starts: at an entry state of its own at once, or, with
    /// `None`, as on a PC: it waits for the boot vCPU's INIT and start-up IPIs, which KVM's
    /// in-kernel local APIC delivers (Intel SDM vol. 3 §9.4, MP initialization), and then runs
    /// from the start-up vector in real mode.
    fn secondary_entry(&self, _index: u8) -> Option<EntryState> {
        None
    }
}
