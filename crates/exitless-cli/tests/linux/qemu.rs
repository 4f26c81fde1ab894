//! The same guest under QEMU (q35, and microvm for virtio-mmio) and under exitless, in the same
//! lab run: what each guest sees must agree, so a case that fails only under exitless is
//! exitless's defect and one that fails under both is the lab's. Each run's boot-to-init time
//! (the guest's uptime when its `/init` starts) is printed beside the others; lab times are
//! TCG's, and only these side-by-side ratios mean anything.

use std::time::Duration;

use crate::guest::{Guest, Job};
use crate::lab::Lab;

/// What each guest reports: its CPUs, its memory and the virtio disks its drivers found.
const REPORT: &str = r#"
echo "GUEST cpus $(grep -c ^processor /proc/cpuinfo)"
echo "GUEST memtotal_mib $(( $(awk '/^MemTotal/ {print $2}' /proc/meminfo) / 1024 ))"
echo "GUEST disks $(ls /sys/block | grep -c '^vd')"
"#;

/// One machine both VMMs run: its name, exitless's options and QEMU's, and what the guest
/// must see (CPUs, at least this much MemTotal in MiB).
struct Pair {
    name: &'static str,
    exitless: String,
    qemu_machine: &'static str,
    qemu: String,
    cpus: &'static str,
    min_memtotal_mib: u64,
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_sees_the_same_machine_under_qemu_and_exitless_in_the_same_lab() {
    let Some(lab) = Lab::or_skip("qemu") else {
        return;
    };
    let mut job = Job::new("qemu");
    let guest = Guest::new(&job.dir, "report", REPORT, &[]);
    let disk = |name: &str| {
        job.image(&format!("{name}.img"), 16 << 20)
            .display()
            .to_string()
    };
    let (pci, mmio) = (disk("pci"), disk("mmio"));
    let pairs = [
        Pair {
            name: "pci",
            exitless: format!("--cpus 2 --memory 256 --disk {pci}"),
            qemu_machine: "q35",
            qemu: format!("-smp 2 -m 256 -drive file={pci},format=raw,if=virtio"),
            cpus: "2",
            min_memtotal_mib: 200,
        },
        Pair {
            name: "mmio",
            exitless: format!("--cpus 2 --memory 256 --disk {mmio},transport=mmio"),
            qemu_machine: "microvm,acpi=on",
            qemu: format!(
                "-smp 2 -m 256 -drive id=d0,file={mmio},format=raw,if=none \
                 -device virtio-blk-device,drive=d0"
            ),
            cpus: "2",
            min_memtotal_mib: 200,
        },
    ];
    for pair in &pairs {
        job.exitless(
            &format!("exitless-{}", pair.name),
            &guest,
            "",
            &pair.exitless,
        );
        job.qemu(
            &format!("qemu-{}", pair.name),
            &guest,
            pair.qemu_machine,
            "",
            &pair.qemu,
        );
    }
    let done = job.run(&lab, Duration::from_secs(720));
    let mut failed = Vec::new();
    println!("boot to /init, guest uptime in s (TCG-timed, one run each): exitless, qemu");
    for pair in &pairs {
        let runs = ["exitless", "qemu"].map(|vmm| done.run(&format!("{vmm}-{}", pair.name)));
        let [exitless, qemu] = runs.each_ref().map(|r| r.up_after_s());
        let ratio = exitless.zip(qemu).map(|(e, q)| format!("{:.2}", e / q));
        println!(
            "  {}: {exitless:?}, {qemu:?}; exitless/qemu {}",
            pair.name,
            ratio.as_deref().unwrap_or("-")
        );
        for run in &runs {
            let memtotal: u64 = run
                .value("memtotal_mib")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let sees = run.console.contains("GUEST done")
                && run.status == 0
                && run.value("cpus") == Some(pair.cpus)
                && memtotal >= pair.min_memtotal_mib
                && run.value("disks") == Some("1");
            if !sees {
                failed.push(format!("{}: {}", run.name, run.tail()));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
