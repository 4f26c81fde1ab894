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
