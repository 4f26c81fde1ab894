//! A vhost-user function in a snapshot: pausing stops every ring with GET_VRING_BASE and keeps
//! the bases as the queue positions; resuming restarts the rings at them; a function restored
//! in a fresh machine hands its new backend the saved bases at resume.

use super::*;

/// A running function whose backend stopped its rings at 5: paused and saved.
fn paused(r: &mut Rig) -> serde_json::Value {
    r.start_driver();
    r.record.lock().unwrap().base = 5;
    PciFunction::pause(&mut r.f).unwrap();
    for q in 0..2 {
        assert!(
            r.log().contains(&format!("GET_VRING_BASE {q}")),
            "ring {q} stopped"
        );
    }
    PciFunction::save(&r.f).unwrap().unwrap()
}

#[test]
fn a_pause_keeps_the_rings_bases_and_a_resume_restarts_them_there() {
    let mut r = rig(CommitStrategy::Batched, Quirks::default());
    let state = paused(&mut r);
    let positions = &state["common"]["positions"];
    assert_eq!(positions[1]["next_avail"], 5, "{positions}");
    assert_eq!(positions[1]["next_used"], 5, "{positions}");
    assert!(!r.log().contains(&"SET_VRING_BASE 0 5".to_owned()));
    PciFunction::resume(&mut r.f);
    r.wait_for("SET_VRING_BASE 0 5");
    r.wait_for("SET_VRING_BASE 1 5");
}

#[test]
fn a_restored_function_gives_its_new_backend_the_saved_bases() {
    let mut old = rig(CommitStrategy::Batched, Quirks::default());
    let state = paused(&mut old);
    let config = old.c.save();
    let mut r = rig(CommitStrategy::Batched, Quirks::default());
    r.c.restore("pci.00:03.0", &config).unwrap();
    PciFunction::restore(&mut r.f, "pci.00:03.0", &r.c, Some(state)).unwrap();
    assert!(
        !r.log().iter().any(|l| l.starts_with("SET_VRING_BASE")),
        "nothing runs before resume"
    );
    PciFunction::resume(&mut r.f);
    r.wait_for("SET_VRING_BASE 0 5");
    r.wait_for("SET_VRING_BASE 1 5");
    r.wait_for("SET_VRING_ENABLE 1 true");
    assert_eq!(
        r.record.lock().unwrap().addrs.len(),
        2,
        "both rings' addresses"
    );
}

/// A card with two pairs, both active: its control queue's position and the active pair
/// count are in the snapshot, and a restored card starts both pairs' rings at their bases and
/// takes the driver's next command at the next index.
#[test]
fn a_multiqueue_cards_active_pairs_and_control_queue_survive_a_restore() {
    use super::multiqueue::two_pairs;
    use virtio_bindings::virtio_net::VIRTIO_NET_OK;
    use vm_memory::Bytes;

    let mut old = two_pairs(Quirks::default());
    old.start_driver();
    assert_eq!(old.pairs_set(0, 2), VIRTIO_NET_OK as u8);
    old.record.lock().unwrap().base = 5;
    PciFunction::pause(&mut old.f).unwrap();
    let state = PciFunction::save(&old.f).unwrap().unwrap();
    let positions = &state["common"]["positions"];
    assert_eq!(positions.as_array().unwrap().len(), 5, "{positions}");
    assert_eq!(
        positions[4]["next_used"], 1,
        "the control queue's: {positions}"
    );
    assert_eq!(state["common"]["handler"]["active"], 2);

    let mut r = two_pairs(Quirks::default());
    let mut ram = vec![0u8; 1 << 20];
    old.mem.read_slice(&mut ram, GuestAddress(0)).unwrap();
    r.mem.write_slice(&ram, GuestAddress(0)).unwrap();
    r.c.restore("pci.00:03.0", &old.c.save()).unwrap();
    PciFunction::restore(&mut r.f, "pci.00:03.0", &r.c, Some(state)).unwrap();
    PciFunction::resume(&mut r.f);
    for q in 0..4 {
        r.wait_for(&format!("SET_VRING_BASE {q} 5"));
    }
    r.wait_for("SET_VRING_ENABLE 3 true");
    assert_eq!(r.pairs_set(1, 1), VIRTIO_NET_OK as u8, "the next command");
    assert_eq!(
        r.told_of("SET_VRING_ENABLE 3"),
        ["SET_VRING_ENABLE 3 true", "SET_VRING_ENABLE 3 false"]
    );
}

/// A card whose backend hung up is snapshotted broken, without rings; restored, it is still
/// broken (DEVICE_NEEDS_RESET), and the driver's reset brings it back on the new backend.
#[test]
fn a_card_whose_backend_hung_up_is_restored_broken_and_recovers_at_reset() {
    let mut old = rig(CommitStrategy::Batched, Quirks::default());
    old.start_driver();
    let stream = old.record.lock().unwrap().stream.take().unwrap();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    eventually("DEVICE_NEEDS_RESET", || {
        old.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
    PciFunction::pause(&mut old.f).unwrap();
    let state = PciFunction::save(&old.f).unwrap().unwrap();
    assert!(state["common"]["positions"].is_null(), "no rings");
    let mut r = rig(CommitStrategy::Batched, Quirks::default());
    r.c.restore("pci.00:03.0", &old.c.save()).unwrap();
    PciFunction::restore(&mut r.f, "pci.00:03.0", &r.c, Some(state)).unwrap();
    PciFunction::resume(&mut r.f);
    assert_ne!(
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET,
        0,
        "still broken"
    );
    r.write(VIRTIO_PCI_COMMON_STATUS, 1, 0);
    assert_eq!(r.status(), 0);
    r.start_driver();
    assert_eq!(
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET,
        0,
        "working again"
    );
}
