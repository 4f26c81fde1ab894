//! A vCPU's state in and out of KVM ([`VcpuState`]), in the order Firecracker's and Cloud
//! Hypervisor's `vcpu` modules use, which KVM's own ordering constraints dictate (api.rst §4).

mod coverage;

pub(super) use coverage::Coverage;

use kvm_bindings::{KVM_MAX_MSR_ENTRIES, Msrs, kvm_msr_entry};
use kvm_ioctls::VcpuFd;

use super::Vcpu;
use crate::vm::state::{Msr, VcpuState};
use crate::vm::{VmError, kvm_err};

/// Read `indices` (at most [`KVM_MAX_MSR_ENTRIES`]): as many as KVM read, in order.
fn read_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<Msr>, VmError> {
    let entries: Vec<kvm_msr_entry> = indices
        .iter()
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    let mut msrs = Msrs::from_entries(&entries)
        .map_err(|_| VmError::StateMismatch(format!("{} MSRs in one read", indices.len())))?;
    let read = fd.get_msrs(&mut msrs).map_err(kvm_err("get MSRs"))?;
    Ok(msrs.as_slice()[..read]
        .iter()
        .map(|e| Msr {
            index: e.index,
            data: e.data,
        })
        .collect())
}

/// Set every MSR of `msrs`, or fail naming the first KVM refused.
fn write_msrs(fd: &VcpuFd, msrs: &[Msr]) -> Result<(), VmError> {
    for batch in msrs.chunks(KVM_MAX_MSR_ENTRIES) {
        let entries: Vec<kvm_msr_entry> = batch
            .iter()
            .map(|m| kvm_msr_entry {
                index: m.index,
                data: m.data,
                ..Default::default()
            })
            .collect();
        let kvm_msrs = Msrs::from_entries(&entries).expect("at most KVM_MAX_MSR_ENTRIES");
        let set = fd.set_msrs(&kvm_msrs).map_err(kvm_err("set MSRs"))?;
        // KVM_SET_MSRS stops at the first MSR it refuses and says how many it set.
        if let Some(refused) = batch.get(set) {
            return Err(VmError::MsrNotSet {
                index: refused.index,
                data: refused.data,
            });
        }
    }
    Ok(())
}

impl Vcpu {
    /// This vCPU's state. It must be out of `KVM_RUN`, at an instruction boundary (parked:
    /// `vm::pause`), and the other vCPUs too (the vCPU events are not safe to read while others
    /// run). The MP state first: reading it lets KVM deliver a pending INIT/SIPI into the state
    /// read after it; the local APIC before the MSRs (the TSC deadline is read relative to it);
    /// the events last.
    pub fn save_state(&self) -> Result<VcpuState, VmError> {
        let fd = &self.fd;
        let mp_state = fd.get_mp_state().map_err(kvm_err("get MP state"))?;
        let regs = fd.get_regs().map_err(kvm_err("get regs"))?;
        let sregs = fd.get_sregs().map_err(kvm_err("get sregs"))?;
        if self.index == 0 {
            self.coverage.report();
        }
        let xsave = match self.coverage.xsave {
            true => Some(fd.get_xsave().map_err(kvm_err("get XSAVE"))?),
            false => None,
        };
        let xcrs = match self.coverage.xcrs {
            true => Some(fd.get_xcrs().map_err(kvm_err("get XCRs"))?),
            false => None,
        };
        let debug_regs = fd.get_debug_regs().map_err(kvm_err("get debug regs"))?;
        let lapic = fd.get_lapic().map_err(kvm_err("get local APIC"))?;
        let tsc_khz = fd.get_tsc_khz().ok();
        let mut msrs = Vec::with_capacity(self.coverage.msrs.len());
        for batch in self.coverage.msrs.chunks(KVM_MAX_MSR_ENTRIES) {
            let read = read_msrs(fd, batch)?;
            if let Some(&unread) = batch.get(read.len()) {
                return Err(VmError::MsrUnreadable(unread));
            }
            msrs.extend(read);
        }
        let events = fd.get_vcpu_events().map_err(kvm_err("get vCPU events"))?;
        Ok(VcpuState {
            mp_state,
            regs,
            sregs,
            xsave,
            xcrs,
            debug_regs,
            lapic,
            tsc_khz,
            msrs,
            events,
        })
    }

    /// Set `state`, which [`Vcpu::save_state`] took on a vCPU of the same machine
    /// configuration, on this freshly created vCPU (its CPUID set, not yet run). The TSC's
    /// frequency first (the TSC MSR counts at it), then the MP state, the special registers before the XSAVE area (CR4.OSXSAVE decides what it may
    /// hold), the local APIC before the MSRs (the TSC deadline), every MSR checked, and the
    /// events last (they may hold an exception the state before must be there for).
    pub fn restore_state(&self, state: &VcpuState) -> Result<(), VmError> {
        let fd = &self.fd;
        let missing = |what: &str| {
            VmError::StateMismatch(format!(
                "vCPU {}: this KVM has no {what}, which the snapshot holds",
                self.index
            ))
        };
        if let Some(khz) = state.tsc_khz {
            self.keep_tsc_rate(khz)?;
        }
        fd.set_mp_state(state.mp_state)
            .map_err(kvm_err("set MP state"))?;
        fd.set_regs(&state.regs).map_err(kvm_err("set regs"))?;
        fd.set_sregs(&state.sregs).map_err(kvm_err("set sregs"))?;
        if let Some(xsave) = &state.xsave {
            if !self.coverage.xsave {
                return Err(missing("XSAVE"));
            }
            // SAFETY: `xsave` is a whole `kvm_xsave` (4 KiB), the size KVM_SET_XSAVE reads on a
            // KVM whose guest state fits it; larger state needs KVM_CAP_XSAVE2, whose absence
            // `coverage` checked.
            unsafe { fd.set_xsave(xsave) }.map_err(kvm_err("set XSAVE"))?;
        }
        if let Some(xcrs) = &state.xcrs {
            if !self.coverage.xcrs {
                return Err(missing("XCRs"));
            }
            fd.set_xcrs(xcrs).map_err(kvm_err("set XCRs"))?;
        }
        fd.set_debug_regs(&state.debug_regs)
            .map_err(kvm_err("set debug regs"))?;
        fd.set_lapic(&state.lapic)
            .map_err(kvm_err("set local APIC"))?;
        write_msrs(fd, &state.msrs)?;
        fd.set_vcpu_events(&state.events)
            .map_err(kvm_err("set vCPU events"))
    }
}

/// How far the restoring host's TSC frequency may be from the snapshot's before the guest's is
/// scaled to it: Firecracker's tolerance (`TSC_KHZ_TOL`), the NTP drift a guest's clock
/// corrects for anyway.
const TSC_TOLERANCE_PPM: u64 = 250;

impl Vcpu {
    /// Give the guest the TSC frequency `khz` it ran at, where this vCPU's differs by more
    /// than [`TSC_TOLERANCE_PPM`] (`KVM_SET_TSC_KHZ`, which needs TSC scaling: a host without
    /// it cannot restore the snapshot).
    fn keep_tsc_rate(&self, khz: u32) -> Result<(), VmError> {
        let current = self.fd.get_tsc_khz().ok();
        let off = current.map_or(u64::MAX, |c| u64::from(c.abs_diff(khz)));
        if off.saturating_mul(1_000_000) <= u64::from(khz) * TSC_TOLERANCE_PPM {
            return Ok(());
        }
        self.fd
            .set_tsc_khz(khz)
            .map_err(kvm_err("set the TSC frequency to the snapshot's"))
    }
}

#[cfg(test)]
mod tests;
