//! Linux to userspace under `exitless run`, driven by Linux's own drivers: Debian's generic
//! kernel with a busybox initramfs, in the lab ([`lab`]: this host directly where its KVM is
//! hardware KVM, else a nested-KVM outer VM under QEMU's TCG). Each case asserts what the guest
//! sees (its console's `GUEST key value` lines) and what the host sees (files, status).
//!
//! Minutes each: ignored by default; CI runs them with
//! `EXITLESS_LAB=required cargo test -p exitless-cli --test linux -- --ignored --test-threads 1`.
//! docs/linux-lab.md says what runs where and what the lab's figures are worth.

#[path = "../common/mod.rs"]
mod common;

mod guest;
mod lab;

mod boot;
mod disk;
mod iommu;
mod migration;
mod net;
mod net_table;
mod qemu;
mod sleep;
mod snapshot;
mod uso;
mod vhost_net;
mod vhost_user;
