//! What a guest starts from: a loader fills guest memory and says how the boot vCPU enters it.
//!
//! The trait is the machine's side of loading; it knows no loader. Two kinds fit it: the probe
//! (`machine::probe::loader`) and the kernels of `exitless run` (`machine::pc`: bzImage,
//! PVH, multiboot), which write the kernel, its boot protocol's data and ACPI tables from the
//! [`MachineInfo`], and return the protocol's entry registers. As in rust-vmm's linux-loader,
//! image formats are apart from boot protocols: [`elf`] reads an ELF kernel into
//! [`Segment`](segment::Segment)s, which PVH and multiboot each place and enter their own way.

pub mod elf;
pub mod file;
pub mod long_mode;
pub mod segment;

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
    /// Whether the machine has the dual 8259 PICs (KVM's full irqchip); not under a split
    /// irqchip, whose IOAPIC is the VMM's (the MADT's PCAT_COMPAT says which).
    pub pics: bool,
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
            pics: true,
        }
    }
}

/// The processor mode the boot vCPU starts in; sets its special registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuMode {
    /// 64-bit long mode at CPL 0 on the identity-mapping page tables, GDT and TSS that
    /// [`long_mode::write_tables`] wrote (the loader must have called it).
    LongMode,
    /// 32-bit protected mode at CPL 0, paging off, flat segments: multiboot's entry state.
    Protected32,
}

impl CpuMode {
    /// The special registers of this mode, made from the vCPU's current ones (KVM's reset
    /// state; a mode must set every field it depends on).
    pub fn sregs(self, current: kvm_sregs) -> kvm_sregs {
        match self {
            CpuMode::LongMode => long_mode::long_mode_sregs(current),
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
    /// The loader's own refusal (a kernel its format or this machine cannot take, tables it
    /// cannot write), in its own words.
    #[error("{0}")]
    Kernel(Box<dyn std::error::Error + Send + Sync>),
}

impl LoadError {
    /// Wrap a loader's own error; its message is the load's.
    pub fn kernel(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        LoadError::Kernel(Box::new(e))
    }
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
