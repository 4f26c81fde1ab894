//! The `exitless` binary as a user runs it: `run` with the multiboot test kernel (and Debian's
//! kernel, in the ignored `linux` tests), `ctl` against a running VM, snapshots restored in a new
//! process, `bench` and `probe`'s output, and the command line's errors (`/dev/kvm` needed).
//! docs/testing.md says what each group needs.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod bench_baseline;
mod bench_host;
mod bench_scenarios;
mod cli;
mod console;
mod cpu;
mod disk;
mod highmem;
mod ioapic;
mod kernel_files;
mod linux;
mod migration;
mod process;
mod run;
mod run_devices;
mod sleep;
mod snapshot;
mod snapshot_dir;
