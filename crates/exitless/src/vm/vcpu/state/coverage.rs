//! What of a vCPU's state this KVM hands over, found once when the vCPU is created: which of
//! the MSRs KVM lists the vCPU reads, and whether there is an XSAVE area and XCRs. What is left
//! out is said in one line at each snapshot, not made up.

use kvm_bindings::{KVM_MAX_MSR_ENTRIES, kvm_xsave};
use kvm_ioctls::{Cap, VcpuFd};

use super::read_msrs;
use crate::vm::{Vm, VmError, kvm_err};

/// What a snapshot of one vCPU holds on this KVM.
pub struct Coverage {
    /// The MSRs of `KVM_GET_MSR_INDEX_LIST` the vCPU reads, in the list's order.
    pub(super) msrs: Vec<u32>,
    /// Those it lists but does not read (an MSR this vCPU's CPUID leaves out, say).
    left_out: Vec<u32>,
    /// `KVM_GET_XSAVE` gives the whole XSAVE area (x87, SSE, AVX... state).
    pub(super) xsave: bool,
    /// `KVM_GET_XCRS` is there.
    pub(super) xcrs: bool,
}

impl Coverage {
    /// Find out, on the vCPU `fd` of `vm`. `KVM_GET_MSRS` stops at the first MSR it refuses
    /// (api.rst §4.18), so the list is read in batches, each refused one skipped. The XSAVE
    /// area is taken where KVM has `KVM_CAP_XSAVE` and the guest's state fits `kvm_xsave`'s
    /// 4 KiB (`KVM_CAP_XSAVE2` gives the size where it is larger: AMX state, which would need
    /// `KVM_GET_XSAVE2`).
    pub fn of(vm: &Vm, fd: &VcpuFd) -> Result<Self, VmError> {
        let listed = vm
            .kvm()
            .get_msr_index_list()
            .map_err(kvm_err("get the MSR index list"))?;
        let (mut msrs, mut left_out) = (Vec::new(), Vec::new());
        let mut rest = listed.as_slice();
        while !rest.is_empty() {
            let batch = &rest[..rest.len().min(KVM_MAX_MSR_ENTRIES)];
            let read = read_msrs(fd, batch)?.len();
            msrs.extend_from_slice(&batch[..read]);
            left_out.extend(batch.get(read));
            rest = &rest[(read + 1).min(batch.len())..];
        }
        let kvm = vm.kvm();
        let xsave2 = vm.fd().check_extension_int(Cap::Xsave2);
        let fits = usize::try_from(xsave2).map_or(true, |size| size <= size_of::<kvm_xsave>());
        Ok(Coverage {
            msrs,
            left_out,
            xsave: kvm.check_extension(Cap::Xsave) && fits,
            xcrs: kvm.check_extension(Cap::Xcrs),
        })
    }

    /// One line saying what a snapshot leaves out on this KVM, if anything.
    pub(super) fn report(&self) {
        let mut missing = Vec::new();
        if !self.left_out.is_empty() {
            let list: Vec<String> = self.left_out.iter().map(|i| format!("{i:#x}")).collect();
            missing.push(format!(
                "MSRs {} (listed by KVM, not read)",
                list.join(", ")
            ));
        }
        if !self.xsave {
            missing.push("the XSAVE area: x87, SSE and AVX state (no KVM_CAP_XSAVE, or more than 4 KiB of it)".into());
        }
        if !self.xcrs {
            missing.push("XCR0 (no KVM_CAP_XCRS)".into());
        }
        if !missing.is_empty() {
            log::warn!(
                "this KVM does not give, so the snapshot leaves out, {}",
                missing.join("; ")
            );
        }
    }
}
