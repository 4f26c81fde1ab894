//! The CPUID a vCPU reports: what KVM supports shaped by the machine's `--cpu` template
//! ([`template`], [`guest`]), plus the vCPU's APIC ID.
//!
//! The MSRs that follow from CPUID need nothing here: exitless sets no MSR with
//! `KVM_SET_MSRS`, and KVM refuses a guest's access to IA32_ARCH_CAPABILITIES (10AH) and
//! IA32_TSC_ADJUST (3BH) when the guest's CPUID lacks leaf 7 EDX[29] or EBX[1] (its
//! `guest_cpuid_has` checks in `kvm_get_msr_common`/`kvm_set_msr_common`).

pub mod features;
mod guest;
pub mod template;
mod xsave;

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES};

pub use guest::guest;
pub use template::{CpuError, CpuTemplate};

/// `cpuid`, the machine's CPUID, for vCPU `index`: its initial APIC ID in CPUID.01H:EBX[31:24]
/// and its x2APIC ID in leaves 0BH and 1FH EDX (SDM vol. 2A).
pub fn for_vcpu(mut cpuid: CpuId, index: u8) -> CpuId {
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => entry.ebx = (entry.ebx & 0x00ff_ffff) | (u32::from(index) << 24),
            0xb | 0x1f => entry.edx = index.into(),
            _ => {}
        }
    }
    cpuid
}

/// The CPUID a guest of `template` sees on this host, for vCPU 0: what `exitless probe --cpuid`
/// prints.
pub fn for_host(template: &CpuTemplate) -> Result<CpuId, super::VmError> {
    let kvm = super::open_kvm(c"/dev/kvm")?;
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(super::kvm_err("get supported CPUID"))?;
    Ok(for_vcpu(guest(&supported, template)?, 0))
}

/// Physical address bits of this host, as its guests see them (CPUID 8000_0008H:EAX[7:0],
/// Intel SDM vol. 2A): 36 when the leaf is missing, the architectural minimum.
pub fn host_phys_bits() -> u8 {
    let max = std::arch::x86_64::__cpuid(0x8000_0000).eax;
    if max < 0x8000_0008 {
        return 36;
    }
    (std::arch::x86_64::__cpuid(0x8000_0008).eax & 0xff) as u8
}

#[cfg(test)]
mod tests;
