//! `exitless run` as a user runs it (the binary, seccomp on): the multiboot test kernel
//! (guest/testkernel, put beside the binary by build.rs) boots, checks the platform it finds
//! and ends the run the way its command line says; every bad input gets one line on stderr and
//! status 2; and, where QEMU is installed, the same kernel passes the same checks under
//! `qemu-system-x86_64 -machine q35`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The test kernel's `exit=debug` status when every check passed: (0x10 << 1) | 1.
const PASSED: i32 = 0x21;
/// `exitless run`'s status for its own errors.
const ERROR: i32 = 2;
/// Longest a run of the test kernel may take here (it takes well under a second).
const LIMIT: Duration = Duration::from_secs(60);

/// A test kernel image, beside the binary.
fn kernel(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name(name)
}

/// What a run printed and how it ended.
struct Ran {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Drain a pipe on a thread, so a child never blocks on a full one.
fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Run `cmd` with `input` on stdin; kill it and fail if it takes longer than `limit`.
fn run_command(mut cmd: Command, input: &[u8], limit: Duration) -> Ran {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the program starts");
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    // A guest that never reads its console leaves the input unread: that is fine.
    let _ = stdin.write_all(input);
    drop(stdin);
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} still ran after {limit:?}; it printed:\n{}{}",
                stdout.join().unwrap(),
                stderr.join().unwrap()
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ran {
        status: child.wait().unwrap(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// `exitless run ARGS` with `input` on stdin.
fn exitless_run(args: &[&str], input: &[u8]) -> Ran {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_exitless"));
    cmd.arg("run").args(args);
    run_command(cmd, input, LIMIT)
}

/// The test kernel's own check lines ("PASS …" / "FAIL …").
fn results(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("PASS ") || l.starts_with("FAIL "))
        .collect()
}

/// The run ended through isa-debug-exit with every check passed, silently on stderr.
fn assert_passed(ran: &Ran) {
    assert_passed_saying(ran, "");
}

/// The same, with `stderr` on stderr.
fn assert_passed_saying(ran: &Ran, stderr: &str) {
    let results = results(&ran.stdout);
    assert!(
        ran.status.code() == Some(PASSED)
            && !results.is_empty()
            && results.iter().all(|l| l.starts_with("PASS ")),
        "status {:?}, console:\n{}\nstderr:\n{}",
        ran.status,
        ran.stdout,
        ran.stderr
    );
    assert_eq!(ran.stderr, stderr, "stderr");
}

/// The test kernel with `args` and `cmdline`, which must pass.
fn passes(args: &[&str], cmdline: &str) -> Ran {
    let elf = kernel("testkernel.elf");
    let mut all = vec!["--kernel", elf.to_str().unwrap(), "--cmdline", cmdline];
    all.extend_from_slice(args);
    let ran = exitless_run(&all, b"");
    assert_passed(&ran);
    ran
}

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

/// Disks on both transports join the machine without disturbing the kernel's checks.
#[test]
fn disks_on_both_transports_join_the_machine() {
    // Two images: one image is never two disks.
    let disks = ["a", "b"].map(|n| {
        let name = format!("exitless-run-disk-{n}-{}", std::process::id());
        let disk = std::env::temp_dir().join(name);
        std::fs::write(&disk, vec![0u8; 64 << 10]).unwrap();
        disk
    });
    let ro = format!("{},ro,transport=mmio", disks[1].display());
    passes(&["--disk", disks[0].to_str().unwrap(), "--disk", &ro], "");
    for disk in disks {
        std::fs::remove_file(disk).unwrap();
    }
}

/// A tap another process holds is busy: one line that says so, status 2, no guest run. The
/// test holds a tap of its own (the kernel makes it, and removes it when the test lets go).
#[test]
fn a_tap_another_process_holds_is_refused_in_one_line() {
    let name = format!("xlbusy{}", std::process::id() % 100_000);
    let _held = match exitless::virtio::net::tap::Tap::open(&name, false) {
        Ok(tap) => tap,
        Err(why) => {
            println!("skipped: cannot make a tap here: {why}");
            return;
        }
    };
    let elf = kernel("testkernel.elf");
    let ran = exitless_run(
        &[
            "--kernel",
            elf.to_str().unwrap(),
            "--net",
            &format!("tap={name}"),
        ],
        b"",
    );
    assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
    assert_eq!(
        ran.stderr,
        format!(
            "exitless: error: cannot open tap {name} (TUNSETIFF): Device or resource busy \
             (os error 16) (busy: another process has it open)\n"
        )
    );
    assert_eq!(ran.stdout, "", "no guest ran");
}

/// Network devices without a link (`--net none`) on both transports join the machine.
#[test]
fn network_devices_without_a_link_join_the_machine() {
    passes(
        &["--net", "none", "--net", "none,transport=mmio,queues=2"],
        "",
    );
}

/// The first virtio-mmio window `exitless run` gives out (src/machine/layout.rs), which the test
/// kernel is told of on its command line as Linux is (`virtio_mmio.device=`).
const FIRST_MMIO_WINDOW: &str = "virtio_mmio=0xe0100000";

/// The test kernel drives a virtio-blk disk as a driver does: a write, a flush, a read back,
/// the ID and a read past the end; the file holds the written sector afterwards.
#[test]
fn the_test_kernel_writes_flushes_and_reads_its_disk() {
    drives_its_disk(
        "",
        "",
        "PASS disk: a virtio-blk function on bus 0 (00:03.0)",
        "virtio-pci.00:03.0",
    );
}

/// The same driver on virtio-mmio (virtio 1.2 §4.2, version 2): the disk is found in the
/// window the command line names.
#[test]
fn the_test_kernel_drives_its_disk_on_virtio_mmio() {
    drives_its_disk(
        ",transport=mmio",
        FIRST_MMIO_WINDOW,
        "PASS disk: a virtio-blk device at virtio-mmio e0100000",
        "virtio-mmio.0",
    );
}

/// `disk=1` (and `more` on the command line) on a disk with `options`, found as `found` says,
/// named `device` in the log.
fn drives_its_disk(options: &str, more: &str, found: &str, device: &str) {
    // One file per test (they run at once); the ID is the name's first 20 bytes, the same.
    let name = format!("exitless-guest-disk-{}-{device}", std::process::id());
    let disk = std::env::temp_dir().join(name);
    std::fs::write(&disk, vec![0u8; 16 << 10]).unwrap();
    let elf = kernel("testkernel.elf");
    let cmdline = format!("disk=1 {more}");
    let disk_arg = format!("{}{options}", disk.display());
    let args = ["--kernel", elf.to_str().unwrap(), "--cmdline", &cmdline];
    let ran = exitless_run(&[&args[..], &["--disk", &disk_arg]].concat(), b"");
    // The read past the end is the guest's error, counted and logged.
    assert_passed_saying(
        &ran,
        &format!(
            "exitless: warn: {device}: virtio-blk: 512 bytes at sector 32 are past the disk's \
             32 sectors\n"
        ),
    );
    for line in [
        found,
        "PASS disk: FEATURES_OK, 32 sectors",
        "PASS disk: sector 1 written, status 0",
        "PASS disk: flushed, status 0",
        "PASS disk: sector 1 read back, status 0",
        "PASS disk: ID 'exitless-guest-disk-', status 0", // the file's name, 20 bytes of it
        "PASS disk: a read past the end answered IOERR (status 1)",
    ] {
        assert!(ran.stdout.contains(line), "{line:?} in:\n{}", ran.stdout);
    }
    let file = std::fs::read(&disk).unwrap();
    std::fs::remove_file(&disk).unwrap();
    let expected: Vec<u8> = (0..512u32).map(|i| (i * 7 + 1).to_le_bytes()[0]).collect();
    assert_eq!(
        file[512..1024],
        expected[..],
        "the guest's sector reached the file"
    );
    assert_eq!(file.len(), 16 << 10, "the file keeps its size");
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
fn a_run_past_its_timeout_ends_with_status_124_and_one_line() {
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
    assert_eq!(
        ran.stderr.trim_end(),
        "exitless: the guest did not end within --timeout 1 seconds"
    );
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
    let cases: [(&[&str], &str); 21] = [
        (
            &[],
            "the following required arguments were not provided: --kernel <FILE>",
        ),
        (
            &["--kernel", good, "--disk", "disk.img,bogus"],
            "unknown option `bogus` (ro, locking=on|off, transport=pci|mmio;",
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
            "unknown option `speed=10` (mac=MAC, queues=N, transport=pci|mmio)",
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

/// A network namespace of this test run, deleted on drop (its taps with it), however the test
/// ends.
struct NetNamespace {
    name: String,
}

const GUEST_IP: &str = "10.0.2.15";
const PEER_IP: &str = "10.0.2.2";
const PEER_MAC: &str = "02:00:00:00:00:02";

impl NetNamespace {
    /// An empty namespace named after this test process and `tag`, or why it cannot be made
    /// here (no iproute2, not root).
    fn empty(tag: &str) -> Result<Self, String> {
        let name = format!("exitless-{tag}-{}", std::process::id());
        ip(&["netns", "add", &name])?;
        Ok(NetNamespace { name })
    }

    /// `ip -n NS ARGS` for each step, in order.
    fn ip(&self, steps: &[&[&str]]) -> Result<(), String> {
        for step in steps {
            ip(&[&["-n", &self.name][..], step].concat())?;
        }
        Ok(())
    }

    /// A namespace with the tap `tap` in it whose host side has `PEER_IP` and `PEER_MAC`, up.
    fn with_tap(tap: &str) -> Result<Self, String> {
        let ns = NetNamespace::empty("net")?;
        // From here on the namespace exists, and `ns` deletes it if a step fails.
        ns.ip(&[
            &["tuntap", "add", "dev", tap, "mode", "tap"],
            &["addr", "add", &format!("{PEER_IP}/24"), "dev", tap],
            &["link", "set", tap, "address", PEER_MAC],
            &["link", "set", tap, "up"],
        ])?;
        Ok(ns)
    }

    /// A namespace with no tap, `PEER_IP` on its loopback interface: the host's kernel
    /// answers ARP requests for any of its addresses on any interface (arp_ignore 0, Linux
    /// `Documentation/networking/ip-sysctl.rst`), so on a tap the run creates as soon as that
    /// tap is up.
    fn with_peer_on_lo(tag: &str) -> Result<Self, String> {
        let ns = NetNamespace::empty(tag)?;
        ns.ip(&[
            &["addr", "add", &format!("{PEER_IP}/32"), "dev", "lo"],
            &["link", "set", "lo", "up"],
        ])?;
        Ok(ns)
    }

    /// The test kernel in the namespace, sending its ARP request for `PEER_IP` from the
    /// virtio-net device `--net NET`.
    fn run_arp(&self, net: &str) -> Ran {
        self.run_arp_saying(net, "")
    }

    /// The same, with `more` on the test kernel's command line.
    fn run_arp_saying(&self, net: &str, more: &str) -> Ran {
        let elf = kernel("testkernel.elf");
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.name,
            env!("CARGO_BIN_EXE_exitless"),
            "run",
        ])
        .arg("--kernel")
        .arg(&elf)
        .args([
            "--cmdline",
            &format!("net=1 ip={GUEST_IP} peer={PEER_IP} {more}"),
        ])
        .args(["--net", net]);
        run_command(cmd, b"", LIMIT)
    }
}

impl Drop for NetNamespace {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

/// `ip ARGS`: its output, or its error.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Frames really reach the host's network stack: in a network namespace of its own, the test
/// kernel sends an ARP request for the tap's host-side address from its virtio-net device,
/// the host's kernel answers it, and the guest checks the answer: from the peer's address, to
/// its own MAC and address, and carrying the MAC the test gave the tap, which only the host's
/// kernel knew.
#[test]
fn a_frame_the_guest_sends_on_a_tap_is_answered_by_the_host_kernel() {
    let tap = "xltap0";
    let ns = match NetNamespace::with_tap(tap) {
        Ok(ns) => ns,
        Err(why) => {
            println!("skipped: cannot make a network namespace with a tap here: {why}");
            return;
        }
    };
    let guest_mac = "52:54:00:12:34:56";
    let ran = ns.run_arp(&format!("tap={tap},mac={guest_mac}"));
    assert_passed(&ran);
    for line in [
        "PASS net: a virtio-net function on bus 0 (00:03.0)",
        &format!("PASS net: FEATURES_OK, MAC {guest_mac}"),
        &format!("PASS net: ARP request for {PEER_IP} sent from {GUEST_IP}"),
        &format!("PASS net: ARP reply: {PEER_IP} is at {PEER_MAC}"),
    ] {
        assert!(
            results(&ran.stdout).contains(&line),
            "{line}:\n{}",
            ran.stdout
        );
    }
}

/// The same exchange through a virtio-net card on virtio-mmio.
#[test]
fn a_frame_the_guest_sends_from_a_virtio_mmio_card_is_answered_by_the_host_kernel() {
    let tap = "xltapm0";
    let ns = match NetNamespace::with_tap(tap) {
        Ok(ns) => ns,
        Err(why) => {
            println!("skipped: cannot make a network namespace with a tap here: {why}");
            return;
        }
    };
    let ran = ns.run_arp_saying(
        &format!("tap={tap},mac=52:54:00:12:34:57,transport=mmio"),
        FIRST_MMIO_WINDOW,
    );
    assert_passed(&ran);
    for line in [
        "PASS net: a virtio-net device at virtio-mmio e0100000",
        &format!("PASS net: ARP reply: {PEER_IP} is at {PEER_MAC}"),
    ] {
        assert!(
            results(&ran.stdout).contains(&line),
            "{line}:\n{}",
            ran.stdout
        );
    }
}

/// A namespace for taps the run creates (`tag` tells the tests' apart), or `None` after saying
/// why there is none here.
fn namespace_for_new_taps(tag: &str) -> Option<NetNamespace> {
    NetNamespace::with_peer_on_lo(tag)
        .map_err(|why| println!("skipped: cannot make a network namespace here: {why}"))
        .ok()
}

/// The MAC the test kernel found in its virtio-net device's configuration space.
fn guest_mac(ran: &Ran) -> &str {
    let prefix = "PASS net: FEATURES_OK, MAC ";
    let line = results(&ran.stdout)
        .into_iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no MAC in:\n{}\n{}", ran.stdout, ran.stderr));
    &line[prefix.len()..]
}

/// A tap the run creates is brought up (its addresses stay the user's business): the guest's
/// ARP request reaches the host's kernel and its answer comes back. The one line on stderr
/// is the MAC exitless chose.
#[test]
fn a_tap_the_run_creates_is_up_and_the_host_kernel_answers_on_it() {
    let Some(ns) = namespace_for_new_taps("up") else {
        return;
    };
    let ran = ns.run_arp("tap=xlnew0");
    let mac = guest_mac(&ran);
    assert_passed_saying(
        &ran,
        &format!("exitless: tap xlnew0: the guest's MAC is {mac} (mac= sets another)\n"),
    );
}

/// Each tap gives its device a MAC of its own, so VMs on one bridge do not collide, and the
/// same one on every run, so the guest's leases and neighbour entries stay valid: locally
/// administered and unicast (IEEE 802-2014 §8.2: bit 1 of the first byte set, bit 0 clear).
#[test]
fn each_tap_gives_the_guest_a_mac_of_its_own_the_same_on_every_run() {
    let Some(ns) = namespace_for_new_taps("mac") else {
        return;
    };
    let mac_on = |tap: &str| guest_mac(&ns.run_arp(&format!("tap={tap}"))).to_owned();
    let first = mac_on("xlmac0");
    assert_eq!(first, mac_on("xlmac0"), "the same tap, the same MAC");
    assert_ne!(first, mac_on("xlmac1"), "another tap, another MAC");
    let byte0 = u8::from_str_radix(&first[..2], 16).unwrap();
    assert_eq!(byte0 & 0b11, 0b10, "{first}: locally administered, unicast");
}

/// Names that are no tap get the kernel's reason: `all` and `default` are reserved (they name
/// /proc/sys/net/ipv4/conf's settings for every interface and for new ones), `lo` exists and
/// is not a tap. Without /dev/net/tun or CAP_NET_ADMIN the test says so and checks nothing.
#[test]
fn names_that_are_no_tap_are_refused_with_the_kernels_reason() {
    let elf = kernel("testkernel.elf");
    for (name, says) in [
        ("all", "the kernel reserves the name"),
        ("default", "the kernel reserves the name"),
        ("lo", "a device of that name exists and is not a tap"),
    ] {
        let net = format!("tap={name}");
        let ran = exitless_run(&["--kernel", elf.to_str().unwrap(), "--net", &net], b"");
        assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
        if ran.stderr.contains("CAP_NET_ADMIN") || ran.stderr.contains("no TUN/TAP driver") {
            println!("skipped: cannot make a tap here: {}", ran.stderr);
            return;
        }
        assert!(
            ran.stderr.starts_with(&format!(
                "exitless: error: cannot open tap {name} (TUNSETIFF): "
            )) && ran.stderr.contains(says)
                && ran.stderr.lines().count() == 1,
            "{name}: {}",
            ran.stderr
        );
    }
}
