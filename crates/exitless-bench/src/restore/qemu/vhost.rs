//! `bench restore --against qemu` with vhost-user functions on testpmd: the seed's case under
//! QEMU, which routes the vectors of vhost signallers (and VFIO's) only. The functions are
//! vhost-user-net on testpmd's ports (the `*-vhost-user` rows' ports), every vector
//! programmed, unmasked and enabled, each brought up in turn and answering an ICMP echo
//! (`msix_vhost::ops`; the probe resets each function before the next, so the last one's rings
//! and irqfds are live); then a window of rounds, each a short RAM loop, an echo and a read of
//! the marker register, in which QEMU migrates the probe. The second QEMU reconnects to
//! testpmd (its vhost-user ports are servers that take the next frontend once the first QEMU
//! is gone), routes the live rings' vectors and starts them; the guest's next answered echo is
//! its first interrupt after the resume, and the marker read right after it the first step of
//! the guest QEMU sees (its rings and interrupts go through testpmd and KVM), timed in QEMU's
//! trace.
//!
//! An echo in flight while QEMU's migration talks to testpmd may lose its reply, as any packet
//! in flight across a migration may (testpmd drops a reply it cannot queue while a vhost-user
//! message holds the rings; one in flight at the stop may be lost too); the probe gives up on
//! it after a second. So the echoes of the rounds from the first after `migrate` was sent to
//! the first run by the second QEMU may go unanswered (they are counted); every other echo
//! must be answered, and the first interrupt is the first answered one after the resume.

use std::path::PathBuf;
use std::time::Duration;

use super::check::{checked, resume_failed};
use crate::msix_vhost;
use crate::restore::RestoreBench;
use crate::vhost_net::{BACKEND_IP, BACKEND_MAC, GUEST_IP};
use exitless::contract::{MAX_OPS, METHOD_ECAM, Op, STATUS_OK, STATUS_TIMEOUT};
use exitless::machine::ops;
use exitless::pci::PciAddress;
use exitless_peer::{MarkerTraces, Migration, PeerError, Qemu, QemuMachine, QemuResume};

/// RAM reads of each round of the migration window (a few ms): at most this much of the
/// guest's work after the resume comes before its first echo.
pub(super) const WINDOW_READS: u64 = 10_000_000;
/// The register the window's marker reads, once per round: Min_Gnt (PCI 3.0 §6.2.1, a type 0
/// header byte), which neither SeaBIOS nor the probe's other ops read.
const MARKER_REG: u16 = 0x3e;
/// How long after the guest's first marker read the migration begins.
const WINDOW_SETTLE: Duration = Duration::from_millis(100);

/// The guest's work on QEMU's vhost-user functions.
struct VhostPlan {
    ops: Vec<Op>,
    /// The window's echoes, one per round.
    echoes: Vec<usize>,
    /// The first MSI-X check after the window: the echoes' receive interrupts come on the IDT
    /// vectors of the functions' entries (the driver's own), so it counts them as unexpected
    /// (`STATUS_BAD_DATA`); its status is not read, and the checks after it count from it.
    baseline: usize,
}

/// A vhost-user migration's outcome.
pub(super) struct VhostResume {
    pub resumed: QemuResume,
    /// The second QEMU's start to the marker read after the first answered echo after the
    /// resume.
    pub first_interrupt: Duration,
    /// Echoes the migration cut (unanswered).
    pub lost: usize,
}

impl RestoreBench {
    /// The vhost-user functions on `sockets` (testpmd polling), migrated in the window.
    pub(super) fn migrate_vhost(
        &self,
        qemu: &Qemu,
        sockets: &[PathBuf],
    ) -> Result<VhostResume, PeerError> {
        let machine = QemuMachine {
            virtio_net: u8::try_from(sockets.len()).expect("validated: at most 28"),
            queue_pairs: self.queue_pairs,
            vhost_user: sockets.to_vec(),
            ..QemuMachine::default()
        };
        let functions: Vec<_> = (0..machine.virtio_net)
            .map(|d| crate::against::virtio_net_function(&machine, d))
            .collect();
        let plan = vhost_plan(&functions);
        let m = Migration {
            ops: &plan.ops,
            settle: WINDOW_SETTLE,
            marker: Some(MARKER_REG),
            timeout: self.timeout,
        };
        let resumed = qemu.migrate_probe(&machine, &m)?;
        // Every op passed but the baseline and the window's echoes that got no reply (the
        // dump holds a result per op: `Qemu::migrate_probe` checked the count).
        let results = &resumed.run.results;
        let timed_out = |i: &usize| results[*i].status == STATUS_TIMEOUT;
        let mut skip: Vec<usize> = plan.echoes.iter().copied().filter(timed_out).collect();
        skip.push(plan.baseline);
        let resumed = checked(resumed, &skip)?;
        let results = &resumed.run.results;
        let answered: Vec<bool> = (plan.echoes.iter())
            .map(|&i| results[i].status == STATUS_OK && results[i].value == 1)
            .collect();
        let traces = resumed.markers.as_ref().expect("migrated with a marker");
        let (first_interrupt, lost) = first_interrupt(traces, &answered).map_err(resume_failed)?;
        Ok(VhostResume {
            resumed,
            first_interrupt,
            lost,
        })
    }
}

/// Each function programmed, enabled, brought up and answering an echo (the driver then
/// drives the last one); the window's rounds, as many as the op array holds; the baseline
/// MSI-X check, then every function's.
fn vhost_plan(functions: &[PciAddress]) -> VhostPlan {
    let mut list = Vec::new();
    msix_vhost::ops(&mut list, functions, false);
    let last = *functions.last().expect("at least one function");
    let max = usize::try_from(MAX_OPS).expect("the op array's 512 entries");
    let rounds = max.saturating_sub(list.len() + functions.len() + 1) / 3;
    let mut echoes = Vec::new();
    for _ in 0..rounds {
        list.push(ops::ram_read_loop(WINDOW_READS));
        list.push(ops::icmp_echo(BACKEND_IP, GUEST_IP, BACKEND_MAC, 32, 1));
        echoes.push(list.len() - 1);
        list.push(ops::cfg_read(METHOD_ECAM, last, MARKER_REG, 1));
    }
    list.push(ops::msix_check(last, false));
    let baseline = list.len() - 1;
    list.extend(functions.iter().map(|&f| ops::msix_check(f, false)));
    VhostPlan {
        ops: list,
        echoes,
        baseline,
    }
}

/// Place the window's rounds by the marker reads each QEMU saw (the first QEMU's, then the
/// second's), check each round's echo (`answered`): those from the first round after
/// `migrate` to the first round the second QEMU ran may be lost, no other. Returns the
/// second QEMU's start to the marker read after the first answered echo it ran, and how many
/// were lost.
fn first_interrupt(t: &MarkerTraces, answered: &[bool]) -> Result<(Duration, usize), String> {
    let rounds = answered.len();
    let (on_source, on_target) = (t.source.reads.len(), t.target.reads.len());
    if on_source + on_target != rounds {
        return Err(format!(
            "the QEMUs' traces hold {on_source} + {on_target} reads of the marker for {rounds} \
             rounds"
        ));
    }
    let before_migrate = (t.source.reads.iter())
        .filter(|&&at| at < t.migrate_at)
        .count();
    let may_lose = before_migrate..=on_source;
    if let Some(r) = (0..rounds).find(|&r| !answered[r] && !may_lose.contains(&r)) {
        return Err(format!(
            "the echo of round {r} of {rounds} got no reply (the migration began in round \
             {before_migrate}, the second QEMU ran from round {on_source})"
        ));
    }
    let first = (on_source..rounds)
        .find(|&r| answered[r])
        .ok_or("no echo answered after the resume")?;
    let lost = answered.iter().filter(|&&a| !a).count();
    Ok((t.since_start(t.target.reads[first - on_source]), lost))
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use exitless::contract::{OP_CFG_READ, OP_ICMP_ECHO, OP_MSIX_CHECK, OP_RAM_READ_LOOP};
    use exitless::machine::ProbeConfig;
    use exitless_peer::MarkerTrace;

    #[test]
    fn the_plan_fills_the_op_array_with_rounds_each_ending_in_the_marker() {
        let f: Vec<_> = (0..8).map(ProbeConfig::virtio_pci_address).collect();
        let plan = vhost_plan(&f);
        let list = &plan.ops;
        assert!(list.len() as u64 <= MAX_OPS && list.len() as u64 > MAX_OPS - 3);
        // Each function's bring-up and echo first, then the rounds, then the checks.
        let bring_up = 8 * 5;
        assert_eq!(list[4].kind, OP_ICMP_ECHO);
        assert_eq!(plan.baseline, list.len() - 9);
        assert_eq!(list[plan.baseline], ops::msix_check(f[7], false));
        let rounds = &list[bring_up..plan.baseline];
        assert_eq!(rounds.len(), 3 * plan.echoes.len());
        for (round, &echo) in rounds.chunks(3).zip(&plan.echoes) {
            assert_eq!(round[0].kind, OP_RAM_READ_LOOP);
            assert_eq!(round[1].kind, OP_ICMP_ECHO);
            assert_eq!(list[echo], round[1]);
            assert_eq!(round[2], ops::cfg_read(METHOD_ECAM, f[7], MARKER_REG, 1));
        }
        assert!(
            list[plan.baseline..]
                .iter()
                .all(|o| o.kind == OP_MSIX_CHECK)
        );
        // Only the rounds read the marker.
        let markers = list
            .iter()
            .filter(|o| o.kind == OP_CFG_READ && o.address & 0xfff == u64::from(MARKER_REG));
        assert_eq!(markers.count(), plan.echoes.len());
    }

    /// Traces of 6 rounds: reads at 1..=6 s, `migrate` sent at 2.5 s, the second QEMU started
    /// at 10 s and running rounds 4 to 6 at 11, 12 and 13 s.
    fn traces(on_source: usize) -> MarkerTraces {
        let at = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        let reads = |from, to| (from..to).map(|s| at(s as u64 + 1)).collect();
        MarkerTraces {
            source: MarkerTrace {
                reads: reads(0, on_source),
                ..Default::default()
            },
            migrate_at: at(2) + Duration::from_millis(500),
            started: at(10),
            target: MarkerTrace {
                reads: (on_source..6).map(|r| at(8 + r as u64)).collect(),
                ..Default::default()
            },
        }
    }

    #[test]
    fn the_first_interrupt_is_the_first_answered_echo_the_second_qemu_ran() {
        let t = traces(3);
        let all = [true; 6];
        assert_eq!(first_interrupt(&t, &all), Ok((Duration::from_secs(1), 0)));
        // Rounds 2 (after `migrate`) and 3 (in flight at the stop) may be lost.
        let cut = [true, true, false, false, true, true];
        assert_eq!(first_interrupt(&t, &cut), Ok((Duration::from_secs(2), 2)));
        // Round 1 ran before `migrate`; round 4 after the resume.
        for lost in [1, 4] {
            let mut a = all;
            a[lost] = false;
            let e = first_interrupt(&t, &a).unwrap_err();
            assert!(
                e.starts_with(&format!("the echo of round {lost} of 6")),
                "{e}"
            );
        }
        // Rounds the traces do not account for; a migration after the window.
        assert!(first_interrupt(&t, &all[..5]).is_err());
        let after = traces(6);
        assert_eq!(
            first_interrupt(&after, &all),
            Err("no echo answered after the resume".into())
        );
    }
}
