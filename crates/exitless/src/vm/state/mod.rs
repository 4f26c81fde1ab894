//! What a snapshot holds of the VM itself: each vCPU's state ([`VcpuState`]), the in-kernel
//! interrupt controllers and clock ([`VmState`]), and guest memory (a sparse file, [`memory`]).
//!
//! Each KVM struct is kept as KVM hands it over (its bytes, [`bytes`]): the snapshot is
//! restored by the same KVM API, which checks every field as it would the VMM's own values.
//! What this KVM cannot give (an MSR it lists but refuses to read, no XSAVE) is reported once
//! and left out, never made up.

pub mod bytes;
mod chips;
pub mod memory;
mod summary;
mod walk;

use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_pit_state2,
    kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use serde::{Deserialize, Serialize};

/// One model-specific register: its index (Intel SDM Vol. 4) and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Msr {
    /// The register's number, as RDMSR takes it in ECX.
    pub index: u32,
    /// Its value.
    pub data: u64,
}

/// A vCPU's architectural state, as KVM keeps it, taken at an instruction boundary (a parked
/// vCPU, `vm::pause`). The fields are in the order they are read (Firecracker's `vstate::vcpu`
/// order: the MP state first, since reading it lets KVM deliver pending INIT/SIPI to the local
/// APIC; the local APIC before the MSRs, for the TSC deadline; the vCPU events last).
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    /// Runnable, halted, or waiting for INIT/SIPI (api.rst §4.38).
    #[serde(with = "bytes")]
    pub mp_state: kvm_mp_state,
    /// The general registers, RIP and RFLAGS.
    #[serde(with = "bytes")]
    pub regs: kvm_regs,
    /// Segments, descriptor tables, control registers, EFER, the APIC base and the pending
    /// external interrupt bitmap.
    #[serde(with = "bytes")]
    pub sregs: kvm_sregs,
    /// The XSAVE area: x87 FPU, SSE and the extended states XCR0 enables (Intel SDM Vol. 1
    /// §13.4), the FPU's state included. `None` where KVM has no `KVM_CAP_XSAVE`.
    #[serde(with = "bytes::option")]
    pub xsave: Option<kvm_xsave>,
    /// XCR0 and the other extended control registers. `None` where KVM has no
    /// `KVM_CAP_XCRS`.
    #[serde(with = "bytes::option")]
    pub xcrs: Option<kvm_xcrs>,
    /// DR0-DR3, DR6, DR7.
    #[serde(with = "bytes")]
    pub debug_regs: kvm_debugregs,
    /// The local APIC's register page (Intel SDM Vol. 3A §11.4.1).
    #[serde(with = "bytes")]
    pub lapic: kvm_lapic_state,
    /// The TSC frequency the guest saw, in kHz; `None` where KVM does not say (an unstable
    /// host TSC).
    pub tsc_khz: Option<u32>,
    /// The MSRs of `KVM_GET_MSR_INDEX_LIST` that this KVM reads, in its order.
    pub msrs: Vec<Msr>,
    /// Pending exceptions, interrupts and NMIs, interrupt shadows, SMM (api.rst §4.31).
    #[serde(with = "bytes")]
    pub events: kvm_vcpu_events,
}

/// The VM-wide state KVM keeps: the in-kernel interrupt controllers, the PIT and the KVM clock.
#[derive(Debug, Serialize, Deserialize)]
pub struct VmState {
    /// The 8259A master, the 8259A slave and the IOAPIC (`KVM_GET_IRQCHIP`, chip ids 0, 1, 2);
    /// `None` under a split irqchip, whose IOAPIC is a userspace device with its own state.
    pub irqchip: Option<Irqchips>,
    /// The in-kernel PIT (`KVM_GET_PIT2`); `None` where the VM has none (a split irqchip, or a
    /// KVM without `KVM_CAP_PIT2`: `KVM_GET_PIT2` fails with ENXIO).
    #[serde(with = "bytes::option")]
    pub pit: Option<kvm_pit_state2>,
    /// The KVM clock (`KVM_GET_CLOCK`, api.rst §4.57), less `KVM_CLOCK_TSC_STABLE`, which
    /// `KVM_SET_CLOCK` does not take back.
    #[serde(with = "bytes")]
    pub clock: kvm_clock_data,
}

/// The in-kernel irqchip's three chips.
#[derive(Debug, Serialize, Deserialize)]
pub struct Irqchips {
    /// The master 8259A (`KVM_IRQCHIP_PIC_MASTER`).
    #[serde(with = "bytes")]
    pub pic_master: kvm_irqchip,
    /// The slave 8259A (`KVM_IRQCHIP_PIC_SLAVE`).
    #[serde(with = "bytes")]
    pub pic_slave: kvm_irqchip,
    /// The IOAPIC (`KVM_IRQCHIP_IOAPIC`).
    #[serde(with = "bytes")]
    pub ioapic: kvm_irqchip,
}

#[cfg(test)]
pub(crate) mod tests;
