//! The control socket as a user drives it: `exitless run --api-socket` with the test kernel
//! printing numbered lines (`spam=N`), and `exitless ctl` (or raw HTTP) pausing, resuming,
//! reading and shutting it down; bad requests and bad sockets.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::running::{Running, scratch, spamming};
use crate::common::testkernel::{LIMIT, PASSED};

fn exitless() -> Command {
    Command::new(env!("CARGO_BIN_EXE_exitless"))
}

/// A run of the test kernel on two vCPUs printing `lines` numbered lines, serving its API
/// socket, once it has printed a few. (The second vCPU waits in the guest's idle loop or for
/// SIPI: parked all the same by a pause.)
fn start(dir: &Path, lines: u32) -> Running {
    let mut vm = spamming(dir, "api", lines);
    vm.wait_for_lines("spam ", 20);
    vm
}

/// The exits counted so far.
fn total_exits(vm: &Running) -> u64 {
    vm.ctl(&["counters"])["total"].as_u64().unwrap()
}

/// Send `request` on a fresh connection and read the answer: its status and body.
fn raw(socket: &Path, request: &[u8]) -> (u16, String) {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.write_all(request).unwrap();
    read_answer(stream)
}

fn read_answer(mut stream: UnixStream) -> (u16, String) {
    let mut bytes = Vec::new();
    // The server may close with part of a huge request unread: a reset after the answer.
    let _ = stream.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

#[test]
fn a_paused_guest_makes_no_progress_and_once_resumed_passes() {
    let dir = scratch("pause");
    let vm = start(&dir, 2000);
    let mode = std::fs::metadata(&vm.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "owner-only");
    assert_eq!(vm.ctl(&["info"])["state"], "running");
    assert_eq!(vm.ctl(&["pause"])["state"], "paused");
    assert_eq!(vm.ctl(&["info"])["state"], "paused");
    // Every vCPU is parked: not one exit, however long it stays paused.
    let before = total_exits(&vm);
    thread::sleep(Duration::from_millis(500));
    assert_eq!(total_exits(&vm), before, "exits while paused");
    let twice = vm.ctl_output(&["pause"]);
    assert_eq!(twice.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&twice.stderr),
        "exitless: error: the VM is already paused (HTTP 400)\n"
    );
    assert_eq!(vm.ctl(&["resume"])["state"], "running");
    let again = vm.ctl_output(&["resume"]);
    assert_eq!(again.status.code(), Some(1), "resume while running");
    let socket = vm.socket.clone();
    let lines = vm.lines("spam ");
    let (status, stderr, _) = vm.end();
    assert_eq!((status, stderr.as_str()), (PASSED, ""));
    assert_eq!(
        crate::common::running::numbers(
            &std::fs::read_to_string(dir.join("api.console")).unwrap(),
            "spam "
        ),
        (1..=2000).collect::<Vec<_>>(),
        "every line, once, in order"
    );
    assert!(lines.len() < 2000, "paused mid-way");
    assert!(!socket.exists(), "the socket is removed at exit");
    let _ = std::fs::remove_dir_all(dir);
}

/// `vm.counters` carries, per served queue, what the test kernel's disk requests were: its
/// check (a write, a flush, a read, the ID, a read past the end: the driver's error) and two
/// rounds of write, flush and read, each with a 16-byte header and a status byte.
#[test]
fn counters_show_each_request_and_byte_the_disks_queue_carried() {
    let dir = scratch("queues");
    let disk = dir.join("disk");
    std::fs::write(&disk, vec![0u8; 16 << 10]).unwrap();
    let kernel = Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("testkernel.elf");
    let args = [
        "--kernel",
        kernel.to_str().unwrap(),
        "--cmdline",
        "disk=1 disk_rounds=2 spam=1000000",
        "--disk",
        disk.to_str().unwrap(),
    ];
    let mut vm = Running::start(&dir, "queues", &args);
    vm.wait_for_lines("spam ", 5);
    let counters = vm.ctl(&["counters"]);
    let served: Vec<_> = counters["by_device"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|d| d.get("queues"))
        .collect();
    assert_eq!(served.len(), 1, "one device with queues: {counters}");
    let queue = &served[0][0];
    let (requests, writes, reads) = (5 + 2 * 3, 1 + 2, 1 + 2);
    assert_eq!(queue["completed"], requests, "{queue}");
    assert_eq!(queue["bytes_read"], 16 * requests + 512 * writes, "{queue}");
    // Data read in (512 each, the ID's 20), and every status byte.
    assert_eq!(
        queue["bytes_written"],
        512 * reads + 20 + requests,
        "{queue}"
    );
    let errors = &queue["errors"];
    assert_eq!(
        (&errors["guest"], &errors["backend"], &errors["iommu"]),
        (&1.into(), &0.into(), &0.into()),
        "the read past the end: {queue}"
    );
    vm.ctl(&["shutdown"]);
    let (status, _, _) = vm.end();
    assert_eq!(status, 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn shutdown_ends_a_run_with_status_0_even_while_paused() {
    let dir = scratch("shutdown");
    let vm = start(&dir, 1_000_000);
    vm.ctl(&["pause"]);
    assert_eq!(vm.ctl(&["shutdown"])["state"], "shutting down");
    let socket = vm.socket.clone();
    let (status, stderr, _) = vm.end();
    assert_eq!((status, stderr.as_str()), (0, ""));
    assert!(!socket.exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_requests_and_bad_clients_never_disturb_the_vm() {
    let dir = scratch("bad");
    let vm = start(&dir, 1_000_000);
    let s = &vm.socket;
    let (status, body) = raw(s, b"\x16\x03\x01 not http at all\r\n\r\n");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"error\""), "{body}");
    let huge = format!(
        "GET /api/v1/vm.info HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let mut stream = UnixStream::connect(s).unwrap();
    let writer = thread::spawn(move || {
        let _ = stream.write_all(huge.as_bytes());
        stream
    });
    let stream = writer.join().unwrap();
    assert_eq!(read_answer(stream).0, 413);
    assert_eq!(raw(s, b"GET /api/v1/vm.reboot HTTP/1.1\r\n\r\n").0, 404);
    assert_eq!(raw(s, b"POST /api/v1/vm.pause HTTP/1.1\r\n\r\n").0, 405);
    // Half a request, then gone.
    UnixStream::connect(s)
        .unwrap()
        .write_all(b"PUT /api/v1/vm.pa")
        .unwrap();
    // A client that connects and says nothing is given up on; the next one is answered.
    let silent = UnixStream::connect(s).unwrap();
    assert_eq!(
        raw(s, b"GET /api/v1/vm.info HTTP/1.1\r\n\r\n").0,
        200,
        "answered after the silent client's deadline"
    );
    assert_eq!(read_answer(silent).0, 408);
    // The guest ran on all along, and still does.
    let before = total_exits(&vm);
    let deadline = Instant::now() + LIMIT;
    while total_exits(&vm) <= before {
        assert!(Instant::now() < deadline, "no progress after {LIMIT:?}");
        thread::sleep(Duration::from_millis(20));
    }
    let lines = vm.lines("spam ");
    assert_eq!(lines, (1..).take(lines.len()).collect::<Vec<u32>>());
    vm.ctl(&["shutdown"]);
    let (status, stderr, _) = vm.end();
    assert_eq!((status, stderr.as_str()), (0, ""));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_path_in_use_or_not_a_socket_is_refused_in_one_line_and_a_stale_socket_replaced() {
    let dir = scratch("paths");
    let kernel = Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("testkernel.elf");
    let run = |socket: &Path| {
        exitless()
            .arg("run")
            .arg("--kernel")
            .arg(&kernel)
            .arg("--api-socket")
            .arg(socket)
            .output()
            .unwrap()
    };
    let file = dir.join("file");
    std::fs::write(&file, "keep").unwrap();
    let out = run(&file);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not a socket") && stderr.lines().count() == 1,
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    let live = dir.join("live.sock");
    let _listener = UnixListener::bind(&live).unwrap();
    let out = run(&live);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("another process listens"), "{stderr}");
    // A socket nobody listens on (a VMM killed): replaced, and the run passes.
    let stale = dir.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert!(std::fs::metadata(&stale).unwrap().file_type().is_socket());
    assert_eq!(run(&stale).status.code(), Some(PASSED));
    assert!(!stale.exists());
    // ctl with nothing listening: one line, status 2.
    let out = exitless()
        .args(["ctl", "--api-socket"])
        .arg(dir.join("none.sock"))
        .arg("info")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Clients that connect and say nothing each hold a place for their own deadline, and hold up
/// no one: a request sent behind a hundred of them is answered at once (once, each held the
/// single API thread 2 s in turn: 200 s), and each of them is then given up on with 408.
#[test]
fn idle_clients_hold_up_no_one() {
    let dir = scratch("idle");
    let vm = start(&dir, 1_000_000);
    let idle: Vec<UnixStream> = (0..100)
        .map(|_| UnixStream::connect(&vm.socket).unwrap())
        .collect();
    let (status, body) = raw(&vm.socket, b"GET /api/v1/vm.info HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200, "{body}");
    // Answered before the first idle client's deadline, whose 408 is still to come.
    idle[0].set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let first = (&idle[0]).read(&mut byte).map_err(|e| e.kind());
    assert_eq!(
        first,
        Err(std::io::ErrorKind::WouldBlock),
        "answered already"
    );
    idle[0].set_nonblocking(false).unwrap();
    for stream in idle {
        assert_eq!(read_answer(stream).0, 408);
    }
    vm.ctl(&["shutdown"]);
    let (status, stderr, _) = vm.end();
    assert_eq!((status, stderr.as_str()), (0, ""));
    let _ = std::fs::remove_dir_all(dir);
}

/// A VMM that ends removes its socket's file only if it is still its own: a newer VMM bound at
/// the same path meanwhile (the old file removed by hand) keeps its socket.
#[test]
fn an_ending_vmm_leaves_a_newer_vmms_socket_alone() {
    let dir = scratch("newer");
    let mut old = start(&dir, 1_000_000);
    std::fs::remove_file(&old.socket).unwrap();
    // The same console file as the old one's: wait for the socket, not for lines.
    let newer = spamming(&dir, "api", 1_000_000);
    let deadline = Instant::now() + LIMIT;
    while !newer.socket.exists() {
        assert!(Instant::now() < deadline, "no socket after {LIMIT:?}");
        thread::sleep(Duration::from_millis(20));
    }
    // The old VMM can only be stopped by signal now: its socket's path is the newer one's.
    // SAFETY: kill sends SIGTERM to the child this test started.
    let sent = unsafe { libc::kill(old.child.id() as i32, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let ended = old.child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&ended),
        Some(libc::SIGTERM)
    );
    assert!(
        newer.socket.exists(),
        "the newer VMM's socket is still there"
    );
    assert_eq!(newer.ctl(&["info"])["state"], "running");
    newer.ctl(&["shutdown"]);
    let socket = newer.socket.clone();
    let (status, stderr, _) = newer.end();
    assert_eq!((status, stderr.as_str()), (0, ""));
    assert!(!socket.exists(), "removed by its own VMM");
    let _ = std::fs::remove_dir_all(dir);
}

/// `exitless ctl` on a server that takes the connection and never answers gives up after
/// `--timeout` with one line and status 2 (once, it waited 300 s).
#[test]
fn ctl_gives_up_on_a_server_that_never_answers() {
    let dir = scratch("silent");
    let socket = dir.join("silent.sock");
    // Listening, never accepting: the connection waits in the backlog, as with a hung VMM.
    let _listener = UnixListener::bind(&socket).unwrap();
    let out = exitless()
        .args(["ctl", "--timeout", "1", "--api-socket"])
        .arg(&socket)
        .arg("info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("no answer from the API socket within 1 s"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
