//! MSI vectors on the routing fakes and on KVM: commits per update, masking and pending
//! messages, delivery modes, invalid messages, and refused commits.

use super::*;
use crate::irq::{CommitStrategy, GsiRouting};

pub(in crate::irq::msi) fn vectors(
    strategy: CommitStrategy,
    count: usize,
) -> (MsiVectors, Arc<GsiRouting>) {
    let vm = Arc::new(kvm_ioctls::Kvm::new().unwrap().create_vm().unwrap());
    vm.create_irq_chip().unwrap();
    let routing = Arc::new(GsiRouting::new(vm, strategy).unwrap());
    let msi = MsiVectors::new(
        routing.clone(),
        count,
        DeviceLog::new("test"),
        Signaller::Vmm,
    )
    .unwrap();
    (msi, routing)
}

fn program(index: usize, data: u32) -> MsiChange {
    MsiChange::Program {
        index,
        address: MSI_ADDRESS_BASE,
        data,
    }
}

#[test]
fn one_update_is_one_commit_when_batched_and_one_per_vector_otherwise() {
    for (strategy, enable_commits) in [(CommitStrategy::Batched, 1), (CommitStrategy::PerVector, 8)]
    {
        let (msi, routing) = vectors(strategy, 8);
        let commits = || routing.stats().commits;
        let start = commits();
        let changes: Vec<MsiChange> = (0..8u32).map(|i| program(i as usize, 0x40 + i)).collect();
        msi.update(&changes);
        assert_eq!(commits(), start, "disabled: nothing is routed");
        msi.update(&[MsiChange::Enable(true)]);
        assert_eq!(commits(), start + enable_commits, "{strategy:?}");
        assert_eq!(routing.route_count(), 24 + 8);
        let before = commits();
        msi.update(&[
            MsiChange::FunctionMask(true),
            MsiChange::Mask {
                index: 3,
                masked: false,
            },
        ]);
        msi.update(&[MsiChange::FunctionMask(false)]);
        assert_eq!(commits(), before, "masks never cost a commit");
        msi.reset();
        assert_eq!(
            commits(),
            before + enable_commits,
            "reset removes every route"
        );
        assert_eq!(routing.route_count(), 24);
    }
}

#[test]
fn invalid_messages_are_never_routed_and_their_interrupts_dropped() {
    let (msi, routing) = vectors(CommitStrategy::Batched, 2);
    msi.update(&[
        program(0, 0x05), // a reserved vector
        MsiChange::Program {
            index: 1,
            address: 0x1000, // outside the interrupt window
            data: 0x41,
        },
        MsiChange::Enable(true),
        MsiChange::Mask {
            index: 0,
            masked: false,
        },
        MsiChange::Mask {
            index: 1,
            masked: false,
        },
        program(7, 0x41), // no such vector
    ]);
    assert_eq!(routing.route_count(), 24);
    msi.trigger(0);
    msi.trigger(1);
    msi.trigger(9);
    assert!(
        !msi.is_pending(0) && !msi.is_pending(1),
        "dropped, not held"
    );
    for v in &msi.gsis {
        assert_eq!(v.irqfd.read().ok(), None, "nothing was signalled");
    }
}

#[test]
fn a_message_due_while_masked_is_sent_at_unmask_after_its_new_route_is_committed() {
    let (msi, routing) = vectors(CommitStrategy::Batched, 1);
    msi.update(&[program(0, 0x40), MsiChange::Enable(true)]);
    msi.trigger(0);
    assert!(msi.is_pending(0));
    msi.update(&[
        program(0, 0x50),
        MsiChange::Mask {
            index: 0,
            masked: false,
        },
    ]);
    assert!(!msi.is_pending(0), "sent at unmask");
    assert_eq!(routing.route_count(), 25);
    assert_eq!(
        routing.stats().commits,
        3,
        "the first table, enable, the new message"
    );
}

/// Defect: NMI/INIT/SMI messages were judged by their vector field, which those delivery
/// modes ignore (Intel SDM vol. 3 §11.11.2).
#[test]
fn messages_are_judged_by_their_delivery_mode() {
    let mode = |m: u32, vector: u32| m << MSI_DATA_DELIVERY_MODE_SHIFT | vector;
    for m in [MSI_DELIVERY_NMI, MSI_DELIVERY_INIT, MSI_DELIVERY_SMI] {
        assert!(is_valid_message(MSI_ADDRESS_BASE, mode(m, 0)), "mode {m}");
    }
    for m in [MSI_DELIVERY_FIXED, MSI_DELIVERY_LOWEST] {
        assert!(
            !is_valid_message(MSI_ADDRESS_BASE, mode(m, 2)),
            "reserved vector"
        );
        assert!(is_valid_message(MSI_ADDRESS_BASE, mode(m, 0x41)));
    }
    for reserved_or_extint in [3, 6, 7] {
        assert!(!is_valid_message(
            MSI_ADDRESS_BASE,
            mode(reserved_or_extint, 0x41)
        ));
    }
}

fn faked(strategy: CommitStrategy, count: usize) -> (MsiVectors, Arc<crate::fakes::FakeRoutes>) {
    faked_for(strategy, count, Signaller::Vmm)
}

fn faked_for(
    strategy: CommitStrategy,
    count: usize,
    signaller: Signaller,
) -> (MsiVectors, Arc<crate::fakes::FakeRoutes>) {
    let routes = Arc::new(crate::fakes::FakeRoutes::with_strategy(strategy));
    let msi = MsiVectors::new(routes.clone(), count, DeviceLog::new("test"), signaller).unwrap();
    (msi, routes)
}

fn unmask(index: usize) -> MsiChange {
    MsiChange::Mask {
        index,
        masked: false,
    }
}

#[test]
fn first_use_commits_at_the_first_message_after_a_change_and_never_before() {
    let (msi, routes) = faked(CommitStrategy::FirstUse, 2);
    msi.update(&[program(0, 0x40), program(1, 0x41), unmask(0), unmask(1)]);
    msi.update(&[MsiChange::Enable(true)]);
    assert_eq!(routes.commits(), 0, "guest accesses only stage");
    msi.trigger(0);
    assert_eq!(
        routes.commits(),
        1,
        "the first message commits everything staged"
    );
    assert_eq!(
        routes.route(msi.gsis[1].gsi),
        Some((MSI_ADDRESS_BASE, 0x41))
    );
    msi.trigger(1);
    msi.trigger(0);
    assert_eq!(routes.commits(), 1, "nothing new to commit");
    assert_eq!(msi.gsis[0].irqfd.read().unwrap(), 2, "both messages sent");
    // Re-programmed between two messages: the next one goes to the new message.
    msi.update(&[program(0, 0x50)]);
    assert_eq!(routes.commits(), 1);
    msi.trigger(0);
    assert_eq!(routes.commits(), 2);
    assert_eq!(
        routes.route(msi.gsis[0].gsi),
        Some((MSI_ADDRESS_BASE, 0x50))
    );
}

#[test]
fn direct_messages_need_no_route_and_follow_masks_and_validity() {
    let (msi, routes) = faked(CommitStrategy::Direct, 2);
    assert!(msi.gsis.is_empty(), "no GSIs, no irqfds");
    assert_eq!(msi.len(), 2);
    msi.update(&[program(0, 0x40), program(1, 0x05), unmask(1)]);
    msi.update(&[MsiChange::Enable(true)]);
    msi.trigger(0);
    assert!(msi.is_pending(0), "masked: held");
    msi.trigger(1);
    assert!(
        routes.injected().is_empty(),
        "an invalid message is never injected"
    );
    msi.update(&[program(0, 0x44), unmask(0)]);
    assert_eq!(
        routes.injected(),
        vec![(MSI_ADDRESS_BASE, 0x44)],
        "sent at unmask"
    );
    msi.update(&[MsiChange::BusMaster(false)]);
    msi.trigger(0);
    assert_eq!(routes.injected().len(), 1, "no Bus Master, no message");
    msi.update(&[MsiChange::BusMaster(true)]);
    assert_eq!(routes.injected().len(), 2, "sent when it is back");
    assert_eq!(routes.commits(), 0);
}

/// A route KVM refused to take is never used: the message goes directly instead, and the
/// route is committed at a later message once KVM takes it.
#[test]
fn a_refused_commit_never_leaves_a_message_on_a_stale_route() {
    let (msi, routes) = faked(CommitStrategy::FirstUse, 1);
    msi.update(&[program(0, 0x40), unmask(0), MsiChange::Enable(true)]);
    routes.refuse_commits(true);
    msi.trigger(0);
    assert_eq!(routes.injected(), vec![(MSI_ADDRESS_BASE, 0x40)]);
    assert!(
        msi.gsis[0].irqfd.read().is_err(),
        "not through the uncommitted route"
    );
    routes.refuse_commits(false);
    msi.trigger(0);
    assert_eq!(routes.commits(), 1);
    assert_eq!(msi.gsis[0].irqfd.read().unwrap(), 1);
}

/// Counts what a [`VectorWatcher`] hears.
#[derive(Default)]
struct Heard(std::sync::atomic::AtomicUsize);

impl VectorWatcher for Heard {
    fn vectors_changed(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Heard {
    fn take(&self) -> usize {
        self.0.swap(0, std::sync::atomic::Ordering::SeqCst)
    }
}

/// The module's rule, for each vector: an irqfd handed to an outside signaller delivers the
/// vector's message through a route that is committed now.
fn assert_no_irqfd_on_an_uncommitted_route(msi: &MsiVectors, routes: &crate::fakes::FakeRoutes) {
    for i in 0..msi.len() {
        if let Some(irqfd) = msi.deliverable_irqfd(i) {
            assert_eq!(
                routes.committed_route_of(&irqfd),
                msi.message(i),
                "vector {i}: its irqfd was handed out before its route was committed"
            );
        }
    }
}

/// An outside signaller's table made live: two vectors programmed and unmasked, then enabled;
/// under first use, a message on vector 0 commits the staged routes.
fn live(strategy: CommitStrategy) -> (MsiVectors, Arc<crate::fakes::FakeRoutes>, Arc<Heard>) {
    let (msi, routes) = faked_for(strategy, 2, Signaller::Outside);
    let heard = Arc::new(Heard::default());
    let weak: std::sync::Weak<Heard> = Arc::downgrade(&heard);
    msi.set_watcher(weak);
    msi.update(&[program(0, 0x40), program(1, 0x41), unmask(0), unmask(1)]);
    assert_eq!(heard.take(), 0, "disabled: nothing deliverable yet");
    msi.update(&[MsiChange::Enable(true)]);
    assert_no_irqfd_on_an_uncommitted_route(&msi, &routes);
    if strategy == CommitStrategy::FirstUse {
        assert!(msi.deliverable_irqfd(0).is_none(), "staged, not committed");
        assert_eq!(heard.take(), 0);
        msi.trigger(0);
        assert_eq!(
            routes.take_delivered(),
            vec![Some((MSI_ADDRESS_BASE, 0x40))]
        );
    }
    assert_eq!(
        heard.take(),
        1,
        "{strategy:?}: the vectors became deliverable"
    );
    (msi, routes, heard)
}

/// Vector 0's message `data` reached the guest once, and its irqfd may be signalled again
/// (through a committed route), which the watcher heard once.
fn assert_sent_and_deliverable_again(
    msi: &MsiVectors,
    routes: &crate::fakes::FakeRoutes,
    heard: &Heard,
    data: u32,
    what: &str,
) {
    assert_eq!(
        routes.take_delivered(),
        vec![Some((MSI_ADDRESS_BASE, data))],
        "{what}"
    );
    assert!(msi.deliverable_irqfd(0).is_some(), "{what}");
    assert_no_irqfd_on_an_uncommitted_route(msi, routes);
    assert_eq!(heard.take(), 1, "{what}: the irqfd is back");
}

#[test]
fn an_outside_signaller_gets_routes_under_every_strategy_and_never_an_uncommitted_one() {
    for strategy in CommitStrategy::ALL {
        let (msi, routes, heard) = live(strategy);
        assert_eq!(msi.gsis.len(), 2, "{strategy:?}: direct too has GSIs");
        for i in 0..2 {
            let irqfd = msi.deliverable_irqfd(i).expect("deliverable");
            assert!(Arc::ptr_eq(&irqfd, &msi.gsis[i].irqfd));
        }
        // A new message: its route is staged until committed, and no irqfd is handed out
        // meanwhile (KVM refusing the commit keeps it staged under every strategy).
        routes.refuse_commits(true);
        msi.update(&[program(0, 0x50)]);
        assert!(msi.deliverable_irqfd(0).is_none(), "{strategy:?}");
        assert!(
            msi.deliverable_irqfd(1).is_some(),
            "{strategy:?}: untouched"
        );
        assert_no_irqfd_on_an_uncommitted_route(&msi, &routes);
        assert_eq!(heard.take(), 1, "{strategy:?}");
        routes.refuse_commits(false);
        // The outside signaller signals exitless meanwhile: that message commits (first use)
        // or, where KVM refused a commit made at the guest's access, commits it now.
        msi.trigger(0);
        assert_sent_and_deliverable_again(&msi, &routes, &heard, 0x50, &format!("{strategy:?}"));
    }
}

#[test]
fn masks_enable_and_bus_master_take_the_irqfd_away_and_the_watcher_hears() {
    let off_and_on = [
        (
            MsiChange::Mask {
                index: 0,
                masked: true,
            },
            unmask(0),
        ),
        (
            MsiChange::FunctionMask(true),
            MsiChange::FunctionMask(false),
        ),
        (MsiChange::Enable(false), MsiChange::Enable(true)),
        (MsiChange::BusMaster(false), MsiChange::BusMaster(true)),
    ];
    for strategy in CommitStrategy::ALL {
        for (off, on) in off_and_on {
            let (msi, routes, heard) = live(strategy);
            msi.update(&[off]);
            assert!(msi.deliverable_irqfd(0).is_none(), "{strategy:?} {off:?}");
            assert_eq!(heard.take(), 1, "{strategy:?} {off:?}");
            msi.update(&[off]);
            assert_eq!(heard.take(), 0, "{strategy:?} {off:?}: nothing changed");
            // Signalled meanwhile (through exitless): held pending, sent when it is back.
            msi.trigger(0);
            assert!(msi.is_pending(0), "{strategy:?} {off:?}");
            msi.update(&[on]);
            assert!(!msi.is_pending(0), "{strategy:?} {on:?}");
            let what = format!("{strategy:?} {on:?}");
            assert_sent_and_deliverable_again(&msi, &routes, &heard, 0x40, &what);
            msi.reset();
            assert!((0..2).all(|i| msi.deliverable_irqfd(i).is_none()));
            assert_eq!(heard.take(), 1, "{strategy:?}: reset");
        }
    }
}

#[test]
fn the_vmm_signaller_under_direct_has_no_irqfd_to_hand_out() {
    let (msi, routes) = faked(CommitStrategy::Direct, 1);
    msi.update(&[program(0, 0x40), unmask(0), MsiChange::Enable(true)]);
    assert!(msi.deliverable_irqfd(0).is_none());
    assert!(msi.deliverable_irqfd(7).is_none(), "no such vector");
    assert_eq!(routes.commits(), 0, "nothing routed");
}
