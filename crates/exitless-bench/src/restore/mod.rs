//! `exitless bench restore`: the seed's own moment, resuming a VM whose devices have hundreds
//! of live MSI-X vectors (issue 25 item 4). The probe boots with `devices` virtio-net functions
//! of 65 vectors each, every vector programmed, unmasked and enabled, and a further function
//! carrying request/response traffic; in the middle of that traffic the machine is paused and
//! snapshotted; then it is restored once per strategy (`gsi_commits`), each restore a new
//! machine built from the snapshot, and run on: the traffic finishes byte-exact (the guest
//! checks every response) and every vector of every function is asked for once and must
//! arrive exactly once. Reported per strategy: the restore's phases, the commits, the time to
//! each function's first interrupt, and the seed's per-function table. Each strategy's restore
//! is then done again in a new exitless process (`newproc`), checked the same way and timed
//! from the process's start, as QEMU's resume is.

mod board;
mod child;
mod launcher;
mod newproc;
mod qemu;
mod report;
mod resume;
mod source;
mod vhost;

pub use child::{CHILD_COMMAND, monotonic, restore_child};
pub use launcher::{LAUNCHER_COMMAND, Launcher, serve_launcher};
pub use qemu::QemuRestore;

use std::time::Duration;

use crate::model::ScenarioReport;
use crate::msix::{FIRST_VECTOR, validate_sizes};
use crate::vhost_net::VhostPorts;
use exitless::contract::{Op, STATUS_OK, TRANSPORT_PCI};
use exitless::irq::CommitStrategy;
use exitless::machine::snapshot::{DESCRIPTION_FILE, memory_path};
use exitless::machine::{MAX_VIRTIO_PCI, ProbeConfig, ProbeError, Transport, VirtioNetConfig, ops};
use exitless::pci::regs::PCI_MSIX_FLAGS_ENABLE;
use exitless::virtio::notify::NotifyPath;
use exitless::vm::run_control::StopReason;

use newproc::InNewProcess;
use resume::{Resumed, resume};

/// Transactions before the snapshot (traffic under way), in flight across it, and after.
const RR_BEFORE: u64 = 50;
const RR_ACROSS: u64 = 500;
const RR_AFTER: u64 = 200;
/// Bytes of each request.
const REQUEST_SIZE: u64 = 64;

/// What `exitless bench restore` runs.
#[derive(Clone, Debug)]
pub struct RestoreBench {
    /// virtio-net functions whose vectors are all live.
    pub devices: usize,
    /// Queue pairs per function: 2 × pairs + 1 MSI-X vectors.
    pub queue_pairs: u16,
    /// Longest each boot may take.
    pub timeout: Duration,
    /// testpmd and its sockets, `msix` one per function, for the vhost-user pass
    /// (`vhost`); none: no such pass.
    pub vhost_user: Option<VhostPorts>,
}

/// Op indexes the report reads.
struct Steps {
    /// Traffic under way before the snapshot.
    before: usize,
    /// The traffic op the snapshot lands in: the machine is paused as it begins.
    across: usize,
    /// Each function's first interrupt after the restore.
    first: Vec<usize>,
    /// Each function's every vector, once.
    every: Vec<usize>,
    /// Traffic after.
    after: usize,
}

impl RestoreBench {
    /// Check the sizes against what the probe machine holds (one function carries traffic).
    pub fn validate(&self) -> Result<(), String> {
        validate_sizes(self.devices, MAX_VIRTIO_PCI - 1, self.queue_pairs)
    }

    fn vectors(&self) -> u64 {
        2 * u64::from(self.queue_pairs) + 1
    }

    /// Every vector live and checked, traffic started, the traffic the snapshot lands in;
    /// then (after the restore) each function's first interrupt, each vector once, a check,
    /// and more traffic.
    fn ops(&self) -> (Vec<Op>, Steps) {
        let mut list = Vec::new();
        let functions: Vec<_> = (0..self.devices)
            .map(ProbeConfig::virtio_pci_address)
            .collect();
        for &f in &functions {
            list.push(ops::msix_program(f, FIRST_VECTOR, 0, true));
            list.push(ops::msix_control(f, PCI_MSIX_FLAGS_ENABLE));
        }
        list.extend(functions.iter().map(|&f| ops::msix_check(f, true)));
        let traffic = ProbeConfig::virtio_pci_address(self.devices);
        list.push(ops::virtio_init(TRANSPORT_PCI, traffic.ecam_offset(), 0));
        let push = |list: &mut Vec<Op>, op| {
            list.push(op);
            list.len() - 1
        };
        let before = push(&mut list, ops::virtio_rr(REQUEST_SIZE, RR_BEFORE));
        let across = push(&mut list, ops::virtio_rr(REQUEST_SIZE, RR_ACROSS));
        let first = (functions.iter())
            .map(|&f| push(&mut list, ops::msix_latency(f, 0, 1, 1)))
            .collect();
        let every = (functions.iter())
            .map(|&f| push(&mut list, ops::msix_latency(f, 0, self.vectors(), 1)))
            .collect();
        list.extend(functions.iter().map(|&f| ops::msix_check(f, true)));
        let after = push(&mut list, ops::virtio_rr(REQUEST_SIZE, RR_AFTER));
        let steps = Steps {
            before,
            across,
            first,
            every,
            after,
        };
        (list, steps)
    }

    fn probe(&self, ops: Vec<Op>) -> ProbeConfig {
        let device = VirtioNetConfig {
            queue_pairs: self.queue_pairs,
            ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
        };
        let traffic = VirtioNetConfig::new(Transport::Pci, NotifyPath::Address);
        let mut virtio = vec![device; self.devices];
        virtio.push(traffic);
        ProbeConfig {
            ops,
            virtio,
            gsi_commits: CommitStrategy::Batched,
            timeout: self.timeout,
            ..Default::default()
        }
    }

    /// Snapshot once, restore once per strategy in this process and once in a new one
    /// started by `launcher` (or why there is none), and report.
    pub fn run(&self, launcher: Result<&Launcher, &str>) -> Result<ScenarioReport, ProbeError> {
        let (list, steps) = self.ops();
        let dir =
            std::env::temp_dir().join(format!("exitless-bench-restore-{}", std::process::id()));
        let taken = source::snapshot(&self.probe(list.clone()), steps.across, &dir);
        let runs = taken.and_then(|taken| {
            let runs = CommitStrategy::ALL
                .iter()
                .map(|&s| {
                    let r = resume(&dir, s, list.len(), self.timeout)?;
                    self.check(&format!("the {} restore", s.name()), &r, &list, &steps)?;
                    Ok((s, r))
                })
                .collect::<Result<Vec<_>, ProbeError>>()?;
            let fresh = match launcher {
                Ok(launcher) => Ok(self.new_processes(launcher, &dir, &list, &steps)?),
                Err(why) => Err(why.to_owned()),
            };
            Ok((taken, runs, fresh))
        });
        let on_disk = report::disk_use(&dir);
        remove(&dir);
        let (taken, runs, fresh) = runs?;
        let mut report = self.report(taken, &runs, &steps, on_disk);
        self.add_new_process(&mut report, fresh, &steps);
        let vhost_dir = dir.with_extension("vhost-user");
        self.add_vhost(&mut report, &vhost_dir);
        remove(&vhost_dir);
        Ok(report)
    }

    /// Restore the snapshot in `dir` once per strategy in a new process, each checked.
    fn new_processes(
        &self,
        launcher: &Launcher,
        dir: &std::path::Path,
        list: &[Op],
        steps: &Steps,
    ) -> Result<Vec<(CommitStrategy, InNewProcess)>, ProbeError> {
        (CommitStrategy::ALL.iter())
            .map(|&s| {
                let p = self.resume_in_new_process(launcher, dir, s, list.len())?;
                let what = format!("the {} restore in a new process", s.name());
                self.check(&what, &p.resumed, list, steps)?;
                Ok((s, p))
            })
            .collect()
    }

    /// The guest's verdicts: every op OK, the traffic complete, every vector once per request.
    fn check(&self, what: &str, r: &Resumed, list: &[Op], steps: &Steps) -> Result<(), ProbeError> {
        let failed = |why: String| {
            ProbeError::GuestFailed(
                StopReason::VcpuFailed(format!("after {what}: {why}")),
                String::new(),
            )
        };
        if let Some(i) = r.results.iter().position(|x| x.status != STATUS_OK) {
            return Err(failed(format!(
                "probe op {i} returned status {}",
                r.results[i].status
            )));
        }
        for &i in [steps.before, steps.across, steps.after].iter() {
            if r.results[i].value != list[i].count {
                return Err(failed(format!(
                    "op {i} did {} of {} transactions",
                    r.results[i].value, list[i].count
                )));
            }
        }
        for &i in steps.first.iter().chain(&steps.every) {
            let (asked, got) = (r.results[i].value, r.results[i].irqs);
            if asked != list[i].size || got != asked {
                return Err(failed(format!(
                    "op {i}: {got} interrupts for {asked} requests of {}",
                    list[i].size
                )));
            }
        }
        Ok(())
    }
}

/// Remove the snapshot folder `dir` by its files' names (the memory file's as the description
/// names it): the main thread, confined, may not list a folder.
fn remove(dir: &std::path::Path) {
    if let Ok(memory) = memory_path(dir) {
        let _ = std::fs::remove_file(memory);
    }
    let _ = std::fs::remove_file(dir.join(DESCRIPTION_FILE));
    let _ = std::fs::remove_dir(dir);
}
