//! vhost-user backends that exitless's tests and benchmarks start beside it (issue 21): the
//! programs that serve a vhost-user device's queues from another process.
//!
//! - [`Backend::storage_daemon`]: qemu-storage-daemon (Debian `qemu-system-common`) exporting
//!   an image file as a vhost-user-blk device (QEMU docs, "qemu-storage-daemon": `--blockdev`
//!   plus `--export type=vhost-user-blk`). The image file holds what the guest wrote.
//! - [`Backend::testpmd`]: DPDK's testpmd (Debian `dpdk-dev`) with one `net_vhost` port per
//!   socket in `icmpecho` forwarding, which answers ARP requests and ICMP echo requests on the
//!   port they came in on. What works on these hosts, found by hand: no hugepages
//!   (`--no-huge -m 1024`), no PCI scan, a mempool small enough for 1 GiB
//!   (`--total-num-mbufs=8192`, an application option: after `--`), a file prefix of its own per
//!   instance (DPDK's runtime directory; two instances with one prefix refuse each other), and
//!   non-interactive `--auto-start` with stdin held open: testpmd exits when its stdin reaches
//!   EOF ("Press enter to exit"). Its sockets appear 1 to 4 s after start here. Its forwarding
//!   core busy-polls one CPU while it runs.
//!
//! Both create their sockets as servers; [`Backend`] waits until every socket exists, and stops
//! the program (SIGTERM, then SIGKILL after a grace period) when dropped. A missing binary is
//! `PeerError::NotFound` inside [`BackendError::Start`], whose message a test prints as its skip reason.

use std::ffi::OsString;
use std::fs::{self, File};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::PeerError;

/// How long a backend may take to create its sockets (testpmd takes seconds on a busy host).
const SOCKET_WAIT: Duration = Duration::from_secs(60);
/// How long a backend may take to exit after SIGTERM (or testpmd after stdin's EOF).
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How often the socket and exit waits look.
const POLL: Duration = Duration::from_millis(20);

/// Why a backend is not running.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The program is not installed (`PeerError::NotFound`, whose message is the skip
    /// reason a test prints), or could not be started (`PeerError::Io`).
    #[error(transparent)]
    Start(#[from] PeerError),
    /// The program exited, or did not create its sockets in time.
    #[error("{binary} {why}; it printed:\n{output}")]
    NotServing {
        /// The program.
        binary: &'static str,
        /// What went wrong.
        why: String,
        /// Its stdout and stderr.
        output: String,
    },
}

/// A program on PATH.
struct Program {
    binary: &'static str,
    package: &'static str,
}

const STORAGE_DAEMON: Program = Program {
    binary: "qemu-storage-daemon",
    package: "qemu-system-common",
};
const TESTPMD: Program = Program {
    binary: "dpdk-testpmd",
    package: "dpdk-dev",
};

impl Program {
    /// Its path, or NotFound.
    fn find(&self) -> Result<PathBuf, BackendError> {
        on_path(self.binary).ok_or(BackendError::Start(PeerError::NotFound {
            binary: self.binary,
            package: self.package,
        }))
    }
}

/// The first `binary` in PATH's directories.
pub fn on_path(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|p| p.is_file())
}

/// The program names on PATH, for a caller that starts one itself (the Linux lab, from a shell
/// script in its outer VM) with the arguments below.
pub const STORAGE_DAEMON_BINARY: &str = STORAGE_DAEMON.binary;
/// See [`STORAGE_DAEMON_BINARY`].
pub const TESTPMD_BINARY: &str = TESTPMD.binary;

/// qemu-storage-daemon's arguments: `image` (a raw file) as node d0, exported writable as
/// vhost-user-blk on the Unix socket `socket`.
pub fn storage_daemon_args(image: &Path, socket: &Path) -> Vec<OsString> {
    let mut blockdev = OsString::from("driver=file,node-name=d0,filename=");
    blockdev.push(image);
    let mut export = OsString::from(
        "type=vhost-user-blk,id=e0,node-name=d0,addr.type=unix,writable=on,addr.path=",
    );
    export.push(socket);
    vec!["--blockdev".into(), blockdev, "--export".into(), export]
}

/// testpmd's arguments: EAL options (no hugepages, no PCI, `prefix` for its runtime files, a
/// `net_vhostN` port per socket with `queues` queue pairs), then testpmd's (icmpecho, started
/// at once, no periodic statistics; the first `polled` pairs of each port polled, testpmd's
/// default being the first only).
pub fn testpmd_args(sockets: &[PathBuf], queues: u16, polled: u16, prefix: &str) -> Vec<OsString> {
    let mut args = eal_args(prefix);
    for (i, socket) in sockets.iter().enumerate() {
        let mut vdev = OsString::from(format!("net_vhost{i},iface="));
        vdev.push(socket);
        vdev.push(format!(",queues={queues}"));
        args.extend(["--vdev".into(), vdev]);
    }
    args.extend(
        [
            "--",
            "--total-num-mbufs=8192",
            "--forward-mode=icmpecho",
            "--auto-start",
            "--stats-period=0",
        ]
        .map(OsString::from),
    );
    if polled > 1 {
        args.extend([
            format!("--rxq={polled}").into(),
            format!("--txq={polled}").into(),
        ]);
    }
    args
}

/// testpmd's arguments for a forwarder between a vhost-user NIC and the host's stack: a
/// `net_vhost0` port on `socket` (one queue pair) and a `net_tap0` port, which makes the host's
/// tap interface `tap`, frames passed between the two as they are (io forwarding, started at
/// once). No offload is done on the way: a driver that leaves checksums to the device must
/// be told not to (`ethtool -K eth0 tx off`).
pub fn testpmd_tap_forwarder_args(socket: &Path, tap: &str, prefix: &str) -> Vec<OsString> {
    let mut args = eal_args(prefix);
    let mut vhost = OsString::from("net_vhost0,iface=");
    vhost.push(socket);
    args.extend(["--vdev".into(), vhost]);
    args.extend(["--vdev".into(), format!("net_tap0,iface={tap}").into()]);
    args.extend(
        [
            "--",
            "--total-num-mbufs=8192",
            "--forward-mode=io",
            "--auto-start",
            "--stats-period=0",
        ]
        .map(OsString::from),
    );
    args
}

/// The EAL options every testpmd here takes: no hugepages (1 GiB of ordinary memory), no PCI,
/// `prefix` for its runtime files.
fn eal_args(prefix: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["--no-huge", "-m", "1024", "--no-pci"]
        .map(OsString::from)
        .into();
    args.push(format!("--file-prefix={prefix}").into());
    args
}

/// DPDK's runtime directory for `prefix` (EAL's eal_get_runtime_dir: /var/run/dpdk for root,
/// else $XDG_RUNTIME_DIR/dpdk or /tmp/dpdk), which testpmd leaves behind even on a clean exit.
fn dpdk_runtime_dir(prefix: &str) -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let base = match std::env::var_os("XDG_RUNTIME_DIR") {
        _ if root => PathBuf::from("/var/run"),
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from("/tmp"),
    };
    base.join("dpdk").join(prefix)
}

/// A running backend: stopped, reaped and its sockets removed when dropped.
pub struct Backend {
    binary: &'static str,
    child: Child,
    /// testpmd's stdin, held open: it exits at EOF.
    stdin: Option<ChildStdin>,
    sockets: Vec<PathBuf>,
    log: PathBuf,
    /// A directory the program leaves behind, removed after it exits.
    leftover: Option<PathBuf>,
}

impl Backend {
    /// qemu-storage-daemon serving `image` as a writable vhost-user-blk device on `socket`.
    pub fn storage_daemon(image: &Path, socket: &Path) -> Result<Backend, BackendError> {
        Backend::storage_daemon_queues(image, socket, 1)
    }

    /// The same with `queues` virtqueues on the export (its `num-queues`).
    pub fn storage_daemon_queues(
        image: &Path,
        socket: &Path,
        queues: u16,
    ) -> Result<Backend, BackendError> {
        let binary = STORAGE_DAEMON.find()?;
        let mut cmd = Command::new(binary);
        let mut args = storage_daemon_args(image, socket);
        args[3].push(format!(",num-queues={queues}"));
        cmd.args(args);
        Backend::start(&STORAGE_DAEMON, cmd, vec![socket.to_owned()], None)
    }

    /// testpmd answering ARP and ICMP echo on one vhost-user port per socket, each with
    /// `queues` queue pairs of which it polls the first.
    pub fn testpmd(sockets: &[PathBuf], queues: u16) -> Result<Backend, BackendError> {
        Backend::testpmd_polling(sockets, queues, 1)
    }

    /// The same, polling and answering on every one of the `pairs` queue pairs of each port
    /// (a multiqueue card's; each polled pair holds receive buffers, so not for many ports).
    pub fn testpmd_multiqueue(sockets: &[PathBuf], pairs: u16) -> Result<Backend, BackendError> {
        Backend::testpmd_polling(sockets, pairs, pairs)
    }

    fn testpmd_polling(
        sockets: &[PathBuf],
        queues: u16,
        polled: u16,
    ) -> Result<Backend, BackendError> {
        static INSTANCE: AtomicU32 = AtomicU32::new(0);
        let binary = TESTPMD.find()?;
        let n = INSTANCE.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("exitless-{}-{n}", std::process::id());
        let mut cmd = Command::new(binary);
        cmd.args(testpmd_args(sockets, queues, polled, &prefix));
        let leftover = Some(dpdk_runtime_dir(&prefix));
        Backend::start(&TESTPMD, cmd, sockets.to_vec(), leftover)
    }

    /// Start `cmd` with its output in a log file, and wait for `sockets`.
    fn start(
        program: &Program,
        mut cmd: Command,
        sockets: Vec<PathBuf>,
        leftover: Option<PathBuf>,
    ) -> Result<Backend, BackendError> {
        let io = |what: String| move |source| BackendError::Start(PeerError::Io { what, source });
        for socket in &sockets {
            // A socket file left by an earlier run would pass the wait below at once.
            let _ = fs::remove_file(socket);
        }
        let log = std::env::temp_dir().join(format!(
            "exitless-{}-{}-{}.log",
            program.binary,
            std::process::id(),
            sockets[0].file_name().unwrap_or_default().to_string_lossy()
        ));
        let out = File::create(&log).map_err(io(format!("create {}", log.display())))?;
        let err = out.try_clone().map_err(io("duplicate a file".into()))?;
        cmd.stdin(Stdio::piped()).stdout(out).stderr(err);
        // SAFETY: the closure runs in the child between fork and exec and only makes prctl,
        // which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                // The backend dies with the thread that started it, even if that is killed.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(io(format!("start {}", program.binary)))?;
        let stdin = child.stdin.take();
        let mut backend = Backend {
            binary: program.binary,
            child,
            stdin,
            sockets,
            log,
            leftover,
        };
        backend.await_sockets()?;
        Ok(backend)
    }

    /// Wait until every socket exists, or fail if the program exits or takes too long.
    fn await_sockets(&mut self) -> Result<(), BackendError> {
        let deadline = Instant::now() + SOCKET_WAIT;
        let is_socket = |p: &PathBuf| fs::metadata(p).is_ok_and(|m| m.file_type().is_socket());
        while !self.sockets.iter().all(is_socket) {
            let why = match self.child.try_wait() {
                Ok(Some(status)) => format!("exited with {status} before its sockets existed"),
                _ if Instant::now() > deadline => {
                    format!("created no socket within {SOCKET_WAIT:?}")
                }
                _ => {
                    thread::sleep(POLL);
                    continue;
                }
            };
            return Err(BackendError::NotServing {
                binary: self.binary,
                why,
                output: self.output(),
            });
        }
        Ok(())
    }

    /// The sockets it serves, in the order given.
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }

    /// What it leaves on disk until it is dropped: its log, its sockets and any directory it
    /// leaves behind. For a caller that cannot drop it (a confined process cannot wait for
    /// it) and has these removed by a helper after it ends.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.log.clone()];
        files.extend(self.sockets.iter().cloned());
        files.extend(self.leftover.iter().cloned());
        files
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Kill it at once (SIGKILL), as a crash would, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Ask it to stop (EOF on stdin, SIGTERM), wait up to STOP_GRACE, then kill it.
    fn stop(&mut self) {
        self.stdin = None;
        if matches!(self.child.try_wait(), Ok(None)) {
            // The pid is our unreaped child's, so it names no other process.
            let pid = self.child.id() as libc::pid_t;
            // SAFETY: kill sends a signal; it touches no memory of ours.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + STOP_GRACE;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            thread::sleep(POLL);
        }
        self.kill();
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
        for socket in &self.sockets {
            let _ = fs::remove_file(socket);
        }
        if let Some(dir) = &self.leftover {
            let _ = fs::remove_dir_all(dir);
        }
        let _ = fs::remove_file(&self.log);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn the_storage_daemon_exports_the_image_writable_on_the_socket() {
        let args = storage_daemon_args(Path::new("/i/disk.img"), Path::new("/s/blk.sock"));
        assert_eq!(
            strings(args),
            [
                "--blockdev",
                "driver=file,node-name=d0,filename=/i/disk.img",
                "--export",
                "type=vhost-user-blk,id=e0,node-name=d0,addr.type=unix,writable=on,\
                 addr.path=/s/blk.sock",
            ]
        );
    }

    #[test]
    fn testpmd_gets_a_vhost_port_per_socket_and_icmpecho_after_the_eal_options() {
        let sockets = [PathBuf::from("/s/a.sock"), PathBuf::from("/s/b.sock")];
        let args = strings(testpmd_args(&sockets, 2, 2, "exitless-7-0"));
        assert_eq!(
            args,
            [
                "--no-huge",
                "-m",
                "1024",
                "--no-pci",
                "--file-prefix=exitless-7-0",
                "--vdev",
                "net_vhost0,iface=/s/a.sock,queues=2",
                "--vdev",
                "net_vhost1,iface=/s/b.sock,queues=2",
                "--",
                "--total-num-mbufs=8192",
                "--forward-mode=icmpecho",
                "--auto-start",
                "--stats-period=0",
                "--rxq=2",
                "--txq=2",
            ]
        );
    }

    #[test]
    fn a_missing_program_is_a_reason_to_print() {
        let missing = Program {
            binary: "exitless-no-such-backend",
            package: "nothing",
        };
        let err = missing.find().unwrap_err();
        assert_eq!(
            err.to_string(),
            "exitless-no-such-backend is not on PATH (Debian: apt-get install nothing)"
        );
    }
}
