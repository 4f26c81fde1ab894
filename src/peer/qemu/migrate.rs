//! The probe migrated by QEMU itself (`bench restore --against qemu`): a first QEMU boots it
//! with a QMP socket, is told to `migrate` to a file (`exec:cat > FILE`; QEMU 7.2 has no
//! `file:` URI) once the probe runs its ops, and is stopped; a second QEMU, the same command
//! line with `-incoming exec:cat FILE`, loads it and runs the probe on to its end. The resume
//! time is the second process's start to QMP `query-status` answering `running` (QEMU starts
//! the guest itself once the incoming migration completes).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use serde_json::{Value, json};

use super::{Duration, Instant, Op, TempDir, fs, thread};
use super::{PeerError, PeerRun, Qemu, QemuMachine, RunFiles, Running, io, read_lossy, wait};
use zerocopy::IntoBytes;

/// What the serial port shows once the probe runs its ops.
const RUNNING: &str = "exitless probe: running";
/// ... and once it has ended them.
const DONE: &str = "exitless probe: done";

/// A migration of the probe under QEMU and its resume.
#[derive(Debug)]
pub struct QemuResume {
    /// The second QEMU's start to its guest running.
    pub start_to_running: Duration,
    /// The first QEMU's `migrate` to `completed`.
    pub migrate: Duration,
    /// The migration file's length.
    pub file_bytes: u64,
    /// Whether the probe was running its ops when migrated: started them, not yet ended.
    pub mid_ops: bool,
    /// What the probe reported at its end, under the second QEMU.
    pub run: PeerRun,
}

/// A QMP connection (QEMU's JSON lines over a Unix socket), capabilities negotiated.
struct Qmp(BufReader<UnixStream>);

impl Qmp {
    /// Connect to `path` (retrying until QEMU has made it, up to `deadline`).
    fn connect(path: &std::path::Path, deadline: Instant) -> Result<Qmp, PeerError> {
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(io("connect to QMP")(e)),
                Err(_) => thread::sleep(Duration::from_millis(1)),
            }
        };
        let mut qmp = Qmp(BufReader::new(stream));
        qmp.line()?; // the greeting
        qmp.execute("qmp_capabilities", json!({}))?;
        Ok(qmp)
    }

    fn line(&mut self) -> Result<Value, PeerError> {
        let mut line = String::new();
        self.0.read_line(&mut line).map_err(io("read QMP"))?;
        serde_json::from_str(&line).map_err(|e| io("parse QMP")(std::io::Error::other(e)))
    }

    /// Run `command` and return its `return`, events before it skipped.
    fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, PeerError> {
        let request = json!({"execute": command, "arguments": arguments}).to_string() + "\n";
        self.0
            .get_mut()
            .write_all(request.as_bytes())
            .map_err(io("write QMP"))?;
        loop {
            let answer = self.line()?;
            if let Some(r) = answer.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = answer.get("error") {
                let why = format!("QMP {command}: {e}");
                return Err(io("use QMP")(std::io::Error::other(why)));
            }
        }
    }

    /// Poll `command` every millisecond until `field` of its answer is `want` (an error if it
    /// becomes `failed`, or `deadline` passes).
    fn until(
        &mut self,
        command: &str,
        field: &str,
        want: &str,
        deadline: Instant,
    ) -> Result<(), PeerError> {
        loop {
            let answer = self.execute(command, json!({}))?;
            match answer[field].as_str() {
                Some(s) if s == want => return Ok(()),
                Some("failed") => {
                    let why = format!("QMP {command}: {answer}");
                    return Err(io("migrate")(std::io::Error::other(why)));
                }
                _ if Instant::now() >= deadline => {
                    let why = format!("QMP {command} still says {answer}");
                    return Err(io("wait for QEMU")(std::io::Error::other(why)));
                }
                _ => thread::sleep(Duration::from_millis(1)),
            }
        }
    }
}

impl Qemu {
    /// Boot the probe on `machine` with `ops`, migrate it to a file `settle` after it starts
    /// its ops, and resume it in a second QEMU, which runs it to its end.
    pub fn migrate_probe(
        &self,
        machine: &QemuMachine,
        ops: &[Op],
        settle: Duration,
        timeout: Duration,
    ) -> Result<QemuResume, PeerError> {
        machine.check()?;
        let dir = TempDir::new_with_prefix("/tmp/exitless-qemu-")
            .map_err(|e| io("create a temporary directory")(e.into()))?;
        let (source, target) = (dir.as_path().join("source"), dir.as_path().join("target"));
        let state = dir.as_path().join("state.bin");
        let deadline = Instant::now() + timeout;
        let mut files = Vec::new();
        for d in [&source, &target] {
            fs::create_dir(d).map_err(io("create a run folder"))?;
            let f = RunFiles::in_dir(d);
            fs::write(&f.image, super::PROBE_IMAGE).map_err(io("write the probe image"))?;
            fs::write(&f.ops, ops.as_bytes()).map_err(io("write the ops file"))?;
            files.push(f);
        }
        let qmp_arg =
            |d: &std::path::Path| format!("unix:{},server=on,wait=off", d.join("qmp").display());
        let mut cmd = self.command(machine, &files[0])?;
        let first = Running(
            cmd.arg("-qmp")
                .arg(qmp_arg(&source))
                .spawn()
                .map_err(io("run QEMU"))?,
        );
        let mut qmp = Qmp::connect(&source.join("qmp"), deadline)?;
        while !read_lossy(&files[0].serial).contains(RUNNING) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(settle);
        let migrating = Instant::now();
        let uri = format!("exec:cat > {}", state.display());
        qmp.execute("migrate", json!({ "uri": uri }))?;
        qmp.until("query-migrate", "status", "completed", deadline)?;
        let migrate = migrating.elapsed();
        let before = read_lossy(&files[0].serial);
        let mid_ops = before.contains(RUNNING) && !before.contains(DONE);
        drop((qmp, first));
        let file_bytes = fs::metadata(&state)
            .map_err(io("read the migration file"))?
            .len();
        let mut cmd = self.command(machine, &files[1])?;
        cmd.arg("-qmp").arg(qmp_arg(&target));
        cmd.arg("-incoming")
            .arg(format!("exec:cat {}", state.display()));
        let started = Instant::now();
        let second = Running(cmd.spawn().map_err(io("run QEMU"))?);
        Qmp::connect(&target.join("qmp"), deadline)?.until(
            "query-status",
            "status",
            "running",
            deadline,
        )?;
        let start_to_running = started.elapsed();
        let status = wait(second, deadline).map_err(io("wait for QEMU"))?;
        let serial = read_lossy(&files[1].serial);
        let run = self.ended(
            status,
            serial,
            &files[1],
            ops.len(),
            started.elapsed(),
            timeout,
        )?;
        Ok(QemuResume {
            start_to_running,
            migrate,
            file_bytes,
            mid_ops,
            run,
        })
    }
}
