//! `exitless bench --against qemu`: the same probe binary and the same guest ops under QEMU, in
//! the same run, each of its figures set beside the exitless variant it answers.
//!
//! The peer's boots come first, before exitless's main thread confines itself
//! (`Session::prepare`, in `bench::session`): a seccomp filter is inherited across fork and
//! execve, and QEMU cannot run under exitless's. Times on both sides are the guest's own rdtsc
//! around each op; under QEMU the probe takes the TSC rate from the ACPI PM timer
//! ([`exitless_peer`]). QEMU's exits cannot be counted from outside it, so the peer has none in
//! the report.

use std::borrow::Cow;
use std::time::Duration;

use crate::format::human_ns;
use crate::model::{PeerFigure, ScenarioReport, TargetCheck, Variant};
use exitless::contract::Op;
use exitless::pci::PciAddress;
use exitless_peer::{PeerError, PeerRun, Qemu, QemuMachine};

/// One scenario's part of the comparison: the machine QEMU gets, the ops the probe runs there,
/// and how each exitless variant finds its counterpart among the results.
pub struct PeerPlan {
    /// QEMU's machine.
    pub machine: QemuMachine,
    /// The ops, the same the exitless side runs wherever QEMU can run them.
    pub ops: Vec<Op>,
    /// For each exitless variant: its counterpart's ops under QEMU (the median is taken), the
    /// timed operations each does, and QEMU's path where it is not the variant's own.
    pub counterparts: Vec<Counterpart>,
    /// The variants whose whole point is to avoid QEMU's default path: the 0.1× target's.
    pub exit_avoiding: &'static [&'static str],
    /// Longest the QEMU boot may take.
    pub timeout: Duration,
}

/// Which peer ops answer one exitless variant.
pub struct Counterpart {
    /// The exitless variant's name (made up for some: `none-1500`).
    pub variant: Cow<'static, str>,
    /// Indexes of the peer's ops that measure it (one per repetition or device).
    pub ops: Vec<usize>,
    /// Timed operations per op.
    pub per_op: u64,
    /// QEMU's path, in a few words.
    pub path: &'static str,
    /// Left out of the exitless-against-peer target: a floor both VMMs share (guest RAM
    /// reads: a check on the timing), or work the peer does not do alike.
    pub control: bool,
}

/// A finished peer boot, ready to be set beside a scenario's variants.
pub struct PeerResult {
    plan: PeerPlan,
    run: PeerRun,
    name: String,
    version: String,
}

/// Boot the probe under `qemu` with `plan`.
pub fn run(qemu: &Qemu, plan: PeerPlan) -> Result<PeerResult, PeerError> {
    let run = qemu.run_probe(&plan.machine, &plan.ops, plan.timeout)?;
    Ok(PeerResult {
        plan,
        run,
        name: "qemu".into(),
        version: qemu.version().into(),
    })
}

impl PeerResult {
    /// The median over peer ops `ops` of nanoseconds per operation, each op doing `per_op`;
    /// NaN where the probe could not time them.
    pub fn median_ns(&self, ops: &[usize], per_op: u64) -> f64 {
        let ns = |i: usize| match (self.run.tsc_khz, self.run.results.get(i)) {
            (Some(khz), Some(r)) if r.status == exitless::contract::STATUS_OK => {
                r.cycles as f64 * 1e6 / f64::from(khz) / per_op as f64
            }
            _ => f64::NAN,
        };
        let mut times: Vec<f64> = ops.iter().map(|&i| ns(i)).collect();
        times.sort_by(f64::total_cmp);
        times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
    }

    /// The peer's name (`qemu`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Set the peer's figures beside `report`'s variants, and add the two targets:
    /// exitless no slower than QEMU on every shared variant, and the plan's exit-avoiding
    /// variants at most 0.1× QEMU's default path.
    pub fn attach(&self, report: &mut ScenarioReport) {
        for c in &self.plan.counterparts {
            let Some(v) = report.variants.iter_mut().find(|v| v.name == c.variant) else {
                // A figure with no exitless variant of its own.
                report.notes.push(format!(
                    "{} {}: {}: {}",
                    self.name,
                    c.variant,
                    c.path,
                    human_ns(self.median_ns(&c.ops, c.per_op))
                ));
                continue;
            };
            v.peer = Some(PeerFigure {
                name: self.name.clone(),
                version: self.version.clone(),
                ns_per_op: self.median_ns(&c.ops, c.per_op),
                path: c.path.into(),
            });
        }
        let compared = |v: &&Variant| {
            self.plan
                .counterparts
                .iter()
                .any(|c| c.variant == v.name && !c.control)
        };
        let worst = report
            .variants
            .iter()
            .filter(compared)
            .filter_map(|v| Some((v.name.as_str(), v.vs_peer()?)))
            // An op the peer could not time has no ratio, rather than the worst one.
            .filter(|(_, ratio)| ratio.is_finite())
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((name, ratio)) = worst {
            report.targets.push(TargetCheck {
                target: format!("exitless <= {} on every shared variant", self.name),
                measured: format!("slowest relative to {}: {name} at {ratio:.3}x", self.name),
                met: ratio <= 1.0,
                ..Default::default()
            });
        }
        for name in self.plan.exit_avoiding {
            let Some(ratio) = report
                .variants
                .iter()
                .find(|v| v.name == *name)
                .and_then(Variant::vs_peer)
                .filter(|r| r.is_finite())
            else {
                continue;
            };
            report.targets.push(TargetCheck {
                target: format!("{name} <= 0.1x {}'s default path", self.name),
                measured: format!("{ratio:.4}x"),
                met: ratio <= 0.1,
                ..Default::default()
            });
        }
        if self.run.tsc_khz.is_none() {
            report.notes.push(format!(
                "{}: the probe could not measure its TSC against the PM timer; no peer times",
                self.name
            ));
        }
        report.notes.push(format!(
            "{} {}: one boot of {:.1} s for these ops (SeaBIOS included); its exits are not counted",
            self.name,
            self.version,
            self.run.wall.as_secs_f64()
        ));
    }
}

/// The PCI address of the QEMU machine's virtio-net function `i` (function 0 of its slot on
/// bus 0), as the probe's ops name it.
pub fn virtio_net_function(machine: &QemuMachine, i: u8) -> PciAddress {
    PciAddress::new(0, machine.virtio_net_slot(i), 0).expect("QEMU's slots are below 32")
}
