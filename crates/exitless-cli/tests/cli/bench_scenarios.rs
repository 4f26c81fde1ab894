//! `exitless bench`'s scenarios as a user runs them: each report's variants, counts and
//! checks, the restore child and its launcher, and the limits each scenario refuses before it
//! boots anything.

use std::process::Command;

use crate::cli::{bench_json, errors, exitless, refused, variant_names};

#[test]
fn bench_pci_json_has_every_variant_with_exit_counts() {
    let report = bench_json(&[
        "pci",
        "--reads",
        "200",
        "--enumerations",
        "1",
        "--rounds",
        "3",
    ]);
    assert!(report["host"].as_str().is_some_and(|h| !h.is_empty()));
    let scenario = &report["scenarios"][0];
    assert_eq!(scenario["name"], "pci");
    let variants = scenario["variants"].as_array().unwrap();
    let names = variant_names(variants);
    assert_eq!(
        names,
        [
            "ram",
            "pio",
            "ecam-trap",
            "ecam-shadow",
            "enum-pio",
            "enum-ecam-trap",
            "enum-ecam-shadow"
        ]
    );
    let exits = |name: &str| {
        variants.iter().find(|v| v["name"] == name).unwrap()["exits_per_op"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(
        exits("pio"),
        2.0,
        "CONFIG_ADDRESS write and CONFIG_DATA read"
    );
    assert_eq!(exits("ecam-trap"), 1.0);
    assert_eq!(exits("ecam-shadow"), 0.0);
    assert_eq!(exits("ram"), 0.0);
    assert!(
        exits("enum-ecam-shadow") > 0.0,
        "BAR sizing writes still exit"
    );
    assert!(exits("enum-ecam-shadow") < exits("enum-ecam-trap"));
    for v in variants {
        assert!(v["ns_per_op"].as_f64().is_some_and(|t| t > 0.0), "{v}");
        // Three rounds: the median lies in its interval, and counts never vary for pci.
        assert_eq!(v["rounds"], 3, "{v}");
        let (lo, hi) = (
            v["ci95"][0].as_f64().unwrap(),
            v["ci95"][1].as_f64().unwrap(),
        );
        let ns = v["ns_per_op"].as_f64().unwrap();
        assert!(lo <= ns && ns <= hi, "{v}");
        assert_eq!(v["counts_vary"], false, "{v}");
        assert!(v["time_ratio_ci95"].is_array(), "{v}");
    }
    for t in scenario["targets"].as_array().unwrap() {
        let verdict = t["verdict"].as_str().unwrap();
        assert!(
            ["met", "missed", "not established"].contains(&verdict),
            "{t}"
        );
    }
}

#[test]
fn bench_table_names_the_host_and_the_seed() {
    let dir = std::env::temp_dir().join(format!("exitless-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let charts = dir.join("charts");
    let out = exitless(&[
        "bench",
        "--reads",
        "100",
        "--enumerations",
        "1",
        "--rounds",
        "2",
        "--svg",
        charts.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("exitless bench on "));
    assert!(
        text.contains("seed ratio") && text.contains("ecam-shadow") && text.contains("targets")
    );
    // `--svg DIR`: the folder made, a chart per scenario run (msix's per-device lines too),
    // each naming its own variants.
    for chart in ["pci.svg", "rr.svg", "msix.svg", "msix-per-device.svg"] {
        let svg = std::fs::read_to_string(charts.join(chart)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("ecam-shadow") == (chart == "pci.svg"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_rr_reports_every_transport_and_doorbell_path() {
    let report = bench_json(&["rr", "--transactions", "30"]);
    let scenario = &report["scenarios"][0];
    assert_eq!(scenario["name"], "rr");
    let variants = scenario["variants"].as_array().unwrap();
    let names = variant_names(variants);
    for mode in ["pci-msix", "mmio-legacy", "mmio-msi"] {
        for path in ["exit", "datamatch", "addr"] {
            assert!(
                names.contains(&format!("{mode}-{path}").as_str()),
                "{names:?}"
            );
        }
    }
    for v in variants {
        assert!(v["trans_per_s"].as_f64().is_some_and(|t| t > 0.0), "{v}");
        assert!(v["exits_per_op"].as_f64().is_some(), "{v}");
        // A vhost-user variant (where testpmd is installed) runs its echo op 5 times.
        let name = v["name"].as_str().unwrap();
        match name.ends_with("-vhost-user") {
            true => assert_eq!(v["exits_per_op"], 0.0, "{v}"),
            false => assert_eq!(v["ops"], 30),
        }
        if name.ends_with("-exit") {
            assert!(
                v["exits_per_op"].as_f64().unwrap() >= 1.0,
                "a doorbell that exits: {v}"
            );
        }
    }
    let msi_addr = variants
        .iter()
        .find(|v| v["name"] == "mmio-msi-addr")
        .unwrap();
    assert_eq!(
        msi_addr["exits_per_op"], 0.0,
        "address-only doorbells and MSI: no exit"
    );
}

#[test]
fn bench_iommu_streams_every_frame_size_and_the_sink_checks_every_byte() {
    let report = bench_json(&[
        "iommu",
        "--packets",
        "300",
        "--transactions",
        "20",
        "--rounds",
        "1",
        "--frame-sizes",
        "32,1500,9000",
    ]);
    let scenario = &report["scenarios"][0];
    let variants = scenario["variants"].as_array().unwrap();
    let names = variant_names(variants);
    // The seed's 32-byte rows keep their names; each other size has its four.
    for name in ["none", "linux-fq", "deferred-array-hwm1000"] {
        assert!(names.contains(&name), "{names:?}");
    }
    for size in ["1500", "9000"] {
        for base in ["none", "strict", "deferred-list", "deferred-array"] {
            assert!(
                names.contains(&format!("{base}-{size}").as_str()),
                "{names:?}"
            );
        }
    }
    assert_eq!(names.len(), 20, "{names:?}");
    for v in variants {
        let name = v["name"].as_str().unwrap();
        let size = name.rsplit('-').next().and_then(|s| s.parse().ok());
        let size = size.filter(|&s: &u64| s >= 1500).unwrap_or(32);
        // The IOMMU's figures are flattened into the variant.
        assert_eq!(v["payload_bytes"], size, "{name}");
        assert_eq!(
            v["bad_frames"], 0,
            "{name}: every byte the guest wrote arrived"
        );
        assert_eq!(v["ops"], 300, "{name}: every frame came back");
        assert_eq!(
            v["baseline"],
            if size == 32 {
                "none".to_owned()
            } else {
                format!("none-{size}")
            }
        );
    }
    let targets: Vec<&str> = scenario["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["target"].as_str().unwrap())
        .collect();
    assert!(
        targets.contains(&"deferred-array ≥ 0.95× none's packets/s (seed 0.97×) with ≤ 1/250 IOMMU exits per packet"),
        "the seed size's target keeps its words: {targets:?}"
    );
    for size in ["1500", "9000"] {
        for target in [
            "deferred-array ≥ 0.95×",
            "deferred-list ≥ 0.9×",
            "deferred-array's device-thread CPU per packet ≤ 1.1×",
            "strict the slowest",
        ] {
            let want = format!("{size}-byte frames: {target}");
            assert!(
                targets.iter().any(|t| t.starts_with(&want)),
                "{want}: {targets:?}"
            );
        }
    }
}

#[test]
fn bad_frame_sizes_are_refused_before_booting() {
    for args in [
        &["bench", "iommu", "--frame-sizes", "0"][..],
        &["bench", "iommu", "--frame-sizes", "32,30000"],
        &["bench", "iommu", "--frame-sizes", "32,jumbo"],
    ] {
        refused(args, 2, "exitless: error: ");
    }
    let args = ["bench", "iommu", "--frame-sizes", "1500,1500"];
    refused(&args, 1, "exitless: error: --frame-sizes");
}

#[test]
fn bad_request_or_response_sizes_are_refused_before_booting() {
    for args in [
        &["bench", "rr", "--response-size", "0"][..],
        &["bench", "rr", "--response-size", "100000"],
        &["bench", "rr", "--request-size", "0"],
        &["bench", "rr", "--request-size", "5000"],
    ] {
        refused(args, 1, "exitless: error: --");
    }
}

#[test]
fn bench_msix_reports_both_strategies_per_device() {
    let report = bench_json(&["msix"]);
    let scenario = &report["scenarios"][0];
    assert_eq!(scenario["name"], "msix");
    let variant = |name: &str| {
        scenario["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {scenario}"))
            .clone()
    };
    let list = |v: &serde_json::Value| v.as_array().unwrap().len();
    for (name, commits_per_enable) in [("per-vector", 65), ("batched", 1)] {
        let v = variant(name);
        assert_eq!(list(&v["per_device_ms"]), 8, "{v}");
        assert_eq!(list(&v["seed_per_device_ms"]), 8, "{v}");
        assert!(v["total_ms"].as_f64().is_some_and(|t| t > 0.0), "{v}");
        assert!(v["commit_ms"].as_f64().is_some_and(|t| t > 0.0), "{v}");
        assert_eq!(v["commits"], 8 * commits_per_enable, "{v}");
        for c in v["per_device_commits"].as_array().unwrap() {
            assert_eq!(c, commits_per_enable, "{v}");
        }
        assert_eq!(v["table_programming"]["commits"], 0, "{v}");
        assert_eq!(
            v["unmask_one_by_one"]["commits"], 520,
            "a new message at each unmask is committed before the write returns: {v}"
        );
    }
}

#[test]
fn bench_restore_reports_each_strategy_per_function_after_checked_restores() {
    // The run fails unless every restore finished the traffic byte-exact and delivered every
    // vector once per request: a report at all is the guest's verdict.
    let report = bench_json(&["restore", "--devices", "3", "--queue-pairs", "4"]);
    let scenario = &report["scenarios"][0];
    assert_eq!(scenario["name"], "restore");
    let variants = scenario["variants"].as_array().unwrap();
    let names = variant_names(variants);
    // Then each restored again in a new exitless; with testpmd, the vhost-user pass's four.
    let strategies = ["per-vector", "batched", "first-use", "direct"];
    assert_eq!(names[..4], strategies);
    assert_eq!(names[4..8], strategies.map(|s| format!("{s}-new-process")));
    // Commits carrying each function's 9 routes: one per vector, one for the whole restore,
    // one for every staged route at the first message after the restore, none.
    for (v, per_function, commits) in [
        (&variants[0], 9, 27),
        (&variants[1], 1, 1),
        (&variants[2], 1, 1),
        (&variants[3], 0, 0),
    ] {
        assert_eq!(
            v["per_device_commits"],
            serde_json::json!(vec![per_function; 3]),
            "{v}"
        );
        assert_eq!(v["commits"], commits, "{v}");
        assert!(v["ns_per_op"].as_f64().is_some_and(|t| t > 0.0), "{v}");
    }
    // The seed's column needs its configuration (8 × 65).
    assert!(variants[0].get("seed_per_device_ms").is_none());
    let notes = scenario["notes"].as_array().unwrap();
    let note = |start: &str| notes.iter().any(|n| n.as_str().unwrap().starts_with(start));
    for strategy in &names[..4] {
        assert!(note(&format!("{strategy}: restore ")), "{notes:?}");
        assert!(
            note(&format!("{strategy}: first interrupt of each function")),
            "{notes:?}"
        );
    }
    assert!(note("snapshot: pause"), "{notes:?}");
    // A new process's restore is checked as an in-process one (a failed check fails the run),
    // and timed from the process's start: past the restore, to each function's interrupt.
    for (s, v) in strategies.iter().zip(&variants[4..8]) {
        assert!(v["ns_per_op"].as_f64().is_some_and(|t| t > 0.0), "{v}");
        let line = format!("{s}-new-process: process start to vCPUs running ");
        let found = notes.iter().map(|n| n.as_str().unwrap());
        let found = found.filter(|n| n.starts_with(&line)).collect::<Vec<_>>();
        assert_eq!(found.len(), 1, "{notes:?}");
        let firsts = found[0].rsplit(": ").next().unwrap();
        assert_eq!(firsts.split(", ").count(), 3, "{}", found[0]);
        assert!(
            !firsts.contains('-'),
            "every function interrupted: {}",
            found[0]
        );
    }
    assert!(
        note("whole restore, batched in a new exitless (process start to first interrupt)"),
        "{notes:?}"
    );
    let targets = scenario["targets"].as_array().unwrap().len();
    if names.len() > 8 {
        // vhost-user: routes for the outside signaller under every strategy but first-use
        // (committed at its first signal), 9 vectors per function.
        let vhost =
            ["per-vector", "batched", "first-use", "direct"].map(|s| format!("{s}-vhost-user"));
        assert_eq!(names[8..], vhost);
        assert_eq!(variants[8]["commits"], 27, "{}", variants[8]);
        assert_eq!(variants[9]["commits"], 1, "{}", variants[9]);
        assert!(note("`*-vhost-user` rows:"), "{notes:?}");
        assert_eq!(targets, 5);
    } else {
        assert_eq!(targets, 4);
    }
}

/// `bench restore --against qemu`: QEMU migrates the same functions to a file and resumes
/// them in a second process, whose probe passes its checks; its time is set beside ours.
/// With testpmd, the same for vhost-user functions on it. Skipped without QEMU.
#[test]
fn bench_restore_against_qemu_resumes_a_migrated_probe_beside_ours() {
    if let Err(e) = exitless_peer::Qemu::find() {
        println!("skipped: {e}");
        return;
    }
    let args = [
        "restore",
        "--devices",
        "2",
        "--queue-pairs",
        "2",
        "--against",
        "qemu",
    ];
    let report = bench_json(&args);
    let scenario = &report["scenarios"][0];
    let notes = scenario["notes"].as_array().unwrap();
    let qemu = notes
        .iter()
        .map(|n| n.as_str().unwrap())
        .find(|n| n.starts_with("QEMU"))
        .unwrap_or_else(|| panic!("no QEMU note in {notes:?}"));
    assert!(
        qemu.contains("then every function's MSI-X check passed"),
        "{qemu}"
    );
    assert!(
        qemu.contains("migrated in the middle of the probe's ops"),
        "{qemu}"
    );
    let targets = scenario["targets"].as_array().unwrap();
    let target = |name: &str| targets.iter().any(|t| t["target"] == name);
    assert!(target("whole restore <= QEMU's"), "{targets:?}");
    // With testpmd (the `*-vhost-user` rows ran), QEMU migrates vhost-user functions on it too.
    let variants = scenario["variants"].as_array().unwrap();
    if !variants.iter().any(|v| v["name"] == "batched-vhost-user") {
        println!("no vhost-user pass (testpmd not running): its QEMU migration skipped");
        return;
    }
    let vhost = notes
        .iter()
        .map(|n| n.as_str().unwrap())
        .find(|n| n.starts_with("QEMU") && n.contains("vhost-user"))
        .unwrap_or_else(|| panic!("no QEMU vhost-user note in {notes:?}"));
    for part in [
        "2 vhost-user-net functions on DPDK testpmd",
        "reconnecting to testpmd: process start to guest running",
        "to the guest's first config read after its first interrupt",
        "migrated in the middle of the probe's ops, then every echo answered",
        "and every function's MSI-X check passed",
    ] {
        assert!(vhost.contains(part), "{part}: {vhost}");
    }
    assert!(
        target("batched-vhost-user whole restore <= QEMU vhost-user's"),
        "{targets:?}"
    );
}

/// `exitless bench-restore-launcher` given `requests` on stdin, to its end.
fn launch(requests: &str) -> std::process::Output {
    use std::process::Stdio;
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .arg("bench-restore-launcher")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut stdin = launcher.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, requests.as_bytes()).unwrap();
    drop(stdin);
    launcher.wait_with_output().unwrap()
}

/// `bench restore`'s child (hidden) refuses a folder that holds no snapshot as `run
/// --restore` does: status 2, one line naming the file; through the launcher too, whose answer
/// carries that line for the bench's error.
#[test]
fn a_restore_child_given_no_snapshot_exits_2_with_one_line() {
    let args = ["/nonexistent/snap", "--strategy", "batched", "--ops", "3"];
    let args = [&["bench-restore-child"], &args[..], &["--timeout", "5"]].concat();
    let out = exitless(&args);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("cannot open the directory /nonexistent/snap:"),
        "{e}"
    );
    assert!(out.stdout.is_empty());
    let request = serde_json::to_string(&args).unwrap() + "\n";
    let answer = launch(&request);
    assert!(answer.status.success());
    let answer: serde_json::Value = serde_json::from_slice(&answer.stdout).unwrap();
    assert_eq!(answer["status"], 2, "{answer}");
    assert_eq!(answer["stderr"].as_str(), Some(&*e), "{answer}");
    assert!(
        answer["spawned"].as_u64().is_some_and(|t| t > 0),
        "{answer}"
    );
}

/// The launcher starts nothing but the restore child.
#[test]
fn the_restore_launcher_starts_nothing_else() {
    let out = launch("[\"run\",\"--kernel\",\"/bin/true\"]\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("starts `bench-restore-child` only"), "{e}");
}

#[test]
fn restore_with_no_function_left_for_traffic_gets_one_clear_error() {
    let out = exitless(&["bench", "restore", "--devices", "29"]);
    // As every bench option error: status 1, one line.
    assert_eq!(out.status.code(), Some(1));
    let e = errors(&out.stderr);
    assert!(
        e.starts_with("exitless: error: --devices must be 1..=28 (got 29)"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn msix_configurations_beyond_the_limits_get_one_clear_error() {
    for (args, says) in [
        (
            &["bench", "msix", "--devices", "0"][..],
            "--devices must be",
        ),
        (&["bench", "msix", "--devices", "30"], "--devices must be"),
        (
            &["bench", "msix", "--queue-pairs", "128"],
            "--queue-pairs must be",
        ),
        (
            &["bench", "msix", "--devices", "29", "--queue-pairs", "127"],
            "too many MSI vectors: KVM routes at most 4056",
        ),
    ] {
        let out = exitless(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = errors(&out.stderr);
        assert!(
            err.starts_with(&format!("exitless: error: {says}")),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// `bench rr --against qemu`: the tap variant gets QEMU's figure and the shared-variant target,
/// and the bench's tap is gone once it ends; with the tap's name taken, rr runs without the
/// column and a note says why. Skipped without QEMU or the rights to make a tap.
#[test]
fn bench_rr_against_qemu_compares_the_tap_variant_or_says_why_not() {
    use exitless_peer::host_tap::{HostTap, TapLink};
    if let Err(e) = exitless_peer::Qemu::find() {
        println!("skipped: {e}");
        return;
    }
    if let Err(why) = HostTap::create(TapLink::numbered("xl-rr-cli", 4)) {
        println!("skipped: {why}");
        return;
    }
    let args = ["rr", "--transactions", "20", "--against", "qemu"];
    let sys = std::path::Path::new("/sys/class/net/exitless-rr0");
    let rr = |report: &serde_json::Value| report["scenarios"][0].clone();
    let tap_variant = |rr: &serde_json::Value| {
        rr["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "pci-msix-tap")
            .cloned()
    };

    let compared = rr(&bench_json(&args));
    let v = tap_variant(&compared).expect("the tap variant ran");
    assert_eq!(v["peer"]["name"], "qemu", "{v}");
    assert!(
        v["peer"]["ns_per_op"].as_f64().is_some_and(|t| t > 0.0),
        "{v}"
    );
    assert!(v["ns_per_op"].as_f64().is_some_and(|t| t > 0.0), "{v}");
    assert!(
        compared["targets"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["target"] == "exitless <= qemu on every shared variant"),
        "{compared}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sys.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the bench's tap outlived it"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    // Something else has the name: a tap of another's, which the bench must leave alone.
    let ip = |a: &[&str]| Command::new("ip").args(a).status().unwrap().success();
    assert!(ip(&["tuntap", "add", "dev", "exitless-rr0", "mode", "tap"]));
    let refused = rr(&bench_json(&args));
    let still_there = sys.exists();
    ip(&["link", "del", "exitless-rr0"]);
    assert!(
        still_there,
        "the bench deleted an interface it did not make"
    );
    assert!(tap_variant(&refused).is_none(), "{refused}");
    assert!(
        refused["notes"].as_array().unwrap().iter().any(|n| n
            .as_str()
            .unwrap()
            .contains("not measured under qemu: interface exitless-rr0 exists already")),
        "{refused}"
    );
}
