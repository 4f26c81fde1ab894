//! Snapshot and restore as a user drives them: `exitless ctl ... snapshot DIR` on a running
//! `exitless run --api-socket`, `exitless run --restore DIR` in a new process; and snapshots
//! that must be refused (another version, corrupt, memory cut short, a disk gone) with one
//! line and status 2, nothing started.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::testkernel::*;
use exitless::machine::snapshot::{Description, MEMORY_FILE, MemoryFile};
use exitless::machine::{DiskConfig, MachineConfig};
use exitless::peer::PeerError;
use exitless::peer::backends::{Backend, BackendError};

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("exitless-snap-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A snapshot as exitless writes one, in `dir`, of a 16 MiB machine with `disks`: its
/// description and a memory file of the RAM's length, all zero (sparse).
fn written(dir: &Path, disks: Vec<DiskConfig>) {
    let config = MachineConfig {
        ram_size: 16 << 20,
        disks,
        ..MachineConfig::default()
    };
    let memory = std::fs::File::create(dir.join(MEMORY_FILE)).unwrap();
    memory.set_len(16 << 20).unwrap();
    Description {
        exitless_version: env!("CARGO_PKG_VERSION").into(),
        config,
        vcpus: vec![serde_json::json!({})],
        vm: serde_json::json!({}),
        devices: Default::default(),
        memory: MemoryFile {
            file: MEMORY_FILE.into(),
            length: 16 << 20,
        },
    }
    .write(dir)
    .unwrap();
}

/// `exitless run --restore dir` with its console to a file: its one line of error, which
/// must say `says`, status 2, and no console file made (nothing started).
fn refused(dir: &Path, says: &str) {
    let console = dir.join("console");
    let ran = exitless_run(
        &[
            "--restore",
            dir.to_str().unwrap(),
            "--console",
            console.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
    assert_eq!(ran.stderr.lines().count(), 1, "one line: {}", ran.stderr);
    assert!(ran.stderr.contains(says), "{says:?} in {}", ran.stderr);
    assert!(!console.exists(), "nothing started");
}

#[test]
fn a_snapshot_of_another_format_version_is_refused() {
    let dir = scratch("version");
    written(&dir, Vec::new());
    let path = dir.join("snapshot.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replacen("\"format_version\":1", "\"format_version\":7", 1),
    )
    .unwrap();
    refused(
        &dir,
        "the snapshot's format is version 7; this exitless reads version 1",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_corrupt_description_is_refused() {
    let dir = scratch("checksum");
    written(&dir, Vec::new());
    let path = dir.join("snapshot.json");
    let text = std::fs::read_to_string(&path).unwrap();
    // 16 MiB becomes 17 MiB, the checksum left as it was.
    let edited = text.replacen("16777216", "17825792", 1);
    assert_ne!(edited, text);
    std::fs::write(&path, edited).unwrap();
    refused(&dir, "is corrupt: its content does not match its checksum");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_truncated_memory_file_is_refused() {
    let dir = scratch("truncated");
    written(&dir, Vec::new());
    let memory = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(MEMORY_FILE))
        .unwrap();
    memory.set_len(8 << 20).unwrap();
    refused(
        &dir,
        "is 8388608 bytes, not the 16777216 its description says",
    );
    std::fs::remove_file(dir.join(MEMORY_FILE)).unwrap();
    refused(&dir, "cannot open");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_snapshot_whose_disk_is_gone_is_refused() {
    let dir = scratch("disk");
    let image = dir.join("disk.img");
    written(&dir, vec![DiskConfig::new(&image)]);
    refused(
        &dir,
        &format!("had the disk {}: No such file", image.display()),
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_snapshot_or_a_machine_option_beside_restore_is_refused() {
    let dir = scratch("none");
    refused(&dir, "snapshot.json: No such file");
    let elf = kernel("testkernel.elf");
    let restore = ["--restore", dir.to_str().unwrap()];
    for extra in [
        &["--kernel", elf.to_str().unwrap()][..],
        &["--memory", "64"],
        &["--disk", "x.img"],
    ] {
        let ran = exitless_run(&[&restore[..], extra].concat(), b"");
        assert_eq!(ran.status.code(), Some(ERROR), "{extra:?}: {}", ran.stderr);
        assert_eq!(ran.stderr.lines().count(), 1, "{}", ran.stderr);
        assert!(ran.stderr.contains("cannot be used with"), "{}", ran.stderr);
    }
    let ran = exitless_run(&["--kernel", elf.to_str().unwrap(), "--paused"], b"");
    assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
    assert!(ran.stderr.contains("--restore"), "{}", ran.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An `exitless run` in the background with its console in `DIR/NAME.console` and its API on
/// `DIR/NAME.sock`.
struct Running {
    child: Child,
    socket: PathBuf,
    console: PathBuf,
}

impl Running {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Running {
        let socket = dir.join(format!("{name}.sock"));
        let console = dir.join(format!("{name}.console"));
        let child = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .arg("run")
            .args(args)
            .arg("--console")
            .arg(&console)
            .arg("--api-socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("exitless starts");
        Running {
            child,
            socket,
            console,
        }
    }

    /// Wait until the console holds `lines` lines starting with `prefix` and a number.
    fn wait_for_lines(&mut self, prefix: &str, lines: usize) {
        let deadline = Instant::now() + LIMIT;
        let text = |path| std::fs::read_to_string(path).unwrap_or_default();
        while numbers(&text(&self.console), prefix).len() < lines {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "exitless ended early"
            );
            assert!(
                Instant::now() < deadline,
                "fewer than {lines} lines in {LIMIT:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `exitless ctl` with `args`, which must succeed: its JSON answer.
    fn ctl(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .arg("ctl")
            .arg("--api-socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "ctl {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).expect("the answer is JSON")
    }

    /// Wait for the run to end: its status, stderr and console.
    fn end(mut self) -> (i32, String, String) {
        let deadline = Instant::now() + LIMIT;
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("exitless still ran after {LIMIT:?}");
            }
            thread::sleep(Duration::from_millis(20));
        }
        let out = self.child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let console = std::fs::read_to_string(&self.console).unwrap_or_default();
        (out.status.code().expect("an exit"), stderr, console)
    }
}

/// The numbers of the lines in `text` that start with `prefix` and a six-digit number (the
/// test kernel's `spam 000001 of ...`, `disk round 000001 of ...`).
fn numbers(text: &str, prefix: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix)?.get(..6)?.parse().ok())
        .collect()
}

/// The test kernel printing `lines` numbered lines on two vCPUs.
fn spamming(dir: &Path, name: &str, lines: u32) -> Running {
    let elf = kernel("testkernel.elf");
    let cmdline = format!("spam={lines} cpus=2");
    let args = [
        "--kernel",
        elf.to_str().unwrap(),
        "--cmdline",
        &cmdline,
        "--cpus",
        "2",
    ];
    Running::start(dir, name, &args)
}

#[test]
fn a_guest_snapshotted_mid_work_finishes_in_a_new_process_with_every_line() {
    const LINES: u32 = 600;
    let dir = scratch("midwork");
    let snap = dir.join("snap");
    let mut first = spamming(&dir, "first", LINES);
    first.wait_for_lines("spam ", 20);
    assert_eq!(first.ctl(&["pause"])["state"], "paused");
    let taken = first.ctl(&["snapshot", snap.to_str().unwrap()]);
    assert_eq!(taken["state"], "paused", "a paused VM stays paused");
    first.ctl(&["shutdown"]);
    let (status, stderr, before) = first.end();
    assert_eq!(status, 0, "{stderr}");
    // Guest memory is sparse: far fewer blocks than its 128 MiB hold data.
    let memory = std::fs::metadata(snap.join(MEMORY_FILE)).unwrap();
    assert_eq!(memory.len(), 128 << 20);
    assert!(
        memory.blocks() * 512 < memory.len() / 4,
        "{} blocks",
        memory.blocks()
    );
    for file in [MEMORY_FILE, "snapshot.json"] {
        let mode = std::fs::metadata(snap.join(file)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "{file} is the guest's, owner-only");
    }

    // Restored paused: nothing runs until the resume.
    let restore = ["--restore", snap.to_str().unwrap(), "--paused"];
    let second = Running::start(&dir, "second", &restore);
    let deadline = Instant::now() + LIMIT;
    // Paused once every vCPU has parked, before its first entry.
    while !second.socket.exists() || second.ctl(&["info"])["state"] != "paused" {
        assert!(Instant::now() < deadline, "not paused after {LIMIT:?}");
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(300));
    let console = std::fs::read(&second.console).unwrap_or_default();
    assert!(console.is_empty(), "a paused guest writes nothing");
    assert_eq!(second.ctl(&["resume"])["state"], "running");
    let (status, stderr, after) = second.end();
    assert_eq!(status, PASSED, "{stderr}\n{after}");
    // The console's bytes: the first run's, then the restored one's (a line the snapshot cut
    // is ended by the second).
    let all = numbers(&(before + &after), "spam ");
    assert_eq!(
        all,
        (1..=LINES).collect::<Vec<_>>(),
        "every line once, in order"
    );
    assert!(after.contains(" passed, 0 failed"), "{after}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_running_guest_snapshotted_goes_on_and_so_does_its_restore() {
    const LINES: u32 = 400;
    let dir = scratch("running");
    let snap = dir.join("snap");
    let mut first = spamming(&dir, "first", LINES);
    first.wait_for_lines("spam ", 20);
    // A destination that cannot be written: the error, and the VM goes on.
    let out = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(["ctl", "--api-socket", first.socket.to_str().unwrap()])
        .args(["snapshot", "/proc/exitless-snapshot"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot make the directory /proc/exitless-snapshot"),
        "{stderr}"
    );
    assert_eq!(first.ctl(&["info"])["state"], "running");
    let taken = first.ctl(&["snapshot", snap.to_str().unwrap()]);
    assert_eq!(taken["state"], "running");
    assert_eq!(taken["destination"], snap.to_str().unwrap());
    let (status, stderr, before) = first.end();
    assert_eq!(status, PASSED, "{stderr}");
    assert_eq!(numbers(&before, "spam "), (1..=LINES).collect::<Vec<_>>());

    let second = Running::start(&dir, "second", &["--restore", snap.to_str().unwrap()]);
    let (status, stderr, after) = second.end();
    assert_eq!(status, PASSED, "{stderr}\n{after}");
    // The restored guest goes on from the line it was at: the rest, in order.
    let rest = numbers(&after, "spam ");
    let from = *rest.first().expect("lines after the restore");
    assert!(from > 20, "it went on, not from the start ({from})");
    assert_eq!(rest, (from..=LINES).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_guest_snapshotted_while_writing_its_disk_finishes_with_every_sector_right() {
    writes_its_disk("writing-pci", Disk::Image(""), "", &[]);
}

#[test]
fn the_same_on_virtio_mmio() {
    let mmio = Disk::Image(",transport=mmio");
    writes_its_disk("writing-mmio", mmio, FIRST_MMIO_WINDOW, &[]);
}

#[test]
fn the_same_behind_the_iommu_with_the_split_irqchip() {
    writes_its_disk("writing-iommu", Disk::Image(""), "iommu=1", &["--iommu"]);
}

/// The restored machine connects to qemu-storage-daemon again and gives it the rings'
/// positions the snapshot holds.
#[test]
fn the_same_on_a_vhost_user_disk() {
    writes_its_disk("writing-vu", Disk::VhostUser, "", &[]);
}

/// How the guest's disk is served.
#[derive(Clone, Copy)]
enum Disk {
    /// exitless opens the image, with these `--disk` options.
    Image(&'static str),
    /// qemu-storage-daemon serves the image, on a socket in the test's folder.
    VhostUser,
}

/// The test kernel writing `disk_rounds` on a disk served as `served` (and `cmdline`,
/// `args`), paused and snapshotted mid-work in `name`, shut down and restored in a new
/// process: every round once, every sector right in the image.
fn writes_its_disk(name: &str, served: Disk, cmdline: &str, args: &[&str]) {
    const ROUNDS: u32 = 120;
    let dir = scratch(name);
    let snap = dir.join("snap");
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 256 << 10]).unwrap();
    let elf = kernel("testkernel.elf");
    let cmdline = format!("disk=1 disk_rounds={ROUNDS} {cmdline}");
    let (disk, _backend) = match served {
        Disk::Image(options) => (format!("{}{options}", image.display()), None),
        Disk::VhostUser => {
            let socket = dir.join("blk.sock");
            match Backend::storage_daemon_queues(&image, &socket, 1) {
                Ok(backend) => (format!("vhost-user={}", socket.display()), Some(backend)),
                Err(BackendError::Start(why @ PeerError::NotFound { .. })) => {
                    println!("skipped: {why}");
                    return;
                }
                Err(e) => panic!("qemu-storage-daemon did not start: {e}"),
            }
        }
    };
    let kernel_args = ["--kernel", elf.to_str().unwrap(), "--cmdline", &cmdline];
    let mut first = Running::start(
        &dir,
        "first",
        &[&kernel_args[..], &["--disk", &disk], args].concat(),
    );
    first.wait_for_lines("disk round ", 10);
    assert_eq!(first.ctl(&["pause"])["state"], "paused");
    first.ctl(&["snapshot", snap.to_str().unwrap()]);
    first.ctl(&["shutdown"]);
    let (status, stderr, before) = first.end();
    assert_eq!(status, 0, "{stderr}");
    let done = numbers(&before, "disk round ");
    assert!(
        done.len() < ROUNDS as usize,
        "the snapshot caught it mid-work"
    );

    let second = Running::start(&dir, "second", &["--restore", snap.to_str().unwrap()]);
    let (status, stderr, after) = second.end();
    assert_eq!(status, PASSED, "{stderr}\n{after}");
    let all = numbers(&(before + &after), "disk round ");
    assert_eq!(
        all,
        (1..=ROUNDS).collect::<Vec<_>>(),
        "every round once, in order"
    );
    assert!(
        !after.contains("FAILED") && after.contains(" passed, 0 failed"),
        "{after}"
    );
    let file = std::fs::read(&image).unwrap();
    for n in 1..=ROUNDS {
        let at = n as usize * 512;
        assert_eq!(file[at..at + 512], pattern(n)[..], "sector {n}");
    }
    assert!(file[(ROUNDS as usize + 1) * 512..].iter().all(|&b| b == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// In one process, through the library (as `exitless bench restore` does): the test kernel's
/// machine paused mid-work, snapshotted, stopped and dropped; a machine restored from the
/// snapshot runs on to the end with every console byte once.
#[test]
fn a_machine_snapshotted_and_restored_in_the_same_process_finishes_its_work() {
    use exitless::machine::run::FW_CFG_CMDLINE;
    use exitless::machine::run::multiboot::MultibootKernel;
    use exitless::machine::snapshot::Restorable;
    use exitless::machine::{Machine, Platform, RunEnd};
    use exitless::vm::run_control::StopReason;

    const LINES: u32 = 300;
    let dir = scratch("in-process");
    let snap = dir.join("snap");
    let cmdline = format!("spam={LINES}");
    let cfg = MachineConfig {
        platform: Some(Platform {
            fw_cfg_files: vec![(FW_CFG_CMDLINE.into(), cmdline.as_bytes().to_vec())],
        }),
        ..MachineConfig::default()
    };
    let image = std::fs::read(kernel("testkernel.elf")).unwrap();
    let loader = MultibootKernel::parse(image, &format!("testkernel.elf {cmdline}")).unwrap();
    let machine = Machine::new(&cfg, None).unwrap();
    let control = machine.view().control;
    let ended = thread::scope(|s| {
        let run = s.spawn(|| machine.run(&loader, LIMIT));
        let deadline = Instant::now() + LIMIT;
        while numbers(&machine.console(), "spam ").len() < 20 {
            assert!(Instant::now() < deadline && !run.is_finished(), "no lines");
            thread::sleep(Duration::from_millis(20));
        }
        control.pause_vcpus(Duration::from_secs(30)).unwrap();
        machine.snapshot(&snap).unwrap();
        control.stop(StopReason::Requested);
        run.join().unwrap().unwrap().end
    });
    assert!(
        matches!(ended, RunEnd::Stopped(StopReason::Requested)),
        "{ended:?}"
    );
    let before = machine.console();
    drop(machine);

    let Restorable {
        description,
        memory,
    } = Restorable::open(&snap).unwrap();
    let restored = Machine::restore(&description.config, None, memory).unwrap();
    let ran = restored.run_restored(&description, LIMIT).unwrap();
    let after = restored.console();
    assert!(
        matches!(ran.end, RunEnd::Stopped(StopReason::DebugExit(0x10))),
        "{:?}\n{after}",
        ran.end
    );
    let all = numbers(&(before + &after), "spam ");
    assert_eq!(
        all,
        (1..=LINES).collect::<Vec<_>>(),
        "every line once, in order"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
