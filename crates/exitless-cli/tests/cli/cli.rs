//! What a user gets from the `exitless` command line.

use std::process::Command;

pub(crate) fn exitless(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// What a bench run said on stderr besides the busy host's line (`exitless bench` names a busy
/// host before measuring; the tests' host often is).
pub(crate) fn errors(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| !l.contains("the figures will be noisy"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The JSON report of a successful `exitless bench ARGS --json`.
pub(crate) fn bench_json(args: &[&str]) -> serde_json::Value {
    let out = exitless(&[&["bench"], args, &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

/// The names of a scenario's `variants`, in report order.
pub(crate) fn variant_names(variants: &[serde_json::Value]) -> Vec<&str> {
    variants
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect()
}

#[test]
fn bad_input_gets_one_clear_error_and_a_failure_code() {
    for args in [
        &["bench", "nosuch"][..],
        &["bench", "--reads", "0"],
        &["bench", "--reads", "many"],
        &["bench", "--timeout", "0"],
        &["bench", "--svg", "out.svg"],
        &["frobnicate"],
    ] {
        let out = exitless(args);
        assert_eq!(out.status.code(), Some(2), "{args:?} is a usage error");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("exitless: error: ") && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
    let out = exitless(&[
        "bench",
        "--svg",
        "/dev/null/charts",
        "--reads",
        "10",
        "--enumerations",
        "1",
        "--transactions",
        "5",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(errors(&out.stderr).starts_with("exitless: error: cannot write the chart"));
}

/// `exitless ARGS` exits with `status` and one line on stderr that starts with `start`.
pub(crate) fn refused(args: &[&str], status: i32, start: &str) {
    let out = exitless(args);
    assert_eq!(out.status.code(), Some(status), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with(start), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
}

#[test]
fn probe_lists_what_the_guest_enumerated_by_the_chosen_method() {
    let out = exitless(&["probe", "--ecam", "shadow"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("by ECAM (ECAM served from a read-only shadow): 4 functions"),
        "{text}"
    );
    assert!(text.contains("00:02.1 7e57:0003"));
    assert!(text.contains("capabilities: vendor power-management msi pci-express ext:vendor"));

    let out = exitless(&["probe", "--ecam", "none", "--vcpus", "2"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("by port I/O"), "{text}");
    assert!(
        !text.contains("ext:vendor"),
        "extended space is out of reach of port I/O"
    );

    let out = exitless(&["probe", "--ecam", "none", "--method", "ecam"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use --ecam trap or shadow"));
}

#[test]
fn running_out_of_file_descriptors_is_an_error_not_a_crash() {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 200 && exec {} bench msix",
            env!("CARGO_BIN_EXE_exitless")
        ))
        .output()
        .expect("sh runs");
    assert_eq!(out.status.code(), Some(1));
    let err = errors(&out.stderr);
    assert!(err.starts_with("exitless: error: "), "{err}");
    assert!(err.contains("raise the open-file limit"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Defect: a reader that goes away (`exitless probe --console | head -2`) made exitless panic
/// with a backtrace; it is a normal end of the output.
#[test]
fn a_closed_stdout_ends_the_output_quietly() {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} probe --console | head -2 >/dev/null; exit ${{PIPESTATUS[0]}}",
            env!("CARGO_BIN_EXE_exitless")
        ))
        .output()
        .expect("bash runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

/// Before its first thread starts, exitless grows its descriptor table to what a machine of
/// 8 × 65 vectors needs (each growth once threads share it waits for an RCU grace period, some
/// milliseconds in a restore): /proc's FDSize shows its length once the log writer runs.
#[test]
fn the_descriptor_table_is_grown_before_the_first_thread() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct passed.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(got, 0);
    let want = limit.rlim_max.min(4096);
    // The launcher waits on stdin: a process to look at.
    let mut process = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .arg("bench-restore-launcher")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let status = format!("/proc/{}/status", process.id());
    let field = |text: &str, name: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        line[name.len()..].trim().parse().unwrap()
    };
    let mut text = String::new();
    for _ in 0..500 {
        text = std::fs::read_to_string(&status).unwrap();
        if field(&text, "Threads:") > 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    drop(process.stdin.take());
    process.wait().unwrap();
    assert!(field(&text, "Threads:") > 1, "{text}");
    assert!(field(&text, "FDSize:") >= want, "{text}");
}
