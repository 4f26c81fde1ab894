//! exitless beside the programs it is measured against or works with: the probe under QEMU
//! (`qemu-system-x86_64`), and vhost-user devices on qemu-storage-daemon and DPDK's testpmd.
//! A test whose program is missing says so and passes; CI installs them all. docs/testing.md
//! says what each group needs.

#[path = "../common/mod.rs"]
mod common;

mod qemu;
mod vhost_user;
