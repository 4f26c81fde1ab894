//! S3 as Linux uses it: `rtcwake -m mem` sets the RTC alarm as a wake event and writes `mem` to
//! `/sys/power/state`; exitless suspends the machine, the alarm wakes it, Linux resumes through
//! its real-mode waking vector with both CPUs, its clock still the host's, and its disk still
//! works (the write after the resume is in the image).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::guest::{Guest, Job};
use crate::lab::Lab;

/// util-linux's rtcwake (busybox has none); the guest gets this host's.
const RTCWAKE: &str = "/usr/sbin/rtcwake";

/// What the guest does: sleep in S3 for 5 s, then report ([`AFTER_RESUME`] follows).
const SLEEP: &str = r#"
echo "GUEST sleep_states $(cat /sys/power/state)"
echo "GUEST mem_sleep $(cat /sys/power/mem_sleep)"
echo "GUEST rtc_wakeup $(cat /sys/class/rtc/rtc0/device/power/wakeup)"
rtcwake -m mem -s 5; echo "GUEST rtcwake_status $?"
echo "GUEST cpus_online $(cat /sys/devices/system/cpu/online)"
echo "GUEST suspend_exits $(dmesg | grep -c 'PM: suspend exit')"
echo "GUEST date_epoch $(date -u +%s)"
"#;

/// What the guest writes at sector 1 of its disk after it resumed.
const AFTER_RESUME: &str = "written after the resume";

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_sleeps_in_s3_and_its_rtc_alarm_wakes_it_with_both_cpus_and_its_disk() {
    let Some(lab) = Lab::or_skip("sleep") else {
        return;
    };
    let mut job = Job::new("sleep");
    let image = job.image("s3.img", 1 << 20);
    let script = format!(
        "{SLEEP}printf '{AFTER_RESUME}' | dd of=/dev/vda bs=512 seek=1 conv=fsync 2>/dev/null\n\
         echo \"GUEST disk_write_status $?\"\n"
    );
    let guest = Guest::new(&job.dir, "s3", &script, &[RTCWAKE]);
    job.exitless(
        "s3",
        &guest,
        "",
        &format!("--cpus 2 --memory 256 --disk {}", image.display()),
    );
    let now = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let before = now();
    let done = job.run(&lab, Duration::from_secs(420));
    let after = now();

    let run = done.run("s3");
    // `mem` is S3 only where mem_sleep has chosen `deep`: without \_S3, Linux still lists
    // `mem`, as suspend-to-idle (s2idle).
    let states = run.value("sleep_states").unwrap_or_default();
    assert!(
        states.split(' ').any(|s| s == "mem"),
        "{states}; {}",
        run.tail()
    );
    let mem_sleep = run.value("mem_sleep").unwrap_or_default();
    assert!(
        mem_sleep.split(' ').any(|s| s == "[deep]"),
        "mem_sleep {mem_sleep:?}: S3 not chosen; {}",
        run.tail()
    );
    run.expect_done(0);
    run.expect("rtc_wakeup", "enabled");
    run.expect("rtcwake_status", "0");
    run.expect("suspend_exits", "1");
    run.expect("cpus_online", "0-1");
    run.expect("disk_write_status", "0");
    let date: u64 = run.value("date_epoch").unwrap().parse().unwrap();
    assert!(
        (before - 60..=after + 60).contains(&date),
        "the guest's clock after the resume {date}, the host's {before}..{after}"
    );
    let written = std::fs::read(&image).unwrap();
    assert_eq!(
        &written[512..512 + AFTER_RESUME.len()],
        AFTER_RESUME.as_bytes(),
        "sector 1 after the resume"
    );
}
