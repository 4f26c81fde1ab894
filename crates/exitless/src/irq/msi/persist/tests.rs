//! Restoring a vector table on KVM's routing: the commits each strategy makes, masked vectors
//! that keep their pending bits, and a saved table of the wrong size.

use super::*;
use crate::irq::CommitStrategy;
use crate::irq::msi::tests::vectors;
use crate::irq::regs::MSI_ADDRESS_BASE;

/// A table of 8 vectors enabled, each with its own valid message and unmasked, but vector 5
/// masked with a message pending.
fn saved_table() -> Vec<VectorState> {
    let (msi, _routing) = vectors(CommitStrategy::Batched, 8);
    let mut changes = vec![MsiChange::Enable(true)];
    for index in 0..8u32 {
        changes.push(MsiChange::Program {
            index: index as usize,
            address: MSI_ADDRESS_BASE,
            data: 0x40 + index,
        });
        changes.push(MsiChange::Mask {
            index: index as usize,
            masked: index == 5,
        });
    }
    msi.update(&changes);
    msi.trigger(5);
    msi.save()
}

const LIVE: [MsiChange; 3] = [
    MsiChange::BusMaster(true),
    MsiChange::FunctionMask(false),
    MsiChange::Enable(true),
];

#[test]
fn restore_commits_the_live_routes_as_the_strategy_says() {
    let saved = saved_table();
    for (strategy, commits, routes) in [
        (CommitStrategy::PerVector, 8, 8),
        (CommitStrategy::Batched, 1, 8),
        // Staged, not committed.
        (CommitStrategy::FirstUse, 0, 8),
        (CommitStrategy::Direct, 0, 0),
    ] {
        let (msi, routing) = vectors(strategy, 8);
        let (before, pins) = (routing.stats().commits, routing.route_count());
        msi.restore("t", &saved, LIVE).unwrap();
        assert_eq!(routing.stats().commits - before, commits, "{strategy:?}");
        assert_eq!(
            routing.route_count() - pins,
            routes,
            "{strategy:?}: routes in the table"
        );
        assert_eq!(msi.message(3), Some((MSI_ADDRESS_BASE, 0x43)));
        assert!(
            msi.is_masked(5) && msi.is_pending(5),
            "{strategy:?}: still held"
        );
        assert!(!msi.is_masked(4) && !msi.is_pending(4));
        if strategy == CommitStrategy::FirstUse {
            let before = routing.stats().commits;
            msi.trigger(2);
            assert_eq!(
                routing.stats().commits - before,
                1,
                "committed at first use"
            );
        }
        msi.update(&[MsiChange::Mask {
            index: 5,
            masked: false,
        }]);
        assert!(!msi.is_pending(5), "{strategy:?}: sent at unmask");
        assert_eq!(
            msi.save()[5],
            VectorState {
                pending: false,
                masked: false,
                ..saved[5]
            }
        );
    }
}

#[test]
fn a_table_of_another_size_is_refused() {
    let saved = saved_table();
    let (msi, routing) = vectors(CommitStrategy::Batched, 4);
    let before = routing.stats().commits;
    let err = msi
        .restore("virtio-pci.00:03.0.msix.vectors", &saved, LIVE)
        .unwrap_err();
    assert_eq!(err.what, "virtio-pci.00:03.0.msix.vectors");
    assert!(err.why.contains("8 vectors"), "{err}");
    assert_eq!(routing.stats().commits, before, "nothing changed");
    assert!(msi.is_masked(0));
}
