//! The VMM driven as a library: machines built with `exitless::machine`, the probe guest booted
//! on KVM, and what it sees and measures checked (`/dev/kvm` needed; `virtio::tap` also needs
//! root for its host tap). docs/testing.md says what each group needs.

mod common;

mod intremap;
mod iommu;
mod machine;
mod msix;
mod pci_bad_access;
mod pci_methods;
mod platform_persist;
mod virtio;
mod virtio_persist;
mod wiring;
