//! What `exitless bench` tells about the host and its own progress, outside the report's
//! figures: a busy host named (on stderr and in the JSON), and a progress line drawn only on a
//! terminal.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const SHORT_PCI: [&str; 6] = ["bench", "pci", "--reads", "200", "--enumerations", "1"];

fn exitless(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

/// The host's load as the JSON states it: `host_busy`, and the figures it rests on.
fn host_busy(report: &serde_json::Value) -> bool {
    let load = &report["host_load"];
    for field in ["loadavg1", "others_cpu_percent"] {
        assert!(
            load[field].as_f64().is_some(),
            "host_load.{field}: {report}"
        );
    }
    report["host_busy"]
        .as_bool()
        .expect("host_busy is in the JSON")
}

#[test]
fn a_busy_host_is_named_on_stderr_and_in_the_json() {
    // Another process's worth of work: a thread of this test process spinning.
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        })
    };
    let out = exitless(&[&SHORT_PCI[..], &["--json"]].concat());
    stop.store(true, Ordering::Relaxed);
    spinner.join().unwrap();
    let report = json(&out);
    assert!(host_busy(&report), "{}", report["host_load"]);
    assert!(report["host_load"]["others_cpu_percent"].as_f64().unwrap() > 10.0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the figures will be noisy"), "{stderr}");
}

#[test]
fn no_progress_when_stderr_is_not_a_terminal() {
    let out = exitless(&SHORT_PCI);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains('\r') && !stderr.contains("\x1b[K") && !stderr.contains("bench ["),
        "progress drawn on a pipe: {stderr:?}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("exitless bench on "));
}

/// The binary run under `script(1)`, so that its stdout and stderr are a terminal; what the
/// terminal received. `None` where `script` is not installed.
fn on_a_terminal(args: &[&str]) -> Option<String> {
    if !Path::new("/usr/bin/script").exists() {
        eprintln!("script(1) not installed: the terminal case is not run");
        return None;
    }
    let command = std::iter::once(env!("CARGO_BIN_EXE_exitless"))
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("/usr/bin/script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .output()
        .expect("script runs");
    assert!(out.status.success(), "{out:?}");
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn progress_on_a_terminal_and_never_with_json() {
    let Some(text) = on_a_terminal(&SHORT_PCI) else {
        return;
    };
    assert!(text.contains("\rbench [1/1] pci, "), "{text:?}");
    assert!(
        text.contains("\r\x1b[K"),
        "the line is cleared at the end: {text:?}"
    );
    let Some(json_text) = on_a_terminal(&[&SHORT_PCI[..], &["--json"]].concat()) else {
        return;
    };
    assert!(!json_text.contains("bench ["), "{json_text:?}");
    assert!(!json_text.contains("\x1b[K"), "{json_text:?}");
    // The JSON always states the host's load, busy or not.
    let start = json_text.find('{').expect("JSON on the terminal");
    let end = json_text.rfind('}').expect("JSON on the terminal");
    let report: serde_json::Value =
        serde_json::from_str(&json_text[start..=end].replace("\r\n", "\n")).expect("valid JSON");
    host_busy(&report);
}
