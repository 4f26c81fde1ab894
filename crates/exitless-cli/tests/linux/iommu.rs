//! `--iommu` under Linux's intel-iommu driver (`intel_iommu=on`): the disk and the card each in
//! an IOMMU group whose DMA domain is strict (`iommu.strict=1`) or lazy, with its flush queue
//! (`iommu.strict=0`, the case seed 003's deferred invalidation serves); their MSI-X messages
//! remapped (the IR- chips of /proc/interrupts), with x2APIC; a file system and network traffic
//! through the translation either way. QEMU's intel-iommu runs the strict case beside, in the
//! same lab run: the lab's guests fault now and then, and a case that fails under exitless
//! alone is exitless's.

use std::time::Duration;

use crate::disk::{CONTENT, debugfs_cat, file_system};
use crate::guest::{Guest, Job, Run};
use crate::lab::Lab;
use crate::net::{IPERF3, STOP_IPERF3_SERVERS, expect_traffic, start_iperf3_servers, tap, traffic};

/// What the guest says of the IOMMU: its units, each virtio function's group type (`DMA`:
/// strict; `DMA-FQ`: lazy), how many interrupts are remapped, and whether remapping runs in
/// x2APIC mode (intel-iommu's "Enabled IRQ remapping in x2apic mode").
const REPORT: &str = r#"
echo "GUEST iommu_units $(ls /sys/class/iommu | wc -l)"
for d in /sys/bus/pci/devices/*; do
  [ "$(cat $d/vendor)" = 0x1af4 ] && echo "GUEST group_type $(cat $d/iommu_group/type)"
done
echo "GUEST msi $(grep -c PCI-MSI /proc/interrupts)"
echo "GUEST remapped_msi $(grep -c IR-PCI-MSI /proc/interrupts)"
dmesg | grep -q 'IRQ remapping in x2apic mode' && echo "GUEST x2apic_remapping yes"
"#;

/// The group types the guest listed, one per virtio function.
fn group_types(run: &Run) -> Vec<&str> {
    run.console
        .lines()
        .filter_map(|l| l.split_once("GUEST group_type ").map(|(_, t)| t.trim()))
        .collect()
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_runs_its_disk_and_card_through_the_iommu_strict_and_lazy_with_remapped_interrupts() {
    let Some(lab) = Lab::or_skip("iommu") else {
        return;
    };
    let mut job = Job::new("iommu");
    let script = format!(
        "{fs}\nfs vda\n{traffic}\n{REPORT}",
        fs = file_system(),
        traffic = traffic(5)
    );
    let guest = Guest::new(&job.dir, "iommu", &script, &[IPERF3]);
    job.sh(&tap("lab-tap5", 5, ""));
    start_iperf3_servers(&mut job);
    let modes = [("strict", "1", "DMA"), ("lazy", "0", "DMA-FQ")];
    for (mode, strict, _) in modes {
        let image = job.image(&format!("{mode}.img"), 64 << 20);
        job.exitless(
            mode,
            &guest,
            &format!("intel_iommu=on iommu.strict={strict}"),
            &format!(
                "--memory 512 --cpus 2 --iommu --disk {} --net tap=lab-tap5",
                image.display()
            ),
        );
    }
    // intel-iommu before the functions it translates; each virtio function behind it
    // (iommu_platform, modern only); interrupt remapping needs the split irqchip.
    let image = job.image("qemu-strict.img", 64 << 20);
    job.qemu(
        "qemu-strict",
        &guest,
        "q35,kernel-irqchip=split",
        "intel_iommu=on iommu.strict=1",
        &format!(
            "-m 512 -smp 2 -device intel-iommu,intremap=on \
             -drive file={},format=raw,if=none,id=d0 \
             -device virtio-blk-pci,drive=d0,iommu_platform=on,disable-legacy=on \
             -netdev tap,id=n0,ifname=lab-tap5,script=no,downscript=no \
             -device virtio-net-pci,netdev=n0,iommu_platform=on,disable-legacy=on",
            image.display()
        ),
    );
    job.sh(&format!("{STOP_IPERF3_SERVERS}; ip link del lab-tap5"));
    let done = job.run(&lab, Duration::from_secs(900));

    let runs = modes.map(|(mode, _, group_type)| (mode, group_type));
    for (mode, group_type) in runs.into_iter().chain([("qemu-strict", "DMA")]) {
        let run = done.run(mode);
        expect_traffic(&run);
        run.expect("vda_readback", CONTENT);
        run.expect("iommu_units", "1");
        assert_eq!(
            group_types(&run),
            [group_type, group_type],
            "{mode}: the card's and the disk's domains; {}",
            run.tail()
        );
        let msi = run.value("msi").unwrap_or_default();
        println!("{mode}: {msi} MSI-X vectors");
        assert_ne!(msi, "0", "{mode}: MSI-X in use; {}", run.tail());
        run.expect("remapped_msi", msi);
        run.expect("x2apic_remapping", "yes");
        assert_eq!(
            debugfs_cat(&done.dir.join(format!("{mode}.img")), "/hello"),
            CONTENT,
            "{mode}: the host reads what the guest wrote through the IOMMU"
        );
    }
}
