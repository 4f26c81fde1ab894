//! `exitless run` as a user runs it (the binary, seccomp on): the multiboot test kernel
//! (crates/exitless-guest/testkernel, put beside the binary by build.rs) boots, checks the platform it finds
//! and ends the run the way its command line says; every bad input gets one line on stderr and
//! status 2; and, where QEMU is installed, the same kernel passes the same checks under
//! `qemu-system-x86_64 -machine q35`. Its devices are crates/exitless-cli/tests/cli/run_devices.rs's.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use crate::common::testkernel::*;

#[test]
fn the_test_kernel_passes_every_check_on_one_vcpu() {
    let ran = passes(&["--memory", "64"], "cpus=1 mem=64");
    for line in [
        "PASS multiboot: mem_upper matches mem=64",
        "PASS fw_cfg: RAM 64 MiB, mem=64",
        "PASS fw_cfg: opt/exitless/cmdline is 'cpus=1 mem=64'",
        "PASS fadt: PM timer at 608, PM1a control at 604",
        "PASS madt: local APICs at fee00000, 1 enabled, cpus=1",
        "PASS madt: IOAPIC at fec00000, IRQ 0 on GSI 2",
        "testkernel: booted by exitless",
    ] {
        assert!(ran.stdout.contains(line), "{line:?} in:\n{}", ran.stdout);
    }
    assert!(
        ran.stdout.contains("XSDT lists 3 tables"),
        "FADT, MADT, MCFG:\n{}",
        ran.stdout
    );
}

#[test]
fn other_vcpus_answer_init_sipi_and_trapped_ecam_reads_like_port_io() {
    let ran = passes(&["--cpus", "4", "--ecam", "trap"], "cpus=4");
    for line in [
        "PASS smp: 3 of 3 application processors started by INIT/SIPI",
        "PASS madt: local APICs at fee00000, 4 enabled, cpus=4",
        "PASS fw_cfg: 4 CPUs, cpus=4",
    ] {
        assert!(ran.stdout.contains(line), "{line:?} in:\n{}", ran.stdout);
    }
}
#[test]
fn without_ecam_there_is_no_mcfg() {
    let ran = passes(&["--ecam", "none"], "ecam=0");
    assert!(ran.stdout.contains("PASS mcfg: absent, as ecam=0 says"));
}

#[test]
fn an_iommu_is_described_by_a_dmar_whose_unit_answers() {
    let ran = passes(&["--iommu"], "iommu=1");
    let line = "PASS dmar: host address width";
    assert!(ran.stdout.contains(line), "{line:?} in:\n{}", ran.stdout);
    assert!(
        ran.stdout
            .contains("a DRHD for every PCI device at fed90000, VER 10")
    );
    let ran = passes(&[], "");
    assert!(ran.stdout.contains("PASS dmar: absent, as iommu=0 says"));
}

#[test]
fn the_flat_image_loads_by_its_header_address_fields() {
    let bin = kernel("testkernel.bin");
    let ran = exitless_run(&["--kernel", bin.to_str().unwrap()], b"");
    assert_passed(&ran);
    // QEMU's convention: the kernel's own path comes first on its command line.
    let first = format!("testkernel: command line '{} '", bin.display());
    assert!(ran.stdout.contains(&first), "{}", ran.stdout);
}

#[test]
fn power_off_and_both_resets_end_the_run_with_status_0() {
    let elf = kernel("testkernel.elf");
    for how in ["poweroff", "reset", "kbd"] {
        let cmdline = format!("exit={how}");
        let ran = exitless_run(
            &["--kernel", elf.to_str().unwrap(), "--cmdline", &cmdline],
            b"",
        );
        assert_eq!(ran.status.code(), Some(0), "{how}:\n{}", ran.stdout);
        assert!(ran.stdout.contains(" 0 failed"), "{how}:\n{}", ran.stdout);
        assert!(!ran.stdout.contains("still running"), "{how}");
    }
}

#[test]
fn a_panic_on_the_pvpanic_port_ends_the_run_with_status_4_and_one_line() {
    let elf = kernel("testkernel.elf");
    let ran = exitless_run(
        &["--kernel", elf.to_str().unwrap(), "--cmdline", "exit=panic"],
        b"",
    );
    assert_eq!(ran.status.code(), Some(4), "{}{}", ran.stdout, ran.stderr);
    // It takes PANICKED and CRASH_LOADED (QEMU's pvpanic spec).
    assert!(ran.stdout.contains("pvpanic events 3"), "{}", ran.stdout);
    assert!(!ran.stdout.contains("still running"), "{}", ran.stdout);
    assert!(
        ran.stderr.contains("the guest's kernel panicked"),
        "{}",
        ran.stderr
    );
}

#[test]
fn console_input_reaches_the_guest() {
    let elf = kernel("testkernel.elf");
    let ran = exitless_run(
        &["--kernel", elf.to_str().unwrap(), "--cmdline", "echo=1"],
        b"hello from stdin\n",
    );
    assert_passed(&ran);
    assert!(
        ran.stdout
            .contains("PASS echo: read 'hello from stdin' from the console"),
        "{}",
        ran.stdout
    );
}

#[test]
fn a_run_past_its_timeout_ends_with_status_124_where_its_vcpu_was_and_one_error_line() {
    // With no input the kernel waits 10 s for a console line: longer than the timeout.
    let elf = kernel("testkernel.elf");
    let ran = exitless_run(
        &[
            "--kernel",
            elf.to_str().unwrap(),
            "--cmdline",
            "echo=1",
            "--timeout",
            "1",
        ],
        b"",
    );
    assert_eq!(ran.status.code(), Some(124), "{}", ran.stderr);
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(
        lines.last().copied(),
        Some("exitless: the guest did not end within --timeout 1 seconds"),
        "{}",
        ran.stderr
    );
    // Where the one vCPU was: parked by a kick, so its state could be read.
    let report = lines
        .iter()
        .find(|l| l.starts_with("exitless: warn: at the timeout vCPU 0 was "))
        .unwrap_or_else(|| panic!("no report of vCPU 0: {}", ran.stderr));
    assert!(report.contains(" at RIP 0x"), "{report}");
    assert_eq!(lines.len(), 2, "{}", ran.stderr);
}

#[test]
fn the_console_can_go_to_a_file() {
    let dir = std::env::temp_dir().join(format!("exitless-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("console.txt");
    let elf = kernel("testkernel.elf");
    let ran = exitless_run(
        &[
            "--kernel",
            elf.to_str().unwrap(),
            "--console",
            file.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(ran.status.code(), Some(PASSED), "{}", ran.stderr);
    assert_eq!(ran.stdout, "", "the console went to the file");
    let console = std::fs::read_to_string(&file).unwrap();
    assert!(
        console.contains("PASS fw_cfg: signature 'QEMU'"),
        "{console}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_bad_input_gets_one_line_and_status_2() {
    let dir = std::env::temp_dir().join(format!("exitless-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("not-a-kernel.txt");
    std::fs::write(&text, "hello, I am not a kernel\n").unwrap();
    // The ELF cut short: its multiboot header is there, its code is not.
    let cut = dir.join("cut.elf");
    let elf = std::fs::read(kernel("testkernel.elf")).unwrap();
    std::fs::write(&cut, &elf[..0x1100]).unwrap();
    let good = kernel("testkernel.elf");
    let good = good.to_str().unwrap();
    let cases: [(&[&str], &str); 22] = [
        (
            &[],
            "the following required arguments were not provided: --kernel <FILE>",
        ),
        (
            &["--kernel", good, "--disk", "disk.img,bogus"],
            "unknown option `bogus` (ro, locking=on|off, queues=N, aio=io_uring|sync, transport=pci|mmio;",
        ),
        (
            &["--kernel", good, "--memory", "lots"],
            "invalid value 'lots' for '--memory <MIB>'",
        ),
        (
            &["--kernel", "/nonexistent/kernel"],
            "cannot read the kernel /nonexistent/kernel: No such file or directory",
        ),
        (
            &["--kernel", text.to_str().unwrap()],
            "not a kernel exitless boots: neither a multiboot v1 kernel",
        ),
        (
            &["--kernel", cut.to_str().unwrap()],
            "ELF segment 0: file bytes",
        ),
        (
            &["--kernel", good, "--memory", "0"],
            "--memory 0: a machine needs at least 2 MiB",
        ),
        (
            &["--kernel", good, "--memory", "1000000"],
            "--memory 1000000: at most 505856 MiB",
        ),
        (&["--kernel", good, "--cpus", "0"], "--cpus 0: 1 to 64"),
        (&["--kernel", good, "--cpus", "65"], "--cpus 65: 1 to 64"),
        (
            &["--kernel", good, "--console", "/nonexistent/dir/console"],
            "cannot open the console file /nonexistent/dir/console",
        ),
        (
            &["--kernel", good, "--cmdline", &"x".repeat(30_000)],
            "bytes; at most 28671 fit",
        ),
        (
            &["--kernel", good, "--disk", "/nonexistent/disk.img,ro"],
            "cannot open the disk /nonexistent/disk.img: No such file or directory",
        ),
        (
            &["--kernel", good, "--disk", ",ro"],
            "invalid value ',ro' for '--disk",
        ),
        (
            &["--kernel", good, "--net", "tap="],
            "`tap=`: tap=NAME or none first",
        ),
        (
            &["--kernel", good, "--net", "none,speed=10"],
            "unknown option `speed=10` (mac=MAC, queues=N, vectors=N, transport=pci|mmio, vhost=on|off)",
        ),
        (
            &["--kernel", good, "--net", "tap=t0,mac=01:00:5e:00:00:01"],
            "mac=01:00:5e:00:00:01: six hexadecimal bytes, xx:xx:xx:xx:xx:xx, unicast",
        ),
        (
            &["--kernel", good, "--net", "tap=an-interface-name"],
            "tap name `an-interface-name`: an interface name is 1 to 15 bytes",
        ),
        (
            &["--kernel", good, "--net", "tap=t0", "--net", "tap=t0"],
            "--net tap=t0 given twice",
        ),
        (&["--kernel", good, "--net", "tap=t%d"], "tap name `t%d`"),
        (
            &["--kernel", good, "--net", "none,vhost=on"],
            "vhost=on is for tap=NAME",
        ),
        // An interface that is not a tap (or, without /dev/net/tun, no TUN/TAP driver).
        (&["--kernel", good, "--net", "tap=lo"], "cannot open"),
    ];
    for (args, says) in cases {
        let ran = exitless_run(args, b"");
        let lines: Vec<&str> = ran.stderr.lines().collect();
        assert!(
            ran.status.code() == Some(ERROR)
                && lines.len() == 1
                && lines[0].starts_with("exitless: error: ")
                && lines[0].contains(says),
            "{args:?}: status {:?}, stderr {:?}",
            ran.status,
            ran.stderr
        );
        assert_eq!(ran.stdout, "", "{args:?}: no guest ran");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The check names of the kernel's result lines ("PASS fw_cfg", "PASS acpi", …), counted.
fn check_names(stdout: &str) -> BTreeMap<String, usize> {
    let mut names = BTreeMap::new();
    for line in results(stdout) {
        let name = line.split(':').next().unwrap().to_owned();
        *names.entry(name).or_insert(0) += 1;
    }
    names
}

/// QEMU's conventions, proven: the same kernel and command line under QEMU's q35 machine
/// (with isa-debug-exit and the command line as a fw_cfg file, as exitless gives it) pass the
/// same checks and exit with the same status.
#[test]
fn the_same_kernel_passes_the_same_checks_under_qemu() {
    let qemu = "qemu-system-x86_64";
    if Command::new(qemu).arg("--version").output().is_err() {
        println!("skipped: {qemu} is not installed (Debian: apt-get install qemu-system-x86)");
        return;
    }
    let cmdline = "cpus=2 mem=64";
    let elf = kernel("testkernel.elf");
    let mut cmd = Command::new(qemu);
    cmd.args(["-machine", "q35,accel=kvm", "-m", "64", "-smp", "2"])
        .args(["-nographic", "-no-reboot", "-monitor", "none"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(&elf)
        .args(["-append", cmdline])
        .arg("-fw_cfg")
        .arg(format!("name=opt/exitless/cmdline,string={cmdline}"));
    let under_qemu = run_command(cmd, b"", Duration::from_secs(300));
    let under_exitless = passes(&["--memory", "64", "--cpus", "2"], cmdline);
    assert_eq!(
        under_qemu.status.code(),
        Some(PASSED),
        "under QEMU:\n{}\n{}",
        under_qemu.stdout,
        under_qemu.stderr
    );
    assert_eq!(
        check_names(&under_qemu.stdout),
        check_names(&under_exitless.stdout),
        "QEMU:\n{}\nexitless:\n{}",
        under_qemu.stdout,
        under_exitless.stdout
    );
}
