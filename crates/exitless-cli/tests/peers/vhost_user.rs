//! vhost-user devices against real backends, started by the tests (issue 21): `exitless run`
//! boots the multiboot test kernel with a virtio-blk disk served by qemu-storage-daemon (the
//! image file holds what the guest wrote) and a virtio-net card served by DPDK testpmd, whose
//! icmpecho answers the guest's ARP request, each on virtio-pci and on virtio-mmio; killing
//! either backend mid-traffic leaves the VM running and the device in DEVICE_NEEDS_RESET (and
//! a disk beside the card working), and the driver's reset reconnects to the restarted
//! backend; a card with two queue pairs is answered by testpmd on both, once the driver
//! enables the second on the control queue exitless serves; a socket nobody listens on, a
//! backend without VERSION_1, more queues than the backend serves and two pairs from a
//! backend without multiqueue are one line on stderr and status 2.
//!
//! A test skips, saying why, only where the backend's binary is missing (`.ci/run` installs
//! both). testpmd busy-polls a core: the tests that start one run in turn (`testpmd_turn`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::running::started;
use crate::common::testkernel::{ERROR, FIRST_MMIO_WINDOW, PASSED, kernel, pattern};

use exitless::contract::{
    RR_FLAG_DOORBELLS, RR_FLAG_MSI, STATUS_OK, TRANSPORT_MMIO, TRANSPORT_PCI,
};
use exitless::machine::{
    NetBackendKind, ProbeConfig, Transport, VhostUserConfig, VirtioNetConfig, ops, run_probe,
};
use exitless::virtio::notify::NotifyPath;
use exitless_bench::vhost_net::{BACKEND_IP, BACKEND_MAC, GUEST_IP};
use exitless_peer::backends::Backend;

/// Longest a run may take (a vhost-user request crosses two processes on a busy host).
const LIMIT: Duration = Duration::from_secs(120);

/// A directory of its own for one test's sockets and image, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("exitless-vu-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// qemu-storage-daemon serving a zeroed 64 KiB image here with `queues` virtqueues on
    /// `blk.sock`, and the image's path; `None` after printing why the test skips.
    fn storage_daemon(&self, queues: u16) -> Option<(Backend, PathBuf)> {
        let image = self.image(64);
        let backend = started(Backend::storage_daemon_queues(
            &image,
            &self.path("blk.sock"),
            queues,
        ))?;
        Some((backend, image))
    }

    /// A zeroed image file of `kib` KiB.
    fn image(&self, kib: usize) -> PathBuf {
        let image = self.path("disk.img");
        std::fs::write(&image, vec![0u8; kib << 10]).unwrap();
        image
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `exitless run` of the test kernel with `cmdline` and `args`, running: its console's lines
/// arrive on `lines`, its stderr is gathered.
struct Run {
    child: Child,
    lines: Receiver<String>,
    console: String,
    stderr: thread::JoinHandle<String>,
}

impl Run {
    fn start(cmdline: &str, args: &[&str]) -> Run {
        let elf = kernel("testkernel.elf");
        let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(["run", "--memory", "64", "--kernel"])
            .arg(elf)
            .args(["--cmdline", cmdline])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("exitless starts");
        let (send, lines) = channel();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut pipe = child.stderr.take().unwrap();
        let stderr = thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        });
        Run {
            child,
            lines,
            console: String::new(),
            stderr,
        }
    }

    /// Read console lines until one starts with `prefix` (true), or the run's console ends or
    /// `limit` passes (false).
    fn await_line(&mut self, prefix: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.starts_with(prefix);
                    self.console.push_str(&line);
                    self.console.push('\n');
                    if found {
                        return true;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// Wait for the end (killing it after LIMIT): its status, console and stderr.
    fn finish(mut self) -> (ExitStatus, String, String) {
        self.await_line("\u{0}never", LIMIT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let status = self.child.wait().unwrap();
        (status, self.console, self.stderr.join().unwrap())
    }
}

/// The run passed every check; `lines` among its PASS lines.
fn assert_passed(status: ExitStatus, console: &str, stderr: &str, lines: &[&str]) {
    let failed = console.lines().any(|l| l.starts_with("FAIL "));
    assert!(
        status.code() == Some(PASSED) && !failed,
        "status {status:?}, console:\n{console}\nstderr:\n{stderr}"
    );
    for line in lines {
        assert!(
            console.lines().any(|l| l == *line),
            "{line:?} in:\n{console}\nstderr:\n{stderr}"
        );
    }
}

/// The test kernel's line for the one device (`what`, `name`) on `transport`, and what its
/// command line needs to find it there.
fn found_on(transport: &str, what: &str, name: &str) -> (String, &'static str) {
    match transport {
        "mmio" => (
            format!("PASS {what}: a {name} device at virtio-mmio e0100000"),
            FIRST_MMIO_WINDOW,
        ),
        _ => (
            format!("PASS {what}: a {name} function on bus 0 (00:03.0)"),
            "",
        ),
    }
}

/// The disk checks through qemu-storage-daemon on one transport, `queues` virtqueues on both
/// sides (the test kernel drives the first); the image holds the sector.
fn disk_through_the_storage_daemon(transport: &str, queues: u16) {
    let scratch = Scratch::new(&format!("disk-{transport}-{queues}"));
    let Some((backend, image)) = scratch.storage_daemon(queues) else {
        return;
    };
    let socket = &backend.sockets()[0];
    let (found, more) = found_on(transport, "disk", "virtio-blk");
    let disk = format!(
        "vhost-user={},transport={transport},queues={queues}",
        socket.display()
    );
    let run = Run::start(&format!("disk=1 {more}"), &["--disk", &disk]);
    let (status, console, stderr) = run.finish();
    assert_passed(
        status,
        &console,
        &stderr,
        &[
            &found,
            "PASS disk: FEATURES_OK, 128 sectors",
            "PASS disk: sector 1 written, status 0",
            "PASS disk: flushed, status 0",
            "PASS disk: sector 1 read back, status 0",
            "PASS disk: a read past the end answered IOERR (status 1)",
        ],
    );
    drop(backend);
    let bytes = std::fs::read(&image).unwrap();
    assert_eq!(
        bytes[512..1024],
        pattern(1)[..],
        "the guest's sector is in the image"
    );
    assert_eq!(bytes.len(), 64 << 10, "the image keeps its size");
}

#[test]
fn a_vhost_user_disk_on_virtio_pci_is_served_by_qemu_storage_daemon() {
    disk_through_the_storage_daemon("pci", 1);
}

#[test]
fn a_vhost_user_disk_on_virtio_mmio_is_served_by_qemu_storage_daemon() {
    disk_through_the_storage_daemon("mmio", 1);
}

/// testpmd busy-polls a core: the tests that start one take this first, so they run in turn.
static TESTPMD: Mutex<()> = Mutex::new(());

/// In testpmd's turn (even after another test holding it failed), a scratch directory `tag`
/// and a testpmd with `ports` ports of `pairs` queue pairs, all polled, on its `net-N.sock`;
/// `None` after printing why the test skips. They go in that order: the backend, its
/// directory, the turn.
fn testpmd_in_turn(
    tag: &str,
    pairs: u16,
    ports: usize,
) -> Option<(Backend, Scratch, MutexGuard<'static, ()>)> {
    let turn = TESTPMD
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let scratch = Scratch::new(tag);
    let sockets: Vec<PathBuf> = (0..ports)
        .map(|n| scratch.path(&format!("net-{n}.sock")))
        .collect();
    let backend = started(Backend::testpmd_multiqueue(&sockets, pairs))?;
    Some((backend, scratch, turn))
}

/// The test kernel's `net=1` on a card of one queue pair on `transport`, served by `backend` on
/// its first socket: testpmd's icmpecho answers its ARP request.
fn card_answered(backend: &Backend, transport: &str) {
    card_checked(
        backend,
        (transport, 1, "1"),
        &["PASS net: FEATURES_OK, MAC 52:54:00:00:00:21"],
        &["PASS net: ARP reply: 10.0.2.2 is at "],
    );
}

/// The test kernel's `net=MODE` on a card of `pairs` queue pairs on `transport` (`card`),
/// served by `backend` on its first socket: every check passed, `lines` among them, and a
/// line starting with each of `answers` (testpmd's MAC follows).
fn card_checked(
    backend: &Backend,
    (transport, pairs, mode): (&str, u16, &str),
    lines: &[&str],
    answers: &[&str],
) {
    let (found, more) = found_on(transport, "net", "virtio-net");
    let net = format!(
        "vhost-user={},mac=52:54:00:00:00:21,transport={transport},queues={pairs}",
        backend.sockets()[0].display()
    );
    let cmdline = format!("net={mode} ip=10.0.2.15 peer=10.0.2.2 {more}");
    let (status, console, stderr) = Run::start(&cmdline, &["--net", &net]).finish();
    let mut wanted = vec![found.as_str()];
    wanted.extend_from_slice(lines);
    assert_passed(
        status,
        &console,
        &format!("{stderr}\ntestpmd:\n{}", backend.output()),
        &wanted,
    );
    for answer in answers {
        let seen = console.lines().any(|l| l.starts_with(answer));
        assert!(seen, "{transport}: {answer:?} in:\n{console}");
    }
}

/// One testpmd, the card on virtio-pci and then on virtio-mmio: the guest's ARP request
/// crosses to testpmd and its icmpecho's answer comes back. Then the probe with a card on each
/// transport, each on a port of its own (`bench rr`'s vhost-user boot).
#[test]
fn a_vhost_user_card_on_either_transport_is_answered_by_testpmd() {
    let Some((backend, _scratch, _turn)) = testpmd_in_turn("net", 1, 2) else {
        return;
    };
    for transport in ["pci", "mmio"] {
        card_answered(&backend, transport);
    }
    the_probe_echoes_on_one_card_then_on_the_other(&backend);
    assert_gone_once_dropped(backend);
}

/// The probe's echo on the virtio-pci card, then on the virtio-mmio one: the second card's rings
/// reuse the probe's DMA area, and testpmd polls the first card's rings whether or not it is
/// notified, so the probe resets the first before it brings up the second (without that reset
/// the first port took the second's requests and the echo timed out).
fn the_probe_echoes_on_one_card_then_on_the_other(backend: &Backend) {
    let sockets = backend.sockets();
    const N: u64 = 30;
    let card = |transport, socket: &PathBuf| VirtioNetConfig {
        backend: NetBackendKind::VhostUser(VhostUserConfig {
            socket: socket.clone(),
            queues: 1,
            reconnect: None,
        }),
        ..VirtioNetConfig::new(transport, NotifyPath::Address)
    };
    let echo = ops::icmp_echo(BACKEND_IP, GUEST_IP, BACKEND_MAC, 32, N);
    let pci = ProbeConfig::virtio_pci_address(0).ecam_offset();
    let run = run_probe(&ProbeConfig {
        ops: vec![
            ops::virtio_init(TRANSPORT_PCI, pci, 0),
            echo,
            echo,
            ops::virtio_init(TRANSPORT_MMIO, 0, RR_FLAG_MSI | RR_FLAG_DOORBELLS),
            echo,
        ],
        virtio: vec![
            card(Transport::Mmio, &sockets[1]),
            card(Transport::Pci, &sockets[0]),
        ],
        timeout: LIMIT,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("probe run failed: {e}\ntestpmd:\n{}", backend.output()));
    assert_eq!(run.results.len(), 5, "{}", run.console);
    for (i, r) in run.results.iter().enumerate() {
        assert_eq!(r.status, STATUS_OK, "op {i}: {r:?}\n{}", run.console);
    }
    for i in [1, 2, 4] {
        assert_eq!(run.results[i].value, N, "op {i}: every echo answered");
    }
}

/// `queues=2` on a card whose testpmd port has two queue pairs, on each transport: the test
/// kernel's `net=mq` negotiates MQ, is answered on pair 1, finds pair 2 not served until its
/// VQ_PAIRS_SET 2 on the control queue (which exitless serves, turning it into the backend's
/// SET_VRING_ENABLE), has a count past the pairs refused, and is answered on pair 2.
#[test]
fn a_vhost_user_card_with_two_queue_pairs_is_answered_by_testpmd_on_both() {
    let Some((backend, _scratch, _turn)) = testpmd_in_turn("net-mq", 2, 1) else {
        return;
    };
    for transport in ["pci", "mmio"] {
        card_checked(
            &backend,
            (transport, 2, "mq"),
            &[
                "PASS net: FEATURES_OK with MQ, 2 queue pairs",
                "PASS net: transmitq2 not taken before VQ_PAIRS_SET",
                "PASS net: VQ_PAIRS_SET 3 answered VIRTIO_NET_ERR (1)",
                "PASS net: VQ_PAIRS_SET 2 answered VIRTIO_NET_OK (0)",
            ],
            &[
                "PASS net: ARP reply on pair 1: 10.0.2.2 is at ",
                "PASS net: ARP reply on pair 2: 10.0.2.2 is at ",
            ],
        );
    }
}

/// `queues=2` on a card whose backend has no VHOST_USER_PROTOCOL_F_MQ: one line naming it,
/// status 2.
#[test]
fn two_queue_pairs_from_a_backend_without_mq_are_one_line_and_status_2() {
    let scratch = Scratch::new("nomq");
    let socket = scratch.path("net.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let backend = thread::spawn(move || serve_offering(listener, ONE_QUEUE_PAIR));
    let line = refused(&[
        "--net",
        &format!("vhost-user={},queues=2", socket.display()),
    ]);
    assert!(
        line.contains("does not offer VHOST_USER_PROTOCOL_F_MQ"),
        "says what is missing: {line}"
    );
    let _ = UnixStream::connect(&socket);
    backend.join().unwrap();
}

/// `queues=2` on a disk whose qemu-storage-daemon export has two (`num-queues=2`): the test
/// kernel (no VIRTIO_BLK_F_MQ) drives the first, the image holds its sector.
#[test]
fn a_vhost_user_disk_with_two_queues_is_served_by_qemu_storage_daemon() {
    disk_through_the_storage_daemon("pci", 2);
}

/// `queues=2` against an export of one queue (qemu-storage-daemon's default): one line that
/// says so, status 2.
#[test]
fn more_queues_than_the_backend_serves_is_one_line_and_status_2() {
    let scratch = Scratch::new("queues");
    let Some((backend, _)) = scratch.storage_daemon(1) else {
        return;
    };
    let socket = &backend.sockets()[0];
    let disk = format!("vhost-user={},queues=2", socket.display());
    let line = refused(&["--disk", &disk]);
    assert!(
        line.contains("serves 1 queues, 2 asked for; lower queues="),
        "says what to do: {line}"
    );
}

/// Kill qemu-storage-daemon while the guest writes and reads: the VM runs on, the device
/// shows DEVICE_NEEDS_RESET (the test kernel prints its marker), and once the daemon is back
/// the driver's reset reconnects and the guest's next round reads back what it wrote. On
/// virtio-mmio the driver's reset is a write of 0 to the status register at 0x70.
fn killed_disk_backend_reconnected(transport: &str) {
    let scratch = Scratch::new(&format!("reconnect-{transport}"));
    let Some((mut first, image)) = scratch.storage_daemon(1) else {
        return;
    };
    let socket = first.sockets()[0].clone();
    let disk = format!("vhost-user={},transport={transport}", socket.display());
    let more = if transport == "mmio" {
        FIRST_MMIO_WINDOW
    } else {
        ""
    };
    let mut run = Run::start(&format!("disk=reconnect {more}"), &["--disk", &disk]);
    assert!(
        run.await_line("PASS disk: sector 1 read back", LIMIT),
        "the first round:\n{}",
        run.console
    );
    first.kill();
    let marker = run.await_line("testkernel: disk: DEVICE_NEEDS_RESET", LIMIT);
    assert!(
        marker,
        "no DEVICE_NEEDS_RESET after the kill:\n{}",
        run.console
    );
    assert!(run.child.try_wait().unwrap().is_none(), "the VM runs on");
    let second = started(Backend::storage_daemon(&image, &socket)).expect("it started before");
    let (status, console, stderr) = run.finish();
    assert_passed(status, &console, &stderr, &[]);
    assert!(
        console.contains("PASS disk: read back after ") && !console.contains("after 0 resets"),
        "the round after the reset:\n{console}"
    );
    drop(second);
    let bytes = std::fs::read(&image).unwrap();
    assert_eq!(
        bytes[512..1024],
        pattern(2)[..],
        "the round after the reset reached the image"
    );
}

#[test]
fn a_killed_disk_backend_is_reconnected_by_the_drivers_reset() {
    killed_disk_backend_reconnected("pci");
}

#[test]
fn a_killed_disk_backend_on_virtio_mmio_is_reconnected_by_the_drivers_reset() {
    killed_disk_backend_reconnected("mmio");
}

/// Kill testpmd after the card's first answer, as a crash would: the VM runs on, the card
/// shows DEVICE_NEEDS_RESET, the disk beside it on qemu-storage-daemon still writes, flushes
/// and reads back (the image holds that round's bytes), and once testpmd is back the driver's
/// reset reconnects and the guest's ARP request is answered again.
#[test]
fn a_killed_card_backend_leaves_the_disk_beside_it_working_and_is_reconnected() {
    let Some((mut first, scratch, _turn)) = testpmd_in_turn("net-reconnect", 1, 1) else {
        return;
    };
    let net = first.sockets()[0].clone();
    let Some((disk_backend, image)) = scratch.storage_daemon(1) else {
        return;
    };
    let blk = &disk_backend.sockets()[0];
    let (disk, card) = (
        format!("vhost-user={}", blk.display()),
        format!("vhost-user={}", net.display()),
    );
    let cmdline = "disk=1 net=reconnect ip=10.0.2.15 peer=10.0.2.2";
    let mut run = Run::start(cmdline, &["--disk", &disk, "--net", &card]);
    assert!(
        run.await_line("PASS net: ARP reply: ", LIMIT),
        "the first answer:\n{}",
        run.console
    );
    first.kill();
    // Its socket file goes before the next testpmd makes its own there.
    drop(first);
    for (marker, what) in [
        (
            "testkernel: net: DEVICE_NEEDS_RESET",
            "no DEVICE_NEEDS_RESET after the kill",
        ),
        (
            "PASS disk: a round while the card's backend is away",
            "the disk beside it",
        ),
    ] {
        assert!(run.await_line(marker, LIMIT), "{what}:\n{}", run.console);
    }
    assert!(run.child.try_wait().unwrap().is_none(), "the VM runs on");
    let second = started(Backend::testpmd(std::slice::from_ref(&net), 1)).expect("it started");
    let (status, console, stderr) = run.finish();
    assert_passed(status, &console, &stderr, &[]);
    assert!(
        console.contains("PASS net: ARP reply after ") && !console.contains("after 0 resets"),
        "the answer after the reset:\n{console}"
    );
    drop((second, disk_backend));
    let bytes = std::fs::read(&image).unwrap();
    assert_eq!(
        bytes[512..1024],
        pattern(3)[..],
        "the round while the card was down reached the image"
    );
}

/// `exitless run` with `args` ends at once with status 2 and one line on stderr, which it
/// returns.
fn refused(args: &[&str]) -> String {
    let (status, console, stderr) = Run::start("", args).finish();
    assert_eq!(status.code(), Some(ERROR), "{console}\n{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(console.is_empty(), "no boot: {console}");
    stderr
}

#[test]
fn a_socket_nobody_listens_on_is_one_line_and_status_2() {
    let scratch = Scratch::new("nosocket");
    let socket = scratch.path("absent.sock");
    for option in ["--disk", "--net"] {
        let line = refused(&[option, &format!("vhost-user={}", socket.display())]);
        assert!(
            line.contains(&*socket.to_string_lossy()),
            "names the socket: {line}"
        );
    }
}

/// vhost-user's framing (QEMU docs/interop/vhost-user.rst, "Message Specification"): a
/// request, flags and payload size, 4 bytes each, then the payload.
const HEADER: usize = 12;
const GET_FEATURES: u32 = 1;
const GET_PROTOCOL_FEATURES: u32 = 15;
const GET_QUEUE_NUM: u32 = 17;
/// Flags: version 1, a reply; and the frontend's "reply wanted" (REPLY_ACK).
const VERSION_REPLY: u32 = 0x1 | 0x4;
const NEED_REPLY: u32 = 0x8;

/// VERSION_1, EVENT_IDX and the protocol features bit: a backend of one queue pair, with no
/// protocol feature (VHOST_USER_PROTOCOL_F_MQ among them).
const ONE_QUEUE_PAIR: u64 = 1 << 32 | 1 << 29 | 1 << 30;

/// A backend that offers `features` and no protocol feature: GET_FEATURES answers them, every
/// other GET 0 (1 queue), every request that wants an acknowledgement gets success. Written by
/// hand because it must answer what no real backend answers.
fn serve_offering(listener: UnixListener, features: u64) {
    let Ok((mut stream, _)) = listener.accept() else {
        return;
    };
    let mut header = [0u8; HEADER];
    while stream.read_exact(&mut header).is_ok() {
        let word = |i: usize| u32::from_le_bytes(header[i * 4..i * 4 + 4].try_into().unwrap());
        let (request, flags, size) = (word(0), word(1), word(2) as usize);
        let mut payload = vec![0u8; size];
        if stream.read_exact(&mut payload).is_err() {
            return;
        }
        let value: u64 = match request {
            GET_QUEUE_NUM => 1,
            GET_FEATURES => features,
            GET_PROTOCOL_FEATURES => 0,
            _ if flags & NEED_REPLY != 0 => 0,
            _ => continue,
        };
        let mut reply = Vec::with_capacity(HEADER + 8);
        for w in [request, VERSION_REPLY, 8] {
            reply.extend_from_slice(&w.to_le_bytes());
        }
        reply.extend_from_slice(&value.to_le_bytes());
        if stream.write_all(&reply).is_err() {
            return;
        }
    }
}

/// A backend that takes the connection and never answers (the connection waits in its
/// backlog, as with a backend serving another VMM) is one line naming the message and status
/// 2, after the exchange's deadline; so is one that sends half a reply. Once, the vhost crate
/// retried the socket's timeout for ever and exitless hung at start.
#[test]
fn a_backend_that_never_answers_or_half_answers_is_one_line_and_status_2() {
    let scratch = Scratch::new("silent");
    for option in ["--disk", "--net"] {
        let socket = scratch.path(&format!("silent-{}.sock", &option[2..]));
        let _listening = UnixListener::bind(&socket).unwrap();
        let line = refused(&[option, &format!("vhost-user={}", socket.display())]);
        assert!(
            line.contains("did not answer GET_FEATURES within 5 s"),
            "{line}"
        );
    }
    let socket = scratch.path("half.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let backend = thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        // SET_OWNER, then GET_FEATURES: its reply's header says 8 bytes, 4 come.
        let mut message = [0u8; HEADER];
        for _ in 0..2 {
            stream.read_exact(&mut message).unwrap();
        }
        let mut reply = Vec::new();
        for w in [GET_FEATURES, VERSION_REPLY, 8, 0] {
            reply.extend_from_slice(&w.to_le_bytes());
        }
        stream.write_all(&reply).unwrap();
        // Until exitless gives up on the rest.
        let _ = stream.read(&mut message);
    });
    let line = refused(&["--disk", &format!("vhost-user={}", socket.display())]);
    assert!(
        line.contains("did not answer GET_FEATURES within 5 s"),
        "{line}"
    );
    backend.join().unwrap();
}

/// qemu-storage-daemon serves one client per export: the same socket given twice (or a second
/// VM on an export in use) leaves the second connection unanswered, one line and status 2.
#[test]
fn the_same_export_twice_is_one_line_and_status_2() {
    let scratch = Scratch::new("twice");
    let Some((backend, _image)) = scratch.storage_daemon(1) else {
        return;
    };
    let disk = format!("vhost-user={}", backend.sockets()[0].display());
    let line = refused(&["--disk", &disk, "--disk", &disk]);
    assert!(
        line.contains("did not answer") && line.contains("within 5 s"),
        "{line}"
    );
}

/// A backend gone silent mid-run (qemu-storage-daemon stopped with SIGSTOP): the snapshot that
/// stops its rings is answered after the exchange's deadline, the device needs a reset (one
/// line on stderr saying so) and the VM runs on to its shutdown. Once, the vhost-user thread,
/// the API thread and the snapshot's client waited for good.
#[test]
fn a_disk_backend_gone_silent_mid_run_needs_a_reset_and_the_vm_goes_on() {
    let scratch = Scratch::new("gone-silent");
    let Some((backend, _image)) = scratch.storage_daemon(1) else {
        return;
    };
    let api = scratch.path("api.sock");
    let disk = format!("vhost-user={}", backend.sockets()[0].display());
    let api_arg = api.to_str().unwrap();
    let mut run = Run::start(
        "disk=1 disk_rounds=100000",
        &["--disk", &disk, "--api-socket", api_arg],
    );
    assert!(run.await_line("disk round ", LIMIT), "{}", run.console);
    let signal = |s| {
        // SAFETY: kill sends `s` to the backend this test started.
        let sent = unsafe { libc::kill(backend.pid() as i32, s) };
        assert_eq!(sent, 0);
    };
    signal(libc::SIGSTOP);
    let ctl = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(["ctl", "--timeout", "60", "--api-socket", api_arg])
            .args(args)
            .output()
            .unwrap()
    };
    let snapshot = ctl(&["snapshot", scratch.path("snap").to_str().unwrap()]);
    signal(libc::SIGCONT);
    let answered = String::from_utf8_lossy(&snapshot.stderr);
    assert_ne!(snapshot.status.code(), Some(2), "answered: {answered}");
    assert!(ctl(&["shutdown"]).status.success());
    let (status, console, stderr) = run.finish();
    assert_eq!(status.code(), Some(0), "{console}\n{stderr}");
    assert!(
        stderr.contains("the vhost-user backend did not answer within 5 s"),
        "exitless's stderr: {stderr:?}; ctl snapshot: {:?}, {answered:?}",
        snapshot.status
    );
    drop(backend);
}

#[test]
fn a_backend_without_version_1_is_one_line_and_status_2() {
    let scratch = Scratch::new("noversion1");
    for option in ["--disk", "--net"] {
        let socket = scratch.path(&format!("{}.sock", &option[2..]));
        let listener = UnixListener::bind(&socket).unwrap();
        let backend = thread::spawn(move || serve_offering(listener, 0));
        let line = refused(&[option, &format!("vhost-user={}", socket.display())]);
        assert!(line.contains("VERSION_1"), "says what is missing: {line}");
        // The backend thread ends when exitless closes the connection.
        let _ = UnixStream::connect(&socket);
        backend.join().unwrap();
    }
}

/// A backend, dropped, is stopped and reaped, and its sockets are gone.
fn assert_gone_once_dropped(backend: Backend) {
    let (pid, sockets) = (backend.pid(), backend.sockets().to_vec());
    drop(backend);
    for socket in sockets {
        assert!(!socket.exists(), "{} is removed", socket.display());
    }
    let proc = format!("/proc/{pid}");
    assert!(!Path::new(&proc).exists(), "it is stopped and reaped");
}

/// The backends themselves: qemu-storage-daemon creates its socket, serves on it, and is gone
/// with its socket once dropped (testpmd's the same, in the card's test).
#[test]
fn the_storage_daemon_serves_its_socket_until_dropped() {
    let scratch = Scratch::new("qsd");
    let Some((backend, _)) = scratch.storage_daemon(1) else {
        return;
    };
    let socket = scratch.path("blk.sock");
    assert_eq!(backend.sockets(), std::slice::from_ref(&socket));
    UnixStream::connect(&socket).expect("it listens");
    assert_gone_once_dropped(backend);
}
