//! Interrupt remapping (VT-d §5.1) in a machine: the probe's VT-d driver turns it on with a
//! table whose entries deliver on other vectors than the messages' data say, programs a
//! virtio-pci function's MSI-X entries in remappable format, and every vector the VMM sends
//! arrives exactly once where its entry says, under every commit strategy; entries rewritten
//! and invalidated take effect, with one routing commit for all the routes they change (but
//! under the per-vector baseline).

use std::time::Duration;

use exitless::contract::*;
use exitless::iommu::regs::{
    VTD_FR_IR_SOURCE, VTD_FRCD_F, VTD_FRCD_FR_SHIFT, VTD_FRCD_IR_INDEX_SHIFT, VTD_FRCD_REG,
};
use exitless::irq::CommitStrategy;
use exitless::machine::layout::IOMMU_BASE;
use exitless::machine::{ProbeConfig, ProbeRun, Transport, VirtioNetConfig, ops};
use exitless::pci::PciAddress;
use exitless::pci::regs::PCI_MSIX_FLAGS_ENABLE;
use exitless::virtio::notify::NotifyPath;

/// Four queue pairs: eight queue vectors and the configuration vector.
const PAIRS: u16 = 4;
const VECTORS: u64 = 2 * PAIRS as u64 + 1;

/// Boot with `ops` under `strategy`, the device behind the unit; every op must succeed.
fn boot(strategy: CommitStrategy, ops: Vec<Op>) -> ProbeRun {
    crate::common::run_all_ok(&crate::common::msix_config(strategy, PAIRS, true, ops))
}

/// Remapping on, entry k delivering on k + `delta` and admitting the device (another one if
/// `foreign`); the device's MSI-X entries in remappable format, entry i naming interrupt index
/// 0x20 + i (its subhandle), unmasked; MSI-X on; each vector asked for and checked (op 3).
fn remapped_and_checked(d: PciAddress, delta: u8, foreign: bool) -> Vec<Op> {
    vec![
        ops::iommu_intremap(d, delta, foreign),
        ops::msix_program(d, 0x20, MSI_REMAPPABLE_SHV, true),
        ops::msix_control(d, PCI_MSIX_FLAGS_ENABLE),
        ops::msix_check(d, true),
    ]
}

/// Op `i` saw every entry deliver once on its remapped vector and nothing else arrive.
fn assert_delivered(run: &ProbeRun, i: usize) {
    let r = run.results[i];
    assert_eq!(r.status, STATUS_OK, "op {i}: {r:?}\n{}", run.console);
    assert_eq!(r.value, VECTORS, "op {i}: every entry behaved");
    assert_eq!(r.irqs, VECTORS, "op {i}: one interrupt per vector");
    assert_eq!(r.stray_irqs, 0, "op {i}: interrupts elsewhere");
}

#[test]
fn remapped_msix_vectors_arrive_once_where_their_entries_say_under_every_strategy() {
    let d = ProbeConfig::virtio_pci_address(0);
    for strategy in CommitStrategy::ALL {
        // 3: on 0x60 + i; 4: every entry rewritten to k + 0x80, then a global invalidation;
        // 5: on 0xa0 + i
        let mut list = remapped_and_checked(d, 0x40, false);
        list.extend([
            ops::iommu_intremap(d, 0x80, false),
            ops::msix_check(d, true),
        ]);
        let run = boot(strategy, list);
        let name = strategy.name();
        assert_eq!(run.results[0].value, 256, "{name}: the table's entries");
        assert_delivered(&run, 3);
        assert_delivered(&run, 5);
        let unit = run.iommu.expect("the unit's figures").interrupts;
        assert_eq!(unit.blocked, 0, "{name}: {unit:?}");
        assert_eq!(unit.invalidations, 2, "{name}: {unit:?}");
        let commits = run.phases[4].as_ref().expect("op 4").routing.commits;
        if strategy == CommitStrategy::Direct {
            // Each message remapped as it is sent: no routes.
            assert!(unit.remapped >= 2 * VECTORS, "{name}: {unit:?}");
            assert_eq!(commits, 0, "{name}");
        } else {
            // Every route changed at the invalidation: committed once, but by the baseline
            // that commits each change.
            assert_eq!(unit.route_updates, VECTORS, "{name}: {unit:?}");
            let expected = match strategy {
                CommitStrategy::PerVector => VECTORS,
                _ => 1,
            };
            assert_eq!(commits, expected, "{name}: commits at the invalidation");
        }
    }
}

#[test]
fn messages_from_a_function_the_entries_do_not_admit_fault_and_are_not_delivered() {
    let d = ProbeConfig::virtio_pci_address(0);
    let frcd = IOMMU_BASE + VTD_FRCD_REG;
    for strategy in CommitStrategy::ALL {
        // 0: the entries admit 00:04.0 only (SVT 1), not the device at 00:03.0; 3: nothing
        // arrives; 6: the fault events that reached the guest; 7: the same entries for the
        // device, then a global invalidation; 8: every vector once.
        let mut list = remapped_and_checked(d, 0x40, true);
        list.extend([
            ops::mmio_read(frcd, 8),
            ops::mmio_read(frcd + 8, 8),
            ops::iommu_report(0),
            ops::iommu_intremap(d, 0x40, false),
            ops::msix_check(d, true),
        ]);
        let run = boot(strategy, list);
        let name = strategy.name();
        let blocked = run.results[3];
        assert_eq!(
            blocked.value, VECTORS,
            "{name}: every entry behaved: {blocked:?}"
        );
        assert_eq!(
            (blocked.irqs, blocked.stray_irqs),
            (0, 0),
            "{name}: nothing delivered"
        );
        // FRCD0: the first blocked message, its index in 63:48, reason 0x26, the device's SID.
        let (low, high) = (run.results[4].value, run.results[5].value);
        assert_eq!(
            high >> VTD_FRCD_FR_SHIFT & 0xff,
            u64::from(VTD_FR_IR_SOURCE),
            "{name}"
        );
        assert_eq!(high & 0xffff, u64::from(d.requester_id()), "{name}");
        assert_ne!(high & VTD_FRCD_F, 0, "{name}");
        assert!(
            (0x20..0x20 + VECTORS).contains(&(low >> VTD_FRCD_IR_INDEX_SHIFT)),
            "{name}"
        );
        assert!(
            run.iommu_reports[0].faults >= 1,
            "{name}: the fault event arrived"
        );
        assert_delivered(&run, 8);
        let unit = run.iommu.expect("the unit's figures").interrupts;
        assert!(unit.blocked >= VECTORS, "{name}: {unit:?}");
    }
}

#[test]
fn virtio_traffic_interrupts_through_remapped_vectors_on_both_transports() {
    let pci = ProbeConfig::virtio_pci_address(0);
    // The virtio-mmio device's messages carry source-id 0xF100: "function" f1:00.0.
    let mmio = PciAddress::new(0xf1, 0, 0).unwrap();
    let run = crate::common::run_all_ok(&ProbeConfig {
        ops: vec![
            ops::iommu_intremap(mmio, 0x30, false),
            ops::virtio_init(TRANSPORT_MMIO, 0, RR_FLAG_MSI),
            ops::virtio_rr(32, 10), // 2
            ops::iommu_intremap(pci, 0x30, false),
            ops::virtio_init(TRANSPORT_PCI, pci.ecam_offset(), 0),
            ops::virtio_rr(32, 10), // 5
        ],
        virtio: vec![
            VirtioNetConfig::new(Transport::Mmio, NotifyPath::Datamatch),
            VirtioNetConfig::new(Transport::Pci, NotifyPath::Address),
        ],
        iommu: true,
        timeout: Duration::from_secs(120),
        ..Default::default()
    });
    for i in [2, 5] {
        let rr = run.results[i];
        assert_eq!(rr.value, 10, "op {i}: transactions");
        assert_eq!(rr.stray_irqs, 0, "op {i}: {rr:?}");
    }
    let unit = run.iommu.expect("the unit's figures").interrupts;
    assert!(
        unit.remapped >= 20,
        "a receive interrupt per transaction: {unit:?}"
    );
}

/// A virtio-mmio device's legacy line (IOAPIC pin 16, level-triggered, resampled at each EOI)
/// on a split irqchip, its redirection entry in remappable format naming entry 0x80 of a table
/// that admits only the IOAPIC's source-id FF:00.0: traffic interrupts through the IRTE. An
/// IOAPIC that did not remap would send entry 0x80's RTE to APIC 1 (its bits 63:56), which no
/// vCPU has, and the traffic would stall.
fn legacy_line_remapped() -> ProbeRun {
    let ioapic = PciAddress::new(0xff, 0, 0).unwrap();
    crate::common::run_all_ok(&ProbeConfig {
        ops: vec![
            // Entry k delivers k + 0xb0: IRQ_VECTOR_LEGACY (0x30) is entry 0x80.
            ops::iommu_intremap_level(ioapic, 0xb0),
            ops::virtio_init(TRANSPORT_MMIO, 0, 0),
            ops::virtio_rr(32, 10), // 2
        ],
        virtio: vec![VirtioNetConfig::new(Transport::Mmio, NotifyPath::Datamatch)],
        iommu: true,
        split_irqchip: true,
        timeout: Duration::from_secs(120),
        ..Default::default()
    })
}

#[test]
fn a_legacy_line_interrupts_through_a_remappable_ioapic_entry() {
    let run = legacy_line_remapped();
    let rr = run.results[2];
    assert_eq!(rr.value, 10, "transactions: {rr:?}\n{}", run.console);
    assert_eq!(rr.stray_irqs, 0, "{rr:?}");
    let unit = run.iommu.expect("the unit's figures").interrupts;
    assert!(
        unit.remapped >= 10,
        "an interrupt per transaction: {unit:?}"
    );
    assert_eq!(unit.blocked, 0, "{unit:?}");
}
