//! exitless: a KVM virtual machine monitor for x86-64 whose device I/O path avoids VM exits or
//! amortizes them. See README.md for what it measures and DESIGN notes in the modules.

pub use exitless_contract as contract;

/// What to do about a host error that is a resource limit, to append to its message.
pub(crate) fn resource_hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => {
            "; every interrupt vector and doorbell holds an eventfd: raise the open-file limit \
             (ulimit -n) or configure fewer devices"
        }
        _ => "",
    }
}

pub mod api;
pub mod bus;
pub mod devices;
pub mod dma;
pub mod exits;
#[cfg(any(test, feature = "test-utils"))]
pub mod fakes;
pub mod host_file;
pub mod iommu;
pub mod irq;
pub mod logging;
pub mod machine;
pub mod pci;
pub mod persist;
pub mod seccomp;
pub mod virtio;
pub mod vm;
