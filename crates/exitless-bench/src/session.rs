//! One `exitless bench` run: with `--against`, the probe's boots under the peer first (and
//! `rr`'s host tap and testpmd, kept until the run ends); then each scenario in turn, the peer's figures
//! or the reason there are none set beside it; then the report.
//!
//! [`Session::prepare`] runs before the main thread confines itself: QEMU inherits a seccomp
//! filter across fork and execve, and cannot run under exitless's (nor can testpmd, and a
//! confined process starts no program). [`Session::run`] runs after.

use std::path::PathBuf;

use crate::against::{self, PeerResult};
use crate::baseline::{self, SavedReport};
use crate::chart::{self, Chart};
use crate::host;
use crate::model::{HostLoad, Report};
use crate::options::{BenchOptions, PeerVmm, Scenario};
use crate::progress;
use crate::report;
use crate::restore::{Launcher, QemuRestore};
use crate::rr::TAP_VARIANT;
use crate::vhost_net::{VhostNet, VhostPorts};
use exitless_peer::Qemu;
use exitless_peer::host_tap::{HostTap, TapLink};

/// A checked `exitless bench` command line, and the peer's figures when it asked for them.
pub struct Session {
    options: BenchOptions,
    scenarios: Vec<Scenario>,
    peers: Vec<(Scenario, PeerResult)>,
    /// Why a scenario the peer could have run has no figures from it.
    unpeered: Vec<(Scenario, String)>,
    /// `rr`'s host tap, for exitless's own boot on it; deleted when dropped.
    host_tap: Option<HostTap>,
    /// `rr`'s testpmd for its vhost-user variants, or why there is none; stopped when dropped.
    vhost_net: Result<VhostNet, String>,
    /// `--baseline`: its file and what it holds.
    baseline: Option<(PathBuf, SavedReport)>,
    /// How busy the host was before the first measurement.
    host_load: Option<HostLoad>,
    /// `restore`'s migration under QEMU, set beside its report.
    restore_peer: Option<QemuRestore>,
    /// `restore`'s launcher of new exitless processes, started before the main thread's
    /// filter (a confined process starts no program), or why there is none.
    restore_launcher: Result<Launcher, String>,
}

/// What a finished run prints, and the charts it writes if asked.
pub struct BenchOutput {
    /// The report, as tables or JSON, for stdout.
    pub text: String,
    /// The SVG charts and the folder they go to (`--svg`).
    charts: Option<(PathBuf, Vec<Chart>)>,
    /// The JSON report and the file it goes to (`--save-baseline`).
    saved: Option<(PathBuf, String)>,
    /// The comparison with `--baseline`, for stderr (with `--json`; else it ends `text`).
    comparison: Option<String>,
    /// With `--fail-on-regression`: the variants that regressed beyond their interval.
    regressed: Vec<String>,
}

/// Read the report `--baseline` names, before anything boots; one line if it cannot be used.
pub fn load_baseline(options: &BenchOptions) -> Result<Option<(PathBuf, SavedReport)>, String> {
    options
        .baseline
        .as_ref()
        .map(|path| SavedReport::load(path).map(|saved| (path.clone(), saved)))
        .transpose()
}

impl BenchOutput {
    /// Write the charts into their folder, if they were asked for.
    pub fn write_chart(&self) -> Result<(), String> {
        let Some((dir, charts)) = &self.charts else {
            return Ok(());
        };
        for chart in charts {
            let path = dir.join(&chart.file);
            std::fs::write(&path, &chart.svg)
                .map_err(|e| format!("cannot write the chart {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// Write the chart and the baseline asked for, and (with `--json`) the comparison with
    /// `--baseline` to stderr.
    pub fn write_files(&self) -> Result<(), String> {
        self.write_chart()?;
        if let Some((path, json)) = &self.saved {
            std::fs::write(path, json)
                .map_err(|e| format!("cannot write the baseline to {}: {e}", path.display()))?;
        }
        if let Some(comparison) = &self.comparison {
            exitless::logging::stderr_line(format_args!("{}", comparison.trim_end()));
        }
        Ok(())
    }

    /// With `--fail-on-regression`, the line naming the variants that regressed, if any.
    pub fn regression(&self) -> Option<String> {
        (!self.regressed.is_empty()).then(|| {
            format!(
                "regressed against the baseline beyond the intervals: {}",
                self.regressed.join(", ")
            )
        })
    }
}

impl Session {
    /// Check the options and, with `--against`, boot the probe under the peer.
    pub fn prepare(options: BenchOptions) -> Result<Session, String> {
        // Bad options get their one error before the host is watched.
        options.rr(None, None)?;
        options.msix(None)?;
        options.iommu()?;
        options.soak()?;
        // Restore takes a function for its traffic: its --devices limit is its own, checked
        // only where it runs.
        if options.scenarios().contains(&Scenario::Restore) {
            options.restore(None)?;
        }
        // Before anything is measured, the peer's boots included.
        let host_load = host::sample_load();
        if let Some(load) = host_load.as_ref().filter(|l| host::is_busy(l)) {
            exitless::logging::stderr_line(format_args!("{}", host::busy_line(load)));
        }
        let mut session = Session {
            scenarios: options.scenarios(),
            options,
            peers: Vec::new(),
            unpeered: Vec::new(),
            host_tap: None,
            vhost_net: Err(String::new()),
            baseline: None,
            host_load,
            restore_peer: None,
            restore_launcher: Err("the restore scenario was not asked for".into()),
        };
        // The terminal check is an ioctl: before the filter. The peer's boots count as one step.
        let peer_step = usize::from(session.options.against.is_some());
        progress::start(session.scenarios.len() + peer_step, session.options.json);
        // The chart folder now, before the main thread confines itself (no mkdir after) and
        // before minutes of measuring.
        if let Some(dir) = &session.options.svg {
            std::fs::create_dir_all(dir).map_err(|e| {
                format!(
                    "cannot write the chart: cannot make the folder {}: {e}",
                    dir.display()
                )
            })?;
        }
        let msix = [Scenario::Msix, Scenario::Restore]
            .iter()
            .any(|s| session.scenarios.contains(s));
        if msix || session.scenarios.contains(&Scenario::Rr) {
            // Before the peer: QEMU's functions connect to the same ports.
            let devices = if msix { session.options.devices } else { 0 };
            session.vhost_net = VhostNet::start(devices)
                .map_err(|why| format!("the vhost-user variants did not run: {why}"));
        }
        if session.scenarios.contains(&Scenario::Restore) {
            session.restore_launcher = Launcher::start();
        }
        if session.options.against == Some(PeerVmm::Qemu) {
            if session.scenarios.contains(&Scenario::Soak) {
                let why = "not measured under qemu: the soak counts failures, not time";
                session.unpeered.push((Scenario::Soak, why.to_owned()));
            }
            match Qemu::find() {
                Err(e) => exitless::logging::stderr_line(format_args!(
                    "exitless: {e}; running without the qemu column"
                )),
                Ok(qemu) => session
                    .boot_peer(&qemu)
                    .inspect_err(|_| progress::finish())?,
            }
        }
        Ok(session)
    }

    /// Boot the probe under `qemu` once per scenario it can run; `rr`'s needs a host tap, and
    /// without one gets a note instead.
    fn boot_peer(&mut self, qemu: &Qemu) -> Result<(), String> {
        progress::scenario(0, "qemu");
        let count = self.scenarios.len();
        for (i, scenario) in self.scenarios.clone().into_iter().enumerate() {
            progress::step("qemu", name(scenario), i, count);
            let plan = match scenario {
                Scenario::Pci => self.options.pci().peer_plan(),
                Scenario::Msix => self.options.msix(self.vhost_ports().as_ref())?.peer_plan(),
                Scenario::Rr => {
                    let link = match HostTap::create(TapLink::bench()) {
                        Ok(tap) => {
                            let link = tap.link().clone();
                            self.host_tap = Some(tap);
                            Some(link)
                        }
                        Err(why) => {
                            let why = format!("{TAP_VARIANT} not measured under qemu: {why}");
                            self.unpeered.push((scenario, why));
                            None
                        }
                    };
                    match self.options.rr(link, self.vhost_ports())?.peer_plan() {
                        Some(plan) => plan,
                        None => continue,
                    }
                }
                Scenario::Iommu => self.options.iommu()?.peer_plan(),
                Scenario::Restore => {
                    let restore = self.options.restore(self.vhost_ports().as_ref())?;
                    self.restore_peer = Some(restore.against_qemu(qemu));
                    continue;
                }
                Scenario::Soak => continue,
            };
            // QEMU's rr and msix boots hold vhost-user functions on testpmd's ports.
            let _polling = match scenario {
                Scenario::Rr | Scenario::Msix => self.vhost_ports().map(|p| p.polling()),
                _ => None,
            };
            let result = against::run(qemu, plan)
                .map_err(|e| format!("the probe under {}: {e}", qemu.version()))?;
            self.peers.push((scenario, result));
        }
        Ok(())
    }

    /// testpmd's ports, where it runs.
    fn vhost_ports(&self) -> Option<VhostPorts> {
        self.vhost_net.as_ref().ok().map(|v| v.ports().clone())
    }

    /// Compare this run with `baseline` (read by [`load_baseline`]).
    pub fn with_baseline(mut self, baseline: Option<(PathBuf, SavedReport)>) -> Session {
        self.baseline = baseline;
        self
    }

    /// Run every scenario, set the peer's figures or notes beside each, and render the report.
    pub fn run(self) -> Result<BenchOutput, String> {
        let output = self.measure();
        progress::finish();
        output
    }

    fn measure(self) -> Result<BenchOutput, String> {
        let options = &self.options;
        // Every scenario's options are checked before the first boot, named or not.
        let tap = self.host_tap.as_ref().map(|t| t.link().clone());
        let rr = options.rr(tap, self.vhost_ports())?;
        let msix = options.msix(self.vhost_ports().as_ref())?;
        let iommu = options.iommu()?;
        let soak = options.soak()?;
        let restore = match self.scenarios.contains(&Scenario::Restore) {
            true => Some(options.restore(self.vhost_ports().as_ref())?),
            false => None,
        };
        let mut report = Report {
            host: host::describe(),
            host_busy: self.host_load.as_ref().is_some_and(host::is_busy),
            host_load: self.host_load.clone(),
            scenarios: Vec::new(),
        };
        let peer_step = usize::from(options.against.is_some());
        for (i, &scenario) in self.scenarios.iter().enumerate() {
            progress::scenario(peer_step + i, name(scenario));
            let result = match scenario {
                Scenario::Pci => options.pci().run(),
                Scenario::Rr => rr.run(),
                Scenario::Msix => msix.run(),
                Scenario::Iommu => iommu.run(),
                Scenario::Soak => soak.run(),
                Scenario::Restore => (restore.as_ref().expect("checked: it is named"))
                    .run(self.restore_launcher.as_ref().map_err(String::as_str)),
            };
            let mut scenario_report = result.map_err(|e| e.to_string())?;
            if let Some((_, peer)) = self.peers.iter().find(|(s, _)| *s == scenario) {
                peer.attach(&mut scenario_report);
            }
            if let (Scenario::Restore, Some(peer)) = (scenario, &self.restore_peer) {
                peer.attach(&mut scenario_report);
            }
            scenario_report.notes.extend(
                self.unpeered
                    .iter()
                    .filter(|(s, _)| *s == scenario)
                    .map(|(_, why)| why.clone()),
            );
            if let (Scenario::Rr | Scenario::Msix | Scenario::Restore, Err(why)) =
                (scenario, &self.vhost_net)
            {
                scenario_report.notes.push(why.clone());
            }
            report.scenarios.push(scenario_report);
        }
        let mut text = if options.json {
            report::json(&report) + "\n"
        } else {
            report::text(&report)
        };
        let charts = match options.svg.clone() {
            Some(dir) => Some((dir, chart::charts(&report)?)),
            None => None,
        };
        let saved =
            (options.save_baseline.clone()).map(|path| (path, report::json(&report) + "\n"));
        let mut output = BenchOutput {
            text: String::new(),
            charts,
            saved,
            comparison: None,
            regressed: Vec::new(),
        };
        if let Some((path, old)) = &self.baseline {
            let comparison = baseline::compare(old, &SavedReport::of(&report));
            if options.fail_on_regression {
                output.regressed = comparison.regressed();
            }
            match options.json {
                true => output.comparison = Some(comparison.text(path)),
                false => text.push_str(&comparison.text(path)),
            }
        }
        output.text = text;
        Ok(output)
    }
}

impl Drop for Session {
    /// testpmd and its files go at exitless's exit, not here: the main thread may be confined
    /// by now, and a confined thread cannot wait for a child.
    fn drop(&mut self) {
        if let Ok(net) = std::mem::replace(&mut self.vhost_net, Err(String::new())) {
            net.leave();
        }
    }
}

/// A scenario's name, as the command line spells it.
fn name(scenario: Scenario) -> &'static str {
    match scenario {
        Scenario::Pci => "pci",
        Scenario::Rr => "rr",
        Scenario::Msix => "msix",
        Scenario::Iommu => "iommu",
        Scenario::Soak => "soak",
        Scenario::Restore => "restore",
    }
}
