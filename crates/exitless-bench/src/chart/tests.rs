//! Each chart of a synthetic report parses as XML and holds its variants' labels, an axis
//! with tick labels, the title and the host.

use super::*;
use crate::model::{IommuFigures, PeerFigure, RoutingFigures, ScenarioReport, Variant};

const HOST: &str = "Test CPU @ 2.0GHz, 2 CPUs, Linux 6.1";

fn variant(name: &str, ns: f64) -> Variant {
    Variant {
        name: name.into(),
        ns_per_op: ns,
        ..Variant::default()
    }
}

fn pci() -> ScenarioReport {
    let peer = |ns| PeerFigure {
        name: "qemu".into(),
        version: "QEMU emulator version 9.2.0".into(),
        ns_per_op: ns,
        path: "trapped".into(),
    };
    let mut trap = variant("enum-ecam-trap", 52_000.0);
    (trap.ci95, trap.rounds) = ([48_000.0, 55_000.0], 5);
    trap.peer = Some(peer(61_000.0));
    let mut shadow = variant("enum-ecam-shadow", 900.0);
    (shadow.ci95, shadow.rounds) = ([850.0, 990.0], 5);
    shadow.peer = Some(peer(60_000.0));
    ScenarioReport {
        name: "pci".into(),
        title: "PCI config space by port I/O, trapped ECAM and shadowed ECAM".into(),
        variants: vec![variant("pio", 3_000.0), trap, shadow],
        ..ScenarioReport::default()
    }
}

fn msix() -> ScenarioReport {
    let strategy = |name: &str, base: f64, grows: f64, seed: Option<f64>| {
        let per_device_ms: Vec<f64> = (0..8).map(|d| base + grows * d as f64).collect();
        let mut v = variant(name, base * 1e6);
        v.routing = Some(RoutingFigures {
            total_ms: per_device_ms.iter().sum(),
            seed_per_device_ms: seed.map(|s| (0..8).map(|d| s * (d + 1) as f64).collect()),
            per_device_ms,
            ..RoutingFigures::default()
        });
        v
    };
    ScenarioReport {
        name: "msix".into(),
        title: "MSI-X Enable".into(),
        variants: vec![
            strategy("per-vector", 1.0, 0.5, Some(5.0)),
            strategy("batched", 0.05, 0.0, Some(1.0)),
            strategy("direct", 0.02, 0.0, None),
        ],
        ..ScenarioReport::default()
    }
}

fn iommu() -> ScenarioReport {
    let unmap = |name: &str, fps: f64, mean: f64, p99: f64| {
        let mut v = variant(name, 1e9 / fps);
        v.iommu = Some(IommuFigures {
            packets_per_s: fps,
            exposure_mean_us: mean,
            exposure_p99_us: p99,
            ..IommuFigures::default()
        });
        v
    };
    let mut variants = vec![
        unmap("none", 200_000.0, 0.0, 0.0),
        unmap("strict", 90_000.0, 3.0, 8.0),
        unmap("deferred-array", 180_000.0, 400.0, 1024.0),
    ];
    for (mark, fps) in [(1, 95_000.0), (16, 150_000.0), (1000, 185_000.0)] {
        let mean = mark as f64 * 2.0;
        variants.push(unmap(
            &format!("deferred-array-hwm{mark}"),
            fps,
            mean,
            mean * 3.0,
        ));
    }
    ScenarioReport {
        name: "iommu".into(),
        title: "Unmaps behind a VT-d IOMMU".into(),
        variants,
        ..ScenarioReport::default()
    }
}

/// Every text node of `svg`, which must parse, with an `<svg>` root.
fn texts(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(svg).expect("the chart is well-formed XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_owned()))
        .collect()
}

/// The charts of `scenarios`, by file name.
fn drawn(scenarios: Vec<ScenarioReport>) -> Vec<(String, Vec<String>)> {
    let report = Report {
        host: HOST.into(),
        scenarios,
        ..Report::default()
    };
    charts(&report)
        .unwrap()
        .into_iter()
        .map(|c| (c.file, texts(&c.svg)))
        .collect()
}

fn has(texts: &[String], want: &str) -> bool {
    texts.iter().any(|t| t.contains(want))
}

/// Tick labels: texts that start with a digit.
fn ticks(texts: &[String]) -> usize {
    texts
        .iter()
        .filter(|t| t.starts_with(|c: char| c.is_ascii_digit()))
        .count()
}

#[test]
fn bars_name_every_variant_the_peer_the_axis_and_the_host() {
    let charts = drawn(vec![pci()]);
    assert_eq!(charts.len(), 1);
    let (file, t) = &charts[0];
    assert_eq!(file, "pci.svg");
    for name in ["pio", "enum-ecam-trap", "enum-ecam-shadow"] {
        assert!(t.iter().any(|x| x == name), "{name} in {t:?}");
    }
    assert!(has(t, "qemu (QEMU emulator version 9.2.0)"), "{t:?}");
    assert!(has(t, "exitless bench pci") && has(t, HOST), "{t:?}");
    assert!(has(t, "time per operation (log scale"), "{t:?}");
    // Each bar's figure, and ticks on the log axis in time units.
    assert!(has(t, "52.00 us") && has(t, "61.00 us"), "{t:?}");
    assert!(ticks(t) >= 3 + 5, "{t:?}");
}

#[test]
fn msix_draws_each_strategy_and_the_seeds_lines() {
    let charts = drawn(vec![msix()]);
    let files: Vec<&str> = charts.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(files, ["msix.svg", "msix-per-device.svg"]);
    let t = &charts[1].1;
    for name in [
        "per-vector",
        "batched",
        "direct",
        "per-vector (seed)",
        "batched (seed)",
    ] {
        assert!(t.iter().any(|x| x == name), "{name} in {t:?}");
    }
    assert!(!has(t, "direct (seed)"));
    for device in 1..=8 {
        assert!(
            t.iter().any(|x| *x == device.to_string()),
            "device {device}"
        );
    }
    assert!(has(t, "device, in the order enabled") && has(t, HOST));
}

#[test]
fn iommu_draws_one_point_per_mark_and_marks_the_default() {
    let charts = drawn(vec![iommu()]);
    let files: Vec<&str> = charts.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(files, ["iommu.svg", "iommu-hwm-sweep.svg"]);
    let t = &charts[1].1;
    for mark in ["hwm 1", "hwm 16", "hwm 1000", "hwm 250 (seed's default)"] {
        assert!(t.iter().any(|x| x == mark), "{mark} in {t:?}");
    }
    assert!(has(t, "strict") && has(t, "none: no IOMMU") && has(t, HOST));
    assert!(
        has(t, "exposure per unmapped page") && ticks(t) >= 6,
        "{t:?}"
    );
}

#[test]
fn nothing_to_draw_draws_nothing() {
    let empty = ScenarioReport {
        name: "soak".into(),
        variants: vec![variant("hostile", f64::NAN)],
        ..ScenarioReport::default()
    };
    assert!(drawn(vec![empty]).is_empty());
}

#[test]
fn wrap_keeps_words_whole() {
    assert_eq!(wrap("aa bb cc", 5), ["aa bb", "cc"]);
    assert_eq!(wrap("averylongword x", 4), ["averylongword", "x"]);
    assert!(wrap("", 10).is_empty());
}
