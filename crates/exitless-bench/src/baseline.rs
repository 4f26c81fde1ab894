//! A run against a saved one: `exitless bench --save-baseline FILE` writes the JSON report,
//! `--baseline FILE` reads it back and, per variant (matched by scenario and variant name),
//! gives the change in time per op with its interval and a verdict.
//!
//! The rule: the verdict is "no change within noise" when the two variants' 95% intervals of
//! the median (`ci95`) overlap, "improved" when this run's interval lies entirely below the
//! baseline's, "regressed" when entirely above, and "not established" when either side has no
//! interval: one sample gives no verdict. The change's interval is the widest the two
//! intervals allow: from `new lo / old hi - 1` to `new hi / old lo - 1`. Exit, interrupt and
//! commit counts are not statistics: a changed count is a real change whatever the timing,
//! and is named as such.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

use crate::format::human_ns;
use crate::model::Report;

/// What a comparison reads of a report (this run's, or a saved one): both go through the same
/// JSON, so a baseline is read exactly as this run is.
#[derive(Debug, Deserialize)]
pub struct SavedReport {
    /// The host the figures were taken on.
    pub host: String,
    /// The scenarios, in run order.
    pub scenarios: Vec<SavedScenario>,
}

/// One scenario of a [`SavedReport`].
#[derive(Debug, Deserialize)]
pub struct SavedScenario {
    /// Scenario name (`pci`, ...).
    pub name: String,
    /// Its variants.
    pub variants: Vec<SavedVariant>,
}

/// What a comparison reads of one variant.
#[derive(Clone, Debug, Deserialize)]
pub struct SavedVariant {
    /// Variant name.
    pub name: String,
    /// Time per op (absent where the report had none: JSON writes NaN as null).
    pub ns_per_op: Option<f64>,
    /// 95% interval of the median time per op.
    #[serde(default)]
    pub ci95: Option<[f64; 2]>,
    /// Rounds measured.
    #[serde(default)]
    pub rounds: Option<u32>,
    /// Exits per op.
    #[serde(default)]
    pub exits_per_op: Option<f64>,
    /// Interrupts per op.
    #[serde(default)]
    pub irqs_per_op: Option<f64>,
    /// `KVM_SET_GSI_ROUTING` calls (`msix`).
    #[serde(default)]
    pub commits: Option<u64>,
}

impl SavedVariant {
    /// Its interval, if it has one worth the name: a variant measured in one round has
    /// `ci95` equal to its one figure, which says nothing of the noise.
    fn interval(&self) -> Option<[f64; 2]> {
        self.ci95.filter(|_| self.rounds.is_some_and(|n| n >= 2))
    }
}

impl SavedReport {
    /// Read a report written by `--save-baseline` (or `--json`); one line saying what is wrong.
    pub fn load(path: &Path) -> Result<SavedReport, String> {
        let name = path.display();
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read the baseline {name}: {e}"))?;
        serde_json::from_slice(&bytes).map_err(|e| {
            format!("the baseline {name} is not a report of exitless bench --json: {e}")
        })
    }

    /// This run's report, read as a baseline would be.
    pub fn of(report: &Report) -> SavedReport {
        let value = serde_json::to_value(report).expect("the report serializes");
        serde_json::from_value(value).expect("a report reads back as a baseline")
    }
}

/// What the intervals say of a variant's change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// This run's interval lies entirely below the baseline's.
    Improved,
    /// Entirely above.
    Regressed,
    /// The intervals overlap.
    NoChange,
    /// One side has no interval.
    NotEstablished,
}

impl Verdict {
    /// The verdict as the report words it.
    pub fn words(self) -> &'static str {
        match self {
            Verdict::Improved => "improved",
            Verdict::Regressed => "regressed",
            Verdict::NoChange => "no change within noise",
            Verdict::NotEstablished => "not established",
        }
    }

    /// The verdict of the baseline's interval `old` against this run's `new`.
    pub fn of(old: Option<[f64; 2]>, new: Option<[f64; 2]>) -> Verdict {
        match (old, new) {
            (Some([old_lo, old_hi]), Some([new_lo, new_hi])) => {
                if new_hi < old_lo {
                    Verdict::Improved
                } else if new_lo > old_hi {
                    Verdict::Regressed
                } else {
                    Verdict::NoChange
                }
            }
            _ => Verdict::NotEstablished,
        }
    }
}

/// A count that differs between the baseline and this run.
#[derive(Clone, Debug, PartialEq)]
pub struct CountChange {
    /// Which count (`exits/op`, `irqs/op`, `commits`).
    pub what: &'static str,
    /// The baseline's value, written out.
    pub old: String,
    /// This run's.
    pub new: String,
}

/// One variant in both reports.
#[derive(Clone, Debug)]
pub struct Row {
    /// Scenario name.
    pub scenario: String,
    /// Variant name.
    pub variant: String,
    /// Baseline's time per op.
    pub old_ns: Option<f64>,
    /// This run's.
    pub new_ns: Option<f64>,
    /// Change in time per op, in percent (positive: slower).
    pub change_pct: Option<f64>,
    /// The change's interval, in percent, where both sides have one.
    pub change_ci: Option<[f64; 2]>,
    /// What the intervals say.
    pub verdict: Verdict,
    /// Counts that changed: a real change whatever the timing.
    pub counts: Vec<CountChange>,
}

/// This run against a baseline.
#[derive(Debug, Default)]
pub struct Comparison {
    /// The baseline's host, where it is not this run's.
    pub other_host: Option<String>,
    /// Variants in both, in this run's order.
    pub rows: Vec<Row>,
    /// `scenario/variant` only in the baseline.
    pub only_in_baseline: Vec<String>,
    /// `scenario/variant` only in this run.
    pub only_in_run: Vec<String>,
}

/// Compare this run (`new`) with the baseline (`old`).
pub fn compare(old: &SavedReport, new: &SavedReport) -> Comparison {
    let mut comparison = Comparison {
        other_host: (old.host != new.host).then(|| old.host.clone()),
        ..Comparison::default()
    };
    let find = |report: &SavedReport, scenario: &str, variant: &str| -> Option<SavedVariant> {
        let s = report.scenarios.iter().find(|s| s.name == scenario)?;
        s.variants.iter().find(|v| v.name == variant).cloned()
    };
    for s in &new.scenarios {
        for v in &s.variants {
            match find(old, &s.name, &v.name) {
                Some(o) => comparison.rows.push(row(&s.name, &o, v)),
                None => comparison
                    .only_in_run
                    .push(format!("{}/{}", s.name, v.name)),
            }
        }
    }
    for s in &old.scenarios {
        for v in &s.variants {
            if find(new, &s.name, &v.name).is_none() {
                comparison
                    .only_in_baseline
                    .push(format!("{}/{}", s.name, v.name));
            }
        }
    }
    comparison
}

/// One variant's change.
fn row(scenario: &str, old: &SavedVariant, new: &SavedVariant) -> Row {
    let times = old.ns_per_op.zip(new.ns_per_op).filter(|&(o, _)| o > 0.0);
    let change_pct = times.map(|(o, n)| (n / o - 1.0) * 100.0);
    let intervals = old
        .interval()
        .zip(new.interval())
        .filter(|([o_lo, _], _)| *o_lo > 0.0);
    let change_ci = intervals.map(|([o_lo, o_hi], [n_lo, n_hi])| {
        [(n_lo / o_hi - 1.0) * 100.0, (n_hi / o_lo - 1.0) * 100.0]
    });
    let verdict = match times {
        Some(_) => Verdict::of(old.interval(), new.interval()),
        None => Verdict::NotEstablished,
    };
    Row {
        scenario: scenario.to_owned(),
        variant: new.name.clone(),
        old_ns: old.ns_per_op,
        new_ns: new.ns_per_op,
        change_pct,
        change_ci,
        verdict,
        counts: count_changes(old, new),
    }
}

/// The counts that differ (a float count differs past the last digits JSON may round).
fn count_changes(old: &SavedVariant, new: &SavedVariant) -> Vec<CountChange> {
    fn float(v: Option<f64>) -> String {
        v.map_or("none".into(), |x| format!("{x:.3}"))
    }
    fn same(a: Option<f64>, b: Option<f64>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0),
            (a, b) => a.is_none() && b.is_none(),
        }
    }
    let mut changes = Vec::new();
    for (what, a, b) in [
        ("exits/op", old.exits_per_op, new.exits_per_op),
        ("irqs/op", old.irqs_per_op, new.irqs_per_op),
    ] {
        if !same(a, b) {
            changes.push(CountChange {
                what,
                old: float(a),
                new: float(b),
            });
        }
    }
    if old.commits != new.commits {
        let int = |c: Option<u64>| c.map_or("none".into(), |c| c.to_string());
        changes.push(CountChange {
            what: "commits",
            old: int(old.commits),
            new: int(new.commits),
        });
    }
    changes
}

impl Comparison {
    /// `scenario/variant` of every variant that regressed beyond its interval.
    pub fn regressed(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|r| r.verdict == Verdict::Regressed)
            .map(|r| format!("{}/{}", r.scenario, r.variant))
            .collect()
    }

    /// The comparison section, printed after the tables.
    pub fn text(&self, baseline: &Path) -> String {
        let mut t = format!("Against the baseline {}\n", baseline.display());
        if let Some(host) = &self.other_host {
            let _ = writeln!(
                t,
                "warning: the host line differs: the baseline was taken on {host}"
            );
        }
        let _ = writeln!(
            t,
            "  {:<8} {:<26} {:>11} {:>11} {:>8} {:>20}  verdict",
            "scenario", "variant", "baseline", "now", "change", "95% interval"
        );
        for r in &self.rows {
            let pct = |p: f64| format!("{p:+.1}%");
            let change = r.change_pct.map_or("-".into(), pct);
            let interval = r
                .change_ci
                .map_or("-".into(), |[lo, hi]| format!("[{}, {}]", pct(lo), pct(hi)));
            let ns = |v: Option<f64>| human_ns(v.unwrap_or(f64::NAN));
            let _ = writeln!(
                t,
                "  {:<8} {:<26} {:>11} {:>11} {:>8} {:>20}  {}",
                r.scenario,
                r.variant,
                ns(r.old_ns),
                ns(r.new_ns),
                change,
                interval,
                r.verdict.words()
            );
            for c in &r.counts {
                let _ = writeln!(
                    t,
                    "  {:<8} {:<26} count changed: {} {} -> {} (a real change, whatever the timing)",
                    "", "", c.what, c.old, c.new
                );
            }
        }
        for (list, place) in [
            (&self.only_in_baseline, "only in the baseline"),
            (&self.only_in_run, "only in this run"),
        ] {
            if !list.is_empty() {
                let _ = writeln!(t, "  {place}: {}", list.join(", "));
            }
        }
        t.push_str(
            "  (a verdict needs both 95% intervals of the median: overlapping is no change \
             within noise; without them, not established)\n",
        );
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report with one scenario; each variant `(name, ns, ci95, exits)`.
    fn report(host: &str, variants: &[(&str, f64, Option<[f64; 2]>, f64)]) -> SavedReport {
        let variants: Vec<serde_json::Value> = variants
            .iter()
            .map(|&(name, ns, ci, exits)| {
                let mut v = serde_json::json!({
                    "name": name, "ns_per_op": ns, "exits_per_op": exits,
                    "exits_by_kind": {}, "ops": 100, "time_ratio": null,
                });
                if let Some(ci) = ci {
                    v["ci95"] = serde_json::json!(ci);
                    v["rounds"] = serde_json::json!(5);
                }
                v
            })
            .collect();
        let json = serde_json::json!({
            "host": host,
            "scenarios": [{"name": "pci", "title": "t", "timing": "t", "variants": variants, "targets": []}],
        });
        serde_json::from_str(&json.to_string()).expect("a synthetic report reads")
    }

    fn row<'a>(c: &'a Comparison, variant: &str) -> &'a Row {
        c.rows.iter().find(|r| r.variant == variant).expect(variant)
    }

    #[test]
    fn verdicts_follow_the_intervals_and_counts_are_named() {
        let old = report(
            "host A",
            &[
                ("faster", 100.0, Some([95.0, 105.0]), 1.0),
                ("slower", 100.0, Some([95.0, 105.0]), 1.0),
                ("overlap", 100.0, Some([95.0, 105.0]), 1.0),
                ("one-sample", 100.0, None, 1.0),
                ("more-exits", 100.0, Some([95.0, 105.0]), 1.0),
                ("gone", 100.0, Some([95.0, 105.0]), 1.0),
            ],
        );
        let new = report(
            "host A",
            &[
                ("faster", 50.0, Some([48.0, 52.0]), 1.0),
                ("slower", 200.0, Some([190.0, 210.0]), 1.0),
                ("overlap", 103.0, Some([101.0, 110.0]), 1.0),
                ("one-sample", 50.0, Some([48.0, 52.0]), 1.0),
                ("more-exits", 100.0, Some([96.0, 104.0]), 2.0),
                ("new", 10.0, Some([9.0, 11.0]), 0.0),
            ],
        );
        let c = compare(&old, &new);
        assert_eq!(c.other_host, None);
        assert_eq!(row(&c, "faster").verdict, Verdict::Improved);
        assert_eq!(row(&c, "faster").change_pct, Some(-50.0));
        let [lo, hi] = row(&c, "faster").change_ci.unwrap();
        assert!(lo < -50.0 && hi > -50.0 && hi < 0.0, "{lo} {hi}");
        assert_eq!(row(&c, "slower").verdict, Verdict::Regressed);
        assert_eq!(row(&c, "overlap").verdict, Verdict::NoChange);
        assert_eq!(row(&c, "one-sample").verdict, Verdict::NotEstablished);
        assert_eq!(row(&c, "one-sample").change_ci, None);
        let more = row(&c, "more-exits");
        assert_eq!(more.verdict, Verdict::NoChange);
        assert_eq!(
            more.counts,
            vec![CountChange {
                what: "exits/op",
                old: "1.000".into(),
                new: "2.000".into()
            }]
        );
        assert!(row(&c, "faster").counts.is_empty());
        assert_eq!(c.only_in_baseline, ["pci/gone"]);
        assert_eq!(c.only_in_run, ["pci/new"]);
        assert_eq!(c.regressed(), ["pci/slower"]);

        let text = c.text(Path::new("old.json"));
        assert!(text.contains("regressed"), "{text}");
        assert!(
            text.contains("count changed: exits/op 1.000 -> 2.000"),
            "{text}"
        );
        assert!(text.contains("only in the baseline: pci/gone"), "{text}");
        assert!(!text.contains("warning"), "{text}");
    }

    #[test]
    fn another_host_is_named() {
        let old = report("host A", &[("v", 1.0, None, 0.0)]);
        let new = report("host B", &[("v", 1.0, None, 0.0)]);
        let c = compare(&old, &new);
        assert_eq!(c.other_host.as_deref(), Some("host A"));
        assert!(
            c.text(Path::new("b.json"))
                .contains("warning: the host line differs")
        );
    }

    #[test]
    fn a_missing_or_malformed_file_is_one_line() {
        let dir = std::env::temp_dir().join(format!("exitless-baseline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = SavedReport::load(&dir.join("nosuch.json")).unwrap_err();
        assert!(missing.starts_with("cannot read the baseline"), "{missing}");
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{\"host\": 3}").unwrap();
        let malformed = SavedReport::load(&bad).unwrap_err();
        assert!(malformed.contains("is not a report"), "{malformed}");
        assert!(!missing.contains('\n') && !malformed.contains('\n'));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn verdict_words_are_the_four() {
        let words: Vec<&str> = [
            Verdict::Improved,
            Verdict::Regressed,
            Verdict::NoChange,
            Verdict::NotEstablished,
        ]
        .map(Verdict::words)
        .to_vec();
        assert_eq!(
            words,
            [
                "improved",
                "regressed",
                "no change within noise",
                "not established"
            ]
        );
    }
}
