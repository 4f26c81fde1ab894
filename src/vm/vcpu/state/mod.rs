//! A vCPU's state in and out of KVM ([`VcpuState`]), in the order Firecracker's and Cloud
//! Hypervisor's `vcpu` modules use, which KVM's own ordering constraints dictate (api.rst §4).

use kvm_bindings::{KVM_MAX_MSR_ENTRIES, Msrs, kvm_msr_entry};
use kvm_ioctls::{Cap, VcpuFd};

use super::Vcpu;
use crate::vm::state::{Msr, VcpuState};
use crate::vm::{Vm, VmError, kvm_err};

/// The MSRs of `KVM_GET_MSR_INDEX_LIST` that `fd` reads: the list names every MSR KVM knows,
/// some of which this vCPU's CPUID leaves out (or this KVM cannot read), and one refused read
/// fails the whole `KVM_GET_MSRS` from there. Each left out is reported once per machine (on
/// vCPU 0), not faked.
pub(super) fn readable_msrs(vm: &Vm, fd: &VcpuFd, report: bool) -> Result<Vec<u32>, VmError> {
    let listed = vm
        .kvm()
        .get_msr_index_list()
        .map_err(kvm_err("get the MSR index list"))?;
    let mut readable = Vec::new();
    let mut rest = listed.as_slice();
    while !rest.is_empty() {
        let batch = &rest[..rest.len().min(KVM_MAX_MSR_ENTRIES)];
        let read = read_msrs(fd, batch)?.len();
        readable.extend_from_slice(&batch[..read]);
        if read < batch.len() {
            // KVM_GET_MSRS stops at the first MSR it cannot read (api.rst §4.18).
            if report {
                log::info!(
                    "MSR {:#x}: KVM lists it but does not read it; left out of snapshots",
                    batch[read]
                );
            }
            rest = &rest[read + 1..];
        } else {
            rest = &rest[batch.len()..];
        }
    }
    Ok(readable)
}

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
        let xsave = match self.has_xsave {
            true => Some(fd.get_xsave().map_err(kvm_err("get XSAVE"))?),
            false => None,
        };
        let xcrs = match self.has_xcrs {
            true => Some(fd.get_xcrs().map_err(kvm_err("get XCRs"))?),
            false => None,
        };
        let debug_regs = fd.get_debug_regs().map_err(kvm_err("get debug regs"))?;
        let lapic = fd.get_lapic().map_err(kvm_err("get local APIC"))?;
        let mut msrs = Vec::with_capacity(self.msrs.len());
        for batch in self.msrs.chunks(KVM_MAX_MSR_ENTRIES) {
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
            msrs,
            events,
        })
    }

    /// Set `state`, which [`Vcpu::save_state`] took on a vCPU of the same machine
    /// configuration, on this freshly created vCPU (its CPUID set, not yet run). The MP state
    /// first, the special registers before the XSAVE area (CR4.OSXSAVE decides what it may
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
        fd.set_mp_state(state.mp_state)
            .map_err(kvm_err("set MP state"))?;
        fd.set_regs(&state.regs).map_err(kvm_err("set regs"))?;
        fd.set_sregs(&state.sregs).map_err(kvm_err("set sregs"))?;
        if let Some(xsave) = &state.xsave {
            if !self.has_xsave {
                return Err(missing("XSAVE"));
            }
            // SAFETY: `xsave` is a whole `kvm_xsave` (4 KiB), the size KVM_SET_XSAVE reads on a
            // KVM whose guest state fits it; larger state needs KVM_CAP_XSAVE2, whose absence
            // `has_xsave` checked.
            unsafe { fd.set_xsave(xsave) }.map_err(kvm_err("set XSAVE"))?;
        }
        if let Some(xcrs) = &state.xcrs {
            if !self.has_xcrs {
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

/// Whether `vm`'s KVM hands over the XSAVE area in a `kvm_xsave` (`KVM_CAP_XSAVE`, and no
/// more guest state than its 4 KiB: `KVM_CAP_XSAVE2`'s size, where it has that) and the XCRs.
/// Without XSAVE the snapshot has no FPU or SSE state: reported once, on vCPU 0.
pub(super) fn xsave_caps(vm: &Vm, report: bool) -> (bool, bool) {
    let kvm = vm.kvm();
    let xsave2 = vm.fd().check_extension_int(Cap::Xsave2);
    let fits =
        usize::try_from(xsave2).map_or(true, |size| size <= size_of::<kvm_bindings::kvm_xsave>());
    let xsave = kvm.check_extension(Cap::Xsave) && fits;
    let xcrs = kvm.check_extension(Cap::Xcrs);
    if report && !xsave {
        log::warn!(
            "this KVM gives no XSAVE area of at most 4 KiB (KVM_CAP_XSAVE, KVM_CAP_XSAVE2 {xsave2}): snapshots hold no FPU, SSE or AVX state"
        );
    }
    if report && !xcrs {
        log::warn!("this KVM has no KVM_CAP_XCRS: snapshots hold no XCR0");
    }
    (xsave, xcrs)
}

#[cfg(test)]
mod tests;
