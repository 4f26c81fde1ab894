//! Helpers shared by the test binaries that run `exitless` as a process: the multiboot test
//! kernel under `exitless run` ([`testkernel`]) and a VM in the background driven by
//! `exitless ctl` ([`running`]), and Debian's kernels and initramfs archives for the Linux tests
//! ([`debian`], [`initramfs`]).
// Each binary uses some of them.
#![allow(dead_code)]

pub mod debian;
pub mod initramfs;
pub mod running;
pub mod testkernel;

/// Whether this host's KVM runs guests on the CPU's virtualization extensions: `kvm_intel` or
/// `kvm_amd` loaded, and not the software `kvm_pvm` of docs/host-kvm.md.
pub fn hardware_kvm() -> bool {
    let loaded = |m: &str| std::path::Path::new("/sys/module").join(m).exists();
    (loaded("kvm_intel") || loaded("kvm_amd")) && !loaded("kvm_pvm")
}
