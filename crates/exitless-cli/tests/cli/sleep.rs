//! The RTC and S3 under `exitless run` (seccomp on), with the multiboot test kernel
//! (crates/exitless-guest/testkernel/rtc.c): it reads the RTC's time against the host's, then sleeps in S3 with
//! a pattern in memory and the FACS's waking vector (found through FIRMWARE_CTRL) at a
//! real-mode stub, and is woken by the RTC alarm or by a key on the console.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime};

/// The test kernel's `exit=debug` status when every check passed: (0x10 << 1) | 1.
const PASSED: i32 = 0x21;
/// Longest a run may take here (a sleep lasts about two seconds).
const LIMIT: Duration = Duration::from_secs(60);

/// `exitless run` of the test kernel with `cmdline` (and `extra` options), every pipe taken.
fn start(cmdline: &str, extra: &[&str]) -> Child {
    let elf = Path::new(env!("CARGO_BIN_EXE_exitless")).with_file_name("testkernel.elf");
    Command::new(env!("CARGO_BIN_EXE_exitless"))
        .args([
            "run",
            "--kernel",
            elf.to_str().unwrap(),
            "--cmdline",
            cmdline,
        ])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("exitless starts")
}

/// Its console lines as they come, on a channel.
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// How often a key goes to stdin while the guest goes to sleep: one sent before the machine
/// is asleep is plain input, as on a PC.
const KEY_EVERY: Duration = Duration::from_millis(200);

/// Every console line and stderr until the run ends, and its status (`None`: it outlived
/// `LIMIT` and was killed). After a line holding `key_after`, a key goes to stdin every
/// [`KEY_EVERY`] until the next line comes.
fn console(child: &mut Child, key_after: Option<&str>) -> (String, Option<i32>) {
    let rx = lines(child);
    let mut stdin = child.stdin.take();
    let mut all = String::new();
    let mut keying = false;
    let status = loop {
        let wait = if keying { KEY_EVERY } else { LIMIT };
        match rx.recv_timeout(wait) {
            Ok(line) => {
                keying = key_after.is_some_and(|k| line.contains(k));
                all.push_str(&line);
                all.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Timeout) if keying => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                break None;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break child.wait().unwrap().code(),
        }
        if keying {
            stdin.as_mut().expect("stdin").write_all(b"k").unwrap();
        }
    };
    let _ = child.wait();
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    all.push_str(&stderr);
    (all, status)
}

fn host_utc() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn assert_all_passed(out: &str, status: Option<i32>, lines: &[&str]) {
    assert_eq!(status, Some(PASSED), "{out}");
    assert!(!out.contains("FAIL "), "{out}");
    for line in lines {
        assert!(out.contains(line), "{line:?} in:\n{out}");
    }
}

#[test]
fn the_rtc_alarm_wakes_the_machine_from_s3_at_its_real_mode_waking_vector() {
    let mut child = start(&format!("utc={} s3=alarm", host_utc()), &[]);
    let (out, status) = console(&mut child, None);
    assert_all_passed(
        &out,
        status,
        &[
            "PASS rtc: BCD and binary modes agree",
            "PASS s3: the FACS through FIRMWARE_CTRL",
            "testkernel: s3: sleeping until the RTC alarm",
            "PASS s3: resumed at the waking vector in real mode (CS 700, CR0 60000010)",
            "PASS s3: PM1 status 8400 after waking (WAK_STS, RTC_STS)",
            "PASS s3: memory survived (256 of 256 words)",
            "PASS s3: the alarm flag is set in register C",
        ],
    );
    // The time check passed: the RTC is within a minute after the host's time at the start.
    assert!(out.contains("s after the host's utc="), "{out}");
}

#[test]
fn the_rtc_alarm_wakes_a_machine_with_the_iommu_and_its_split_irqchip() {
    let mut child = start("iommu=1 intremap=1 s3=alarm", &["--iommu"]);
    let (out, status) = console(&mut child, None);
    assert_all_passed(
        &out,
        status,
        &[
            "PASS s3: resumed at the waking vector in real mode (CS 700, CR0 60000010)",
            "PASS s3: PM1 status 8400 after waking (WAK_STS, RTC_STS)",
        ],
    );
}

#[test]
fn a_console_key_wakes_the_machine_and_other_vcpus_wait_for_sipi() {
    let mut child = start("cpus=2 s3=key", &["--cpus", "2"]);
    let (out, status) = console(&mut child, Some("sleeping until a key"));
    assert_all_passed(
        &out,
        status,
        &[
            "PASS s3: resumed at the waking vector in real mode (CS 700, CR0 60000010)",
            "PASS s3: PM1 status 8000 after waking (WAK_STS)",
            "PASS s3: memory survived (256 of 256 words)",
            "PASS smp: 1 of 1 application processors started by INIT/SIPI",
        ],
    );
}
