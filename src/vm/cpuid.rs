//! The CPUID a vCPU reports: what KVM supports, plus the hypervisor bit and the vCPU's APIC ID,
//! minus features the software KVM of docs/host-kvm.md cannot emulate at ring 0.

use kvm_bindings::CpuId;

/// CPUID.01H:ECX bits (Intel SDM vol. 2A, table 3-10).
const ECX_CX16: u32 = 1 << 13;
const ECX_XSAVE: u32 = 1 << 26;
const ECX_OSXSAVE: u32 = 1 << 27;
const ECX_HYPERVISOR: u32 = 1 << 31;

/// Adjust `cpuid` (from `KVM_GET_SUPPORTED_CPUID`) for vCPU `index`.
pub fn for_vcpu(mut cpuid: CpuId, index: u8) -> CpuId {
    for entry in cpuid.as_mut_slice() {
        match entry.function {
            1 => {
                entry.ecx |= ECX_HYPERVISOR;
                entry.ecx &= !(ECX_CX16 | ECX_XSAVE | ECX_OSXSAVE);
                entry.ebx = (entry.ebx & 0x00ff_ffff) | (u32::from(index) << 24);
            }
            0xb | 0x1f => entry.edx = index.into(), // x2APIC ID
            _ => {}
        }
    }
    cpuid
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
