//! `exitless bench --save-baseline` and `--baseline`: a short `pci` run saved, then compared
//! with; a baseline made ten times faster with `--fail-on-regression`; files it cannot use.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The short run every test here makes.
const SHORT_PCI: [&str; 5] = ["pci", "--reads", "200", "--enumerations", "1"];

/// The four verdicts a comparison gives.
const VERDICTS: [&str; 4] = [
    "improved",
    "regressed",
    "no change within noise",
    "not established",
];

fn bench(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_exitless"))
        .arg("bench")
        .args(SHORT_PCI)
        .args(extra)
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("exitless-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Save a baseline with a short run; the saved report, parsed.
fn save(path: &Path) -> serde_json::Value {
    let out = bench(&["--save-baseline", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("exitless bench on "));
    let saved = std::fs::read(path).expect("--save-baseline wrote the file");
    serde_json::from_slice(&saved).expect("the baseline is the JSON report")
}

/// The comparison rows of `pci` in a run's output: (variant, verdict).
fn rows(output: &str) -> Vec<(String, String)> {
    let section = output
        .split_once("Against the baseline ")
        .expect("a comparison section after the tables")
        .1;
    section
        .lines()
        .filter(|l| l.starts_with("  pci "))
        .map(|l| {
            let variant = l.split_whitespace().nth(1).unwrap().to_owned();
            let verdict = VERDICTS
                .into_iter()
                .find(|v| l.trim_end().ends_with(v))
                .unwrap_or_else(|| panic!("no verdict in {l:?}"));
            (variant, verdict.to_owned())
        })
        .collect()
}

#[test]
fn a_saved_run_is_compared_variant_by_variant() {
    let dir = scratch("baseline-compare");
    let path = dir.join("base.json");
    let saved = save(&path);
    let names: Vec<&str> = saved["scenarios"][0]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"ecam-shadow"), "{names:?}");

    let out = bench(&["--baseline", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let compared_rows = rows(&stdout);
    let compared: Vec<&str> = compared_rows.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(compared, names, "{stdout}");
    // Every variant has its interval (several rounds), so every verdict is one of the words.
    assert!(
        saved["scenarios"][0]["variants"][0].get("ci95").is_some(),
        "{saved}"
    );
    assert!(
        compared_rows.iter().all(|(_, v)| [
            "improved",
            "regressed",
            "no change within noise",
            "not established"
        ]
        .contains(&v.as_str())),
        "{stdout}"
    );
    assert!(
        !stdout.contains("warning: the host line differs"),
        "{stdout}"
    );

    // With --json, stdout stays the report and the comparison goes to stderr.
    let out = bench(&["--json", "--baseline", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout is the JSON");
    assert_eq!(rows(&text(&out.stderr)).len(), names.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_baseline_ten_times_faster_fails_on_regression() {
    let dir = scratch("baseline-regression");
    let path = dir.join("base.json");
    let mut saved = save(&path);
    saved["host"] = "another host".into();
    for v in saved["scenarios"][0]["variants"].as_array_mut().unwrap() {
        let ns = v["ns_per_op"].as_f64().unwrap();
        v["ns_per_op"] = (ns / 10.0).into();
        let ci: Vec<f64> = v["ci95"]
            .as_array()
            .expect("every variant has its interval")
            .iter()
            .map(|x| x.as_f64().unwrap() / 10.0)
            .collect();
        v["ci95"] = ci.into();
    }
    let faster = dir.join("faster.json");
    std::fs::write(&faster, saved.to_string()).unwrap();

    let out = bench(&[
        "--baseline",
        faster.to_str().unwrap(),
        "--fail-on-regression",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stdout.contains("warning: the host line differs"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let line = stderr.lines().last().unwrap();
    assert!(
        line.contains("regressed") && line.contains("pci/pio"),
        "{stderr}"
    );
    assert!(
        rows(&stdout).iter().any(|(_, v)| v == "regressed"),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_baseline_it_cannot_use_is_one_line_and_status_2() {
    let dir = scratch("baseline-bad");
    let malformed = dir.join("malformed.json");
    std::fs::write(&malformed, "{\"host\": \"h\", \"scenarios\": 3}").unwrap();
    for (path, says) in [
        (dir.join("missing.json"), "cannot read the baseline"),
        (malformed, "is not a report of exitless bench --json"),
    ] {
        let out = bench(&["--baseline", path.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(
            out.stdout.is_empty(),
            "nothing ran before the baseline was read"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
