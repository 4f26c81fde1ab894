//! A Linux guest in the middle of its I/O, paused and resumed, then snapshotted and restored in
//! a new process: a TCP connection to a server beside exitless (iperf3) and a loop of synced
//! disk writes run across both. After the pause Linux reports no soft lockup or RCU stall and
//! its clock matches the host's; after the restore the connection ends its test and every
//! sector the loop wrote, before and after the snapshot, is in the image. And the same I/O
//! paused forty times in a row, wherever each pause lands.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::guest::{GUEST_TIMEOUT_S, Guest, Job, exitless_command};
use crate::lab::Lab;
use crate::net::{IPERF3, STOP_IPERF3_SERVERS, network, start_iperf3_servers, tap};

/// How long the job holds the guest paused, seconds: past Linux's soft-lockup threshold (20 s,
/// twice `watchdog_thresh`).
const PAUSE_SECONDS: u32 = 25;

/// The guest's I/O, after the address of each module's code (for a restored guest that hangs
/// in one: exitless's report at the timeout gives its RIP): a loop writing sector N of vda with N as 8 digits, synced, until the TCP
/// test beside it ends; then what the watchdogs said and the guest's clock. The test sends
/// 100 MiB paced at 8 Mbit/s (at least 100 s of the guest's time, past the snapshot: with the
/// offloads the lab's guest sent 100 MiB unpaced before the job's second pause) rather than
/// running for a time: an iperf3 server ends a timed test by its own clock, which runs on
/// while the guest is paused or between the snapshot and the restore (the server closed a
/// `-t 90` test mid-way in the lab).
const IO: &str = r#"
(i=0; while [ ! -e /tmp/stop ]; do
   printf '%08d' $i | dd of=/dev/vda bs=512 seek=$i conv=fsync 2>/dev/null || break
   i=$((i + 1)); [ $((i % 20)) = 0 ] && echo "GUEST rounds_so_far $i $(cut -d' ' -f1 /proc/uptime)"
 done; echo $i > /tmp/rounds) &
grep . /sys/module/*/sections/.text | sed 's/^/GUEST text_of /'
echo "GUEST io started"
iperf tcp_across -n 100M -b 8M
touch /tmp/stop; wait
echo "GUEST rounds $(cat /tmp/rounds)"
echo "GUEST stall_reports $(dmesg | grep -ciE 'soft lockup|rcu.*stall')"
echo "GUEST date_epoch $(date -u +%s)"
echo "GUEST uptime_end $(cut -d' ' -f1 /proc/uptime)"
"#;

/// How much longer than the guest's clock advanced the restored process may run, seconds: it
/// loads the snapshot before the guest runs and powers the guest off after its last line
/// (about 17 s in the lab). A clock not restored (no KVM_SET_CLOCK) starts the new VM's
/// kvmclock at zero, below what the guest last read, and Linux's clock stands still until it
/// catches up: as long as the guest had run before the snapshot, which is more than its boot
/// and the 25 s pause (over 60 s in the lab).
const CLOCK_SLACK_S: f64 = 45.0;

/// The guest's clock (its uptime, from kvmclock) runs on across the restore: from its last
/// line before the snapshot to its last after the restore it advances by about as long as
/// the restored process ran.
fn expect_clock_runs_across_the_restore(
    original: &crate::guest::Run,
    restored: &crate::guest::Run,
    times: &std::path::Path,
) {
    let times = std::fs::read_to_string(times).unwrap_or_default();
    let host: Vec<f64> = times
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    let [start, end] = host[..] else {
        panic!("no restore times in {times:?}");
    };
    let before: f64 = original
        .value("rounds_so_far")
        .and_then(|rest| rest.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no uptime before the snapshot; {}", original.tail()));
    let after: f64 = restored
        .value("uptime_end")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no uptime after the restore; {}", restored.tail()));
    let (guest, host) = (after - before, end - start);
    println!(
        "snapshot: from its last line before the snapshot the guest's clock ran {guest:.1} s; the restored process ran {host:.1} s"
    );
    assert!(
        host - guest <= CLOCK_SLACK_S,
        "the guest's clock ran {guest:.1} s while the restored process ran {host:.1} s"
    );
}

/// A job for the I/O guest: its disk image, a tap and iperf3 servers beside it, and the
/// commands that run the guest under exitless (2 vCPUs, the disk, a card on the tap, a control
/// socket) and `exitless ctl` on that socket.
struct IoJob {
    job: Job,
    image: std::path::PathBuf,
    ctl: String,
    run: String,
}

impl IoJob {
    /// The lab, and the job `name` in it, its guest running `io` after the network's setup on
    /// a card with `net_options` (after its tap); `None` where there is no lab (the case is
    /// skipped, saying so).
    fn in_lab(name: &str, io: &str, net_options: &str) -> Option<(Lab, IoJob)> {
        let lab = Lab::or_skip(name)?;
        Some((lab, IoJob::new(name, io, net_options)))
    }

    /// The job `name`, its guest running `io` after the network's setup.
    fn new(name: &str, io: &str, net_options: &str) -> IoJob {
        let mut job = Job::new(name);
        let image = job.image("io.img", 64 << 20);
        let guest = Guest::new(&job.dir, "io", &format!("{}\n{io}", network(6)), &[IPERF3]);
        job.sh(&tap("lab-tap6", 6, ""));
        start_iperf3_servers(&mut job);
        let ctl = format!(
            "{} ctl --api-socket \"$RUN/api.sock\"",
            env!("CARGO_BIN_EXE_exitless")
        );
        let run = exitless_command(
            &guest,
            "",
            &format!(
                "--memory 256 --cpus 2 --disk {} --net tap=lab-tap6{net_options} --api-socket \"$RUN/api.sock\"",
                image.display()
            ),
        );
        IoJob {
            job,
            image,
            ctl,
            run,
        }
    }
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_mid_io_survives_a_pause_and_a_snapshot_restored_in_a_new_process() {
    pause_then_snapshot_and_restore("snapshot", "");
}

/// The same with the card's rings on the kernel's vhost-net: each pause stops them there
/// (VHOST_NET_SET_BACKEND to none, then VHOST_GET_VRING_BASE), the resume and the restored
/// process start them again at those bases.
#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_mid_io_on_vhost_net_survives_a_pause_and_a_snapshot_restored_in_a_new_process() {
    pause_then_snapshot_and_restore("snapshot-vhost-net", ",vhost=on");
}

/// The job `name`: the guest's I/O on a card with `net_options`, paused, resumed, snapshotted
/// and restored in a new process, and what each process's guest said checked.
fn pause_then_snapshot_and_restore(name: &str, net_options: &str) {
    let Some((lab, io_job)) = IoJob::in_lab(name, IO, net_options) else {
        return;
    };
    let IoJob {
        mut job,
        image,
        ctl,
        run,
    } = io_job;
    job.start_exitless_until("original", &run, "io started");
    job.sh(&format!(
        "sleep 5
{ctl} pause && echo 'job: paused' && sleep {PAUSE_SECONDS} && {ctl} resume && echo 'job: resumed'
sleep 10
{ctl} pause && {ctl} snapshot \"$RUN/snapshot\" && echo 'job: snapshot taken' && cp \"$RUN/snapshot/snapshot.json\" . && {ctl} shutdown
[ -e original.status ] || {{ wait $guest; echo $? > original.status; }}
restore_start=$(date +%s.%N)
{exitless} run --restore \"$RUN/snapshot\" --timeout {GUEST_TIMEOUT_S} < /dev/null > restored.console 2>&1 &
restored=$!
wait_watched restored $restored
echo \"$restore_start $(date +%s.%N)\" > restored.times
{STOP_IPERF3_SERVERS}; ip link del lab-tap6",
        exitless = env!("CARGO_BIN_EXE_exitless"),
    ));
    let started = SystemTime::now();
    let done = job.run(&lab, Duration::from_secs(720));
    let ended = SystemTime::now();
    println!("{}", done.finished.output);

    let original = done.run("original");
    assert_eq!(
        original.status,
        0,
        "the shutdown after the snapshot; {}",
        original.tail()
    );
    assert!(
        original.value("rounds_so_far").is_some(),
        "the original process wrote before the snapshot; {}",
        original.tail()
    );
    let restored = done.run("restored");
    if !restored.console.contains("GUEST done") {
        let modules: Vec<&str> = original
            .console
            .lines()
            .filter(|l| l.contains("GUEST text_of "))
            .collect();
        println!(
            "where the guest's modules' code is:\n{}",
            modules.join("\n")
        );
    }
    restored.expect_done(0);
    expect_clock_runs_across_the_restore(&original, &restored, &done.dir.join("restored.times"));
    assert!(
        restored.value("rounds_so_far").is_some(),
        "the restored process wrote after it; {}",
        restored.tail()
    );
    restored.expect("tcp_across_status", "0");
    restored.expect("stall_reports", "0");
    // The guest's clock: between the job's start and end on the host's (UTC, whole seconds).
    let epoch = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let date: u64 = restored.value("date_epoch").unwrap().parse().unwrap();
    assert!(
        (epoch(started)..=epoch(ended) + 1).contains(&date),
        "the guest's date {date} is outside the run's {}..{}",
        epoch(started),
        epoch(ended)
    );
    let rounds = expect_every_sector_written(&restored, &image);
    println!("snapshot: {rounds} synced writes across a {PAUSE_SECONDS} s pause and a restore");
}

/// Every sector the guest's loop wrote (`GUEST rounds N` on `run`'s console) holds its number
/// in `image`; returns how many.
fn expect_every_sector_written(run: &crate::guest::Run, image: &std::path::Path) -> u64 {
    let rounds: u64 = run.value("rounds").unwrap().parse().unwrap();
    let written = std::fs::read(image).unwrap();
    for n in 0..rounds {
        let at = usize::try_from(n * 512).unwrap();
        assert_eq!(
            &written[at..at + 8],
            format!("{n:08}").as_bytes(),
            "sector {n} of {rounds} in the image"
        );
    }
    rounds
}

/// How many times the pause case pauses the guest, and for how long each, seconds.
const PAUSES: u32 = 40;
const SHORT_PAUSE_S: f64 = 0.3;

/// The same I/O paused and resumed [`PAUSES`] times a second or so apart: each pause lands
/// wherever the guest is, now and then between the two exits of one access (an MMIO access
/// KVM splits). Before exitless served the second of those exits on pausing, every run of
/// this case in the nested lab ended on a wedged vCPU (a page fault KVM never delivered, at a
/// bad RIP) or a triple fault (3 runs of 3). With the fix it still provokes the lab's own
/// defect (the outer VM's registers stored as vCPU 1's at `vmrun`: docs/linux-lab.md) in 4
/// attempts of 9, which the job's retries absorbed, but too often for CI.
#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_mid_io_survives_forty_pauses() {
    // Only when asked for: three faulted attempts in a row would fail CI about once in 11.
    if std::env::var_os("EXITLESS_LAB_PAUSE_STORM").is_none() {
        println!(
            "pauses: skipped (EXITLESS_LAB_PAUSE_STORM=1 runs it; it provokes the nested lab's own defect too often for CI)"
        );
        return;
    }
    // 60 MiB at 8 Mbit/s: a minute of I/O, past the last pause.
    let Some((lab, io_job)) = IoJob::in_lab("pauses", &IO.replace("-n 100M", "-n 60M"), "") else {
        return;
    };
    let IoJob {
        mut job,
        image,
        ctl,
        run,
    } = io_job;
    job.start_exitless_until("paused", &run, "io started");
    job.sh(&format!(
        "sleep 2
for k in $(seq {PAUSES}); do {ctl} pause > /dev/null && sleep {SHORT_PAUSE_S} && {ctl} resume > /dev/null; sleep 1; done
echo 'job: {PAUSES} pauses'
[ -e paused.status ] || wait_watched paused $guest
{STOP_IPERF3_SERVERS}; ip link del lab-tap6"
    ));
    let done = job.run(&lab, Duration::from_secs(600));
    println!("{}", done.finished.output);
    let paused = done.run("paused");
    paused.expect_done(0);
    paused.expect("tcp_across_status", "0");
    paused.expect("stall_reports", "0");
    let rounds = expect_every_sector_written(&paused, &image);
    println!("pauses: {rounds} synced writes across {PAUSES} pauses");
}
