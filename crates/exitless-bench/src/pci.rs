//! `exitless bench pci`: reads of one config register and whole-bus enumeration by port I/O,
//! trapped ECAM and shadowed ECAM, with a guest-RAM read loop as the floor
//! (docs/benchmarks.md has the seed each scenario reproduces).

use std::time::Duration;

use crate::against::{Counterpart, PeerPlan};
use crate::measure::{
    Clock, combine_rounds, in_rounds, ratio_target, rounds_line, run_ok, set_baseline, variant,
};
use crate::model::{ScenarioReport, TargetCheck, Variant};
use exitless::contract::{METHOD_ECAM, METHOD_PIO, Op};
use exitless::machine::{ProbeConfig, ProbeError, ProbeRun, ops};
use exitless::pci::{EcamMode, PciAddress};
use exitless_peer::QemuMachine;

/// The seed's figures: 100k reads by PIO 12.809 s, ECAM 8.517 s, ECAM shadow 0.010 s; a PCI
/// scan of 55 ms with PIO and 18 ms with the shadow.
const SEED_PIO_READS_S: f64 = 12.809;
const SEED_ECAM_READS_S: f64 = 8.517;
const SEED_SHADOW_READS_S: f64 = 0.010;
const SEED_ENUM_PIO_MS: f64 = 55.0;
const SEED_ENUM_SHADOW_MS: f64 = 18.0;

/// Knobs of the scenario.
#[derive(Clone, Debug)]
pub struct PciBench {
    /// Config reads per read variant (the seed's count is 100,000).
    pub reads: u64,
    /// Enumerations per method; the median is reported.
    pub enumerations: u16,
    /// Limit for each guest run.
    pub timeout: Duration,
    /// Rounds: each boots the probe twice (ECAM trapped, then shadowed; the order rotated).
    pub rounds: usize,
}

/// The register the read loops hit: vendor/device ID of the first test endpoint, as the seed's
/// `raw_pci_read` loop reads a fixed register.
fn read_target() -> PciAddress {
    PciAddress::new(0, 1, 0).expect("valid address")
}

/// The ops of the boot with ECAM trapped: the floor (op 0), `n` reads of `target` by port I/O
/// (op 1) and by ECAM (op 2), then `reps` enumerations by port I/O and `reps` by ECAM.
fn trap_ops(target: PciAddress, n: u64, reps: usize) -> Vec<Op> {
    let mut list = vec![
        ops::ram_read_loop(n),
        ops::cfg_read_loop(METHOD_PIO, target, 0, n),
        ops::cfg_read_loop(METHOD_ECAM, target, 0, n),
    ];
    list.extend((0..reps).map(|_| ops::enumerate(METHOD_PIO)));
    list.extend((0..reps).map(|_| ops::enumerate(METHOD_ECAM)));
    list
}

impl PciBench {
    /// One boot of the probe with ECAM served as `ecam`; every op must succeed.
    fn boot(&self, ecam: EcamMode, ops: Vec<Op>) -> Result<ProbeRun, ProbeError> {
        run_ok(&ProbeConfig {
            ops,
            ecam: Some(ecam),
            timeout: self.timeout,
            ..Default::default()
        })
    }

    /// The same loops and enumerations under QEMU (`--against qemu`), whose ECAM is always
    /// trapped: the counterpart of both ECAM variants. It reads the first virtio-net function,
    /// as exitless's loop reads its first endpoint.
    pub fn peer_plan(&self) -> PeerPlan {
        let machine = QemuMachine {
            virtio_net: 1,
            ..QemuMachine::default()
        };
        let (n, reps) = (self.reads.max(1), usize::from(self.enumerations.max(1)));
        let list = trap_ops(crate::against::virtio_net_function(&machine, 0), n, reps);
        let enums = |start: usize| (start..start + reps).collect::<Vec<_>>();
        let pair = |variant: &'static str, ops, per_op, path| Counterpart {
            variant: variant.into(),
            ops,
            per_op,
            path,
            control: false,
        };
        let trapped = "ECAM, every access trapped";
        let unshadowed = "ECAM, every access trapped (no shadow)";
        PeerPlan {
            machine,
            ops: list,
            counterparts: vec![
                Counterpart {
                    control: true,
                    ..pair("ram", vec![0], n, "guest RAM")
                },
                pair("pio", vec![1], n, "port I/O, every access trapped"),
                pair("ecam-trap", vec![2], n, trapped),
                pair("ecam-shadow", vec![2], n, unshadowed),
                pair("enum-pio", enums(3), 1, "port I/O"),
                pair("enum-ecam-trap", enums(3 + reps), 1, trapped),
                pair("enum-ecam-shadow", enums(3 + reps), 1, unshadowed),
            ],
            exit_avoiding: &["ecam-shadow"],
            timeout: self.timeout,
        }
    }

    /// One round: the boot with ECAM trapped (`0`) or shadowed (`1`), and its variants.
    fn round_boot(
        &self,
        which: usize,
        target: PciAddress,
    ) -> Result<(Vec<Variant>, Clock), ProbeError> {
        let n = self.reads.max(1);
        let reps = usize::from(self.enumerations.max(1));
        let enum_range = |start: usize| (start..start + reps).collect::<Vec<_>>();
        // A loop op does `n` timed reads plus one warm-up read that its exit count includes.
        if which == 0 {
            // ECAM trapped: the floor, port I/O and trapped-ECAM reads, both enumerations.
            let trap = self.boot(EcamMode::Trap, trap_ops(target, n, reps))?;
            let tc = Clock::of(&trap);
            let variants = vec![
                variant("ram", &trap, &tc, &[0], n, n + 1),
                variant("pio", &trap, &tc, &[1], n, n + 1),
                variant("ecam-trap", &trap, &tc, &[2], n, n + 1),
                variant("enum-pio", &trap, &tc, &enum_range(3), 1, 1),
                variant("enum-ecam-trap", &trap, &tc, &enum_range(3 + reps), 1, 1),
            ];
            return Ok((variants, tc));
        }
        // ECAM shadowed: the same read loop and enumeration.
        let mut shadow_ops = vec![ops::cfg_read_loop(METHOD_ECAM, target, 0, n)];
        shadow_ops.extend((0..reps).map(|_| ops::enumerate(METHOD_ECAM)));
        let shadow = self.boot(EcamMode::Shadow, shadow_ops)?;
        let sc = Clock::of(&shadow);
        let variants = vec![
            variant("ecam-shadow", &shadow, &sc, &[0], n, n + 1),
            variant("enum-ecam-shadow", &shadow, &sc, &enum_range(1), 1, 1),
        ];
        Ok((variants, sc))
    }

    /// `rounds` rounds of two boots (ECAM trapped, ECAM shadowed), and the report.
    pub fn run(&self) -> Result<ScenarioReport, ProbeError> {
        let n = self.reads.max(1);
        let reps = usize::from(self.enumerations.max(1));
        let target = read_target();
        let rounds = self.rounds.max(1);
        let boots = in_rounds(rounds, 2, |which| self.round_boot(which, target))?;
        let tc = boots[0][0].1.describe();
        let per_round: Vec<Vec<Variant>> = (0..rounds)
            .map(|r| boots.iter().flat_map(|b| b[r].0.clone()).collect())
            .collect();
        let all = combine_rounds(per_round);
        let pick = |names: &[&str]| -> Vec<Variant> {
            names
                .iter()
                .filter_map(|n| all.iter().find(|v| v.name == *n).cloned())
                .collect()
        };
        let mut reads = pick(&["ram", "pio", "ecam-trap", "ecam-shadow"]);
        let mut enums = pick(&["enum-pio", "enum-ecam-trap", "enum-ecam-shadow"]);
        let seed_reads = [
            ("pio", 1.0),
            ("ecam-trap", SEED_ECAM_READS_S / SEED_PIO_READS_S),
            ("ecam-shadow", SEED_SHADOW_READS_S / SEED_PIO_READS_S),
        ];
        let seed_enums = [
            ("enum-pio", 1.0),
            ("enum-ecam-shadow", SEED_ENUM_SHADOW_MS / SEED_ENUM_PIO_MS),
        ];
        set_baseline(&mut reads, "pio", &seed_reads);
        set_baseline(&mut enums, "enum-pio", &seed_enums);
        let targets = targets(&reads, &enums);
        reads.extend(enums);
        Ok(ScenarioReport {
            name: "pci".into(),
            title: format!(
                "PCI config space three ways (T1, seed 000): {n} reads of {target} register 0x0 per method, bus enumeration (median of {reps})"
            ),
            timing: format!(
                "{tc}; loops start after one untimed warm-up access; {}",
                rounds_line(rounds, "ECAM trapped, ECAM shadowed")
            ),
            variants: reads,
            targets,
            notes: Vec::new(),
            soak: None,
        })
    }
}

fn targets(reads: &[Variant], enums: &[Variant]) -> Vec<TargetCheck> {
    let get = |vs: &[Variant], name: &str| {
        vs.iter()
            .find(|v| v.name == name)
            .cloned()
            .expect("variant exists")
    };
    let (ram, pio, shadow) = (
        get(reads, "ram"),
        get(reads, "pio"),
        get(reads, "ecam-shadow"),
    );
    let (enum_pio, enum_shadow) = (get(enums, "enum-pio"), get(enums, "enum-ecam-shadow"));
    let ns = |v: &Variant| v.each_round(|r| r.ns_per_op);
    vec![
        ratio_target(
            "ECAM-shadow reads >= 1,000x faster than PIO".into(),
            format!("{:.0}x", pio.ns_per_op / shadow.ns_per_op),
            (&ns(&pio), &ns(&shadow)),
            1000.0,
            false,
        ),
        ratio_target(
            "ECAM-shadow reads within 3x of the RAM floor".into(),
            format!("{:.2}x", shadow.ns_per_op / ram.ns_per_op),
            (&ns(&shadow), &ns(&ram)),
            3.0,
            true,
        ),
        TargetCheck {
            target: "0 exits per ECAM-shadow read".into(),
            measured: format!("{} exits per read", shadow.exits_per_op),
            met: shadow.exits_per_op == 0.0 && !shadow.counts_vary,
            ..Default::default()
        },
        ratio_target(
            "shadow enumeration <= 0.33x PIO enumeration".into(),
            format!("{:.3}x", enum_shadow.ns_per_op / enum_pio.ns_per_op),
            (&ns(&enum_shadow), &ns(&enum_pio)),
            0.33,
            true,
        ),
    ]
}
