//! The probe migrated by QEMU itself (`bench restore --against qemu`): a first QEMU boots it
//! with a QMP socket, is told to `migrate` to a file (`exec:cat > FILE`; QEMU 7.2 has no
//! `file:` URI) once the probe runs its ops, and is stopped; a second QEMU, the same command
//! line with `-incoming exec:cat FILE`, loads it and runs the probe on to its end. The resume
//! time is the second process's start to QMP `query-status` answering `running` (QEMU starts
//! the guest itself once the incoming migration completes).
//!
//! With a [`Migration::marker`], both QEMUs log, with wall-clock timestamps, the guest's
//! config reads, their run state and their KVM MSI routes (`-trace pci_cfg_read -trace
//! runstate_set -trace kvm_irqchip_add_msi_route -trace kvm_irqchip_commit_routes -D FILE -msg
//! timestamp=on`, QEMU's `log` trace backend: `PID@SECONDS.MICROSECONDS:EVENT ...`): the
//! migration starts once the first QEMU's guest has read the marker register (it is in the
//! window its ops leave for the migration), and each QEMU's reads of it place the guest's
//! steps on either side of the migration, timed from the second process's start: a config
//! read is the one step of the probe that QEMU sees when its devices' rings and interrupts go
//! through a vhost-user backend and KVM.
//!
//! With vhost-user functions, each QEMU hands the backend's sockets on only once the backend
//! has closed its connections (`await_closed`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::SystemTime;

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
    /// With a [`Migration::marker`]: both QEMUs' traces of its reads.
    pub markers: Option<MarkerTraces>,
    /// What the probe reported at its end, under the second QEMU.
    pub run: PeerRun,
}

/// What a migration of the probe runs and waits for.
#[derive(Clone, Debug)]
pub struct Migration<'a> {
    /// The probe's ops, the same for both QEMUs (the second takes them from guest memory).
    pub ops: &'a [Op],
    /// How long after the probe starts its ops (with a marker: after its first read of the
    /// marker) the migration begins.
    pub settle: Duration,
    /// A config register offset that only the ops' migration window reads (by
    /// `ops::cfg_read`), or `None`: no trace.
    pub marker: Option<u16>,
    /// Longest the whole migration, both QEMUs, may take.
    pub timeout: Duration,
}

/// The first QEMU's part: how long `migrate` took, whether the probe was mid-ops, when
/// `migrate` was issued and the first QEMU's trace.
struct Outgoing {
    migrate: Duration,
    mid_ops: bool,
    migrate_at: SystemTime,
    trace: String,
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
    /// Boot the probe on `machine` with `m.ops`, migrate it to a file `m.settle` after it
    /// starts its ops (or reads `m.marker`), and resume it in a second QEMU, which runs it to
    /// its end.
    pub fn migrate_probe(
        &self,
        machine: &QemuMachine,
        m: &Migration,
    ) -> Result<QemuResume, PeerError> {
        machine.check()?;
        let dir = TempDir::new_with_prefix("/tmp/exitless-qemu-")
            .map_err(|e| io("create a temporary directory")(e.into()))?;
        let (source, target) = (dir.as_path().join("source"), dir.as_path().join("target"));
        let state = dir.as_path().join("state.bin");
        let deadline = Instant::now() + m.timeout;
        let mut files = Vec::new();
        for d in [&source, &target] {
            fs::create_dir(d).map_err(io("create a run folder"))?;
            let f = RunFiles::in_dir(d);
            fs::write(&f.image, super::PROBE_IMAGE).map_err(io("write the probe image"))?;
            fs::write(&f.ops, m.ops.as_bytes()).map_err(io("write the ops file"))?;
            files.push(f);
        }
        let out = self.outgoing(machine, m, (&source, &files[0]), &state, deadline)?;
        let file_bytes = fs::metadata(&state)
            .map_err(io("read the migration file"))?
            .len();
        let mut cmd = self.traced(machine, m, (&target, &files[1]))?;
        cmd.arg("-incoming")
            .arg(format!("exec:cat {}", state.display()));
        let (started, wall) = (Instant::now(), SystemTime::now());
        let second = Running(cmd.spawn().map_err(io("run QEMU"))?);
        Qmp::connect(&target.join("qmp"), deadline)?.until(
            "query-status",
            "status",
            "running",
            deadline,
        )?;
        let start_to_running = started.elapsed();
        let status = wait(second, deadline).map_err(io("wait for QEMU"))?;
        // Before the caller may stop the backend or connect anything else to its sockets.
        await_closed(&machine.vhost_user, deadline)?;
        let serial = read_lossy(&files[1].serial);
        let run = self.ended(
            status,
            serial,
            &files[1],
            m.ops.len(),
            started.elapsed(),
            m.timeout,
        )?;
        let markers = m.marker.map(|reg| MarkerTraces {
            source: MarkerTrace::read(&out.trace, reg),
            migrate_at: out.migrate_at,
            started: wall,
            target: MarkerTrace::read(&read_lossy(&files[1].trace), reg),
        });
        Ok(QemuResume {
            start_to_running,
            migrate: out.migrate,
            file_bytes,
            mid_ops: out.mid_ops,
            markers,
            run,
        })
    }

    /// The first QEMU: boot, wait for the probe's ops (and the marker), migrate to `state`,
    /// and stop.
    fn outgoing(
        &self,
        machine: &QemuMachine,
        m: &Migration,
        (dir, files): (&Path, &RunFiles),
        state: &Path,
        deadline: Instant,
    ) -> Result<Outgoing, PeerError> {
        let first = Running(
            (self.traced(machine, m, (dir, files))?)
                .spawn()
                .map_err(io("run QEMU"))?,
        );
        let mut qmp = Qmp::connect(&dir.join("qmp"), deadline)?;
        let ready = || match m.marker {
            Some(reg) => !MarkerTrace::read(&read_lossy(&files.trace), reg)
                .reads
                .is_empty(),
            None => read_lossy(&files.serial).contains(RUNNING),
        };
        while !ready() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(m.settle);
        let (migrating, migrate_at) = (Instant::now(), SystemTime::now());
        let uri = format!("exec:cat > {}", state.display());
        qmp.execute("migrate", json!({ "uri": uri }))?;
        qmp.until("query-migrate", "status", "completed", deadline)?;
        let migrate = migrating.elapsed();
        let before = read_lossy(&files.serial);
        let mid_ops = before.contains(RUNNING) && !before.contains(DONE);
        // Killed and reaped: its ends of the vhost-user connections are closed; the second
        // QEMU connects to the same sockets once the backend has closed its ends too.
        drop((qmp, first));
        await_closed(&machine.vhost_user, deadline)?;
        Ok(Outgoing {
            migrate,
            mid_ops,
            migrate_at,
            trace: read_lossy(&files.trace),
        })
    }

    /// QEMU's command line for one side of the migration: a QMP socket in `dir`, and with a
    /// marker, the trace of the guest's config reads.
    fn traced(
        &self,
        machine: &QemuMachine,
        m: &Migration,
        (dir, files): (&Path, &RunFiles),
    ) -> Result<Command, PeerError> {
        let mut cmd = self.command(machine, files)?;
        cmd.arg("-qmp").arg(format!(
            "unix:{},server=on,wait=off",
            dir.join("qmp").display()
        ));
        if m.marker.is_some() {
            for event in EVENTS {
                cmd.args(["-trace", event]);
            }
            // `-D`: the `log` backend's file (its `-trace file=` is ignored).
            cmd.arg("-D")
                .arg(&files.trace)
                .args(["-msg", "timestamp=on"]);
        }
        Ok(cmd)
    }
}

/// What a QEMU's trace shows of its guest's reads of the marker, and before the first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarkerTrace {
    /// When the guest read the marker, each time.
    pub reads: Vec<SystemTime>,
    /// When QEMU last set its run state to `running` before the first read (`runstate_set`;
    /// QMP's answer, polled, comes a little later).
    pub running: Option<SystemTime>,
    /// MSI routes QEMU added to its KVM routing table before the first read
    /// (`kvm_irqchip_add_msi_route`).
    pub routes: u32,
    /// Its commits of the table to KVM before the first read (`kvm_irqchip_commit_routes`).
    pub commits: u32,
}

/// Both QEMUs' traces of the marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkerTraces {
    /// The first QEMU's.
    pub source: MarkerTrace,
    /// When `migrate` was sent to the first QEMU.
    pub migrate_at: SystemTime,
    /// When the second QEMU was started.
    pub started: SystemTime,
    /// The second QEMU's.
    pub target: MarkerTrace,
}

impl MarkerTraces {
    /// Time from the second QEMU's start to `at`.
    pub fn since_start(&self, at: SystemTime) -> Duration {
        at.duration_since(self.started).unwrap_or_default()
    }
}

/// The trace events enabled with a marker.
const EVENTS: [&str; 4] = [
    "pci_cfg_read",
    "runstate_set",
    "kvm_irqchip_add_msi_route",
    "kvm_irqchip_commit_routes",
];

impl MarkerTrace {
    /// Read a trace `log` (lines `PID@SECONDS.MICROSECONDS:EVENT ARGS`) for the guest's reads
    /// of config register `reg` (`pci_cfg_read DEVICE BUS:SLOT.FN @0xREG -> 0xVALUE`).
    fn read(log: &str, reg: u16) -> MarkerTrace {
        let needle = format!(" @{reg:#x} ->");
        let mut t = MarkerTrace::default();
        for line in log.lines() {
            let Some((stamp, event)) = line.split_once('@').and_then(|(_, l)| l.split_once(':'))
            else {
                continue;
            };
            let before = t.reads.is_empty();
            match event.split_once(' ').map_or(event, |(name, _)| name) {
                "kvm_irqchip_add_msi_route" if before => t.routes += 1,
                "kvm_irqchip_commit_routes" if before => t.commits += 1,
                "runstate_set" if before && event.ends_with("(running)") => {
                    t.running = wall_clock(stamp)
                }
                "pci_cfg_read" if event.contains(&needle) => t.reads.extend(wall_clock(stamp)),
                _ => {}
            }
        }
        t
    }
}

/// Wait until the vhost-user backend listening on `sockets` has closed every connection a
/// QEMU made to them (`/proc/net/unix`: an accepted socket is listed with its listener's
/// path, not listening, until the server closes it). A server that takes a new frontend
/// before it has seen the old one go (DPDK's vhost library handles both on its own thread)
/// may tear the new device down with the old one.
fn await_closed(sockets: &[std::path::PathBuf], deadline: Instant) -> Result<(), PeerError> {
    let paths: Vec<String> = sockets.iter().map(|p| p.display().to_string()).collect();
    loop {
        let table = fs::read_to_string("/proc/net/unix").map_err(io("read /proc/net/unix"))?;
        match connected(&table, &paths) {
            0 => return Ok(()),
            n if Instant::now() >= deadline => {
                let why = format!("the backend still holds {n} connections on its sockets");
                return Err(io("hand the vhost-user sockets over")(
                    std::io::Error::other(why),
                ));
            }
            _ => thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Sockets of `/proc/net/unix` (`table`: `Num RefCount Protocol Flags Type St Inode Path`)
/// bound to one of `paths` and not listening: a server's ends of its connections.
fn connected(table: &str, paths: &[String]) -> usize {
    /// `__SO_ACCEPTCON` in the `Flags` column: a listening socket.
    const LISTENING: u32 = 1 << 16;
    let not_listening = |cols: &[&str]| {
        (cols.get(3).and_then(|f| u32::from_str_radix(f, 16).ok()))
            .is_some_and(|f| f & LISTENING == 0)
    };
    (table.lines().skip(1))
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| {
            not_listening(cols) && cols.get(7).is_some_and(|p| paths.contains(&p.to_string()))
        })
        .count()
}

/// A trace line's `SECONDS.MICROSECONDS` (gettimeofday) as a time.
fn wall_clock(stamp: &str) -> Option<SystemTime> {
    let (secs, micros) = stamp.split_once('.')?;
    let at = Duration::from_secs(secs.parse().ok()?) + Duration::from_micros(micros.parse().ok()?);
    SystemTime::UNIX_EPOCH.checked_add(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_gives_every_read_of_the_marker_and_what_came_before_the_first() {
        let log = "4242@1700000000.000100:pci_cfg_read virtio-net-pci 00:02.0 @0x4 -> 0x7\n\
                   4241@1700000000.500000:kvm_irqchip_add_msi_route dev virtio-net-pci vector 0 virq 24\n\
                   4241@1700000000.500001:kvm_irqchip_add_msi_route dev virtio-net-pci vector 1 virq 25\n\
                   4241@1700000000.500002:kvm_irqchip_commit_routes \n\
                   4241@1700000000.600000:runstate_set current_run_state 1 (inmigrate) \
                   new_state 9 (running)\n\
                   4242@1700000001.250000:pci_cfg_read virtio-net-pci 00:02.0 @0x3e -> 0x0\n\
                   4241@1700000001.500002:kvm_irqchip_commit_routes \n\
                   garbage @0x3e -> 1\n\
                   4242@1700000002.000000:pci_cfg_read virtio-net-pci 00:02.0 @0x3e -> 0x0\n";
        let t = MarkerTrace::read(log, 0x3e);
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(t.reads, [at(1_700_000_001_250), at(1_700_000_002_000)]);
        assert_eq!((t.routes, t.commits), (2, 1));
        assert_eq!(t.running, Some(at(1_700_000_000_600)));
        assert_eq!(MarkerTrace::read(log, 0x3c).reads, []);
    }
    #[test]
    fn a_backend_holds_a_connection_while_an_accepted_socket_has_its_path() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
                     00000000e25bf402: 00000003 00000000 00000000 0001 03 4878264 /s/a.sock\n\
                     00000000370b1a3c: 00000002 00000000 00010000 0001 01 4878262 /s/a.sock\n\
                     00000000370b1a3d: 00000002 00000000 00010000 0001 01 4878263 /s/b.sock\n\
                     00000000370b1a3e: 00000003 00000000 00000000 0001 03 4878265\n\
                     00000000370b1a3f: 00000003 00000000 00000000 0001 03 4878266 /s/c.sock\n";
        let paths = ["/s/a.sock".to_string(), "/s/b.sock".to_string()];
        assert_eq!(connected(table, &paths), 1);
        assert_eq!(connected(table, &paths[1..]), 0, "b only listens");
    }
}
