//! Booting to userspace: a bzImage and the PVH entry, 1, 2 and 4 vCPUs, RAM above 4 GiB, a CPU
//! template's change seen in `/proc/cpuinfo`, the RTC's date, and how a run ends (poweroff and
//! reboot: status 0; a panic: 4).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::debian;
use crate::guest::{Done, Guest, Job};
use crate::lab::Lab;

/// What the boot guests print: CPUs online, RAM, whether the CPU shows SSE4.2, the RTC's time.
const REPORT: &str = r#"
echo "GUEST cpus $(grep -c ^processor /proc/cpuinfo)"
echo "GUEST memtotal_kib $(awk '/^MemTotal/ {print $2}' /proc/meminfo)"
grep -qw sse4_2 /proc/cpuinfo && echo "GUEST sse4_2 yes" || echo "GUEST sse4_2 no"
echo "GUEST rtc_epoch $(cat /sys/class/rtc/rtc0/since_epoch)"
echo "GUEST date_epoch $(date -u +%s)"
"#;

/// Panic unless run `name` of `done` reached userspace with `cpus` CPUs and powered off, with
/// every port and address Linux probed at boot answered (docs/linux-lab.md): a stray access is
/// a device missing from the machine.
fn expect_booted(done: &Done, name: &str, cpus: &str) {
    let run = done.run(name);
    run.expect_done(0);
    run.expect("cpus", cpus);
    let stray: Vec<&str> = run
        .console
        .lines()
        .filter(|l| l.contains("no device there"))
        .collect();
    assert!(
        stray.is_empty(),
        "{name}: accesses nothing claims: {stray:?}"
    );
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_reaches_userspace_with_1_and_2_vcpus_as_a_bzimage_and_through_pvh() {
    let Some(lab) = Lab::or_skip("boot") else {
        return;
    };
    let mut job = Job::new("boot");
    let guest = Guest::new(&job.dir, "report", REPORT, &[]);
    let kernel = debian::kernel(crate::lab::KERNEL_PACKAGE).unwrap();
    let vmlinux = debian::vmlinux(&kernel.vmlinuz).expect("the vmlinux inside the bzImage");
    for cpus in [1, 2] {
        job.exitless(
            &format!("bzimage-{cpus}"),
            &guest,
            "",
            &format!("--cpus {cpus} --memory 256"),
        );
    }
    let pvh = Guest {
        kernel: vmlinux,
        initramfs: guest.initramfs.clone(),
    };
    job.exitless("pvh-2", &pvh, "", "--cpus 2 --memory 256");
    let done = job.run(&lab, Duration::from_secs(600));
    for (name, cpus) in [("bzimage-1", "1"), ("bzimage-2", "2"), ("pvh-2", "2")] {
        expect_booted(&done, name, cpus);
    }
}

/// Four vCPUs, on the nested lab's 2 outer vCPUs: a case of its own, since on QEMU 7.2's
/// outer VM 4-vCPU guests triple-faulted now and then, under QEMU as under exitless; on 10.0
/// it passed 6 runs of 6 (docs/linux-lab.md), and CI runs it again.
#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_reaches_userspace_with_4_vcpus() {
    let Some(lab) = Lab::or_skip("boot-4") else {
        return;
    };
    let mut job = Job::new("boot-4");
    let guest = Guest::new(&job.dir, "report", REPORT, &[]);
    job.exitless("bzimage-4", &guest, "", "--cpus 4 --memory 256");
    let done = job.run(&lab, Duration::from_secs(420));
    expect_booted(&done, "bzimage-4", "4");
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_sees_ram_above_4_gib_a_cpu_template_and_the_rtcs_date() {
    let Some(lab) = Lab::or_skip("machine") else {
        return;
    };
    let mut job = Job::new("machine");
    let guest = Guest::new(&job.dir, "report", REPORT, &[]);
    job.exitless("high-memory", &guest, "", "--memory 4608");
    job.exitless("host-cpu", &guest, "", "--memory 256");
    job.exitless("no-sse4_2", &guest, "", "--memory 256 --cpu host,-sse4.2");
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let done = job.run(&lab, Duration::from_secs(600));
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();

    let high = done.run("high-memory");
    high.expect_done(0);
    let kib: u64 = high.value("memtotal_kib").unwrap().parse().unwrap();
    // 4608 MiB less what the kernel keeps: more than 4 GiB means the RAM above the hole counts.
    assert!(kib > 4 << 20, "MemTotal {kib} KiB; {}", high.tail());

    let host = done.run("host-cpu");
    host.expect_done(0);
    host.expect("sse4_2", "yes");
    let hidden = done.run("no-sse4_2");
    hidden.expect_done(0);
    hidden.expect("sse4_2", "no");

    // The RTC and the clock Linux set from it hold the host's time (UTC), to the run's span.
    for key in ["rtc_epoch", "date_epoch"] {
        let seen: u64 = host
            .value(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key}; {}", host.tail()));
        assert!(
            (before - 60..=after + 60).contains(&seen),
            "{key} {seen}, the host's {before}..{after}"
        );
    }
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn a_linux_reboot_ends_the_run_with_status_0_as_a_poweroff_does_and_a_panic_with_4() {
    let Some(lab) = Lab::or_skip("ends") else {
        return;
    };
    let mut job = Job::new("ends");
    let rebooting = Guest::new(
        &job.dir,
        "reboot",
        "echo GUEST rebooting yes\nreboot -f",
        &[],
    );
    job.exitless("reboot", &rebooting, "", "--memory 256");
    // sysrq's `c` panics the kernel (a NULL dereference); its panic notifiers run, the pvpanic
    // driver's among them, before `panic=-1` would reset the machine.
    let panicking = Guest::new(
        &job.dir,
        "panic",
        "echo \"GUEST pvpanic_bound $(ls /sys/bus/platform/drivers/pvpanic-mmio | grep -c QEMU0001)\"\n\
         echo c > /proc/sysrq-trigger",
        &[],
    );
    job.exitless("panic", &panicking, "", "--memory 256");
    let done = job.run(&lab, Duration::from_secs(420));
    let run = done.run("reboot");
    run.expect("rebooting", "yes");
    assert!(
        !run.console.contains("GUEST done"),
        "reboot -f returned; {}",
        run.tail()
    );
    assert_eq!(run.status, 0, "{}", run.tail());

    let run = done.run("panic");
    run.expect("pvpanic_bound", "1");
    assert!(run.console.contains("Kernel panic"), "{}", run.tail());
    assert!(!run.console.contains("GUEST done"), "{}", run.tail());
    assert_eq!(run.status, 4, "a panic's status; {}", run.tail());
}
