//! `exitless run` boots Debian's cloud kernel, as a bzImage and through its PVH entry (the
//! uncompressed vmlinux taken out of the bzImage: Debian ships none), and the kernel log shows
//! what it found: the banner, the e820 map exitless gave it, the ACPI tables it parsed, the CPU
//! count.
//!
//! On this project's hosts KVM emulates ring 0 instruction by instruction (PLATFORM.md), so
//! the bzImage spends about 2.5 minutes decompressing itself, and Linux stops, in every VMM, at
//! its int3 self-test; the tests check what is reachable before that and stop the guest as soon
//! as they have seen it. They are ignored by default (about 165 s and 30 s here); run them with
//! `cargo test --test linux -- --ignored --nocapture --test-threads 1`. The kernel package is
//! downloaded once into the target directory (apt-get download, dpkg-deb -x: nothing is
//! installed); without network, or lz4 for the vmlinux, a test says so and passes.

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
/// log is the same from run to run; no xsave and cx16, which this host's emulator lacks
/// (PLATFORM.md).
const CMDLINE: &str =
    "console=ttyS0 earlyprintk=serial,ttyS0,115200 nokaslr noxsave clearcpuid=cx16";

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
#[ignore = "boots Linux for about 165 s; cargo test --test linux -- --ignored"]
fn a_debian_bzimage_reports_the_e820_map_acpi_tables_and_cpus() {
    match vmlinuz() {
        Ok(kernel) => boot(&kernel),
        Err(why) => println!("skipped: cannot get Debian's {PACKAGE}: {why}"),
    }
}

#[test]
#[ignore = "boots Linux for about 30 s; cargo test --test linux -- --ignored"]
fn a_debian_vmlinux_through_its_pvh_note_reports_the_same() {
    match vmlinuz().and_then(|vmlinuz| vmlinux(&vmlinuz)) {
        Ok(kernel) => boot(&kernel),
        Err(why) => println!("skipped: cannot get Debian's vmlinux: {why}"),
    }
}

/// Boot `kernel` until the log has shown every [`EXPECTED`] line, or the run ends.
fn boot(kernel: &Path) {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["run", "--kernel"])
        .arg(kernel)
        .args(["--cmdline", CMDLINE])
        .args(["--memory", &MEMORY_MIB.to_string()])
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
        if line.contains(EXPECTED[seen]) {
            println!("{:>4} s  {line}", start.elapsed().as_secs());
            seen += 1;
        }
        last = line;
        if seen == EXPECTED.len() {
            break;
        }
    }
    let elapsed = start.elapsed().as_secs();
    if seen == EXPECTED.len() {
        child.kill().expect("the run is ours to stop");
        child.wait().expect("it ends");
    } else {
        let status = child.wait().expect("it ends");
        assert_eq!(status.code(), Some(TIMED_OUT), "{status}");
    }
    println!("{elapsed} s, last line: {last}");
    assert!(
        seen == EXPECTED.len(),
        "after {elapsed} s the log has no {:?}; its last line: {last}",
        EXPECTED[seen]
    );
}
