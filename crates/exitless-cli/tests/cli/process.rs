//! `exitless run` as a process among others: its stderr may be unwritable, it may be started
//! in the background with SIGINT ignored, its core dump should not hold the guest, and its
//! options mean what their Unix namesakes mean.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The test kernel's `exit=debug` status when every check passed: (0x10 << 1) | 1.
const PASSED: i32 = 0x21;
/// `exitless run`'s status for its own errors.
const ERROR: i32 = 2;
/// What the test kernel prints when, with `echo=1`, it starts waiting (10 s) for a line.
const WAITING: &str = "echo: type a line";

fn exitless() -> Command {
    Command::new(env!("CARGO_BIN_EXE_exitless"))
}

/// A test kernel image, beside the binary.
fn kernel() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("testkernel.elf")
}

/// The write end of a pipe whose read end is closed: every write fails with EPIPE.
fn closed_pipe() -> OwnedFd {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which are then owned here.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are open descriptors nothing else owns.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    write
}

#[test]
fn an_error_line_that_cannot_be_written_still_ends_with_status_2() {
    let bad: [&[&str]; 3] = [
        &["run", "--kernel", "/nonexistent/kernel"],
        &["--bad-option"],
        &["run", "--kernel", "/nonexistent/kernel", "--memory", "lots"],
    ];
    for args in bad {
        let sinks: [(&str, Stdio); 2] = [
            (
                "/dev/full",
                std::fs::File::create("/dev/full").unwrap().into(),
            ),
            ("a closed pipe", closed_pipe().into()),
        ];
        for (sink, stderr) in sinks {
            // RUST_BACKTRACE asks std's panic hook for a backtrace, which no filter allows.
            let status = exitless()
                .args(args)
                .env("RUST_BACKTRACE", "1")
                .stdout(Stdio::null())
                .stderr(stderr)
                .status()
                .unwrap();
            assert_eq!(status.code(), Some(ERROR), "{args:?}, stderr on {sink}");
        }
    }
}

/// `exitless run` of the test kernel with `cmdline` and `args`, its console on a pipe read
/// here, stdin a pipe kept open, `ignored` ignored as a script's background job has SIGINT.
fn spawn_run(cmdline: &str, args: &[&str], ignored: Option<libc::c_int>) -> Child {
    let mut cmd = exitless();
    cmd.arg("run")
        .arg("--kernel")
        .arg(kernel())
        .args(["--cmdline", cmdline])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(signal) = ignored {
        // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
        unsafe {
            cmd.pre_exec(move || {
                libc::signal(signal, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    cmd.spawn().expect("exitless starts")
}

/// Read the child's console until `line`; the console is returned to the caller as a reader
/// still open, so the guest never blocks on it.
fn read_until(child: &mut Child, line: &str) -> BufReader<std::process::ChildStdout> {
    let mut console = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut next = String::new();
        let n = console.read_line(&mut next).unwrap();
        assert!(n > 0, "the console ended before {line:?}:\n{seen}");
        seen.push_str(&next);
        if next.contains(line) {
            return console;
        }
    }
}

#[test]
fn stop_signals_end_a_run_even_when_inherited_ignored() {
    for signal in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM] {
        let mut child = spawn_run("echo=1", &[], Some(signal));
        let _console = read_until(&mut child, WAITING);
        // SAFETY: kill only sends a signal to the child started here.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
        let out = child.wait_with_output().unwrap();
        // Ended by the signal, as a program that does not catch it is: not the guest's
        // status (its echo check fails once its 10 s are up), and with nothing on stderr.
        assert_eq!(
            out.status.signal(),
            Some(signal),
            "signal {signal}: {:?}, stderr {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "signal {signal}");
    }
}

/// Ctrl-\ (SIGQUIT) on a run: it says where each vCPU was, as a run past its `--timeout`
/// does, then ends with 128 + 3, not a core dump: the report is what was asked for.
#[test]
fn sigquit_says_where_the_vcpus_were_then_ends_the_run() {
    let mut child = spawn_run("echo=1", &["--cpus", "2"], None);
    let _console = read_until(&mut child, WAITING);
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill only sends a signal to the child started here.
    let sent = unsafe { libc::kill(pid, libc::SIGQUIT) };
    assert_eq!(sent, 0);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGQUIT), "{stderr}");
    for vcpu in 0..2 {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("exitless: warn: on SIGQUIT vCPU {vcpu} was ")))
            .unwrap_or_else(|| panic!("no report of vCPU {vcpu}: {stderr}"));
        assert!(line.contains(" at RIP 0x"), "{line}");
    }
}

/// Ctrl-Z and `fg`, or a debugger attaching: SIGSTOP then SIGCONT. The kernel resumes each
/// thread's interrupted sleep with restart_syscall(2), which every thread's filter allows, so
/// the run goes on and the guest still reads its line.
#[test]
fn a_stopped_and_continued_run_goes_on() {
    let mut child = spawn_run("echo=1", &[], None);
    let console = read_until(&mut child, WAITING);
    let pid = child.id() as libc::pid_t;
    for signal in [libc::SIGSTOP, libc::SIGCONT] {
        // SAFETY: kill only sends a signal to the child started here.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let mut stdin = child.stdin.take().unwrap();
    // A run that died with the signal has closed its end: the status below says so.
    let _ = stdin.write_all(b"after fg\n");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut console.into_inner(), &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(PASSED),
        "{:?}, stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(rest.contains("PASS echo: read 'after fg'"), "{rest}");
}

#[test]
fn timeout_0_is_no_limit() {
    let out = exitless()
        .arg("run")
        .arg("--kernel")
        .arg(kernel())
        .args(["--timeout", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(PASSED),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn negative_sizes_get_the_ranges_message() {
    for (args, says) in [
        (
            ["--memory", "-5"],
            "exitless: error: --memory -5: a machine needs at least 2 MiB",
        ),
        (["--cpus", "-1"], "exitless: error: --cpus -1: 1 to 64"),
    ] {
        let out = exitless()
            .arg("run")
            .arg("--kernel")
            .arg(kernel())
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(ERROR), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), format!("{says}\n"));
    }
}

/// Size in KiB and VmFlags of each of the child's mappings (/proc/PID/smaps, proc(5)).
fn mappings(pid: u32) -> Vec<(u64, String)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut size = 0;
    let mut all = Vec::new();
    for line in smaps.lines() {
        if let Some(s) = line.strip_prefix("Size:") {
            size = s.trim().trim_end_matches("kB").trim().parse().unwrap();
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            all.push((size, flags.trim().to_owned()));
        }
    }
    all
}

#[test]
fn guest_ram_is_left_out_of_core_dumps_unless_asked() {
    const RAM_KIB: u64 = 48 << 10;
    for (args, dumped) in [(&[][..], false), (&["--dump-guest-memory"][..], true)] {
        let mut child = spawn_run("echo=1", &[&["--memory", "48"], args].concat(), None);
        let _console = read_until(&mut child, WAITING);
        // Guest RAM and whatever the kernel merged with it (an anonymous neighbour with the
        // same flags, when it is dumped).
        let large: Vec<_> = mappings(child.id())
            .into_iter()
            .filter(|&(kib, _)| kib >= RAM_KIB)
            .collect();
        child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(PASSED), "{args:?}");
        let dontdump = |flags: &str| flags.split(' ').any(|f| f == "dd");
        if dumped {
            assert!(
                !large.is_empty() && large.iter().all(|(_, f)| !dontdump(f)),
                "{args:?}: {large:?}"
            );
        } else {
            assert!(
                large.iter().any(|(kib, f)| *kib == RAM_KIB && dontdump(f)),
                "{args:?}: {large:?}"
            );
        }
    }
}

/// `unshare --mount sh -c SCRIPT ARGS…`: SCRIPT in a private mount namespace, where
/// /dev/null is bind-mounted over /dev/kvm.
fn with_null_at_dev_kvm(script: &str) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "sh", "-c"])
        .arg(format!("mount --bind /dev/null /dev/kvm && {script}"));
    cmd
}

#[test]
fn a_kvm_node_that_is_not_kvm_is_named_so() {
    // Needs CAP_SYS_ADMIN (root, in a container that allows unshare); the same check is
    // unit-tested on /dev/null directly (vm::tests).
    let can = with_null_at_dev_kvm("true").stderr(Stdio::null()).status();
    if !can.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot bind-mount /dev/null over /dev/kvm in a mount namespace here");
        return;
    }
    let out = with_null_at_dev_kvm("exec \"$0\" run --kernel \"$1\"")
        .arg(env!("CARGO_BIN_EXE_exitless"))
        .arg(kernel())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(ERROR));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("exitless: error: /dev/kvm is not the KVM device")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
}
