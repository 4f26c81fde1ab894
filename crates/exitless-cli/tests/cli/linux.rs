//! `exitless run` boots Debian's cloud kernel, as a bzImage and through its PVH entry (the
//! uncompressed vmlinux taken out of the bzImage: Debian ships none), and the kernel log shows
//! what it found: the banner, the e820 map exitless gave it, the ACPI tables it parsed, the CPU
//! count.
//!
//! On this project's hosts KVM emulates ring 0 instruction by instruction (docs/host-kvm.md), so
//! the bzImage spends about 2.5 minutes decompressing itself, and Linux stops, in every VMM, at
//! its int3 self-test; the tests check what is reachable before that and stop the guest as soon
//! as they have seen it. They are ignored by default (about 165 s and 30 s here); run them with
//! `cargo test -p exitless-cli --test cli -- --ignored --nocapture --test-threads 1 linux::`.
//! The kernel package is downloaded once into the target directory (apt-get download, dpkg-deb
//! -x: nothing is installed); without network, or lz4 for the vmlinux, a test says so and passes.
//!
//! On a host with hardware KVM (detected from the loaded modules) Linux gets past that point,
//! and a third test boots the same kernel to an initramfs built here from Debian's
//! `busybox-static` and the kernel package's virtio modules: its /init prints a marker, checks
//! /dev/vda (a disk given with `--disk`) and an Ethernet interface (`--net none`), and powers
//! off. It passes
//! only if the marker and both checks appear. Wherever QEMU is installed, the same kernel and
//! initramfs first boot under QEMU without KVM (TCG, about 5 s), which must show the same lines:
//! on this project's software-KVM hosts that is what the test checks, and it says why exitless
//! boots nothing.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::common::initramfs::Initramfs;
use crate::common::{debian, hardware_kvm};

/// The metapackage that names the current cloud kernel.
const PACKAGE: &str = "linux-image-cloud-amd64";
/// Guest RAM, MiB; the e820 line below follows from it.
const MEMORY_MIB: u64 = 256;
/// vCPUs; the secondary one waits for INIT/SIPI that the kernel sends later than it gets here.
const CPUS: u64 = 2;
/// Longest the run may take: the banner comes after about 160 s here.
const TIMEOUT_S: u64 = 420;
/// `exitless run`'s status when the guest runs past --timeout.
const TIMED_OUT: i32 = 124;
/// Linux's command line: the serial console from the first line on; no KASLR, so that the
/// log is the same from run to run; `noxsave`, because this host's KVM shows XSAVE to the guest
/// whatever CPUID the VMM sets and its emulator lacks `xrstor` (docs/host-kvm.md, "Which CPUID
/// bits the VMM controls here"). CX16 the template hides.
const CMDLINE: &str = "console=ttyS0 earlyprintk=serial,ttyS0,115200 nokaslr noxsave";
/// The CPU template: without the two features this host's emulator lacks.
const CPU: &str = "host,-xsave,-cx16";

/// Lines the log must have, in order of appearance; the run stops after the last.
const EXPECTED: [&str; 9] = [
    "Linux version 6.",
    "BIOS-provided physical RAM map",
    "BIOS-e820: [mem 0x0000000000100000-0x000000000fffffff] usable",
    "ACPI: RSDP 0x00000000000E0000",
    "ACPI: XSDT",
    "ACPI: FACP",
    "ACPI: APIC",
    "ACPI: MCFG",
    "smpboot: Allowing 2 CPUs",
];

/// Guest RAM past the 32-bit PCI hole, MiB: 3 GiB below it, 1.5 GiB from 4 GiB.
const HIGH_MEMORY_MIB: u64 = 4608;
/// Lines the log of a [`HIGH_MEMORY_MIB`] run must have: RAM up to the hole, then from 4 GiB.
const EXPECTED_HIGH: [&str; 4] = [
    "Linux version 6.",
    "BIOS-provided physical RAM map",
    "BIOS-e820: [mem 0x0000000000100000-0x00000000bfffffff] usable",
    "BIOS-e820: [mem 0x0000000100000000-0x000000015fffffff] usable",
];

/// Modules the initramfs loads, with what they depend on: the cloud kernel builds virtio as
/// modules (CONFIG_VIRTIO_PCI=m, CONFIG_VIRTIO_BLK=m, CONFIG_VIRTIO_NET=m).
const MODULES: [&str; 3] = ["virtio_pci", "virtio_blk", "virtio_net"];

/// The cloud kernel's bzImage, downloaded on first use.
fn vmlinuz() -> Result<PathBuf, String> {
    debian::kernel(PACKAGE).map(|kernel| kernel.vmlinuz)
}

/// The initramfs: busybox, /init and the virtio modules.
fn initramfs(kernel: &debian::Kernel, busybox: &Path) -> Result<Vec<u8>, String> {
    let mut archive = Initramfs::new(busybox, INIT)?;
    for module in MODULES {
        archive.module(kernel, module)?;
    }
    Ok(archive.finish())
}

/// What /init prints when it has come up; the test passes only on it.
const MARKER: &str = "EXITLESS-INITRAMFS-UP";

/// The initramfs's /init after the modules are loaded: report the disk and the interface, power
/// off (reboot(2) with RB_POWER_OFF: ACPI S5, which ends `exitless run` with status 0).
const INIT: &str = r#"
sleep 1
echo EXITLESS-INITRAMFS-UP
[ -b /dev/vda ] && echo "EXITLESS-INITRAMFS-DISK vda $(cat /sys/block/vda/size) sectors"
for n in /sys/class/net/*; do
  [ "$(cat "$n/type")" = 1 ] && echo "EXITLESS-INITRAMFS-NET ${n##*/} $(cat "$n/address")"
done
poweroff -f
"#;

#[test]
#[ignore = "boots Linux for about 165 s; run the ignored linux:: tests of exitless-cli's cli"]
fn a_debian_bzimage_reports_the_e820_map_acpi_tables_and_cpus() {
    match vmlinuz() {
        Ok(kernel) => boot(&kernel, MEMORY_MIB, &EXPECTED),
        Err(why) => println!("skipped: cannot get Debian's {PACKAGE}: {why}"),
    }
}

#[test]
#[ignore = "boots Linux for about 30 s; run the ignored linux:: tests of exitless-cli's cli"]
fn a_debian_vmlinux_through_its_pvh_note_reports_the_same() {
    match vmlinuz().and_then(|vmlinuz| debian::vmlinux(&vmlinuz)) {
        Ok(kernel) => boot(&kernel, MEMORY_MIB, &EXPECTED),
        Err(why) => println!("skipped: cannot get Debian's vmlinux: {why}"),
    }
}

#[test]
#[ignore = "boots Linux for about 30 s; run the ignored linux:: tests of exitless-cli's cli"]
fn with_4608_mib_linux_lists_usable_ram_from_4_gib() {
    match vmlinuz().and_then(|vmlinuz| debian::vmlinux(&vmlinuz)) {
        Ok(kernel) => boot(&kernel, HIGH_MEMORY_MIB, &EXPECTED_HIGH),
        Err(why) => println!("skipped: cannot get Debian's vmlinux: {why}"),
    }
}

#[test]
#[ignore = "downloads busybox-static and, with hardware KVM, boots Linux to userspace"]
fn with_hardware_kvm_linux_reaches_an_initramfs_that_sees_its_disk_and_network() {
    let parts = debian::kernel(PACKAGE).and_then(|kernel| Ok((kernel, debian::busybox()?)));
    let (package, busybox) = match parts {
        Ok(parts) => parts,
        Err(why) => return println!("skipped: cannot get the kernel or busybox: {why}"),
    };
    let archive = initramfs(&package, &busybox).expect("the initramfs builds");
    let kernel = package.vmlinuz;
    let dir = kernel.with_file_name("initramfs-test");
    std::fs::create_dir_all(&dir).unwrap();
    let (initrd, disk) = (dir.join("initramfs.cpio"), dir.join("disk.img"));
    std::fs::write(&initrd, &archive).unwrap();
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    // QEMU without KVM (TCG: every instruction translated in software, about 5 s here) boots
    // the same kernel, initramfs and devices: proof that the initramfs does its job, on any host.
    let tcg = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-m", &MEMORY_MIB.to_string(), "-kernel"])
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", INITRAMFS_CMDLINE, "-drive"])
        .arg(format!("file={},format=raw,if=virtio", disk.display()))
        .args([
            "-device",
            "virtio-net-pci,netdev=n0",
            "-netdev",
            "user,id=n0",
        ])
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .stdin(Stdio::null())
        .output();
    match tcg {
        Ok(out) => check_initramfs_console(&String::from_utf8_lossy(&out.stdout), "QEMU (TCG)"),
        Err(e) => println!("not checked under QEMU (TCG): qemu-system-x86_64: {e}"),
    }
    if !hardware_kvm() {
        return println!(
            "skipped the exitless boot: this host's KVM is software (kvm_pvm), where Linux \
             stops at its int3 self-test long before userspace (docs/host-kvm.md)"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--kernel"])
        .arg(&kernel)
        .arg("--initrd")
        .arg(&initrd)
        .arg("--disk")
        .arg(&disk)
        // A NIC without a link: the interface exists, which is what /init checks.
        .args(["--net", "none"])
        .args(["--cmdline", INITRAMFS_CMDLINE])
        .args(["--memory", &MEMORY_MIB.to_string()])
        .args(["--timeout", "120"])
        .stdin(Stdio::null())
        .output()
        .expect("exitless runs");
    check_initramfs_console(&String::from_utf8_lossy(&out.stdout), "exitless");
    assert_eq!(out.status.code(), Some(0), "powered off");
}

/// The initramfs's command line: no initrd-less root to look for, and a panic ends the run.
const INITRAMFS_CMDLINE: &str = "console=ttyS0 rdinit=/init panic=-1";

/// The console of an initramfs boot under `vmm` shows the marker, the 1 MiB disk and an
/// Ethernet interface.
fn check_initramfs_console(console: &str, vmm: &str) {
    let tail: Vec<&str> = console.lines().rev().take(20).collect();
    assert!(
        console.contains(MARKER),
        "{vmm}: no marker; the log ends {tail:?}"
    );
    assert!(
        console.contains("EXITLESS-INITRAMFS-DISK vda 2048 sectors"),
        "{vmm}: no /dev/vda of 1 MiB; the log ends {tail:?}"
    );
    assert!(
        console.contains("EXITLESS-INITRAMFS-NET "),
        "{vmm}: no Ethernet interface; the log ends {tail:?}"
    );
    println!("{vmm}: the initramfs came up and saw /dev/vda and an Ethernet interface");
}

/// Boot `kernel` with `memory_mib` of RAM until its log has shown `expected`, in order.
fn boot(kernel: &Path, memory_mib: u64, expected: &[&str]) {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--kernel"])
        .arg(kernel)
        .args(["--cmdline", CMDLINE])
        .args(["--cpu", CPU])
        .args(["--memory", &memory_mib.to_string()])
        .args(["--cpus", &CPUS.to_string()])
        .args(["--timeout", &TIMEOUT_S.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("exitless runs");
    let stdout = child.stdout.take().expect("piped");
    let mut seen = 0;
    let mut last = String::new();
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        if line.contains(expected[seen]) {
            println!("{:>4} s  {line}", start.elapsed().as_secs());
            seen += 1;
        }
        last = line;
        if seen == expected.len() {
            break;
        }
    }
    let elapsed = start.elapsed().as_secs();
    if seen == expected.len() {
        child.kill().expect("the run is ours to stop");
        child.wait().expect("it ends");
    } else {
        let status = child.wait().expect("it ends");
        assert_eq!(status.code(), Some(TIMED_OUT), "{status}");
    }
    println!("{elapsed} s, last line: {last}");
    assert!(
        seen == expected.len(),
        "after {elapsed} s the log has no {:?}; its last line: {last}",
        expected[seen]
    );
}
