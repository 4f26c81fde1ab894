//! The VT-d remapping unit in a machine: the probe finds its register page where the boot info
//! says, a virtio-pci device behind it still serves a driver that does not negotiate
//! VIRTIO_F_ACCESS_PLATFORM (untranslated: the "none" mode), and the run reports the unit's
//! figures, its exits counted under its name like any device's.

use std::time::Duration;

use exitless::contract::{
    IOMMU_MODE_DEFERRED_ARRAY, IOMMU_MODE_DEFERRED_LIST, IOMMU_MODE_LINUX_FQ,
    IOMMU_MODE_PER_DOMAIN, IOMMU_MODE_STRICT, RR_FLAG_IOMMU, STATUS_OK, TRANSPORT_PCI,
};
use exitless::iommu::regs::{VTD_CAP_REG, VTD_GSTS_REG, VTD_VER_REG, VTD_VER_VALUE};
use exitless::iommu::{CAP, IommuStats};
use exitless::machine::layout::IOMMU_BASE;
use exitless::machine::{
    NetBackendKind, ProbeConfig, Transport, VirtioNetConfig, names, ops, run_probe,
};
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

/// The probe's modes, each with a small high-water mark so that flushes happen in a short run.
const MODES: [(u64, u64); 5] = [
    (IOMMU_MODE_STRICT, 0),
    (IOMMU_MODE_DEFERRED_LIST, 16),
    (IOMMU_MODE_DEFERRED_ARRAY, 16),
    (IOMMU_MODE_PER_DOMAIN, 16),
    (IOMMU_MODE_LINUX_FQ, 0),
];
const FRAMES: u64 = 200;
const TRANSACTIONS: u64 = 40;

#[test]
fn traffic_is_byte_exact_in_every_unmap_mode_switched_at_run_time() {
    let function = |n| ProbeConfig::virtio_pci_address(n).ecam_offset();
    let mut list = Vec::new();
    let mut streams = Vec::new();
    let mut transactions = Vec::new();
    let mut switches = Vec::new();
    for (slot, &(mode, hwm)) in MODES.iter().enumerate() {
        switches.push(list.len());
        list.push(ops::iommu_mode(mode, hwm));
        list.push(ops::virtio_init(TRANSPORT_PCI, function(0), RR_FLAG_IOMMU));
        streams.push(list.len());
        list.push(ops::net_stream(32, FRAMES, 8));
        list.push(ops::virtio_init(TRANSPORT_PCI, function(1), RR_FLAG_IOMMU));
        transactions.push(list.len());
        list.push(ops::virtio_rr(32, TRANSACTIONS));
        list.push(ops::iommu_report(slot as u64));
    }
    let run = run_probe(&ProbeConfig {
        ops: list,
        virtio: vec![
            VirtioNetConfig {
                backend: NetBackendKind::Sink,
                ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
            },
            VirtioNetConfig::new(Transport::Pci, NotifyPath::Address),
        ],
        iommu: true,
        timeout: Duration::from_secs(300),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("probe run failed: {e}"));
    for (i, r) in run.results.iter().enumerate() {
        assert_eq!(r.status, STATUS_OK, "op {i}: {r:?}\n{}", run.console);
    }
    for (k, &(mode, hwm)) in MODES.iter().enumerate() {
        assert_eq!(
            run.results[streams[k]].value, FRAMES,
            "mode {mode}: frames back"
        );
        let rr = run.results[transactions[k]];
        assert_eq!(rr.value, TRANSACTIONS, "mode {mode}: transactions");
        assert_eq!(
            rr.bytes,
            TRANSACTIONS * 1024,
            "mode {mode}: response bytes checked"
        );
        let r = run.iommu_reports[k];
        // Every buffer given to a device came back and was unmapped; nothing faulted.
        assert_eq!(r.unmaps, FRAMES + 2 * TRANSACTIONS, "mode {mode}: {r:?}");
        assert_eq!((r.faults, r.wait_timeouts), (0, 0), "mode {mode}: {r:?}");
        let buffers = r.unmaps;
        match mode {
            IOMMU_MODE_STRICT => {
                // One invalidation per unmap, and a few for the unit's and devices' bring-up.
                assert!(
                    (buffers..=buffers + 8).contains(&r.iqt_writes),
                    "one invalidation per unmap: {r:?}"
                );
                assert!(r.max_pending <= 5, "at most one buffer's pages: {r:?}");
            }
            IOMMU_MODE_LINUX_FQ => {
                assert!(r.iqt_writes < buffers / 10, "batched: {r:?}");
            }
            _ => {
                // One flush per `hwm` unmaps (the 10 ms timer may add a few).
                assert!(r.flushes >= buffers / hwm, "mode {mode}: {r:?}");
                assert!(r.max_pending <= 5 * hwm, "mode {mode}: {r:?}");
            }
        }
    }
    // A switch flushes what the old mode held: strict holds nothing.
    for (k, &(mode, _)) in MODES.iter().enumerate().skip(1) {
        let previous = MODES[k - 1].0;
        if previous == IOMMU_MODE_STRICT {
            assert_eq!(run.results[switches[k]].value, 0, "after strict: {mode}");
        }
    }
    // The unit really translated, and deferral really left stale entries to drop.
    let unit = run.iommu.expect("the unit's figures");
    assert!(unit.walks > 0 && unit.faults == 0, "{unit:?}");
    assert!(unit.iotlb_dropped_stale > 0, "{unit:?}");
}

/// The IQT write is a doorbell (an ioeventfd per tail of the probe's 256-entry queue): a strict
/// stream, one invalidation per unmap, makes next to no exits to the unit, and every wait
/// still completes.
#[test]
fn strict_unmaps_invalidate_without_exiting_to_the_unit() {
    let function = ProbeConfig::virtio_pci_address(0).ecam_offset();
    let run = run_probe(&ProbeConfig {
        ops: vec![
            ops::iommu_mode(IOMMU_MODE_STRICT, 0),
            ops::virtio_init(TRANSPORT_PCI, function, RR_FLAG_IOMMU),
            ops::net_stream(32, FRAMES, 8),
            ops::iommu_report(0),
        ],
        virtio: vec![VirtioNetConfig {
            backend: NetBackendKind::Sink,
            ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
        }],
        iommu: true,
        timeout: Duration::from_secs(120),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("probe run failed: {e}"));
    for (i, r) in run.results.iter().enumerate() {
        assert_eq!(r.status, STATUS_OK, "op {i}: {r:?}\n{}", run.console);
    }
    assert_eq!(run.results[2].value, FRAMES, "frames back");
    let r = run.iommu_reports[0];
    assert!(r.iqt_writes >= FRAMES, "one invalidation per unmap: {r:?}");
    assert_eq!((r.faults, r.wait_timeouts), (0, 0), "{r:?}");
    let unit = run.iommu.expect("the unit's figures");
    assert!(
        unit.tail_writes >= r.iqt_writes,
        "the unit took them: {unit:?}"
    );
    let exits = run.exits_at(2, names::IOMMU);
    assert!(
        exits < r.iqt_writes / 10,
        "{exits} exits to the unit for {} IQT writes",
        r.iqt_writes
    );
}
