//! The launcher of `bench restore`'s new-process restores: `exitless bench-restore-launcher`
//! (hidden), started by the bench before its main thread confines itself. A confined process
//! starts no program (its filter allows no execve, and a filter outlives an exec, so a child
//! could not be freed of it), so the bench asks this helper, one JSON line on its stdin per
//! child, to start `exitless bench-restore-child ...` and answer with what the child wrote and
//! when it was started. Like the bench's other helpers (testpmd's cleaner, QEMU) the launcher
//! runs unconfined; it reads only its parent's pipe, starts only this exitless's
//! `bench-restore-child` (which confines itself as any exitless does), and ends at its stdin's
//! end: when the bench exits, however it ends.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::child::{CHILD_COMMAND, monotonic, nanos};

/// The hidden subcommand's name.
pub const LAUNCHER_COMMAND: &str = "bench-restore-launcher";

/// A child the launcher ran.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Launched {
    /// CLOCK_MONOTONIC, in nanoseconds, just before the child was spawned.
    pub spawned: u64,
    /// Its exit status; none: a signal ended it, or it could not be started.
    pub status: Option<i32>,
    /// What it wrote to stdout.
    pub stdout: String,
    /// What it wrote to stderr.
    pub stderr: String,
}

impl Launched {
    /// Why the child failed: the last line of its stderr, else its status.
    pub fn why(&self) -> String {
        match (
            self.stderr.lines().rev().find(|l| !l.trim().is_empty()),
            self.status,
        ) {
            (Some(line), _) => line.trim().to_owned(),
            (None, Some(status)) => format!("it exited with status {status} and said nothing"),
            (None, None) => "a signal ended it".into(),
        }
    }
}

/// The running launcher: its stdin (requests) and stdout (answers), one request at a time.
pub struct Launcher {
    pipes: Mutex<(ChildStdin, BufReader<ChildStdout>)>,
    /// Not waited for: a confined process may not reap it; it ends at its stdin's end.
    _process: Child,
}

impl Launcher {
    /// Start the launcher (this exitless's own binary); before the main thread's filter.
    pub fn start() -> Result<Launcher, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this exitless's binary: {e}"))?;
        let mut process = Command::new(exe)
            .arg(LAUNCHER_COMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start exitless {LAUNCHER_COMMAND}: {e}"))?;
        let pipes = (process.stdin.take())
            .zip(process.stdout.take().map(BufReader::new))
            .expect("both piped");
        Ok(Launcher {
            pipes: Mutex::new(pipes),
            _process: process,
        })
    }

    /// Have the launcher run this exitless with `args` (`bench-restore-child ...`) and wait
    /// for its end.
    pub(super) fn launch(&self, args: &[String]) -> Result<Launched, String> {
        let mut pipes = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
        let request = serde_json::to_string(args).expect("strings encode") + "\n";
        let lost = |e: std::io::Error| format!("the launcher is gone: {e}");
        pipes.0.write_all(request.as_bytes()).map_err(lost)?;
        let mut answer = String::new();
        match pipes.1.read_line(&mut answer).map_err(lost)? {
            0 => Err("the launcher ended (its error is above)".into()),
            _ => serde_json::from_str(&answer).map_err(|e| format!("the launcher's answer: {e}")),
        }
    }
}

/// The launcher's work (`exitless bench-restore-launcher`): for each request line on stdin,
/// run this exitless with its arguments, and answer with a [`Launched`] line on stdout.
pub fn serve_launcher() -> Result<(), String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find this exitless's binary: {e}"))?;
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("cannot read a request: {e}"))?;
        let args: Vec<String> = serde_json::from_str(&line)
            .map_err(|e| format!("a request is not a JSON list of arguments: {e}"))?;
        if args.first().map(String::as_str) != Some(CHILD_COMMAND) {
            return Err(format!("{LAUNCHER_COMMAND} starts `{CHILD_COMMAND}` only"));
        }
        let spawned = nanos(monotonic());
        let launched = match Command::new(&exe).args(&args).stdin(Stdio::null()).output() {
            Ok(o) => Launched {
                spawned,
                status: o.status.code(),
                stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            },
            Err(e) => Launched {
                spawned,
                status: None,
                stdout: String::new(),
                stderr: format!("cannot start {}: {e}", exe.display()),
            },
        };
        let answer = serde_json::to_string(&launched).expect("strings encode") + "\n";
        (out.write_all(answer.as_bytes()).and_then(|()| out.flush()))
            .map_err(|e| format!("cannot answer: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_child_is_named_by_its_last_line_else_its_status() {
        let launched = |status, stderr: &str| Launched {
            spawned: 1,
            status,
            stdout: String::new(),
            stderr: stderr.into(),
        };
        let why = launched(Some(2), "a log line\nexitless: error: cannot open x\n\n").why();
        assert_eq!(why, "exitless: error: cannot open x");
        let why = launched(Some(1), "").why();
        assert_eq!(why, "it exited with status 1 and said nothing");
        assert_eq!(launched(None, " \n").why(), "a signal ended it");
    }
}
