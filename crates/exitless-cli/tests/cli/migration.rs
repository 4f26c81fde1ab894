//! Live migration as a user drives it: `exitless run --migrate-from ADDRESS` waiting,
//! `exitless ctl ... migrate ADDRESS` on a running VM, `vm.info` meanwhile; a target that dies
//! mid-copy, which the source outlives; streams a target must refuse with one line before any vCPU runs.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use exitless::machine::migration::stream::{Record, write_preface};
use exitless_peer::backends::Backend;

use crate::common::running::*;
use crate::common::testkernel::*;
use crate::snapshot::peer_namespace;

/// How many numbered lines the test kernel prints.
const LINES: u32 = 3000;

/// `exitless run --migrate-from ADDRESS`, its console and socket named `name` in `dir`.
fn target(dir: &Path, name: &str, address: &str) -> Running {
    target_in(None, dir, name, address)
}

/// [`target`] in the network namespace `netns`, if given.
fn target_in(netns: Option<&str>, dir: &Path, name: &str, address: &str) -> Running {
    let target = Running::start_in(netns, dir, name, &["--migrate-from", address]);
    // Bound at the process's start, before its control socket (a connection to see whether
    // it listens would be taken for the source).
    let deadline = Instant::now() + LIMIT;
    while !target.socket.exists() {
        assert!(Instant::now() < deadline, "the target never listened");
        thread::sleep(Duration::from_millis(20));
    }
    target
}

/// `exitless run`'s arguments for the test kernel with `cmdline`, then `more`.
fn test_kernel_args(cmdline: &str, more: &[&str]) -> Vec<String> {
    let elf = kernel("testkernel.elf");
    let args = ["--kernel", elf.to_str().unwrap(), "--cmdline", cmdline];
    args.iter().chain(more).map(|a| a.to_string()).collect()
}

/// A TCP address on this host that nothing listens on now.
fn free_tcp_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("tcp:{}", listener.local_addr().unwrap())
}

/// `vm` migrated to `address`: the figures it answered, and its run ended with status 0.
fn migrated(vm: Running, address: &str) -> (serde_json::Value, String) {
    let figures = vm.ctl(&["migrate", address]);
    let (status, stderr, console) = vm.end();
    assert_eq!(status, 0, "{stderr}");
    assert!(stderr.contains("went to its migration target"), "{stderr}");
    (figures, console)
}

/// How a hop goes: over a Unix socket, over TCP (within one namespace), or as a same-host
/// live update (guest RAM and the devices' files handed over).
#[derive(Clone, Copy, PartialEq)]
enum Via {
    Unix,
    Tcp,
    Local,
}

impl Via {
    /// An address of this kind, a socket's file named `name` in `dir`.
    fn address(self, dir: &Path, name: &str) -> String {
        let path = dir.join(name);
        match self {
            Via::Unix => format!("unix:{}", path.display()),
            Via::Tcp => free_tcp_address(),
            Via::Local => format!("local:{}", path.display()),
        }
    }
}

/// Where each of [`migrated_twice`]'s three processes runs (a network namespace, or this
/// one), and how each of the two hops goes.
type Hops<'a> = ([Option<&'a str>; 3], [Via; 2]);

/// `exitless run ARGS` until the guest has printed a few of its `rounds` lines starting with
/// `prefix`, migrated mid-work to a second process, which is migrated on to a third, as
/// `hops` says: it passes, and the three consoles hold each round once, in order. A live
/// update copies no page.
fn migrated_twice(dir: &Path, args: &[&str], (prefix, rounds): (&str, u32), hops: Hops<'_>) {
    let ([first_ns, second_ns, third_ns], [first_hop, second_hop]) = hops;
    let mut first = Running::start_in(first_ns, dir, "first", args);
    first.wait_for_lines(prefix, 5);
    let to_second = first_hop.address(dir, "to-second.sock");
    let mut second = target_in(second_ns, dir, "second", &to_second);
    let (figures, before) = migrated(first, &to_second);
    assert!(figures["downtime_ms"].as_f64().unwrap() > 0.0, "{figures}");
    if first_hop == Via::Local {
        assert_eq!(figures["pages"], 0, "{figures}");
        assert!(figures["files"].as_u64().unwrap() >= 1, "{figures}");
    } else {
        assert!(figures["passes"].as_u64().unwrap() >= 1, "{figures}");
        assert!(figures["pages"].as_u64().unwrap() > 0, "{figures}");
    }
    // The guest goes on in the second process, and is sent on again.
    let seen = second.lines(prefix).len();
    second.wait_for_lines(prefix, seen + 5);
    let on = second_hop.address(dir, "to-third.sock");
    let third = target_in(third_ns, dir, "third", &on);
    let (_, middle) = migrated(second, &on);
    let (status, stderr, after) = third.end();
    assert_eq!(status, PASSED, "{stderr}\n{after}");
    // The target says what it measured when the VM came in.
    let came_in = stderr.lines().find(|l| l.contains("the VM came in ("));
    let bytes = came_in.and_then(|l| {
        l.split(" bytes in ")
            .next()?
            .rsplit([' ', '('])
            .next()?
            .parse()
            .ok()
    });
    assert!(bytes > Some(4096_u64), "{stderr}");
    if second_hop == Via::Local {
        assert!(came_in.unwrap().contains("its RAM and "), "{stderr}");
    }
    assert!(
        !after.contains("FAILED") && after.contains(" passed, 0 failed"),
        "{after}"
    );
    let all = numbers(&(before + &middle + &after), prefix);
    assert_eq!(
        all,
        (1..=rounds).collect::<Vec<_>>(),
        "every round once, in order"
    );
    assert!(!dir.join("to-second.sock").exists(), "its socket file went");
}

#[test]
fn a_guest_migrated_mid_work_there_and_back_finishes_with_every_line() {
    let dir = scratch("migrate-twice");
    let args = spam_args(LINES);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    migrated_twice(
        &dir,
        &args,
        ("spam ", LINES),
        ([None; 3], [Via::Unix, Via::Tcp]),
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_guest_dirtying_memory_migrated_there_and_on_finds_every_page_as_it_left_it() {
    // Each round reads back the last one's byte in every page of 8 MiB: a page a pass missed,
    // or sent before its last write, fails the guest's own check.
    const ROUNDS: u32 = 400;
    let dir = scratch("migrate-dirty");
    let cmdline = format!("dirty=8 dirty_rounds={ROUNDS}");
    let args = test_kernel_args(&cmdline, &["--memory", "80"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hops = ([None; 3], [Via::Unix, Via::Tcp]);
    migrated_twice(&dir, &args, ("dirty round ", ROUNDS), hops);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A 2 MiB zeroed image in `dir`, and the arguments of a 16 MiB test kernel that writes
/// `rounds` sectors of it, one a round.
fn disk_writer(dir: &Path, rounds: u32) -> (std::path::PathBuf, Vec<String>) {
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 2 << 20]).unwrap();
    let cmdline = format!("disk=1 disk_rounds={rounds}");
    let disk = image.to_str().unwrap();
    let args = test_kernel_args(&cmdline, &["--disk", disk, "--memory", "16"]);
    (image, args)
}

#[test]
fn a_guest_migrated_while_writing_its_disk_finishes_with_every_sector_right() {
    // Each process opens the image and locks it as QEMU does: the source gives its locks up
    // at the switch-over for the target to take.
    // Enough rounds to be at work through both migrations (a 16 MiB machine's takes well under
    // a second), few enough that the last process ends within the tests' minute on a loaded
    // host (3,000 did not, in CI beside other builds): a sector each.
    const ROUNDS: u32 = 1000;
    let dir = scratch("migrate-disk");
    let (image, args) = disk_writer(&dir, ROUNDS);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hops = ([None; 3], [Via::Unix, Via::Tcp]);
    migrated_twice(&dir, &args, ("disk round ", ROUNDS), hops);
    let file = std::fs::read(&image).unwrap();
    for n in 1..=ROUNDS {
        let at = n as usize * 512;
        assert_eq!(file[at..at + 512], pattern(n)[..], "sector {n}");
    }
    assert!(file[(ROUNDS as usize + 1) * 512..].iter().all(|&b| b == 0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_guest_live_updated_twice_while_writing_its_disk_finishes_with_every_sector_right() {
    // Each new exitless takes the memfd of guest RAM, the image (its locks with it) and the
    // tap's queue from the last: nothing copied, nothing reopened.
    const ROUNDS: u32 = 1000;
    let dir = scratch("live-update-disk");
    let (image, mut args) = disk_writer(&dir, ROUNDS);
    let tap = format!("tap=xlupd{}", std::process::id() % 10_000);
    args.extend(["--shared-memory", "--net", &tap].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hops = ([None; 3], [Via::Local; 2]);
    migrated_twice(&dir, &args, ("disk round ", ROUNDS), hops);
    let file = std::fs::read(&image).unwrap();
    for n in 1..=ROUNDS {
        let at = n as usize * 512;
        assert_eq!(file[at..at + 512], pattern(n)[..], "sector {n}");
    }
    assert!(!locked(&image), "the last exitless let the image go");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_live_update_of_a_guest_with_private_ram_is_refused_and_the_guest_goes_on() {
    let dir = scratch("live-update-private");
    let mut vm = spamming(&dir, "vm", LINES);
    vm.wait_for_lines("spam ", 20);
    let to = format!("local:{}", dir.join("t.sock").display());
    let out = vm.ctl_output(&["migrate", &to]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("start it with --shared-memory"), "{said}");
    assert_eq!(vm.ctl(&["info"])["state"], "running");
    let (status, stderr, console) = vm.end();
    assert_eq!(status, PASSED, "{stderr}\n{console}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stand-in target's first steps: the stream's preface and configuration read, `Accepted`
/// answered (as a target does once its RAM is made); the rest of the stream to read.
fn accepted(stream: &UnixStream) -> std::io::BufReader<UnixStream> {
    let mut input = std::io::BufReader::new(stream.try_clone().unwrap());
    exitless::machine::migration::stream::read_preface(&mut input).unwrap();
    let config = Record::read_from(&mut input).unwrap();
    assert!(matches!(config, Record::Config(_)), "{config:?}");
    Record::Accepted.write_to(&mut &*stream).unwrap();
    input
}

/// While the target stalls, `vm.info` says where the migration stands and `vm.pause` waits
/// (409); when the target dies, the source goes on as it was.
#[test]
fn a_target_that_stalls_then_dies_shows_in_vm_info_and_leaves_the_source_running_to_its_end() {
    let dir = scratch("migrate-dies");
    let mut vm = spamming(&dir, "vm", LINES);
    vm.wait_for_lines("spam ", 20);
    let path = dir.join("dies.sock");
    let listener = UnixListener::bind(&path).unwrap();
    // A target that takes the first 16 KiB of the stream (the test kernel's pages are more),
    // then stops reading until told to go, and is gone.
    let (stalled, go) = (mpsc::channel(), mpsc::channel::<()>());
    let dies = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut input = accepted(&stream);
        let mut taken = vec![0; 16 << 10];
        input.read_exact(&mut taken).unwrap();
        stalled.0.send(()).unwrap();
        let _ = go.1.recv();
    });
    let to = format!("unix:{}", path.display());
    let out = thread::scope(|s| {
        let migrating = s.spawn(|| vm.ctl_output(&["migrate", &to]));
        stalled.1.recv().unwrap();
        // Meanwhile the API answers what reads, with where the migration stands, and holds
        // what acts.
        // The test kernel's pages fit the socket's buffers: the source comes to wait, paused,
        // for the target's answer.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = vm.ctl(&["info"]);
            let progress = &info["migration"];
            assert!(progress["pass"].as_u64() >= Some(1), "{info}");
            assert!(progress["bytes"].as_u64() >= Some(16 << 10), "{info}");
            if progress["phase"] == "switching over" {
                assert_eq!(info["state"], "paused");
                break;
            }
            assert!(Instant::now() < deadline, "{info}");
        }
        let pause = vm.ctl_output(&["pause"]);
        let said = String::from_utf8_lossy(&pause.stderr);
        assert!(said.contains("a migration is under way"), "{said}");
        go.0.send(()).unwrap();
        migrating.join().unwrap()
    });
    dies.join().unwrap();
    assert!(!out.status.success(), "the migration failed");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("migration stream broke"), "{said}");
    // The VM goes on as it was: running, every line printed once.
    assert_eq!(vm.ctl(&["info"])["state"], "running");
    let (status, stderr, console) = vm.end();
    assert_eq!(status, PASSED, "{stderr}\n{console}");
    every_line(&console, "", LINES);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Send `bytes` to a target waiting at `dir/NAME.mig`: it ends with status 2 and one line
/// saying `says`, its console never made (no machine built, no vCPU run).
fn refuses(dir: &Path, name: &str, bytes: &[u8], says: &str) {
    let path = dir.join(format!("{name}.mig"));
    let address = format!("unix:{}", path.display());
    let target = target(dir, name, &address);
    let console = target.console.clone();
    let mut stream = UnixStream::connect(&path).unwrap();
    stream.write_all(bytes).unwrap();
    // The end of the stream: a target that wants more sees it cut short.
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let (status, stderr, _) = target.end();
    assert_eq!(status, ERROR, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(says), "{says:?} in {stderr}");
    assert!(!console.exists(), "nothing started");
}

#[test]
fn a_stream_not_exitless_s_corrupt_or_cut_short_is_refused_before_any_vcpu_runs() {
    let dir = scratch("migrate-refused");
    refuses(
        &dir,
        "other",
        b"GET / HTTP/1.1\r\n\r\n",
        "does not speak exitless's",
    );
    let mut preface = Vec::new();
    write_preface(&mut preface).unwrap();
    let config = serde_json::json!({
        "exitless_version": env!("CARGO_PKG_VERSION"),
        "config": exitless::machine::MachineConfig {
            ram_size: 16 << 20,
            ..Default::default()
        },
    });
    let mut whole = preface.clone();
    Record::Config(config.to_string().into_bytes())
        .write_to(&mut whole)
        .unwrap();
    // Pages outside RAM, then a record whose checksum does not match, then a stream that
    // ends before its state.
    let mut outside = whole.clone();
    Record::Pages {
        gpa: 1 << 40,
        data: vec![1; 4096],
    }
    .write_to(&mut outside)
    .unwrap();
    refuses(&dir, "outside", &outside, "outside guest RAM");
    let mut corrupt = whole.clone();
    let at = corrupt.len() - 3;
    corrupt[at] ^= 1;
    refuses(&dir, "corrupt", &corrupt, "does not match its checksum");
    refuses(&dir, "short", &whole, "the migration stream broke");
    let mut older = preface;
    let config = config
        .to_string()
        .replace(env!("CARGO_PKG_VERSION"), "0.0.1");
    Record::Config(config.into_bytes())
        .write_to(&mut older)
        .unwrap();
    refuses(&dir, "older", &older, "taken by exitless 0.0.1");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_target_that_refuses_at_the_end_leaves_the_source_running_with_its_disk_locked() {
    const ROUNDS: u32 = 1000;
    let dir = scratch("migrate-refused-end");
    let (image, args) = disk_writer(&dir, ROUNDS);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (elf, disk) = (kernel("testkernel.elf"), image.to_str().unwrap());
    let mut vm = Running::start(&dir, "vm", &args);
    vm.wait_for_lines("disk round ", 5);
    assert!(locked(&image), "a running VM holds its image's locks");
    let path = dir.join("refuses.sock");
    let listener = UnixListener::bind(&path).unwrap();
    // A target that reads the whole stream (the source has given its image's locks up by
    // then), then says no.
    let image_now = image.clone();
    let refuses = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut input = accepted(&stream);
        while Record::read_from(&mut input).unwrap() != Record::End {}
        assert!(
            !locked(&image_now),
            "the source gave its locks up before the end"
        );
        // As a target that built the machine would, it holds the image's write lock a while
        // after its refusal: the source tries again until it lets go.
        let held = hold_write_lock(&image_now);
        Record::Refused("no room here".into())
            .write_to(&mut &stream)
            .unwrap();
        thread::sleep(Duration::from_secs(1));
        drop(held);
    });
    let out = vm.ctl_output(&["migrate", &format!("unix:{}", path.display())]);
    refuses.join().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("the target refused the VM: no room here"),
        "{said}"
    );
    assert_eq!(vm.ctl(&["info"])["state"], "running");
    // The source holds its image's locks again: a second VM on it is refused.
    let second = exitless_run(&["--kernel", elf.to_str().unwrap(), "--disk", disk], b"");
    assert_eq!(second.status.code(), Some(ERROR), "{}", second.stderr);
    assert!(second.stderr.contains("lock"), "{}", second.stderr);
    let (status, stderr, console) = vm.end();
    assert_eq!(status, PASSED, "{stderr}\n{console}");
    let all = numbers(&console, "disk round ");
    assert_eq!(all, (1..=ROUNDS).collect::<Vec<_>>());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fcntl(file, command, lock of `l_type` on `len` bytes from `start`)`: the lock's type as
/// the kernel left it.
fn byte_lock(file: &std::fs::File, command: i32, l_type: i32, (start, len): (i64, i64)) -> i32 {
    let mut lock = libc::flock {
        l_type: libc::c_short::try_from(l_type).unwrap(),
        l_whence: libc::c_short::try_from(libc::SEEK_SET).unwrap(),
        l_start: start,
        l_len: len,
        l_pid: 0,
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: F_OFD_GETLK and F_OFD_SETLK read (and GETLK rewrites) the flock passed, which
    // outlives the call.
    let r = unsafe { libc::fcntl(fd, command, &mut lock) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    i32::from(lock.l_type)
}

/// Whether any process holds a lock on QEMU's lock bytes (100 to 299) of the image at `path`.
fn locked(path: &Path) -> bool {
    let file = std::fs::File::open(path).unwrap();
    byte_lock(&file, libc::F_OFD_GETLK, libc::F_WRLCK, (100, 200)) != libc::F_UNLCK
}

/// The image at `path` opened and its write permission's byte (101) locked, as a VMM that
/// writes it holds it, until the file is dropped.
fn hold_write_lock(path: &Path) -> std::fs::File {
    let file = std::fs::File::open(path).unwrap();
    byte_lock(&file, libc::F_OFD_SETLK, libc::F_RDLCK, (101, 1));
    file
}

/// The test kernel asking the host's kernel for a MAC by ARP, again and again, on a tap that
/// each process makes in its own network namespace (the same name in each: a VM moving between
/// hosts finds its network there), migrated from one namespace to the other and back: every
/// request answered, each round once.
#[test]
fn a_guest_migrated_between_network_namespaces_mid_traffic_finishes_with_every_answer() {
    const ROUNDS: u32 = 1000;
    let Some(a) = peer_namespace("miga") else {
        return;
    };
    let b = peer_namespace("migb").expect("a second namespace, as the first");
    let dir = scratch("migrate-net");
    let cmdline = format!("net=1 ip=10.0.2.15 peer=10.0.2.2 net_rounds={ROUNDS}");
    let args = test_kernel_args(&cmdline, &["--net", "tap=xlmig0", "--memory", "16"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hops = (
        [Some(a.0.as_str()), Some(b.0.as_str()), Some(a.0.as_str())],
        [Via::Unix; 2],
    );
    migrated_twice(&dir, &args, ("net round ", ROUNDS), hops);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The same traffic through a two-queue tap whose queues each live update hands on, in one
/// namespace (the driver uses one pair: the second queue is detached, and handed on so): no
/// frame lost at either hand-over.
#[test]
fn a_guest_live_updated_twice_mid_traffic_finishes_with_every_answer() {
    const ROUNDS: u32 = 1000;
    let Some(ns) = peer_namespace("upd") else {
        return;
    };
    let dir = scratch("live-update-net");
    let cmdline = format!("net=1 ip=10.0.2.15 peer=10.0.2.2 net_rounds={ROUNDS}");
    let more = [
        "--net",
        "tap=xlupd0,queues=2",
        "--memory",
        "16",
        "--shared-memory",
    ];
    let args = test_kernel_args(&cmdline, &more);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hops = ([Some(ns.0.as_str()); 3], [Via::Local; 2]);
    migrated_twice(&dir, &args, ("net round ", ROUNDS), hops);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_paused_guest_migrates_paused_and_runs_on_when_resumed_there() {
    let dir = scratch("migrate-paused");
    let mut vm = spamming(&dir, "vm", LINES);
    vm.wait_for_lines("spam ", 20);
    assert_eq!(vm.ctl(&["pause"])["state"], "paused");
    let unix = format!("unix:{}", dir.join("to-target.sock").display());
    let target = target(&dir, "target", &unix);
    let (_, before) = migrated(vm, &unix);
    // It stays as its user left it: paused, nothing printed, until resumed.
    assert_eq!(target.ctl(&["info"])["state"], "paused");
    thread::sleep(Duration::from_millis(300));
    assert!(target.lines("spam ").is_empty(), "a paused guest printed");
    assert_eq!(target.ctl(&["resume"])["state"], "running");
    let (status, stderr, after) = target.end();
    assert_eq!(status, PASSED, "{stderr}\n{after}");
    every_line(&before, &after, LINES);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A 2 MiB zeroed image in `dir` served by qemu-storage-daemon on a socket there, and the
/// arguments of a test kernel that writes `rounds` sectors of it through a vhost-user disk;
/// `None` where qemu-storage-daemon is missing (said on stdout).
fn vhost_user_disk_writer(dir: &Path, rounds: u32) -> Option<(Backend, PathBuf, Vec<String>)> {
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0u8; 2 << 20]).unwrap();
    let socket = dir.join("blk.sock");
    let backend = started(Backend::storage_daemon_queues(&image, &socket, 1))?;
    let disk = format!("vhost-user={}", socket.display());
    let cmdline = format!("disk=1 disk_rounds={rounds}");
    let args = test_kernel_args(&cmdline, &["--disk", &disk, "--memory", "16"]);
    Some((backend, image, args))
}

/// Every sector the disk writer wrote, in the image, and nothing past them.
fn every_sector(image: &Path, rounds: u32) {
    let file = std::fs::read(image).unwrap();
    for n in 1..=rounds {
        let at = n as usize * 512;
        assert_eq!(file[at..at + 512], pattern(n)[..], "sector {n}");
    }
    assert!(file[(rounds as usize + 1) * 512..].iter().all(|&b| b == 0));
}

/// The backend serves one front-end at a time: each source lets it go at the switch-over and
/// its target connects; the first hop copies RAM (the whole shared memfd is scanned), the
/// second hands it over.
#[test]
fn a_guest_on_a_vhost_user_disk_migrated_then_live_updated_finishes_with_every_sector_right() {
    const ROUNDS: u32 = 1000;
    let dir = scratch("migrate-vhost-user");
    let Some((_backend, image, args)) = vhost_user_disk_writer(&dir, ROUNDS) else {
        return;
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hops = ([None; 3], [Via::Unix, Via::Local]);
    migrated_twice(&dir, &args, ("disk round ", ROUNDS), hops);
    every_sector(&image, ROUNDS);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A guest exchanging frames with testpmd on a vhost-user NIC, migrated over a Unix socket and
/// then live-updated: each target connects to testpmd once its source let it go and gives it
/// the rings' positions; every request answered, each round once. testpmd busy-polls a core.
#[test]
fn a_guest_exchanging_frames_with_testpmd_migrated_then_live_updated_finishes_every_round() {
    const ROUNDS: u32 = 1000;
    let dir = scratch("migrate-testpmd");
    let socket = dir.join("net.sock");
    let Some(_backend) = started(Backend::testpmd(std::slice::from_ref(&socket), 1)) else {
        return;
    };
    let cmdline = format!("net=1 ip=10.0.2.15 peer=10.0.2.2 net_rounds={ROUNDS}");
    let card = format!("vhost-user={}", socket.display());
    let args = test_kernel_args(&cmdline, &["--net", &card, "--memory", "16"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hops = ([None; 3], [Via::Unix, Via::Local]);
    migrated_twice(&dir, &args, ("net round ", ROUNDS), hops);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A target that refuses once the source has let its vhost-user backend go: the source
/// connects to the backend again, sets its rings up where they stopped, and runs on.
#[test]
fn a_target_that_refuses_leaves_the_source_on_its_vhost_user_disk_again() {
    const ROUNDS: u32 = 1000;
    let dir = scratch("migrate-vhost-user-refused");
    let Some((_backend, image, args)) = vhost_user_disk_writer(&dir, ROUNDS) else {
        return;
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut vm = Running::start(&dir, "vm", &args);
    vm.wait_for_lines("disk round ", 5);
    let path = dir.join("refuses.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let refuses = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut input = accepted(&stream);
        while Record::read_from(&mut input).unwrap() != Record::End {}
        Record::Refused("no room here".into())
            .write_to(&mut &stream)
            .unwrap();
    });
    let out = vm.ctl_output(&["migrate", &format!("unix:{}", path.display())]);
    refuses.join().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("the target refused the VM: no room here"),
        "{said}"
    );
    assert_eq!(vm.ctl(&["info"])["state"], "running");
    let (status, stderr, console) = vm.end();
    assert_eq!(status, PASSED, "{stderr}\n{console}");
    assert!(!stderr.contains("needs a reset"), "{stderr}");
    let all = numbers(&console, "disk round ");
    assert_eq!(all, (1..=ROUNDS).collect::<Vec<_>>());
    every_sector(&image, ROUNDS);
    std::fs::remove_dir_all(&dir).unwrap();
}
