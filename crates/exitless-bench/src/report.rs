//! Rendering a [`Report`]: a table for people, JSON for tools (the SVG charts are
//! [`chart`](crate::chart)'s).

use std::fmt::Write as _;

use crate::format::{human_ns, human_ns_pm, ratio, ratio_interval};
use crate::model::{IommuFigures, Report, RoutingFigures, ScenarioReport, Variant};

/// The table for one scenario.
pub fn scenario_table(s: &ScenarioReport) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "== {} ==\n{}\ntiming: {}\n", s.name, s.title, s.timing);
    let _ = writeln!(
        t,
        "{:<26} {:>12} {:>14} {:>12}   {:>20} {:>10} {:>8}  exits by kind",
        "variant", "time ratio", "ratio 95%", "seed ratio", "time/op (95%)", "exits/op", "ops"
    );
    for v in &s.variants {
        variant_row(&mut t, v);
    }
    ratios_and_counts(&mut t, s);
    peer_table(&mut t, s);
    routing_table(&mut t, s);
    iommu_table(&mut t, s);
    let _ = writeln!(t, "targets (benchmark figures, not test asserts):");
    for c in &s.targets {
        let mark = c.verdict().label();
        let _ = writeln!(t, "  [{mark:>15}] {}: {}", c.target, c.measured);
    }
    for n in &s.notes {
        let _ = writeln!(t, "  - {n}");
    }
    t
}

/// One variant's row: its ratios, time with its interval, exits, and what else it measured.
fn variant_row(t: &mut String, v: &Variant) {
    let kinds: Vec<String> = v
        .exits_by_kind
        .iter()
        .filter(|(_, n)| **n > 0.0)
        .map(|(k, n)| format!("{k}:{n:.2}"))
        .collect();
    let seed = v.seed_time_ratio.map_or("-".into(), ratio);
    let (vs, vs_ci) = if v.name == v.baseline {
        ("1 (base)".into(), "-".into())
    } else {
        (ratio(v.time_ratio), ratio_interval(v.time_ratio_ci95))
    };
    let exits = format!(
        "{:.2}{}",
        v.exits_per_op,
        if v.counts_vary { "*" } else { "" }
    );
    let mut extra = String::new();
    if let Some(tps) = v.trans_per_s {
        let _ = write!(extra, "  {tps:.0} trans/s");
    }
    if let Some((lo, hi)) = v.seed_trans_per_s {
        let _ = write!(extra, " (seed {lo:.0}-{hi:.0})");
    }
    if let Some(irqs) = v.irqs_per_op {
        let _ = write!(extra, " irqs/op:{irqs:.2}");
    }
    if let Some(delivery) = v.delivery {
        let _ = write!(extra, " via {delivery}");
    }
    let _ = writeln!(
        t,
        "{:<26} {:>12} {:>14} {:>12}   {:>20} {:>10} {:>8}  {}{extra}",
        v.name,
        vs,
        vs_ci,
        seed,
        human_ns_pm(v.ns_per_op, v.ci95[0], v.ci95[1]),
        exits,
        v.ops,
        if kinds.is_empty() {
            "-".into()
        } else {
            kinds.join(" ")
        },
    );
}

/// What the time ratios are against, and whether the counts held across rounds.
fn ratios_and_counts(t: &mut String, s: &ScenarioReport) {
    let mut bases_unique: Vec<&str> = Vec::new();
    for v in &s.variants {
        if !bases_unique.contains(&v.baseline.as_str()) {
            bases_unique.push(&v.baseline);
        }
    }
    let _ = writeln!(
        t,
        "\ntime ratio = time/op over the baseline's ({}); below 1 is faster; ratio 95%: bootstrap \
         over paired rounds",
        bases_unique.join(", ")
    );
    let varying: Vec<&str> = s
        .variants
        .iter()
        .filter(|v| v.counts_vary)
        .map(|v| v.name.as_str())
        .collect();
    let rounds = s.variants.iter().map(|v| v.rounds).max().unwrap_or(1);
    if varying.is_empty() {
        let _ = writeln!(
            t,
            "exit, interrupt and commit counts: identical in all {rounds} rounds"
        );
    } else {
        let _ = writeln!(
            t,
            "exits/op marked *: counts differed between rounds ({}); the median round's shown",
            varying.join(", ")
        );
    }
}

/// The unmap strategies' figures (`iommu`), one row per variant: packets/s against `none`
/// with the seed's ratio, costs per packet, the exposure, the transactions.
fn iommu_table(t: &mut String, s: &ScenarioReport) {
    let rows: Vec<(&str, &IommuFigures)> = s
        .variants
        .iter()
        .filter_map(|v| Some((v.name.as_str(), v.iommu.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        t,
        "\n{:<24} {:>9} {:>8} {:>6} {:>10} {:>9} {:>9} {:>7} {:>13} {:>7} {:>22} {:>6} {:>11} {:>8}",
        "variant",
        "pkts/s",
        "vs none",
        "seed",
        "cyc/pkt",
        "dev/pkt",
        "vmm/pkt",
        "iqt/pk",
        "iotlb hit/miss",
        "stale",
        "exposure max/mean/p99",
        "pend",
        "rr trans/s",
        "rr"
    );
    for (name, f) in rows {
        let seed = f
            .seed_packets_ratio
            .map_or("-".into(), |r| format!("{r:.2}"));
        let stale = f.unit.as_ref().map_or(0, |u| u.iotlb_dropped_stale);
        let iotlb = f.unit.as_ref().map_or("-".into(), |u| {
            format!("{}/{}", u.iotlb.hits, u.iotlb.misses)
        });
        let _ = writeln!(
            t,
            "{name:<24} {:>9.0} {:>8} {seed:>6} {:>10.0} {:>9} {:>9} {:>7.4} {iotlb:>13} {stale:>7} {:>22} {:>6} {:>11.0} {:>8}",
            f.packets_per_s,
            ratio(f.packets_ratio),
            f.guest_cycles_per_packet,
            human_ns(f.device_cpu_ns_per_packet),
            human_ns(f.host_cpu_ns_per_packet),
            f.iqt_writes_per_packet,
            format!(
                "{:.0}/{:.0}/{:.0} us",
                f.exposure_max_us, f.exposure_mean_us, f.exposure_p99_us
            ),
            f.max_pending_pages,
            f.rr_trans_per_s,
            ratio(f.rr_ratio),
        );
    }
    let _ = writeln!(
        t,
        "pkts/s: streamed frames per second; vs none, seed: over none's, here and in the seed; cyc/pkt: \
         guest cycles per frame; dev/pkt: the device thread's CPU per frame; vmm/pkt: the whole \
         VMM's CPU (every thread, guest time included) per frame; iqt/pk: invalidation-queue writes per frame (doorbells, not exits, on a 256-entry queue); \
         iotlb: the unit's hits and misses over the variant's boot; stale: IOTLB entries dropped for pages the guest had already unmapped; exposure: per \
         unmapped page, unmap to completed invalidation; pend: most pages pending"
    );
}

/// The variants measured under another VMM too: its time per op beside exitless's.
fn peer_table(t: &mut String, s: &ScenarioReport) {
    let Some(peer) = s.variants.iter().find_map(|v| v.peer.as_ref()) else {
        return;
    };
    let name = &peer.name;
    let _ = writeln!(
        t,
        "\nagainst {name} {} (same probe binary and ops, same guest TSC timing):",
        peer.version
    );
    let _ = writeln!(
        t,
        "{:<26} {:>11} {:>11} {:>14}   {name}'s path",
        "variant",
        "time/op",
        format!("{name} t/op"),
        format!("exitless/{name}")
    );
    for v in &s.variants {
        let Some(p) = &v.peer else { continue };
        let _ = writeln!(
            t,
            "{:<26} {:>11} {:>11} {:>14}   {}",
            v.name,
            human_ns(v.ns_per_op),
            human_ns(p.ns_per_op),
            v.vs_peer().map_or("-".into(), ratio),
            p.path
        );
    }
    let _ = writeln!(
        t,
        "exitless/{name} below 1: exitless is faster; {name}'s exits cannot be counted from outside it"
    );
}

/// Per-device figures of the variants that have them, side by side, the seed's beside them.
fn routing_table(t: &mut String, s: &ScenarioReport) {
    let with: Vec<(&str, &RoutingFigures)> = s
        .variants
        .iter()
        .filter_map(|v| Some((v.name.as_str(), v.routing.as_ref()?)))
        .collect();
    let Some(devices) = with.iter().map(|(_, r)| r.per_device_ms.len()).max() else {
        return;
    };
    let _ = write!(t, "\n{:<8}", "device");
    for (name, r) in &with {
        let _ = write!(t, " {:>24}", format!("{name} ms (commits)"));
        if r.seed_per_device_ms.is_some() {
            let _ = write!(t, " {:>10}", "seed ms");
        }
    }
    let _ = writeln!(t);
    let cell = |r: &RoutingFigures, i: usize| match (
        r.per_device_ms.get(i),
        r.per_device_commits.get(i),
    ) {
        (Some(ms), Some(c)) => format!("{ms:.3} ({c})"),
        _ => "-".into(),
    };
    for i in 0..devices {
        let _ = write!(t, "{:<8}", i + 1);
        for (_, r) in &with {
            let _ = write!(t, " {:>24}", cell(r, i));
            if let Some(seed) = &r.seed_per_device_ms {
                let _ = write!(
                    t,
                    " {:>10}",
                    seed.get(i).map_or("-".into(), |x| format!("{x:.0}"))
                );
            }
        }
        let _ = writeln!(t);
    }
    let _ = write!(t, "{:<8}", "total");
    for (_, r) in &with {
        let _ = write!(t, " {:>24}", format!("{:.3} ({})", r.total_ms, r.commits));
        if let Some(seed) = r.seed_total_ms {
            let _ = write!(t, " {seed:>10.0}");
        }
    }
    let _ = writeln!(t);
    let _ = write!(t, "{:<8}", "in KVM");
    for (_, r) in &with {
        let _ = write!(t, " {:>24}", format!("{:.3} ms", r.commit_ms));
        if r.seed_total_ms.is_some() {
            let _ = write!(t, " {:>10}", "");
        }
    }
    let _ = writeln!(t, "\n");
}

/// The whole report as text.
pub fn text(r: &Report) -> String {
    let mut t = format!("exitless bench on {}\n\n", r.host);
    for s in &r.scenarios {
        t.push_str(&scenario_table(s));
        t.push('\n');
    }
    t
}

/// The whole report as JSON.
pub fn json(r: &Report) -> String {
    serde_json::to_string_pretty(r).expect("the report serializes")
}
