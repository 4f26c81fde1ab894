//! Running `exitless run` in the background and driving it through `exitless ctl`, as the
//! snapshot tests do: a guest interrupted mid-work, snapshotted, and restored in a new process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use exitless_peer::PeerError;
use exitless_peer::backends::{Backend, BackendError};

use super::testkernel::{LIMIT, PASSED, kernel};

/// A fresh folder for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("exitless-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An `exitless run` in the background with its console in `DIR/NAME.console` and its API on
/// `DIR/NAME.sock`.
pub struct Running {
    pub child: Child,
    pub socket: PathBuf,
    pub console: PathBuf,
}

impl Running {
    pub fn start(dir: &Path, name: &str, args: &[&str]) -> Running {
        Running::start_in(None, dir, name, args)
    }

    /// [`Running::start`] in the network namespace `netns`, if given.
    pub fn start_in(netns: Option<&str>, dir: &Path, name: &str, args: &[&str]) -> Running {
        let socket = dir.join(format!("{name}.sock"));
        let console = dir.join(format!("{name}.console"));
        let exitless = env!("CARGO_BIN_EXE_exitless");
        let mut command = match netns {
            Some(ns) => {
                let mut ip = Command::new("ip");
                ip.args(["netns", "exec", ns, exitless]);
                ip
            }
            None => Command::new(exitless),
        };
        let child = command
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

    /// The numbers of the console's lines so far that start with `prefix` (see [`numbers`]).
    pub fn lines(&self, prefix: &str) -> Vec<u32> {
        numbers(
            &std::fs::read_to_string(&self.console).unwrap_or_default(),
            prefix,
        )
    }

    /// Wait until the console holds `lines` lines starting with `prefix` and a number.
    pub fn wait_for_lines(&mut self, prefix: &str, lines: usize) {
        let deadline = Instant::now() + LIMIT;
        while self.lines(prefix).len() < lines {
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

    /// `exitless ctl --api-socket SOCKET ARGS`, as it ended.
    pub fn ctl_output(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_exitless"))
            .arg("ctl")
            .arg("--api-socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// `exitless ctl` with `args`, which must succeed: its JSON answer.
    pub fn ctl(&self, args: &[&str]) -> serde_json::Value {
        let out = self.ctl_output(args);
        assert!(out.status.success(), "ctl {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).expect("the answer is JSON")
    }

    /// Wait for the run to end: its status, stderr and console.
    pub fn end(mut self) -> (i32, String, String) {
        let deadline = Instant::now() + LIMIT;
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("exitless still ran after {LIMIT:?}");
            }
            thread::sleep(Duration::from_millis(20));
        }
        let status = self.child.wait().unwrap();
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        let console = std::fs::read_to_string(&self.console).unwrap_or_default();
        (status.code().expect("an exit"), stderr, console)
    }
}

/// A test that fails midway leaves no VM running behind it.
impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().is_ok_and(|ended| ended.is_none()) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The numbers of the lines in `text` that start with `prefix` and a six-digit number (the
/// test kernel's `spam 000001 of ...`, `disk round 000001 of ...`).
pub fn numbers(text: &str, prefix: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix)?.get(..6)?.parse().ok())
        .collect()
}

/// The names in `dir`, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `vm` (the test kernel printing numbered lines) paused, snapshotted into `snap` and shut
/// down: its console up to then.
pub fn snapshotted_and_shut_down(vm: Running, snap: &Path) -> String {
    assert_eq!(vm.ctl(&["pause"])["state"], "paused");
    let taken = vm.ctl(&["snapshot", snap.to_str().unwrap()]);
    assert_eq!(
        taken["state"], "paused",
        "a paused VM stays paused: {taken}"
    );
    vm.ctl(&["shutdown"]);
    let (status, stderr, before) = vm.end();
    assert_eq!(status, 0, "{stderr}");
    before
}

/// Restore `snap` in a new process (console and socket named `NAME` in `dir`) and let it end:
/// it passes, and with `before` (the console before the snapshot) the console holds each of
/// the `lines` numbered lines once, in order.
pub fn restored_with_every_line(dir: &Path, name: &str, snap: &Path, before: &str, lines: u32) {
    let restored = Running::start(dir, name, &["--restore", snap.to_str().unwrap()]);
    let (status, stderr, after) = restored.end();
    assert_eq!(status, PASSED, "{stderr}\n{after}");
    every_line(before, &after, lines);
}

/// The consoles `before` a snapshot and `after` its restore hold each of the `lines` numbered
/// lines once, in order (a line the snapshot cut is ended by the restored run).
pub fn every_line(before: &str, after: &str, lines: u32) {
    let all = numbers(&(before.to_owned() + after), "spam ");
    assert_eq!(
        all,
        (1..=lines).collect::<Vec<_>>(),
        "every line once, in order"
    );
}

/// The test kernel printing `lines` numbered lines on two vCPUs.
pub fn spamming(dir: &Path, name: &str, lines: u32) -> Running {
    let args = spam_args(lines);
    Running::start(
        dir,
        name,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
}

/// `exitless run`'s arguments for the test kernel printing `lines` numbered lines on two
/// vCPUs.
pub fn spam_args(lines: u32) -> Vec<String> {
    let elf = kernel("testkernel.elf");
    [
        "--kernel",
        elf.to_str().unwrap(),
        "--cmdline",
        &format!("spam={lines} cpus=2"),
        "--cpus",
        "2",
    ]
    .map(String::from)
    .to_vec()
}

/// The backend, or `None` after printing why the test skips: only a missing binary does.
pub fn started(backend: Result<Backend, BackendError>) -> Option<Backend> {
    match backend {
        Ok(b) => Some(b),
        Err(BackendError::Start(why @ PeerError::NotFound { .. })) => {
            println!("skipped: {why}");
            None
        }
        Err(e) => panic!("the backend did not start: {e}"),
    }
}

/// Run `exitless run ARGS` (in `netns` if given) until the guest has printed a few of its
/// `rounds` lines starting with `prefix`, pause, snapshot it into `dir/snap0`, shut it down,
/// and restore it in a new process: it passes, and the two consoles hold each round once, in
/// order, none failed.
pub fn interrupted_and_restored(
    netns: Option<&str>,
    dir: &Path,
    args: &[&str],
    prefix: &str,
    rounds: u32,
) {
    interrupted_times(netns, dir, (args, prefix, rounds), 1);
}

/// The same `times` over: each process restored is in turn snapshotted a few lines on (into
/// `dir/snapN`) and shut down, the last one runs to the end; every console together holds
/// each round once, in order. More snapshots, more moments of the guest's work caught.
pub fn interrupted_times(
    netns: Option<&str>,
    dir: &Path,
    (args, prefix, rounds): (&[&str], &str, u32),
    times: usize,
) {
    let mut consoles = String::new();
    let mut from: Option<PathBuf> = None;
    for n in 0..=times {
        let restore;
        let args = match &from {
            None => args,
            Some(snap) => {
                restore = ["--restore", snap.to_str().unwrap()];
                &restore[..]
            }
        };
        let mut run = Running::start_in(netns, dir, &format!("run{n}"), args);
        if n == times {
            let (status, stderr, last) = run.end();
            assert_eq!(status, PASSED, "{stderr}\n{last}");
            assert!(
                !last.contains("FAILED") && last.contains(" passed, 0 failed"),
                "{last}"
            );
            consoles += &last;
            break;
        }
        run.wait_for_lines(prefix, 5);
        let snap = dir.join(format!("snap{n}"));
        assert_eq!(run.ctl(&["pause"])["state"], "paused");
        run.ctl(&["snapshot", snap.to_str().unwrap()]);
        run.ctl(&["shutdown"]);
        let (status, stderr, console) = run.end();
        assert_eq!(status, 0, "{stderr}");
        consoles += &console;
        let done = numbers(&consoles, prefix).len();
        assert!(done < rounds as usize, "snapshot {n} caught it mid-work");
        from = Some(snap);
    }
    assert_eq!(
        numbers(&consoles, prefix),
        (1..=rounds).collect::<Vec<_>>(),
        "every round once, in order"
    );
}
