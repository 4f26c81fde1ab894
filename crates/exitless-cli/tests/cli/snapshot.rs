//! Snapshot and restore as a user drives them: `exitless ctl ... snapshot DIR` on a running
//! `exitless run --api-socket`, `exitless run --restore DIR` in a new process; and snapshots
//! that must be refused (another version, corrupt, memory cut short, a disk gone) with one
//! line and status 2, nothing started.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::running::*;
use crate::common::testkernel::*;
use exitless::machine::snapshot::{Description, MEMORY_FILE_PREFIX, MemoryFile, memory_path};
use exitless::machine::{DiskConfig, MachineConfig};
use exitless::vm::state::memory::MemoryChecksum;
use exitless_peer::backends::Backend;

/// The memory file's name in the snapshots [`written`] makes.
const MEMORY_FILE: &str = "memory-written";

/// A snapshot as exitless writes one, in `dir`, of a 16 MiB machine with `disks`: its
/// description and a memory file of the RAM's length, all zero (sparse).
pub(crate) fn written(dir: &Path, disks: Vec<DiskConfig>) {
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
            // No page that is not all zero.
            crc32: MemoryChecksum::default().value(),
        },
    }
    .write(dir)
    .unwrap();
}

/// `exitless run --restore dir` with its console to a file: its one line of error, which
/// must say `says`, status 2, and no console file made (nothing started).
pub(crate) fn refused(dir: &Path, says: &str) {
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
        text.replacen("\"format_version\":2", "\"format_version\":7", 1),
    )
    .unwrap();
    refused(
        &dir,
        "the snapshot's format is version 7; this exitless reads version 2",
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
    // A FIFO in its place is refused, not waited on.
    let fifo = Command::new("mkfifo").arg(dir.join(MEMORY_FILE)).status();
    assert!(fifo.unwrap().success());
    refused(&dir, "memory-written: not a regular file");
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
    // `exitless ctl`: the socket before or after the action, but given.
    let ctl = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .arg("ctl")
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let none = dir.join("none.sock");
    let (status, stderr) = ctl(&["snapshot", "/tmp/x", "--api-socket", none.to_str().unwrap()]);
    assert_eq!(status, Some(ERROR), "{stderr}");
    assert!(stderr.contains("cannot connect to"), "{stderr}");
    let (status, stderr) = ctl(&["snapshot", "/tmp/x"]);
    assert_eq!(
        (status, stderr.lines().count()),
        (Some(ERROR), 1),
        "{stderr}"
    );
    assert!(stderr.contains("--api-socket PATH"), "{stderr}");
    let ran = exitless_run(&["--kernel", elf.to_str().unwrap(), "--paused"], b"");
    assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
    assert!(ran.stderr.contains("--restore"), "{}", ran.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_guest_snapshotted_mid_work_finishes_in_a_new_process_with_every_line() {
    const LINES: u32 = 600;
    let dir = scratch("midwork");
    let snap = dir.join("snap");
    let mut first = spamming(&dir, "first", LINES);
    first.wait_for_lines("spam ", 20);
    let before = snapshotted_and_shut_down(first, &snap);
    // Guest memory is sparse: far fewer blocks than its 128 MiB hold data.
    let memory = std::fs::metadata(memory_path(&snap).unwrap()).unwrap();
    assert_eq!(memory.len(), 128 << 20);
    assert!(
        memory.blocks() * 512 < memory.len() / 4,
        "{} blocks",
        memory.blocks()
    );
    for file in [memory_path(&snap).unwrap(), snap.join("snapshot.json")] {
        let mode = std::fs::metadata(&file).unwrap().mode() & 0o777;
        let file = file.display();
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
    every_line(&before, &after, LINES);
    assert!(after.contains(" passed, 0 failed"), "{after}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A destination someone prepared: a FIFO and symlinks where the snapshot's temporary files
/// used to be named. Nothing there is opened or followed (the FIFO once hung the API thread,
/// the links once had guest RAM and the description written where they pointed): the snapshot
/// is whole, the link's target untouched, and the restore finishes the guest's work.
#[test]
fn a_prepared_destination_is_neither_followed_nor_waited_on() {
    const LINES: u32 = 200;
    let dir = scratch("prepared");
    let snap = dir.join("snap");
    std::fs::create_dir(&snap).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"not the guest's").unwrap();
    let fifo = std::ffi::CString::new(
        snap.join(".memory.tmp")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path it is given.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    for name in [".snapshot.json.tmp", ".memory.file.tmp"] {
        std::os::unix::fs::symlink(&victim, snap.join(name)).unwrap();
    }
    let mut first = spamming(&dir, "first", LINES);
    first.wait_for_lines("spam ", 20);
    let before = snapshotted_and_shut_down(first, &snap);
    assert_eq!(std::fs::read(&victim).unwrap(), b"not the guest's");
    // The snapshot's two files beside what was prepared, and no temporary file left.
    let memory = memory_path(&snap).unwrap();
    let memory = memory.file_name().unwrap().to_str().unwrap();
    assert!(memory.starts_with(MEMORY_FILE_PREFIX), "{memory}");
    let expected = [
        ".memory.file.tmp",
        ".memory.tmp",
        ".snapshot.json.tmp",
        memory,
        "snapshot.json",
    ];
    assert_eq!(names(&snap), expected, "what the directory holds");
    restored_with_every_line(&dir, "second", &snap, &before, LINES);
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

    // The restored guest, snapshotted into the directory it was restored from, goes on; the
    // directory then holds the new snapshot alone, its older memory file gone.
    let mut second = Running::start(&dir, "second", &["--restore", snap.to_str().unwrap()]);
    second.wait_for_lines("spam ", 20);
    assert_eq!(
        second.ctl(&["snapshot", snap.to_str().unwrap()])["state"],
        "running"
    );
    let memory = memory_path(&snap).unwrap();
    let memory = memory.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        names(&snap),
        [memory, "snapshot.json"],
        "the new snapshot alone"
    );
    let (status, stderr, after) = second.end();
    assert_eq!(status, PASSED, "{stderr}\n{after}");
    // The restored guest goes on from the line it was at: the rest, in order.
    let rest = numbers(&after, "spam ");
    let from = *rest.first().expect("lines after the restore");
    assert!(from > 20, "it went on, not from the start ({from})");
    assert_eq!(rest, (from..=LINES).collect::<Vec<_>>());

    // And the snapshot of the restored guest restores in turn, further on.
    let third = Running::start(&dir, "third", &["--restore", snap.to_str().unwrap()]);
    let (status, stderr, last) = third.end();
    assert_eq!(status, PASSED, "{stderr}\n{last}");
    let rest = numbers(&last, "spam ");
    let later = *rest.first().expect("lines after the second restore");
    assert!(
        later > from,
        "from the second snapshot ({later} after {from})"
    );
    assert_eq!(rest, (later..=LINES).collect::<Vec<_>>());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_guest_snapshotted_while_writing_its_disk_finishes_with_every_sector_right() {
    writes_its_disk("writing-pci", Disk::Image(""), "", &[], WRITES);
}

#[test]
fn the_same_on_virtio_mmio() {
    let mmio = Disk::Image(",transport=mmio");
    writes_its_disk("writing-mmio", mmio, FIRST_MMIO_WINDOW, &[], WRITES);
}

#[test]
fn the_same_behind_the_iommu_with_the_split_irqchip() {
    writes_its_disk(
        "writing-iommu",
        Disk::Image(""),
        "iommu=1",
        &["--iommu"],
        WRITES,
    );
}

/// The restored machine connects to qemu-storage-daemon again and gives it the rings'
/// positions the snapshot holds.
#[test]
fn the_same_on_a_vhost_user_disk() {
    writes_its_disk("writing-vu", Disk::VhostUser, "", &[], WRITES);
}

/// Snapshotted while the driver resets the disk and moves its BAR 0 (`disk_resets`): the
/// restored function decodes where the snapshot caught its BAR (away from home: once moved it
/// never goes back), its queue set up again or not yet, and the driver's next reset, move and
/// set-up work on it.
#[test]
fn a_guest_snapshotted_while_resetting_its_disk_and_moving_its_bar_finishes_every_round() {
    writes_its_disk("resets-pci", Disk::Image(""), "", &[], RESETS);
}

/// The same with the disk on virtio-mmio (a reset in a loop; nothing to move).
#[test]
fn the_same_resets_on_virtio_mmio() {
    let mmio = Disk::Image(",transport=mmio");
    writes_its_disk("resets-mmio", mmio, FIRST_MMIO_WINDOW, &[], RESETS);
}

/// The same with qemu-storage-daemon serving the disk: each reset stops its rings, each set-up
/// starts them again with the notify address moved, before the snapshot and after the restore.
#[test]
fn the_same_resets_on_a_vhost_user_disk() {
    writes_its_disk("resets-vu", Disk::VhostUser, "", &[], RESETS);
}

/// The test kernel's rounds on its disk: the option that asks for them, their lines' prefix,
/// and how many snapshots in turn interrupt them.
type DiskRounds = (&'static str, &'static str, usize);
/// Write, flush and read back sector i in round i.
const WRITES: DiskRounds = ("disk_rounds", "disk round ", 1);
/// The same after resetting the disk (and moving its virtio-pci BAR 0) and setting it up
/// again; three snapshots in turn, each catching the loop at another moment.
const RESETS: DiskRounds = ("disk_resets", "disk reset round ", 3);

/// How the guest's disk is served.
#[derive(Clone, Copy)]
enum Disk {
    /// exitless opens the image, with these `--disk` options.
    Image(&'static str),
    /// qemu-storage-daemon serves the image, on a socket in the test's folder.
    VhostUser,
}

/// The test kernel doing `rounds` on a disk served as `served` (and `cmdline`, `args`), paused
/// and snapshotted mid-work in `name`, shut down and restored in a new process: every round
/// once, every sector right in the image.
fn writes_its_disk(name: &str, served: Disk, cmdline: &str, args: &[&str], rounds: DiskRounds) {
    let (option, prefix, snapshots) = rounds;
    // Enough that a pause asked once a few are printed, on a loaded host, still finds it at work.
    const ROUNDS: u32 = 500;
    let dir = scratch(name);
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 256 << 10]).unwrap();
    let elf = kernel("testkernel.elf");
    let cmdline = format!("disk=1 {option}={ROUNDS} {cmdline}");
    let (disk, _backend) = match served {
        Disk::Image(options) => (format!("{}{options}", image.display()), None),
        Disk::VhostUser => {
            let socket = dir.join("blk.sock");
            let Some(backend) = started(Backend::storage_daemon_queues(&image, &socket, 1)) else {
                return;
            };
            (format!("vhost-user={}", socket.display()), Some(backend))
        }
    };
    let kernel_args = ["--kernel", elf.to_str().unwrap(), "--cmdline", &cmdline];
    let args = [&kernel_args[..], &["--disk", &disk], args].concat();
    interrupted_times(None, &dir, (&args, prefix, ROUNDS), snapshots);
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
    use exitless::machine::pc::FW_CFG_CMDLINE;
    use exitless::machine::pc::multiboot::MultibootKernel;
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

/// A network namespace of this test, deleted on drop, with the peer's address on its loopback
/// interface: the host's kernel answers ARP requests for it on a tap the run creates.
pub(crate) struct NetNamespace(pub(crate) String);

impl Drop for NetNamespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

/// `ip ARGS`, which must succeed, or why not.
/// A network namespace of its own (`exitless-TAG-PID`) where the host answers as the test
/// kernel's peer 10.0.2.2 (on its loopback, up); `None` where none can be made (said on
/// stdout).
pub(crate) fn peer_namespace(tag: &str) -> Option<NetNamespace> {
    let name = format!("exitless-{tag}-{}", std::process::id());
    if let Err(why) = ip(&["netns", "add", &name]) {
        println!("skipped: cannot make a network namespace here: {why}");
        return None;
    }
    let ns = NetNamespace(name);
    ip(&["-n", &ns.0, "addr", "add", "10.0.2.2/32", "dev", "lo"]).unwrap();
    ip(&["-n", &ns.0, "link", "set", "lo", "up"]).unwrap();
    Some(ns)
}

pub(crate) fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
    }
}

/// The test kernel asking the host's kernel for a MAC by ARP, again and again (`net_rounds`)
/// on a tap in a namespace of its own, snapshotted mid-work and restored in a new process (the
/// tap made again): every request answered, each round once.
#[test]
fn a_guest_snapshotted_while_receiving_frames_finishes_with_every_answer() {
    const ROUNDS: u32 = 300;
    let Some(ns) = peer_namespace("snap") else {
        return;
    };
    let dir = scratch("net");
    let elf = kernel("testkernel.elf");
    let cmdline = format!("net=1 ip=10.0.2.15 peer=10.0.2.2 net_rounds={ROUNDS}");
    let args = ["--kernel", elf.to_str().unwrap(), "--cmdline", &cmdline];
    let args = [&args[..], &["--net", "tap=xlsnap0"]].concat();
    interrupted_and_restored(Some(&ns.0), &dir, &args, "net round ", ROUNDS);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The test kernel asking testpmd's icmpecho for a MAC by ARP, again and again (`net_rounds`),
/// on a vhost-user card on virtio-pci and then on virtio-mmio, each snapshotted mid-traffic and
/// restored in a new process that connects to the same testpmd again and gives it the rings'
/// positions, twice in turn: every request answered, each round once. testpmd busy-polls a core: one
/// testpmd, two ports, the transports in turn.
#[test]
fn a_guest_snapshotted_while_exchanging_frames_with_testpmd_finishes_every_round() {
    const ROUNDS: u32 = 200;
    let dir = scratch("testpmd");
    let sockets = [dir.join("net-0.sock"), dir.join("net-1.sock")];
    let Some(backend) = started(Backend::testpmd(&sockets, 1)) else {
        return;
    };
    let elf = kernel("testkernel.elf");
    let cards = [
        ("pci", "", &sockets[0]),
        ("mmio", FIRST_MMIO_WINDOW, &sockets[1]),
    ];
    for (transport, more, socket) in cards {
        let cmdline = format!("net=1 ip=10.0.2.15 peer=10.0.2.2 net_rounds={ROUNDS} {more}");
        let card = format!("vhost-user={},transport={transport}", socket.display());
        let args = ["--kernel", elf.to_str().unwrap(), "--cmdline", &cmdline];
        let run = dir.join(transport);
        std::fs::create_dir(&run).unwrap();
        interrupted_and_restored(
            None,
            &run,
            &[&args[..], &["--net", &card]].concat(),
            "net round ",
            ROUNDS,
        );
        assert!(
            backend.sockets()[0].exists(),
            "testpmd: {}",
            backend.output()
        );
    }
    drop(backend);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A change made to a description.
type Edit = fn(&mut Description);

/// States that do not fit the machine the description's configuration builds are refused with
/// one line naming what, status 2, before any vCPU runs.
#[test]
fn a_snapshot_whose_states_do_not_fit_the_machine_is_refused() {
    let dir = scratch("states");
    let snap = dir.join("snap");
    let mut first = spamming(&dir, "first", 400);
    first.wait_for_lines("spam ", 5);
    first.ctl(&["snapshot", snap.to_str().unwrap()]);
    first.ctl(&["shutdown"]);
    let (status, stderr, _) = first.end();
    assert_eq!(status, 0, "{stderr}");
    let edits: [(&str, Edit); 4] = [
        ("no state for `serial`", |d| {
            d.devices.remove("serial");
        }),
        ("a state for `nosuch`, which the machine lacks", |d| {
            d.devices.insert("nosuch".into(), serde_json::json!({}));
        }),
        ("device state: rtc", |d| {
            d.devices.insert("rtc".into(), serde_json::json!("garbage"));
        }),
        ("device state: vcpus[1]", |d| {
            d.vcpus[1] = serde_json::json!({})
        }),
    ];
    let original = std::fs::read(snap.join("snapshot.json")).unwrap();
    for (says, edit) in edits {
        let mut description = Description::read(&snap).unwrap();
        edit(&mut description);
        description.write(&snap).unwrap();
        let ran = exitless_run(
            &[
                "--restore",
                snap.to_str().unwrap(),
                "--console",
                "/dev/null",
            ],
            b"",
        );
        assert_eq!(ran.status.code(), Some(ERROR), "{says}: {}", ran.stderr);
        assert_eq!(ran.stderr.lines().count(), 1, "one line: {}", ran.stderr);
        assert!(ran.stderr.contains(says), "{says:?} in {}", ran.stderr);
        assert!(!ran.stdout.contains("spam"), "no vCPU ran");
        std::fs::write(snap.join("snapshot.json"), &original).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
