//! A Linux guest in the middle of its disk writes, live-migrated to a second exitless on the
//! same host (the lab's outer VM) over a Unix socket, and from there back to a third over TCP:
//! Linux's virtio-blk, MSI-X, timers and kvmclock on 2 vCPUs go on across both; every sector
//! the loop wrote, before, between and after, is in the image, which each process's image
//! lock was handed over to; Linux reports no soft lockup or RCU stall.

use std::time::Duration;

use crate::guest::{GUEST_TIMEOUT_S, Guest, Job, exitless_command};
use crate::lab::Lab;

/// The guest's work: a loop writing sector N of vda with N as 8 digits, synced, for 180 s of
/// the guest's clock (two migrations of a debug build under TCG take about 40 s each) (it runs on across a migration: kvmclock is part of the state), then
/// what it wrote and what the watchdogs said.
const IO: &str = r#"
(i=0; while [ ! -e /tmp/stop ]; do
   printf '%08d' $i | dd of=/dev/vda bs=512 seek=$i conv=fsync 2>/dev/null || break
   i=$((i + 1)); [ $((i % 20)) = 0 ] && echo "GUEST rounds_so_far $i"
 done; echo $i > /tmp/rounds) &
echo "GUEST io started"
sleep 180; touch /tmp/stop; wait
echo "GUEST rounds $(cat /tmp/rounds)"
echo "GUEST stall_reports $(dmesg | grep -ciE 'soft lockup|rcu.*stall')"
"#;

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_mid_io_migrated_there_and_back_finishes_with_every_sector() {
    // Only when asked for: a migrated guest meets the nested lab's defect as a restored one
    // does (1 job attempt of 2 on 2026-12-07), and a job costs CI about 10 minutes.
    if std::env::var_os("EXITLESS_LAB_MIGRATION").is_none() {
        println!("migration: skipped (EXITLESS_LAB_MIGRATION=1 runs it; see docs/linux-lab.md)");
        return;
    }
    let Some(lab) = Lab::or_skip("migration") else {
        return;
    };
    let mut job = Job::new("migration");
    let image = job.image("io.img", 64 << 20);
    let guest = Guest::new(&job.dir, "io", IO, &[]);
    let exitless = env!("CARGO_BIN_EXE_exitless");
    let ctl = |n: u32| format!("{exitless} ctl --api-socket \"$RUN/api{n}.sock\" --timeout 300");
    let run = exitless_command(
        &guest,
        "",
        &format!(
            "--memory 256 --cpus 2 --disk {} --api-socket \"$RUN/api0.sock\"",
            image.display()
        ),
    );
    job.start_exitless_until("original", &run, "io started");
    // Each target waits before the migration to it is asked; the source's run ends with it.
    let target = |n: u32, to: &str| {
        format!(
            "{exitless} run --migrate-from {to} --api-socket \"$RUN/api{n}.sock\" --timeout {GUEST_TIMEOUT_S} < /dev/null > hop{n}.console 2>&1 &
hop{n}=$!
wait_for_socket \"$RUN/api{n}.sock\""
        )
    };
    job.sh(&format!(
        "ip link set lo up
sleep 10
{first}
{ctl0} migrate unix:\"$RUN/hop1.mig\" > hop1.figures && echo 'job: migrated to hop1'
[ -e original.status ] || {{ wait $guest; echo $? > original.status; }}
watch_wedge hop1 $hop1 & watcher=$!
sleep 10
{second}
{ctl1} migrate tcp:127.0.0.1:47912 > hop2.figures && echo 'job: migrated to hop2'
wait $hop1; echo $? > hop1.status
kill $watcher 2>/dev/null; wait $watcher
wait_watched hop2 $hop2
cat hop1.figures hop2.figures",
        first = target(1, "unix:\"$RUN/hop1.mig\""),
        second = target(2, "tcp:127.0.0.1:47912"),
        ctl0 = ctl(0),
        ctl1 = ctl(1),
    ));
    let done = job.run(&lab, Duration::from_secs(900));
    println!("{}", done.finished.output);
    for (name, source) in [("original", "the first"), ("hop1", "the second")] {
        let run = done.run(name);
        assert_eq!(
            run.status,
            0,
            "{source} process's run ends with the migration; {}",
            run.tail()
        );
        assert!(
            run.console.contains("went to its migration target"),
            "{}",
            run.tail()
        );
    }
    let last = done.run("hop2");
    last.expect_done(0);
    last.expect("stall_reports", "0");
    let rounds: u64 = last.value("rounds").unwrap().parse().unwrap();
    let written = std::fs::read(&image).unwrap();
    for n in 0..rounds {
        let at = usize::try_from(n * 512).unwrap();
        assert_eq!(
            &written[at..at + 8],
            format!("{n:08}").as_bytes(),
            "sector {n} of {rounds} in the image"
        );
    }
    for hop in ["hop1", "hop2"] {
        let figures = std::fs::read_to_string(done.dir.join(format!("{hop}.figures")));
        println!(
            "migration to {hop}: {}",
            figures.unwrap_or_default().replace('\n', " ")
        );
    }
    println!("migration: {rounds} synced writes across two migrations");
}
