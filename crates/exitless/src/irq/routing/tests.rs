use super::*;

fn routing(strategy: CommitStrategy) -> GsiRouting {
    let vm = Arc::new(kvm_ioctls::Kvm::new().unwrap().create_vm().unwrap());
    vm.create_irq_chip().unwrap();
    GsiRouting::new(vm, strategy).unwrap()
}

#[test]
fn per_vector_commits_every_change_and_batched_waits() {
    for (strategy, after_three) in [(CommitStrategy::PerVector, 4), (CommitStrategy::Batched, 1)] {
        let r = routing(strategy);
        assert_eq!(r.stats().commits, 1, "the initial table");
        for i in 0..3 {
            let g = r.allocate_msi().unwrap();
            r.set_msi(g.gsi, 0xfee0_0000, 0x40 + i).unwrap();
        }
        assert_eq!(r.stats().commits, after_three, "{strategy:?}");
        r.commit().unwrap();
        r.commit().unwrap(); // nothing staged: no call
        assert_eq!(r.stats().commits, after_three.max(2), "{strategy:?}");
        assert_eq!(r.route_count(), 24 + 3);
    }
}

#[test]
fn routes_set_together_commit_as_each_strategy_says() {
    for (strategy, commits) in [
        (CommitStrategy::PerVector, 1 + 3 + 1),
        (CommitStrategy::Batched, 1),
        (CommitStrategy::FirstUse, 1),
    ] {
        let r = routing(strategy);
        let g: Vec<_> = (0..3).map(|_| r.allocate_msi().unwrap()).collect();
        let set: Vec<_> = (0x40..)
            .zip(&g)
            .map(|(data, g)| (g.gsi, Some((0xfee0_0000, data))))
            .collect();
        r.set_msis(&set).unwrap();
        assert_eq!(r.route_count(), 24 + 3, "{strategy:?}: all three staged");
        r.set_msis(&[(g[1].gsi, None)]).unwrap();
        assert_eq!(r.stats().commits, commits, "{strategy:?}");
        assert_eq!(r.route_count(), 24 + 2, "{strategy:?}: one removed");
        r.commit().unwrap();
        let bound = r.table.lock().unwrap().bound.clone();
        assert_eq!(
            bound.into_iter().collect::<Vec<_>>(),
            vec![g[0].gsi, g[2].gsi],
            "{strategy:?}: the committed routes' irqfds are bound"
        );
    }
}

#[test]
fn the_commit_log_names_the_msi_gsis_each_commit_added_once_asked_for() {
    let r = routing(CommitStrategy::Batched);
    let a = r.allocate_msi().unwrap();
    r.set_msi(a.gsi, 0xfee0_0000, 0x41).unwrap();
    r.commit().unwrap();
    assert!(r.commit_log().is_empty(), "not kept before it is asked for");
    r.keep_commit_log();
    let (b, c) = (r.allocate_msi().unwrap(), r.allocate_msi().unwrap());
    r.set_msi(b.gsi, 0xfee0_0000, 0x42).unwrap();
    r.set_msi(c.gsi, 0xfee0_0000, 0x43).unwrap();
    r.commit().unwrap();
    // A new message on a routed GSI adds none.
    r.set_msi(a.gsi, 0xfee0_0000, 0x44).unwrap();
    r.commit().unwrap();
    let log = r.commit_log();
    let added: Vec<&[u32]> = log.iter().map(|c| c.added.as_slice()).collect();
    assert_eq!(added, [&[b.gsi, c.gsi][..], &[]]);
    assert!(log[0].at <= log[1].at);
}

#[test]
fn released_gsis_are_reused_and_their_routes_removed() {
    let r = routing(CommitStrategy::Batched);
    let a = r.allocate_msi().unwrap();
    r.set_msi(a.gsi, 0xfee0_0000, 0x41).unwrap();
    r.commit().unwrap();
    r.release(a.gsi).unwrap();
    r.commit().unwrap();
    assert_eq!(r.route_count(), 24);
    assert_eq!(r.allocate_msi().unwrap().gsi, a.gsi);
}

#[test]
fn the_table_never_outgrows_kvm() {
    let r = routing(CommitStrategy::Batched);
    let gsis: Vec<MsiGsi> = (0..MAX_MSI_ROUTES)
        .map(|_| r.allocate_msi().unwrap())
        .collect();
    assert!(matches!(
        r.allocate_msi(),
        Err(IrqError::GsisExhausted(MAX_MSI_ROUTES))
    ));
    for g in &gsis {
        r.set_msi(g.gsi, 0xfee0_0000, 0x40).unwrap();
    }
    r.commit().expect("a full table is one KVM accepts");
    assert_eq!(r.route_count(), MAX_ROUTES as usize - PIC_PINS as usize);
}

#[test]
fn a_restore_commits_what_the_tables_committed_once_at_its_end() {
    let r = routing(CommitStrategy::Batched);
    let before = r.stats().commits;
    let g: Vec<_> = (0..3).map(|_| r.allocate_msi().unwrap()).collect();
    r.commit_once(|| {
        for (data, g) in (0x40..).zip(&g) {
            r.set_msis(&[(g.gsi, Some((0xfee0_0000, data)))]).unwrap();
            r.commit().unwrap();
        }
        assert_eq!(r.stats().commits, before, "each table's commit held");
        assert!(
            r.table.lock().unwrap().bound.is_empty(),
            "no irqfd bound yet"
        );
    })
    .unwrap();
    assert_eq!(
        r.stats().commits,
        before + 1,
        "one commit for the three tables"
    );
    let bound: Vec<u32> = r.table.lock().unwrap().bound.iter().copied().collect();
    assert_eq!(bound, g.iter().map(|g| g.gsi).collect::<Vec<_>>());

    // An irqfd already bound: not held (a table that commits must then reach KVM at once).
    r.commit_once(|| {
        r.set_msi(g[0].gsi, 0xfee0_0000, 0x50).unwrap();
        r.commit().unwrap();
        assert_eq!(r.stats().commits, before + 2, "committed at once");
    })
    .unwrap();
    assert_eq!(r.stats().commits, before + 2);
}

#[test]
fn a_restore_commits_nothing_no_table_committed() {
    // First use stages at restore and commits at each vector's first message.
    let r = routing(CommitStrategy::FirstUse);
    let before = r.stats().commits;
    let g = r.allocate_msi().unwrap();
    r.commit_once(|| r.set_msis(&[(g.gsi, Some((0xfee0_0000, 0x40)))]))
        .unwrap()
        .unwrap();
    assert_eq!(r.stats().commits, before);
    assert!(
        r.table.lock().unwrap().staged,
        "still staged for the first message"
    );
}
