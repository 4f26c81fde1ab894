//! `exitless run` with RAM past the 32-bit PCI hole, and with a kernel where loaders used to
//! keep their boot information: the multiboot test kernel finds RAM from 4 GiB in its memory
//! map, writes and reads it back, and finds its virtio-pci function's 64-bit BAR above RAM
//! answering there (highmem=, crates/exitless-guest/testkernel/highmem.c); the same kernel
//! linked at 0x8000 (testkernel-low.elf, built by build.rs) boots and passes its checks; and
//! more memory than the host has is one line on stderr with status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The test kernel's `exit=debug` status when every check passed: (0x10 << 1) | 1.
const PASSED: i32 = 0x21;
/// `exitless run`'s status for its own errors.
const ERROR: i32 = 2;

/// A test kernel image, beside the binary.
fn kernel(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name(name)
}

/// `exitless run --kernel KERNEL ARGS`, bounded by --timeout so that a hung guest fails.
fn run(kernel: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--timeout", "60", "--kernel"])
        .arg(kernel)
        .args(args)
        .output()
        .expect("exitless runs")
}

/// Check every check passed and that `lines` were printed.
fn passed(out: &Output, lines: &[&str]) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(PASSED),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    for line in lines {
        assert!(stdout.contains(line), "{line:?} in:\n{stdout}");
    }
}

#[test]
fn ram_past_the_pci_hole_is_mapped_from_4_gib_and_holds_what_the_guest_writes() {
    // 4.5 GiB: 3 GiB below the hole, 1.5 GiB from 4 GiB (mapped lazily: it costs little),
    // and a virtio-net function with no link, whose 64-bit BAR goes above RAM.
    let out = run(
        &kernel("testkernel.elf"),
        &[
            "--memory",
            "4608",
            "--net",
            "none",
            "--cmdline",
            "highmem=1536",
        ],
    );
    passed(
        &out,
        &[
            "PASS multiboot: mem_lower 639 KiB, mem_upper 3144704 KiB, 6 map entries",
            "PASS highmem: the memory map lists 1536 MiB of RAM from 4 GiB",
            "PASS highmem: 8 cache lines at 4 GiB and at 4 GiB + 1534 MiB read back what was \
             written (0 wrong)",
            "PASS highmem: a second mapping of 4 GiB reads the same (4 of 4), low RAM does not",
            "64-bit BAR 0 at 1:8",
            ", above RAM, answers (2 queues)",
        ],
    );
}

#[test]
fn a_kernel_linked_at_0x8000_boots_and_passes_its_checks() {
    let low = kernel("testkernel-low.elf");
    let out = run(
        &low,
        &[
            "--memory",
            "64",
            "--cpus",
            "2",
            "--cmdline",
            "cpus=2 mem=64",
        ],
    );
    passed(
        &out,
        &[
            "testkernel: booted by exitless",
            &format!("testkernel: command line '{} cpus=2 mem=64'", low.display()),
            "PASS multiboot: mem_upper matches mem=64",
        ],
    );
}

/// The host's RAM in MiB, as /proc/meminfo's MemTotal gives it.
fn host_mib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("MemTotal");
    kib >> 10
}

#[test]
fn more_memory_than_the_host_has_is_refused_with_one_line() {
    let asked = (host_mib() + 1).to_string();
    let out = run(&kernel("testkernel.elf"), &["--memory", &asked]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(ERROR), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("--memory {asked}: more than this host's")),
        "{stderr}"
    );
}
