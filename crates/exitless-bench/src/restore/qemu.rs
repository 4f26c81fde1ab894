//! `bench restore --against qemu`: the same functions under QEMU, migrated by QEMU to a file
//! mid-ops and resumed in a second QEMU (`exitless_peer::Qemu::migrate_probe`): userspace
//! virtio-net functions (every vector programmed, unmasked and enabled, then checked),
//! migrated while the probe runs a RAM loop, the resumed probe checking every function again;
//! and where testpmd runs, vhost-user ones ([`vhost`]). QEMU's userspace functions route no
//! vectors (QEMU adds KVM routes for vhost and VFIO signallers only), so it has no commits to
//! make at their resume. Both are timed from the second process's start to its guest running.

mod check;
mod vhost;

use std::time::Duration;

use super::{FIRST_VECTOR, RestoreBench};
use crate::model::{ScenarioReport, TargetCheck};
use crate::msix_vhost;
use exitless::contract::Op;
use exitless::irq::CommitStrategy;
use exitless::machine::ops;
use exitless::pci::regs::PCI_MSIX_FLAGS_ENABLE;
use exitless_peer::{Migration, PeerError, Qemu, QemuMachine, QemuResume};

use check::checked;
use vhost::{VhostResume, WINDOW_READS};

/// RAM reads the probe does while QEMU migrates it (a few seconds at CPL 3).
const RAM_READS: u64 = 6_000_000_000;
/// How long after the probe starts its ops the migration begins: past the programming.
const SETTLE: Duration = Duration::from_millis(300);

/// QEMU's migrations and resumes, or why there are none.
pub struct QemuRestore {
    version: String,
    result: Result<QemuResume, String>,
    /// The vhost-user functions' (their count and the outcome), where testpmd runs.
    vhost: Option<(usize, Result<VhostResume, String>)>,
}

impl RestoreBench {
    /// Run the probe's functions under `qemu`, migrated and resumed: vhost-user on testpmd
    /// where it runs (testpmd polling for that migration only), then userspace virtio-net.
    pub fn against_qemu(&self, qemu: &Qemu) -> QemuRestore {
        let vhost = (self.vhost_user.as_ref())
            .filter(|p| !p.msix.is_empty())
            .map(|ports| {
                let _polling = ports.polling();
                let result = self.migrate_vhost(qemu, &ports.msix);
                (ports.msix.len(), result.map_err(|e| e.to_string()))
            });
        QemuRestore {
            version: qemu.version().into(),
            result: self.migrate(qemu).map_err(|e| e.to_string()),
            vhost,
        }
    }

    fn migrate(&self, qemu: &Qemu) -> Result<QemuResume, PeerError> {
        let machine = QemuMachine {
            virtio_net: u8::try_from(self.devices).expect("validated: at most 28"),
            queue_pairs: self.queue_pairs,
            ..QemuMachine::default()
        };
        let functions: Vec<_> = (0..machine.virtio_net)
            .map(|d| crate::against::virtio_net_function(&machine, d))
            .collect();
        let mut list: Vec<Op> = Vec::new();
        for &f in &functions {
            list.push(ops::msix_program(f, FIRST_VECTOR, 0, true));
            list.push(ops::msix_control(f, PCI_MSIX_FLAGS_ENABLE));
        }
        list.extend(functions.iter().map(|&f| ops::msix_check(f, false)));
        list.push(ops::ram_read_loop(RAM_READS));
        list.extend(functions.iter().map(|&f| ops::msix_check(f, false)));
        let m = Migration {
            ops: &list,
            settle: SETTLE,
            marker: None,
            timeout: self.timeout,
        };
        checked(qemu.migrate_probe(&machine, &m)?, &[])
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Whether QEMU migrated the probe in the middle of its ops.
fn mid_ops(r: &QemuResume) -> &'static str {
    match r.mid_ops {
        true => "migrated in the middle of the probe's ops",
        false => "NOT migrated in the middle of the probe's ops",
    }
}

impl QemuRestore {
    /// Set QEMU's figures beside `report`'s: notes, and the whole-restore targets.
    pub fn attach(&self, report: &mut ScenarioReport) {
        self.attach_userspace(report);
        self.attach_vhost(report);
    }

    fn attach_userspace(&self, report: &mut ScenarioReport) {
        let resumed = match &self.result {
            Ok(r) => r,
            Err(why) => {
                report
                    .notes
                    .push(format!("{}: not measured: {why}", self.version));
                return;
            }
        };
        let qemu_ms = ms(resumed.start_to_running);
        report.notes.push(format!(
            "{}: migrate to a file (exec:cat) {:.1} ms, {:.1} MiB; resume with -incoming: \
             process start to guest running (QMP query-status) {qemu_ms:.1} ms; {}, then every \
             function's MSI-X check passed",
            self.version,
            ms(resumed.migrate),
            resumed.file_bytes as f64 / 1048576.0,
            mid_ops(resumed),
        ));
        // Like for like: batched restored in a new exitless, from its process start.
        let targets = RestoreBench::whole_restore_targets(report, resumed.start_to_running);
        report.targets.extend(targets);
    }

    fn attach_vhost(&self, report: &mut ScenarioReport) {
        let Some((functions, result)) = &self.vhost else {
            return;
        };
        let vhost = match result {
            Ok(r) => r,
            Err(why) => {
                report.notes.push(format!(
                    "{} with vhost-user functions on testpmd: not measured: {why}",
                    self.version
                ));
                return;
            }
        };
        (report.notes).push(vhost_note(&self.version, *functions, vhost));
        let resumed = &vhost.resumed;
        let batched_name = msix_vhost::name(CommitStrategy::Batched);
        let Some(batched) = restore_ms(report, batched_name) else {
            return;
        };
        let qemu_ms = ms(traced_running(resumed).unwrap_or(resumed.start_to_running));
        report.targets.push(TargetCheck {
            target: format!("{batched_name} whole restore <= QEMU vhost-user's"),
            measured: format!(
                "{batched_name} {batched:.1} ms (snapshot opened to vCPUs started, in the \
                 bench's process: routes and irqfds of every live vector committed, testpmd \
                 reconnected) vs QEMU vhost-user {qemu_ms:.1} ms (second process's start to \
                 guest running, testpmd reconnected)"
            ),
            met: batched <= qemu_ms,
            ..Default::default()
        });
    }
}

/// The restore time of `report`'s variant `name`, in ms.
fn restore_ms(report: &ScenarioReport, name: &str) -> Option<f64> {
    (report.variants.iter())
        .find(|v| v.name == name)
        .map(|v| v.ns_per_op / 1e6)
}

/// The second QEMU's start to its guest running, from its trace.
fn traced_running(r: &QemuResume) -> Option<Duration> {
    let t = r.markers.as_ref()?;
    t.target.running.map(|at| t.since_start(at))
}

/// The vhost-user migration's note: what ran, the resume's times and QEMU's routes.
fn vhost_note(version: &str, functions: usize, v: &VhostResume) -> String {
    let r = &v.resumed;
    let running = match traced_running(r) {
        Some(t) => format!(
            "{:.1} ms (QEMU's trace; QMP, polled, saw it at {:.1} ms)",
            ms(t),
            ms(r.start_to_running)
        ),
        None => format!("{:.1} ms (QMP)", ms(r.start_to_running)),
    };
    let routes = r
        .markers
        .as_ref()
        .map_or((0, 0), |t| (t.target.routes, t.target.commits));
    format!(
        "{version} with {functions} vhost-user-net functions on DPDK testpmd (the \
         `*-vhost-user` rows' ports; every vector programmed, unmasked and enabled; each \
         function brought up in turn and answering an ICMP echo, the last one up at the \
         migration): migrate to a file {:.1} ms, {:.1} MiB; resume with -incoming, \
         reconnecting to testpmd: process start to guest running {running}, to the guest's \
         first config read after its first interrupt (an ICMP echo through testpmd on the \
         restored rings, after at most one {}M-read RAM loop; QEMU's trace) {:.1} ms, QEMU \
         having added {} MSI routes (those of the live rings' vectors: it routes no other) in \
         {} commits by then; {}, then every echo answered{}, and every function's MSI-X check \
         passed",
        ms(r.migrate),
        r.file_bytes as f64 / 1048576.0,
        WINDOW_READS / 1_000_000,
        ms(v.first_interrupt),
        routes.0,
        routes.1,
        mid_ops(r),
        match v.lost {
            0 => " (none lost to the migration)".into(),
            n =>
                format!(" but the {n} the migration cut (a packet in flight across it may be lost)"),
        },
    )
}
