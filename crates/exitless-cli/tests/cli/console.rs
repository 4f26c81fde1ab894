//! `exitless run`'s console as an operator meets it (the binary, seccomp on, the multiboot test
//! kernel): a reader that pauses loses nothing, `--console-drop` says what it dropped, a console
//! target that cannot be written is refused at start, the last log survives a refused run, a
//! disk is never the console, a write that fails mid-run is reported, and a console file may
//! have any name (not only UTF-8).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The test kernel's `exit=debug` status when every check passed: (0x10 << 1) | 1.
const PASSED: i32 = 0x21;
/// `exitless run`'s status for its own errors.
const ERROR: i32 = 2;
/// Lines the guest prints with `spam=`: 4000 lines of 67 bytes, four times the 64 KiB each of
/// the pipe, the console thread's batch and its queue hold.
const SPAM: usize = 4000;
const SPAM_LINE: usize = 67;

fn exitless() -> &'static str {
    env!("CARGO_BIN_EXE_exitless")
}

/// The test kernel, beside the binary.
fn kernel() -> PathBuf {
    Path::new(exitless()).with_file_name("testkernel.elf")
}

/// `exitless run --kernel testkernel.elf ARGS`, stdin empty, stdout and stderr piped.
fn start(args: &[&str]) -> Child {
    Command::new(exitless())
        .arg("run")
        .arg("--kernel")
        .arg(kernel())
        .args(["--timeout", "300"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("exitless starts")
}

/// Read a pipe to its end on a thread.
fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    })
}

/// Whether `child` ended within `limit`.
fn ends_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A run's status, stdout and stderr, read as it goes.
fn run(args: &[&str]) -> (ExitStatus, String, String) {
    let mut child = start(args);
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    assert!(
        ends_within(&mut child, Duration::from_secs(300)),
        "{args:?} hung"
    );
    let status = child.wait().unwrap();
    (status, out.join().unwrap(), err.join().unwrap())
}

fn spam_line(i: usize) -> String {
    format!("spam {i:06} of {SPAM:06}: the quick brown fox jumps over the lazy dog")
}

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("exitless-console-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A refusal: status 2 and one line on stderr that contains `says`.
fn assert_refused(status: ExitStatus, stderr: &str, says: &str) {
    assert_eq!(status.code(), Some(ERROR), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

/// A run with `spam=SPAM` and `args` whose stdout nobody reads until it ends or `unread_for`
/// passes; whether it ended unread, its status, stdout and stderr.
fn spam_run(args: &[&str], unread_for: Duration) -> (bool, ExitStatus, String, String) {
    let spam = format!("spam={SPAM}");
    let mut child = start(&[&["--cmdline", spam.as_str()], args].concat());
    let err = drain(child.stderr.take().unwrap());
    let ended_unread = ends_within(&mut child, unread_for);
    let mut out = String::new();
    let mut stdout = child.stdout.take().unwrap();
    stdout.read_to_string(&mut out).unwrap();
    let status = child.wait().unwrap();
    (ended_unread, status, out, err.join().unwrap())
}

#[test]
fn a_reader_that_pauses_gets_every_line_in_order() {
    // Nobody reads stdout for a while: the guest is held back rather than losing output (it
    // would have finished and exited by then if it were not).
    let (ended_unread, status, out, err) = spam_run(&[], Duration::from_secs(20));
    let got: Vec<&str> = out.lines().filter(|l| l.starts_with("spam ")).collect();
    let want: Vec<String> = (1..=SPAM).map(spam_line).collect();
    assert!(
        got == want,
        "{} of {SPAM} lines arrived (run ended unread: {ended_unread}); stderr: {err}",
        got.len()
    );
    let last = out.lines().last().unwrap_or_default();
    assert!(last.ends_with("passed, 0 failed"), "the last line: {last}");
    assert_eq!(status.code(), Some(PASSED), "{err}");
    assert!(!err.contains("lost"), "{err}");
}

#[test]
fn console_drop_never_holds_the_guest_and_says_what_it_dropped() {
    // Nobody reads stdout until the run has ended: it ends all the same.
    let (ended_unread, status, out, err) = spam_run(&["--console-drop"], Duration::from_secs(300));
    assert!(ended_unread, "held back");
    assert_eq!(status.code(), Some(PASSED), "{err}");
    let summary: Vec<&str> = err.lines().filter(|l| l.contains("output lost")).collect();
    assert_eq!(summary.len(), 1, "one line at exit: {err}");
    let dropped: usize = summary[0]
        .split("lost: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count: {}", summary[0]));
    // What arrived and what was dropped make up what the guest wrote: the spam and a couple
    // of kilobytes of checks.
    let wrote = out.len() + dropped;
    assert!(
        (SPAM * SPAM_LINE..SPAM * SPAM_LINE + 4096).contains(&wrote),
        "{} arrived + {dropped} dropped",
        out.len()
    );
}

#[test]
fn a_console_that_cannot_be_written_is_refused_at_start() {
    let (status, _, err) = run(&["--console", "/dev/full"]);
    assert_refused(status, &err, "--console /dev/full: cannot be written");
    let (status, _, err) = run(&["--console", "/proc/version"]);
    assert_refused(status, &err, "/proc/version");
    let dir = scratch("fifo");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path it is given.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let (status, _, err) = run(&["--console", fifo.to_str().unwrap()]);
    assert_refused(status, &err, "a FIFO that no process reads");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_console_file_may_have_any_name_a_kernel_may() {
    use std::os::unix::ffi::OsStrExt;
    let dir = scratch("name");
    let log = dir.join(std::ffi::OsStr::from_bytes(b"console-\xff.log"));
    let status = Command::new(exitless())
        .arg("run")
        .arg("--kernel")
        .arg(kernel())
        .args(["--timeout", "300", "--console"])
        .arg(&log)
        .stdin(Stdio::null())
        .status()
        .expect("exitless starts");
    assert_eq!(status.code(), Some(PASSED), "the test kernel's checks pass");
    let written = std::fs::read_to_string(&log).expect("the console file");
    assert!(written.contains("testkernel:"), "{written}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_refused_run_leaves_the_last_console_log() {
    let dir = scratch("keep");
    let log = dir.join("console.log");
    std::fs::write(&log, "the last run's log\n").unwrap();
    let missing = dir.join("missing.img");
    let (status, _, err) = run(&[
        "--console",
        log.to_str().unwrap(),
        "--disk",
        missing.to_str().unwrap(),
    ]);
    assert_refused(status, &err, "missing.img");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "the last run's log\n"
    );
    // And where there was none, a refused run leaves none (once, an empty file).
    let new = dir.join("new.log");
    let (status, _, err) = run(&[
        "--console",
        new.to_str().unwrap(),
        "--disk",
        missing.to_str().unwrap(),
    ]);
    assert_refused(status, &err, "missing.img");
    assert!(!new.exists(), "no console file made");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_disk_image_is_never_the_console() {
    let dir = scratch("disk");
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![0x5a; 1 << 16]).unwrap();
    let link = dir.join("console.log");
    std::os::unix::fs::symlink(&image, &link).unwrap();
    let (status, _, err) = run(&[
        "--console",
        link.to_str().unwrap(),
        "--disk",
        image.to_str().unwrap(),
    ]);
    assert_refused(status, &err, "is also the disk image");
    assert_eq!(std::fs::read(&image).unwrap(), vec![0x5a; 1 << 16]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_console_write_that_fails_is_reported_once_and_at_exit() {
    let dir = scratch("full");
    let log = dir.join("console.log");
    // A file system with 4 KiB left, as far as this process can tell: RLIMIT_FSIZE makes a
    // write past it fail with EFBIG (SIGXFSZ ignored, as setrlimit(2) says).
    let script = format!(
        "trap '' XFSZ; ulimit -f 4; exec {} run --kernel {} --cmdline spam=200 --console {}",
        exitless(),
        kernel().display(),
        log.display()
    );
    let out = Command::new("bash")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(PASSED), "{err}");
    assert_eq!(std::fs::metadata(&log).unwrap().len(), 4096);
    let at_failure: Vec<&str> = err.lines().filter(|l| l.contains("cannot write")).collect();
    assert_eq!(at_failure.len(), 1, "once: {err}");
    let at_exit: Vec<&str> = err.lines().filter(|l| l.contains("output lost")).collect();
    assert_eq!(at_exit.len(), 1, "at exit: {err}");
    assert!(at_exit[0].contains("not written: File too large"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
