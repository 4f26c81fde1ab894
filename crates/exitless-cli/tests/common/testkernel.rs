//! The multiboot test kernel (crates/exitless-guest/testkernel, put beside the binary by build.rs) under
//! `exitless run`, as a user runs it: shared by the tests that boot it (crates/exitless-cli/tests/cli/run.rs,
//! crates/exitless-cli/tests/cli/run_devices.rs, crates/exitless-cli/tests/peers/vhost_user.rs).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The test kernel's `exit=debug` status when every check passed: (0x10 << 1) | 1.
pub const PASSED: i32 = 0x21;
/// `exitless run`'s status for its own errors.
pub const ERROR: i32 = 2;
/// Longest a run of the test kernel may take here (it takes well under a second).
pub const LIMIT: Duration = Duration::from_secs(60);

/// A test kernel image, beside the binary.
pub fn kernel(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name(name)
}

/// What a run printed and how it ended.
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Drain a pipe on a thread, so a child never blocks on a full one.
pub fn drain(mut pipe: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Run `cmd` with `input` on stdin; kill it and fail if it takes longer than `limit`.
pub fn run_command(mut cmd: Command, input: &[u8], limit: Duration) -> Ran {
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
pub fn exitless_run(args: &[&str], input: &[u8]) -> Ran {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_exitless"));
    cmd.arg("run").args(args);
    run_command(cmd, input, LIMIT)
}

/// The test kernel's own check lines ("PASS …" / "FAIL …").
pub fn results(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("PASS ") || l.starts_with("FAIL "))
        .collect()
}

/// The run ended through isa-debug-exit with every check passed, silently on stderr.
pub fn assert_passed(ran: &Ran) {
    assert_passed_saying(ran, "");
}

/// The same, with `stderr` on stderr.
pub fn assert_passed_saying(ran: &Ran, stderr: &str) {
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
pub fn passes(args: &[&str], cmdline: &str) -> Ran {
    let elf = kernel("testkernel.elf");
    let mut all = vec!["--kernel", elf.to_str().unwrap(), "--cmdline", cmdline];
    all.extend_from_slice(args);
    let ran = exitless_run(&all, b"");
    assert_passed(&ran);
    ran
}

/// The first virtio-mmio window `exitless run` gives out (crates/exitless/src/machine/layout.rs), which the test
/// kernel is told of on its command line as Linux is (`virtio_mmio.device=`).
pub const FIRST_MMIO_WINDOW: &str = "virtio_mmio=0xe0100000";

/// The pattern the test kernel writes to sector 1 (round `seed`): byte i is i * 7 + seed.
pub fn pattern(seed: u32) -> Vec<u8> {
    (0..512u32)
        .map(|i| (i * 7 + seed).to_le_bytes()[0])
        .collect()
}
