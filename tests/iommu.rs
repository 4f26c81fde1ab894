//! The VT-d remapping unit in a machine: the probe finds its register page where the boot info
//! says, a virtio-pci device behind it still serves a driver that does not negotiate
//! VIRTIO_F_ACCESS_PLATFORM (untranslated: the "none" mode), and the run reports the unit's
//! figures, its exits counted under its name like any device's.

use std::time::Duration;

use exitless::contract::{STATUS_OK, TRANSPORT_PCI};
use exitless::iommu::regs::{VTD_CAP_REG, VTD_GSTS_REG, VTD_VER_REG, VTD_VER_VALUE};
use exitless::iommu::{CAP, IommuStats};
use exitless::machine::layout::IOMMU_BASE;
use exitless::machine::{ProbeConfig, Transport, VirtioNetConfig, names, ops, run_probe};
use exitless::virtio::notify::NotifyPath;

#[test]
fn the_probe_reaches_the_unit_and_a_device_behind_it_serves_an_untranslated_driver() {
    let device = ProbeConfig::virtio_pci_address(0).ecam_offset();
    let run = run_probe(&ProbeConfig {
        ops: vec![
            ops::mmio_read(IOMMU_BASE + VTD_VER_REG, 4),
            ops::mmio_read(IOMMU_BASE + VTD_CAP_REG, 8),
            ops::mmio_read(IOMMU_BASE + VTD_GSTS_REG, 4),
            ops::virtio_init(TRANSPORT_PCI, device, 0),
            ops::virtio_rr(32, 10),
        ],
        virtio: vec![VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)],
        iommu: true,
        timeout: Duration::from_secs(120),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("probe run failed: {e}"));
    for (i, r) in run.results.iter().enumerate() {
        assert_eq!(r.status, STATUS_OK, "op {i}: {r:?}\n{}", run.console);
    }
    let values: Vec<u64> = run.results[..3].iter().map(|r| r.value).collect();
    assert_eq!(values, [u64::from(VTD_VER_VALUE), CAP, 0]);
    assert_eq!(run.results[4].value, 10, "transactions");
    assert_eq!(run.exits_at(0, names::IOMMU), 1);
    assert_eq!(
        run.iommu,
        Some(IommuStats::default()),
        "translation never enabled"
    );
}

#[test]
fn a_machine_without_the_unit_reports_none() {
    let run = run_probe(&ProbeConfig::default()).expect("probe run");
    assert_eq!(run.iommu, None);
    assert!(!run.devices.iter().any(|n| n == names::IOMMU));
}
