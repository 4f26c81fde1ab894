//! Builds the probe guest (probe/) with gcc, for the VMM to embed (`PROBE_IMAGE`): the VMM
//! binary needs no other file. The contract header the guest includes is generated here from the
//! exitless-contract crate, the single definition of the VMM ↔ guest contract.
//!
//! Also builds the multiboot test kernel (testkernel/) for `exitless run`: a 32-bit ELF,
//! `testkernel.elf`, the same kernel linked at 0x8000, `testkernel-low.elf`, and as a flat image
//! loaded by its multiboot address fields, `testkernel.bin`. All are put next to the exitless
//! binary (target/debug/ or target/release/), where the tests and the README's examples find them. The test kernel
//! shares nothing with the VMM's sources, only the firmware readers and the multiboot header
//! (firmware.h, multiboot.h, portio.h) with the probe: it checks exitless against QEMU's conventions.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (is gcc/binutils installed?)"));
    assert!(status.success(), "{cmd:?} failed with {status}");
}

/// The probe's sources: `probe.c` is its one translation unit and includes every concern file
/// beside it (probe/probe.c says why); `entry.S` is its entry and interrupt stubs.
const PROBE_DIR: &str = "probe";

/// Headers beside probe/ and testkernel/ that the probe and the test kernel both include.
const GUEST_SHARED: [&str; 3] = ["firmware.h", "multiboot.h", "portio.h"];

/// Flags for freestanding guest code, 32- or 64-bit.
const FREESTANDING: [&str; 13] = [
    "-ffreestanding",
    "-fno-pic",
    "-fno-stack-protector",
    "-fno-asynchronous-unwind-tables",
    "-mgeneral-regs-only",
    "-nostdlib",
    "-static",
    "-no-pie",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wl,--build-id=none",
];

/// Where the test kernel's sources are.
const TEST_KERNEL_DIR: &str = "testkernel";

/// The test kernel's C files, one concern each (testkernel.h declares what they share).
const TEST_KERNEL_C: [&str; 10] = [
    "main.c",
    "console.c",
    "platform.c",
    "virtio.c",
    "virtio_blk.c",
    "virtio_net.c",
    "cpuid.c",
    "rtc.c",
    "highmem.c",
    "ioapic.c",
];

/// The multiboot test kernel: `testkernel.elf` (ELF) and `testkernel.bin` (flat, loaded by the
/// header's address fields), in `out` and next to the binary cargo builds.
fn build_test_kernel(cc: &str, out: &Path) {
    let dir = Path::new(TEST_KERNEL_DIR);
    // Cargo scans a folder for any change: every file in it, and one added or removed.
    println!("cargo:rerun-if-changed={TEST_KERNEL_DIR}");
    for f in GUEST_SHARED {
        println!("cargo:rerun-if-changed={f}");
    }
    let build = |defines: &[&str], elf: &Path| {
        run(Command::new(cc)
            .args(["-m32", "-march=i686", "-fno-delete-null-pointer-checks"])
            .args(FREESTANDING)
            .args(defines)
            .arg("-T")
            .arg(dir.join("testkernel.ld"))
            .arg(dir.join("entry.S"))
            .args(TEST_KERNEL_C.map(|f| dir.join(f)))
            .arg("-o")
            .arg(elf));
    };
    let elf = out.join("testkernel.elf");
    build(&[], &elf);
    // The same kernel linked at 0x8000, in the conventional memory a loader may not keep to
    // itself (QEMU boots such kernels).
    let low = out.join("testkernel-low.elf");
    build(&["-Wl,--defsym=LOAD_BASE=0x8000"], &low);
    let kludge = out.join("testkernel-kludge.elf");
    build(&["-DAOUT_KLUDGE"], &kludge);
    let flat = out.join("testkernel.bin");
    run(Command::new("objcopy")
        .args(["-O", "binary"])
        .arg(&kludge)
        .arg(&flat));
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out: the binary is in <profile>.
    let profile_dir = out.ancestors().nth(3).expect("cargo's OUT_DIR layout");
    for file in [&elf, &low, &flat] {
        let name = file.file_name().expect("a file");
        fs::copy(file, profile_dir.join(name)).expect("copy the test kernel beside the binary");
    }
}

/// Checks that probe.c includes every concern file beside it: one it left out would silently
/// not be built.
fn check_probe_unit(probe: &Path) {
    let unit = fs::read_to_string(probe.join("probe.c")).expect("probe/probe.c");
    for entry in fs::read_dir(probe).expect("probe/") {
        let path = entry.expect("a probe/ entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a UTF-8 name");
        if name.ends_with(".c") && name != "probe.c" {
            assert!(
                unit.contains(&format!("#include \"{name}\"")),
                "probe/probe.c does not include {name}"
            );
        }
    }
}

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let probe = Path::new(PROBE_DIR);
    // Cargo scans a folder for any change: every file in it, and one added or removed.
    println!("cargo:rerun-if-changed={PROBE_DIR}");
    check_probe_unit(probe);
    for f in GUEST_SHARED {
        println!("cargo:rerun-if-changed={f}");
    }

    fs::write(
        out.join("contract.h"),
        exitless_contract::header::c_header(),
    )
    .unwrap();
    let elf = out.join("probe.elf");
    let cc = env::var("EXITLESS_GUEST_CC").unwrap_or_else(|_| "gcc".into());
    run(Command::new(&cc)
        .args(FREESTANDING)
        .args(["-mno-red-zone", "-mcmodel=small"])
        .arg("-I")
        .arg(&out)
        .arg(format!(
            "-Wl,--defsym=PROBE_LOAD_ADDR={}",
            exitless_contract::PROBE_LOAD_ADDR
        ))
        .arg("-T")
        .arg(probe.join("probe.ld"))
        .arg(probe.join("entry.S"))
        .arg(probe.join("probe.c"))
        .arg("-o")
        .arg(&elf));
    run(Command::new("objcopy")
        .args(["-O", "binary"])
        .arg(&elf)
        .arg(out.join("probe.bin")));
    build_test_kernel(&cc, &out);
}
