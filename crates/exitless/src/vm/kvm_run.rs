//! A read-only view of a vCPU's `kvm_run` page, for the exit fields kvm-ioctls' decoded exits
//! drop.
//!
//! `VcpuExit::IoIn`/`IoOut` hand over the data area of a port exit (`count × size` bytes) but
//! not `kvm_run.io.size` (rust-vmm/kvm#371), and the exit borrows the `VcpuFd` for as long as the
//! data is in use. "Application code obtains a pointer to the kvm_run structure by mmap()ing a
//! vcpu fd" (Documentation/virt/kvm/api.rst §5): a second, read-only shared mapping of that page
//! gives the element size without touching kvm-ioctls' mapping or its borrow.

use std::fs::File;
use std::mem::offset_of;
use std::os::fd::{AsRawFd, BorrowedFd};

use kvm_bindings::kvm_run;
use kvm_ioctls::VcpuFd;
use vm_memory::{FileOffset, MmapRegion, VolatileMemory};

use crate::vm::VmError;

/// Offset of `kvm_run.io.size`, the element size of a port exit.
const IO_SIZE: usize = offset_of!(kvm_run, __bindgen_anon_1.io.size);

/// Offset of `kvm_run.internal.suberror`, why KVM gave up (`KVM_INTERNAL_ERROR_*`).
const INTERNAL_SUBERROR: usize = offset_of!(kvm_run, __bindgen_anon_1.internal.suberror);

/// Offset of `kvm_run.emulation_failure.flags`: with
/// `KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES` set, KVM gives the instruction's bytes.
const EMULATION_FLAGS: usize = offset_of!(kvm_run, __bindgen_anon_1.emulation_failure.flags);

/// Offset of `kvm_run.emulation_failure.insn_size`; `insn_bytes[15]` follows it.
const EMULATION_INSN_SIZE: usize = offset_of!(
    kvm_run,
    __bindgen_anon_1
        .emulation_failure
        .__bindgen_anon_1
        .__bindgen_anon_1
        .insn_size
);

/// The longest x86 instruction.
pub const MAX_INSTRUCTION_BYTES: usize = 15;

/// The `kvm_run` page of one vCPU, mapped read-only.
pub struct RunPage {
    page: MmapRegion,
}

impl RunPage {
    /// Map the `kvm_run` page of `vcpu`.
    pub fn new(vcpu: &VcpuFd) -> Result<Self, VmError> {
        let err = |e: std::io::Error| VmError::Kvm {
            what: "map the vCPU's kvm_run page",
            source: kvm_ioctls::Error::new(e.raw_os_error().unwrap_or(libc::EINVAL)),
        };
        // SAFETY: `vcpu` owns this descriptor and keeps it open while the borrow lives (this
        // statement); the clone is a new descriptor of our own.
        let fd = unsafe { BorrowedFd::borrow_raw(vcpu.as_raw_fd()) }
            .try_clone_to_owned()
            .map_err(err)?;
        // The header is all we read: it starts at offset 0 of the vCPU fd (api.rst §5).
        let page = MmapRegion::build(
            Some(FileOffset::new(File::from(fd), 0)),
            size_of::<kvm_run>(),
            libc::PROT_READ,
            libc::MAP_SHARED,
        )
        .map_err(|e| match e {
            vm_memory::mmap::MmapRegionError::Mmap(e) => err(e),
            _ => err(std::io::Error::from_raw_os_error(libc::EINVAL)),
        })?;
        Ok(RunPage { page })
    }

    /// `kvm_run.io.size`: the bytes of one element of the last port exit (1, 2 or 4). Only
    /// meaningful right after a `KVM_EXIT_IO`.
    pub fn pio_size(&self) -> u8 {
        // A volatile load: the kernel writes this page behind the program's back.
        self.page
            .as_volatile_slice()
            .get_ref::<u8>(IO_SIZE)
            .map_or(0, |r| r.load())
    }

    /// `kvm_run.internal.suberror` of a `KVM_EXIT_INTERNAL_ERROR`: 1 when KVM could not
    /// emulate an instruction (`KVM_INTERNAL_ERROR_EMULATION`, api.rst §5).
    pub fn internal_suberror(&self) -> u32 {
        self.page
            .as_volatile_slice()
            .get_ref::<u32>(INTERNAL_SUBERROR)
            .map_or(0, |r| r.load())
    }

    /// The bytes of the instruction KVM could not emulate, when KVM gives them (Linux 5.14 and
    /// later, api.rst §5 `emulation_failure`). Only meaningful after a
    /// `KVM_INTERNAL_ERROR_EMULATION`.
    pub fn emulation_failure_bytes(&self) -> Option<Vec<u8>> {
        let page = self.page.as_volatile_slice();
        let flags = page.get_ref::<u64>(EMULATION_FLAGS).ok()?.load();
        if flags & u64::from(kvm_bindings::KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES) == 0
        {
            return None;
        }
        let size = usize::from(page.get_ref::<u8>(EMULATION_INSN_SIZE).ok()?.load());
        let mut bytes = vec![0; size.min(MAX_INSTRUCTION_BYTES)];
        page.subslice(EMULATION_INSN_SIZE + 1, bytes.len())
            .ok()?
            .copy_to(&mut bytes);
        (!bytes.is_empty()).then_some(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_ioctls::Kvm;

    #[test]
    fn the_view_sees_what_kvm_writes_in_kvm_run() {
        let kvm = Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        let mut vcpu = vm.create_vcpu(0).unwrap();
        let page = RunPage::new(&vcpu).unwrap();
        for size in [1, 2, 4] {
            // The same page through kvm-ioctls' own mapping, standing in for the kernel.
            vcpu.get_kvm_run().__bindgen_anon_1.io.size = size;
            assert_eq!(page.pio_size(), size);
        }
    }
}
