//! `bench restore --against qemu`: the same functions under QEMU (every vector programmed,
//! unmasked and enabled, then checked), migrated by QEMU to a file while the probe runs a RAM
//! loop, and resumed in a second QEMU (`crate::peer::Qemu::migrate_probe`), where the probe
//! checks every function again and ends. QEMU's resume is timed from the second process's
//! start to its guest running; its userspace virtio-net functions route no vectors (QEMU adds
//! KVM routes for vhost and VFIO signallers only), so it has no commits to make.

use std::time::Duration;

use super::{FIRST_VECTOR, RestoreBench};
use crate::bench::model::{ScenarioReport, TargetCheck};
use crate::contract::{Op, STATUS_OK};
use crate::irq::CommitStrategy;
use crate::machine::ops;
use crate::pci::regs::PCI_MSIX_FLAGS_ENABLE;
use crate::peer::{PeerError, Qemu, QemuMachine, QemuResume};

/// RAM reads the probe does while QEMU migrates it (a few seconds at CPL 3).
const RAM_READS: u64 = 6_000_000_000;
/// How long after the probe starts its ops the migration begins: past the programming.
const SETTLE: Duration = Duration::from_millis(300);

/// QEMU's migration and resume, or why there is none.
pub struct QemuRestore {
    version: String,
    result: Result<QemuResume, String>,
}

impl RestoreBench {
    /// Run the probe's functions under `qemu`, migrated and resumed.
    pub fn against_qemu(&self, qemu: &Qemu) -> QemuRestore {
        QemuRestore {
            version: qemu.version().into(),
            result: self.migrate(qemu).map_err(|e| e.to_string()),
        }
    }

    fn migrate(&self, qemu: &Qemu) -> Result<QemuResume, PeerError> {
        let machine = QemuMachine {
            virtio_net: u8::try_from(self.devices).expect("validated: at most 28"),
            queue_pairs: self.queue_pairs,
            ..QemuMachine::default()
        };
        let functions: Vec<_> = (0..machine.virtio_net)
            .map(|d| machine.virtio_net_function(d))
            .collect();
        let mut list: Vec<Op> = Vec::new();
        for &f in &functions {
            list.push(ops::msix_program(f, FIRST_VECTOR, 0, true));
            list.push(ops::msix_control(f, PCI_MSIX_FLAGS_ENABLE));
        }
        list.extend(functions.iter().map(|&f| ops::msix_check(f, false)));
        list.push(ops::ram_read_loop(RAM_READS));
        list.extend(functions.iter().map(|&f| ops::msix_check(f, false)));
        let resumed = qemu.migrate_probe(&machine, &list, SETTLE, self.timeout)?;
        if let Some(i) = resumed
            .run
            .results
            .iter()
            .position(|r| r.status != STATUS_OK)
        {
            let why = format!(
                "probe op {i} ended with status {}",
                resumed.run.results[i].status
            );
            return Err(PeerError::Io {
                what: "resume the probe under QEMU".into(),
                source: std::io::Error::other(why),
            });
        }
        Ok(resumed)
    }
}

impl QemuRestore {
    /// Set QEMU's figures beside `report`'s: a note, and the whole-restore target.
    pub fn attach(&self, report: &mut ScenarioReport) {
        let resumed = match &self.result {
            Ok(r) => r,
            Err(why) => {
                report
                    .notes
                    .push(format!("{}: not measured: {why}", self.version));
                return;
            }
        };
        let qemu_ms = resumed.start_to_running.as_secs_f64() * 1e3;
        report.notes.push(format!(
            "{}: migrate to a file (exec:cat) {:.1} ms, {:.1} MiB; resume with -incoming: \
             process start to guest running (QMP query-status) {qemu_ms:.1} ms; {}, then every \
             function's MSI-X check passed",
            self.version,
            resumed.migrate.as_secs_f64() * 1e3,
            resumed.file_bytes as f64 / 1048576.0,
            match resumed.mid_ops {
                true => "migrated in the middle of the probe's ops",
                false => "NOT migrated in the middle of the probe's ops",
            }
        ));
        let Some(batched) = (report.variants.iter())
            .find(|v| v.name == CommitStrategy::Batched.name())
            .map(|v| v.ns_per_op / 1e6)
        else {
            return;
        };
        report.targets.push(TargetCheck {
            target: "whole restore <= QEMU's".into(),
            measured: format!(
                "batched {batched:.1} ms (snapshot opened to vCPUs started, in the bench's \
                 process) vs QEMU {qemu_ms:.1} ms (process start to guest running)"
            ),
            met: batched <= qemu_ms,
            ..Default::default()
        });
    }
}
