//! The virtual machine: KVM handles, guest memory, extra memslots, vCPUs.

pub mod boot;
pub mod cpuid;
pub mod kvm_run;
pub mod run_control;
pub mod vcpu;

use std::sync::Arc;

use kvm_bindings::{KVM_MEM_READONLY, kvm_userspace_memory_region};
use kvm_ioctls::{Cap, Kvm, VmFd};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MmapRegion};

/// Errors creating or configuring a VM. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// /dev/kvm is missing.
    #[error(
        "/dev/kvm does not exist: load the kvm module (modprobe kvm_intel or kvm_amd) or run on a host with virtualization"
    )]
    NoKvm,
    /// /dev/kvm cannot be opened.
    #[error(
        "cannot open /dev/kvm: permission denied; add yourself to the kvm group or run as root"
    )]
    KvmPermission,
    /// Another KVM failure.
    #[error("KVM {what} failed: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The errno.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A capability the VMM needs is missing.
    #[error("this KVM lacks {0}, which exitless needs")]
    MissingCap(&'static str),
    /// Guest memory allocation failed.
    #[error("cannot allocate {size} bytes of guest memory: {reason}")]
    Memory {
        /// Requested size.
        size: usize,
        /// Why.
        reason: String,
    },
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// Open the KVM device at `path`, turning the common failures into advice.
fn open_kvm(path: &std::ffi::CStr) -> Result<Kvm, VmError> {
    Kvm::new_with_path(path).map_err(|e| match e.errno() {
        libc::ENOENT => VmError::NoKvm,
        libc::EACCES | libc::EPERM => VmError::KvmPermission,
        _ => VmError::Kvm {
            what: "open /dev/kvm",
            source: e,
        },
    })
}

/// A VM with an in-kernel irqchip and guest RAM at address 0.
pub struct Vm {
    kvm: Kvm,
    fd: Arc<VmFd>,
    memory: GuestMemoryMmap,
    next_slot: u32,
}

impl Vm {
    /// Open KVM and create a VM with `mem_size` bytes of RAM.
    pub fn new(mem_size: usize) -> Result<Self, VmError> {
        let kvm = open_kvm(c"/dev/kvm")?;
        for (cap, name) in [
            (Cap::Irqchip, "an in-kernel irqchip"),
            (Cap::UserMemory, "user memory slots"),
            (Cap::ReadonlyMem, "read-only memory slots"),
            (Cap::Ioeventfd, "ioeventfd"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(VmError::MissingCap(name));
            }
        }
        let fd = kvm.create_vm().map_err(kvm_err("create VM"))?;
        // The irqchip must exist before any vCPU (PLATFORM.md).
        fd.create_irq_chip().map_err(kvm_err("create irqchip"))?;
        let memory =
            GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), mem_size)]).map_err(|e| {
                VmError::Memory {
                    size: mem_size,
                    reason: e.to_string(),
                }
            })?;
        let mut vm = Vm {
            kvm,
            fd: Arc::new(fd),
            memory,
            next_slot: 0,
        };
        let regions: Vec<(u64, u64, u64)> = vm
            .memory
            .iter()
            .map(|r| {
                let host = vm
                    .memory
                    .get_host_address(r.start_addr())
                    .expect("region start is mapped");
                (r.start_addr().0, r.len(), host as u64)
            })
            .collect();
        for (gpa, len, host) in regions {
            vm.add_slot(gpa, len, host, 0)?;
        }
        Ok(vm)
    }

    fn add_slot(&mut self, gpa: u64, len: u64, host: u64, flags: u32) -> Result<(), VmError> {
        let region = kvm_userspace_memory_region {
            slot: self.next_slot,
            flags,
            guest_phys_addr: gpa,
            memory_size: len,
            userspace_addr: host,
        };
        // SAFETY: `host..host+len` is a live mapping owned by `self.memory` or by a region the
        // caller keeps alive as long as the VM (see `add_readonly_region`); KVM checks overlaps.
        unsafe { self.fd.set_user_memory_region(region) }.map_err(kvm_err("set memory region"))?;
        self.next_slot += 1;
        Ok(())
    }

    /// Map `region` read-only at `gpa`: guest reads are plain memory accesses, writes exit as
    /// MMIO. The caller must keep `region` alive as long as this VM.
    pub fn add_readonly_region(&mut self, gpa: u64, region: &MmapRegion) -> Result<(), VmError> {
        self.add_slot(
            gpa,
            region.size() as u64,
            region.as_ptr() as u64,
            KVM_MEM_READONLY,
        )
    }

    /// The KVM system handle.
    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    /// The VM handle.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// The VM handle, for devices that register irqfds, ioeventfds and routes.
    pub fn shared_fd(&self) -> Arc<VmFd> {
        self.fd.clone()
    }

    /// Guest RAM.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_kvm_device_says_what_to_do() {
        let e = open_kvm(c"/nonexistent/kvm").expect_err("no such device");
        assert!(matches!(e, VmError::NoKvm));
        assert!(e.to_string().contains("modprobe"));
    }
}
