//! Interrupt remapping (VT-d §5.1) in a machine: the probe's VT-d driver turns it on with a
//! table whose entries deliver on other vectors than the messages' data say, programs a
//! virtio-pci function's MSI-X entries in remappable format, and every vector the VMM sends
//! arrives exactly once where its entry says, under every commit strategy; entries rewritten
//! and invalidated take effect, with one routing commit for all the routes they change (but
//! under the per-vector baseline).

mod common;

use exitless::contract::*;
use exitless::irq::CommitStrategy;
use exitless::machine::{ProbeConfig, ProbeRun, ops};
use exitless::pci::regs::PCI_MSIX_FLAGS_ENABLE;

/// Four queue pairs: eight queue vectors and the configuration vector.
const PAIRS: u16 = 4;
const VECTORS: u64 = 2 * PAIRS as u64 + 1;

fn boot(strategy: CommitStrategy, ops: Vec<Op>) -> ProbeRun {
    common::run_msix(strategy, PAIRS, true, ops)
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
        let run = boot(
            strategy,
            vec![
                // 0: entry k delivers on k + 0x40
                ops::iommu_intremap(d, 0x40),
                // 1: entry i of the table names interrupt index 0x20 + i (its subhandle)
                ops::msix_program(d, 0x20, MSI_REMAPPABLE_SHV, true),
                ops::msix_control(d, PCI_MSIX_FLAGS_ENABLE), // 2
                ops::msix_check(d, true),                    // 3: on 0x60 + i
                // 4: every entry rewritten to k + 0x80, then a global invalidation
                ops::iommu_intremap(d, 0x80),
                ops::msix_check(d, true), // 5: on 0xa0 + i
            ],
        );
        let name = strategy.name();
        for (i, r) in run.results.iter().enumerate() {
            assert_eq!(r.status, STATUS_OK, "{name} op {i}: {r:?}\n{}", run.console);
        }
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
