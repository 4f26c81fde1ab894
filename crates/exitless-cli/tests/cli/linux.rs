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

/// Run `cmd` in `dir`; why it failed, if it did.
fn sh(dir: &Path, cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{cmd} {args:?}: {}", stderr.trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The extracted vmlinuz, downloaded on first use into the target directory.
fn vmlinuz() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("linux-kernel");
    let boot = dir.join("root/boot");
    let find = || {
        std::fs::read_dir(&boot).ok().and_then(|entries| {
            entries.filter_map(Result::ok).map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
        })
    };
    if let Some(path) = find() {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // The metapackage depends on the versioned package that holds the kernel.
    let depends = sh(&dir, "apt-cache", &["depends", PACKAGE])?;
    let versioned = depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .ok_or(format!(
            "apt-cache depends {PACKAGE} names no linux-image package"
        ))?
        .to_owned();
    sh(&dir, "apt-get", &["download", &versioned])?;
    let deb = std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.to_string_lossy().contains(&versioned) && p.extension().is_some_and(|x| x == "deb")
        })
        .ok_or(format!("apt-get download {versioned} left no .deb"))?;
    sh(&dir, "dpkg-deb", &["-x", &deb.to_string_lossy(), "root"])?;
    find().ok_or(format!("{} holds no vmlinuz", deb.display()))
}

/// Whether this host's KVM runs guests on the CPU's virtualization extensions: `kvm_intel` or
/// `kvm_amd` loaded, and not the software `kvm_pvm` of docs/host-kvm.md.
fn hardware_kvm() -> bool {
    let loaded = |m: &str| Path::new("/sys/module").join(m).exists();
    (loaded("kvm_intel") || loaded("kvm_amd")) && !loaded("kvm_pvm")
}

/// Debian's statically linked busybox, downloaded on first use beside the kernel.
fn busybox() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("busybox");
    let binary = dir.join("root/bin/busybox");
    if binary.exists() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    sh(&dir, "apt-get", &["download", "busybox-static"])?;
    let deb = std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download busybox-static left no .deb")?;
    sh(&dir, "dpkg-deb", &["-x", &deb.to_string_lossy(), "root"])?;
    binary
        .exists()
        .then_some(binary)
        .ok_or("busybox-static holds no bin/busybox".into())
}

/// Modules the initramfs loads, in dependency order (the package has no modules.dep: depmod
/// writes it at install): the cloud kernel builds virtio as modules (CONFIG_VIRTIO_PCI=m,
/// CONFIG_VIRTIO_BLK=m, CONFIG_VIRTIO_NET=m).
const MODULES: [&str; 9] = [
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_pci_modern_dev.ko",
    "drivers/virtio/virtio_pci_legacy_dev.ko",
    "drivers/virtio/virtio_pci.ko",
    "drivers/block/virtio_blk.ko",
    "net/core/failover.ko",
    "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko",
];

/// What /init prints when it has come up; the test passes only on it.
const MARKER: &str = "EXITLESS-INITRAMFS-UP";

/// The initramfs's /init: load the virtio modules, report the disk and the interface, power
/// off (reboot(2) with RB_POWER_OFF: ACPI S5, which ends `exitless run` with status 0).
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in /modules/*.ko; do insmod "$m"; done
sleep 1
echo EXITLESS-INITRAMFS-UP
[ -b /dev/vda ] && echo "EXITLESS-INITRAMFS-DISK vda $(cat /sys/block/vda/size) sectors"
for n in /sys/class/net/*; do
  [ "$(cat "$n/type")" = 1 ] && echo "EXITLESS-INITRAMFS-NET ${n##*/} $(cat "$n/address")"
done
poweroff -f
"#;

/// One member of a "newc" cpio archive (the initramfs format, Documentation/driver-api/
/// early-userspace/buffer-format.rst): the header's 13 fields in hex, the name, the data, each
/// padded to 4 bytes. Written here because it is 20 lines and the format is fixed.
fn cpio_member(archive: &mut Vec<u8>, ino: u32, name: &str, mode: u32, data: &[u8]) {
    let size = u32::try_from(data.len()).expect("a small file");
    let name_size = u32::try_from(name.len() + 1).expect("a short name");
    let fields = [ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, name_size, 0];
    archive.extend_from_slice(b"070701");
    for f in fields {
        archive.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    archive.extend_from_slice(name.as_bytes());
    archive.push(0);
    archive.resize(archive.len().next_multiple_of(4), 0);
    archive.extend_from_slice(data);
    archive.resize(archive.len().next_multiple_of(4), 0);
}

/// The initramfs: busybox, /init, the mount points, and the virtio modules of the kernel
/// package `root` (its lib/modules/VERSION/kernel tree) under /modules, numbered in load order.
fn initramfs(root: &Path, busybox: &Path) -> Result<Vec<u8>, String> {
    const DIR: u32 = 0o040_755;
    const FILE: u32 = 0o100_755;
    let modules = std::fs::read_dir(root.join("lib/modules"))
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path().join("kernel"))
        .next()
        .ok_or("the kernel package has no lib/modules")?;
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut archive = Vec::new();
    let mut ino = 1..;
    for dir in ["bin", "dev", "proc", "sys", "modules"] {
        cpio_member(&mut archive, ino.next().unwrap(), dir, DIR, &[]);
    }
    cpio_member(
        &mut archive,
        ino.next().unwrap(),
        "bin/busybox",
        FILE,
        &read(busybox)?,
    );
    cpio_member(
        &mut archive,
        ino.next().unwrap(),
        "init",
        FILE,
        INIT.as_bytes(),
    );
    for (i, module) in MODULES.iter().enumerate() {
        let name = Path::new(module).file_name().unwrap().to_string_lossy();
        let data = read(&modules.join(module))?;
        cpio_member(
            &mut archive,
            ino.next().unwrap(),
            &format!("modules/{i}-{name}"),
            FILE,
            &data,
        );
    }
    cpio_member(&mut archive, 0, "TRAILER!!!", 0, &[]);
    Ok(archive)
}

/// The uncompressed ELF vmlinux inside `vmlinuz`, with its PVH note: Debian compresses it
/// with LZ4 (CONFIG_KERNEL_LZ4), whose legacy frame starts with the magic 0x184C2102.
fn vmlinux(vmlinuz: &Path) -> Result<PathBuf, String> {
    let out = vmlinuz.with_file_name("vmlinux");
    if out.exists() {
        return Ok(out);
    }
    let image = std::fs::read(vmlinuz).map_err(|e| e.to_string())?;
    let magic = 0x184c_2102u32.to_le_bytes();
    let at = image
        .windows(4)
        .position(|w| w == magic)
        .ok_or("no LZ4 payload in the bzImage")?;
    let payload = vmlinuz.with_file_name("payload.lz4");
    std::fs::write(&payload, &image[at..]).map_err(|e| e.to_string())?;
    // lz4 complains of the bytes after the frame (the bzImage's tail) once it has written it.
    let _ = sh(
        vmlinuz.parent().expect("a directory"),
        "sh",
        &["-c", "lz4 -dc payload.lz4 > vmlinux.part"],
    );
    let _ = std::fs::remove_file(&payload);
    let part = vmlinuz.with_file_name("vmlinux.part");
    let elf = std::fs::read(&part).map_err(|e| format!("lz4 -dc: {e}"))?;
    if !elf.starts_with(b"\x7fELF") {
        return Err("lz4 -dc gave no ELF file (is lz4 installed?)".into());
    }
    std::fs::rename(&part, &out).map_err(|e| e.to_string())?;
    Ok(out)
}

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
    match vmlinuz().and_then(|vmlinuz| vmlinux(&vmlinuz)) {
        Ok(kernel) => boot(&kernel, MEMORY_MIB, &EXPECTED),
        Err(why) => println!("skipped: cannot get Debian's vmlinux: {why}"),
    }
}

#[test]
#[ignore = "boots Linux for about 30 s; run the ignored linux:: tests of exitless-cli's cli"]
fn with_4608_mib_linux_lists_usable_ram_from_4_gib() {
    match vmlinuz().and_then(|vmlinuz| vmlinux(&vmlinuz)) {
        Ok(kernel) => boot(&kernel, HIGH_MEMORY_MIB, &EXPECTED_HIGH),
        Err(why) => println!("skipped: cannot get Debian's vmlinux: {why}"),
    }
}

#[test]
#[ignore = "downloads busybox-static and, with hardware KVM, boots Linux to userspace"]
fn with_hardware_kvm_linux_reaches_an_initramfs_that_sees_its_disk_and_network() {
    let parts = vmlinuz().and_then(|kernel| Ok((kernel, busybox()?)));
    let (kernel, busybox) = match parts {
        Ok(parts) => parts,
        Err(why) => return println!("skipped: cannot get the kernel or busybox: {why}"),
    };
    let root = kernel.ancestors().nth(2).expect("root/boot/vmlinuz-*");
    let archive = initramfs(root, &busybox).expect("the initramfs builds");
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
