//! `bench restore` with vhost-user functions served by DPDK testpmd (issue 21's devices): the
//! seed's own case, where the signaller is outside the VMM and holds an irqfd per queue vector,
//! so the routes of its vectors must be committed at restore under every strategy. Each
//! function has 65 vectors (one queue pair, the table sized apart: `msix_vhost::devices`), all
//! programmed, unmasked and enabled, is brought up (testpmd gets its rings) and answers one
//! ICMP echo; the machine is paused as a RAM loop begins and snapshotted; each restore
//! reconnects to testpmd, which gets its rings back at their saved positions, and the guest
//! then does one echo on the function its driver drives (the first backend-raised interrupt
//! after the restore, on the restored rings) and asks for each vector of each function once.

use std::path::Path;

use super::report::phases_note;
use super::resume::{Resumed, resume};
use super::{FIRST_VECTOR, RestoreBench, source};
use crate::measure::{ratio_target, set_baseline};
use crate::model::{ScenarioReport, Variant};
use crate::msix_vhost;
use crate::vhost_net::{BACKEND_IP, BACKEND_MAC, GUEST_IP, VhostPorts};
use exitless::contract::{Op, STATUS_OK, TRANSPORT_PCI};
use exitless::irq::CommitStrategy;
use exitless::machine::{ProbeConfig, ProbeError, ops};
use exitless::pci::regs::PCI_MSIX_FLAGS_ENABLE;
use exitless::vm::run_control::StopReason;

/// RAM reads the snapshot is taken in (and testpmd's time to start polling before an echo).
const SETTLE_READS: u64 = 200_000_000;

/// The pass: its snapshot, each strategy's restore, the ops read.
type Pass = (source::Taken, Vec<(CommitStrategy, Resumed)>, VhostSteps);

/// Op indexes the report reads.
pub(super) struct VhostSteps {
    /// The RAM loop the snapshot lands in.
    pub across: usize,
    /// The echo after the restore (on the last function).
    pub first: Vec<usize>,
    /// Each function's every vector, once.
    pub every: Vec<usize>,
}

/// The guest's work on `functions` with `vectors` vectors each.
fn plan(functions: &[exitless::pci::PciAddress], vectors: u64) -> (Vec<Op>, VhostSteps) {
    let mut list = Vec::new();
    let echo = || ops::icmp_echo(BACKEND_IP, GUEST_IP, BACKEND_MAC, 32, 1);
    for &f in functions {
        list.push(ops::msix_program(f, FIRST_VECTOR, 0, true));
        list.push(ops::msix_control(f, PCI_MSIX_FLAGS_ENABLE));
        list.push(ops::virtio_init(TRANSPORT_PCI, f.ecam_offset(), 0));
        list.push(ops::ram_read_loop(SETTLE_READS));
        list.push(echo());
    }
    list.push(ops::ram_read_loop(SETTLE_READS));
    let across = list.len() - 1;
    // The probe's driver drives the function it brought up last: its rings, restored at their
    // positions, answer the first echo after the restore (the others would need a reset).
    list.push(ops::ram_read_loop(SETTLE_READS));
    list.push(echo());
    let first = vec![list.len() - 1];
    let every = (functions.iter())
        .map(|&f| {
            list.push(ops::msix_latency(f, 0, vectors, 1));
            list.len() - 1
        })
        .collect();
    let steps = VhostSteps {
        across,
        first,
        every,
    };
    (list, steps)
}

impl RestoreBench {
    /// Snapshot the vhost-user functions on `ports` once and restore them once per strategy.
    pub(super) fn vhost_runs(&self, ports: &VhostPorts, dir: &Path) -> Result<Pass, ProbeError> {
        let _polling = ports.polling();
        let sockets = &ports.msix;
        let vectors = u16::try_from(self.vectors()).expect("validated: at most 129");
        let functions: Vec<_> = (0..sockets.len())
            .map(ProbeConfig::virtio_pci_address)
            .collect();
        let (list, steps) = plan(&functions, self.vectors());
        let cfg = ProbeConfig {
            ops: list.clone(),
            virtio: msix_vhost::devices(sockets, vectors),
            gsi_commits: CommitStrategy::Batched,
            timeout: self.timeout,
            ..Default::default()
        };
        let taken = source::snapshot(&cfg, steps.across, dir)?;
        let runs = CommitStrategy::ALL
            .iter()
            .map(|&s| {
                let r = resume(dir, s, list.len(), self.timeout)?;
                check(s, &r, &list, &steps)?;
                Ok((s, r))
            })
            .collect::<Result<Vec<_>, ProbeError>>()?;
        Ok((taken, runs, steps))
    }

    /// The vhost-user pass's variants and notes added to `report`, or why it did not run.
    pub(super) fn add_vhost(&self, report: &mut ScenarioReport, dir: &Path) {
        let Some(ports) = self.vhost_user.as_ref().filter(|p| !p.msix.is_empty()) else {
            return;
        };
        let (taken, runs, steps) = match self.vhost_runs(ports, dir) {
            Ok(done) => done,
            Err(e) => {
                report
                    .notes
                    .push(format!("the vhost-user restores failed: {e}"));
                return;
            }
        };
        let mut variants: Vec<Variant> = runs
            .iter()
            .map(|(s, r)| Variant {
                name: msix_vhost::name(*s).into(),
                routing: self.variant(*s, r).routing.map(|mut f| {
                    (f.seed_per_device_ms, f.seed_total_ms) = (None, None);
                    f
                }),
                ..self.variant(*s, r)
            })
            .collect();
        set_baseline(&mut variants, msix_vhost::NAMES[0], &[]);
        let (per_vector, batched) = (&variants[0], &variants[1]);
        let routes = |v: &Variant| v.routing.as_ref().map_or(f64::NAN, |f| f.total_ms);
        let (b, p) = (routes(batched), routes(per_vector));
        report.targets.push(ratio_target(
            "batched-vhost-user routes <= 0.1x per-vector-vhost-user".into(),
            format!("{b:.3} ms vs {p:.3} ms ({:.3}x)", b / p),
            (&[b], &[p]),
            0.1,
            true,
        ));
        report.notes.push(format!(
            "`*-vhost-user` rows: {} vhost-user functions served by DPDK testpmd, {} vectors \
             each, all live, every ring up; snapshot (pause {:.2} ms, save {:.2} ms) as a RAM \
             loop began; each restore reconnected to testpmd; checked: an ICMP echo on the \
             restored rings, every vector once",
            ports.msix.len(),
            self.vectors(),
            taken.pause.as_secs_f64() * 1e3,
            taken.save.as_secs_f64() * 1e3,
        ));
        for (s, r) in &runs {
            let echo = steps.first.first().and_then(|&op| r.until_end_of(op));
            let functions = format!("{} vhost-user functions", ports.msix.len());
            report.notes.push(format!(
                "{}; first echo answered {} ms after the vCPUs started",
                phases_note(msix_vhost::name(*s), r, &functions),
                echo.map_or("-".into(), |d| format!("{:.2}", d.as_secs_f64() * 1e3))
            ));
        }
        report.variants.extend(variants);
    }
}

/// Every op OK, each echo answered, every vector once per request.
fn check(
    s: CommitStrategy,
    r: &Resumed,
    list: &[Op],
    steps: &VhostSteps,
) -> Result<(), ProbeError> {
    let failed = |why: String| {
        let why = format!("after the {} vhost-user restore: {why}", s.name());
        ProbeError::GuestFailed(StopReason::VcpuFailed(why), String::new())
    };
    if let Some(i) = r.results.iter().position(|x| x.status != STATUS_OK) {
        return Err(failed(format!(
            "probe op {i} returned status {}",
            r.results[i].status
        )));
    }
    for &i in &steps.first {
        if r.results[i].value != 1 {
            return Err(failed(format!(
                "echo op {i} got {} replies",
                r.results[i].value
            )));
        }
    }
    for &i in &steps.every {
        let (asked, got) = (r.results[i].value, r.results[i].irqs);
        if asked != list[i].size || got != asked {
            return Err(failed(format!(
                "op {i}: {got} interrupts for {asked} requests"
            )));
        }
    }
    Ok(())
}
