//! A virtio-mmio transport with the MSI extension saved and restored into a fresh one: the
//! registers the driver reads, the per-queue doorbells registered again, a pending message on
//! a masked vector that fires once at unmask, and a corrupted MsiControl refused.

use std::sync::Arc;

use super::super::tests::{negotiate, program_vector, read, write};
use super::*;
use crate::fakes::{FakeIoEvents, FakeRoutes};
use crate::irq::CommitStrategy;
use crate::virtio::notify::NotifyPath;
use crate::virtio::regs::*;
use crate::virtio::transport::mmio::{MmioPlacement, doorbell_offset};
use crate::virtio::worker::Worker;

const BASE: u64 = 0xd000_0000;

fn transport() -> (MmioTransport, Worker, Arc<FakeRoutes>, Arc<FakeIoEvents>) {
    let mut p = crate::virtio::test_parts();
    let routes = Arc::new(FakeRoutes::with_strategy(CommitStrategy::Batched));
    p.env.routes = routes.clone();
    let at = MmioPlacement {
        base: BASE,
        gsi: 16,
        notify: NotifyPath::Address,
    };
    let (t, w) = MmioTransport::new(p.env, p.net, at).unwrap();
    (t, w, routes, p.ioevents)
}

/// What the driver reads: the queue registers of both queues and every vector's state.
fn view(t: &MmioTransport) -> Vec<u32> {
    let mut v = Vec::new();
    for q in 0..2 {
        write(t, VIRTIO_MMIO_QUEUE_SEL, q);
        for reg in [
            VIRTIO_MMIO_STATUS,
            VIRTIO_MMIO_QUEUE_READY,
            VIRTIO_MMIO_QUEUE_MSI_VEC,
            VIRTIO_MMIO_CONFIG_MSI_VEC,
            VIRTIO_MMIO_MSI_CONTROL,
            VIRTIO_MMIO_QUEUE_NOTIFY_OFF,
            VIRTIO_MMIO_INTERRUPT_STATUS,
        ] {
            v.push(read(t, reg));
        }
    }
    for vector in 0..3 {
        write(t, VIRTIO_MMIO_MSI_SEL, vector);
        v.push(read(t, VIRTIO_MMIO_MSI_STATE));
    }
    v
}

/// A transport with both extension features, vectors 0..2 programmed, vector 1 masked with a
/// message pending, MSI enabled: its state and what the driver reads.
fn saved() -> (serde_json::Value, Vec<u32>) {
    let (t, _w, _routes, _io) = transport();
    negotiate(&t, 1 << VIRTIO_F_MMIO_MSI | 1 << VIRTIO_F_MMIO_NOTIFY);
    for vector in 0..3 {
        program_vector(&t, vector, 0x40 + vector);
        let command = if vector == 1 {
            VIRTIO_MMIO_MSI_CMD_MASK
        } else {
            VIRTIO_MMIO_MSI_CMD_UNMASK
        };
        write(&t, VIRTIO_MMIO_MSI_COMMAND, command);
    }
    write(&t, VIRTIO_MMIO_QUEUE_SEL, 1);
    write(&t, VIRTIO_MMIO_QUEUE_MSI_VEC, 1);
    write(&t, VIRTIO_MMIO_MSI_CONTROL, VIRTIO_MMIO_MSI_CTRL_ENABLE);
    t.msi().trigger(1);
    Persist::pause(&t).unwrap();
    let state = Persist::save(&t).unwrap();
    (state, view(&t))
}

#[test]
fn a_restored_transport_reads_the_same_and_keeps_its_doorbells_and_pending_vector() {
    let (state, before) = saved();
    let (t, _w, routes, ioevents) = transport();
    Persist::restore(&t, state).unwrap();
    Persist::resume(&t);
    assert_eq!(view(&t), before, "what the driver reads");
    let doorbells: Vec<u64> = ioevents.registered().iter().map(|d| d.address).collect();
    assert_eq!(
        doorbells,
        [0, 1].map(|q| BASE + u64::from(doorbell_offset(q))),
        "the extension's doorbells"
    );
    assert_eq!(routes.commits(), 1, "the live vectors routed in one commit");
    assert!(routes.take_delivered().is_empty(), "held while masked");
    write(&t, VIRTIO_MMIO_MSI_SEL, 1);
    write(&t, VIRTIO_MMIO_MSI_COMMAND, VIRTIO_MMIO_MSI_CMD_UNMASK);
    assert_eq!(
        routes.take_delivered(),
        vec![Some((0xfee0_0000, 0x41))],
        "once, at unmask"
    );
}

#[test]
fn a_corrupted_msi_control_or_vector_is_refused() {
    let (state, _) = saved();
    let (t, _w, _routes, _io) = transport();
    let mut bad = state.clone();
    bad["msi_control"] = 6.into();
    assert_eq!(
        Persist::restore(&t, bad).unwrap_err().what,
        "test.msi_control"
    );
    let mut bad = state;
    bad["common"]["interrupts"]["config_vector"] = 9.into();
    assert_eq!(
        Persist::restore(&t, bad).unwrap_err().what,
        "test.interrupts.config_vector"
    );
}

/// A snapshot taken while a reset waits for the device thread holds the reset device: the
/// reset is in it, and the restored device completes it (the driver reads the status until it
/// is 0); the paused one completes it at the driver's next read, as without a snapshot.
#[test]
fn a_snapshot_during_a_late_reset_holds_the_reset_device() {
    let (t, _w, _routes, (_calls, entered, release)) = super::super::tests::live_recording(true);
    let release = release.unwrap();
    entered.recv().unwrap();
    release.send(()).unwrap();
    write(&t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    entered.recv().unwrap(); // the device thread is inside its work
    write(&t, VIRTIO_MMIO_STATUS, 0); // returns after the acknowledgement timeout
    assert_ne!(read(&t, VIRTIO_MMIO_STATUS), 0, "not reset yet");
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        release.send(()).unwrap();
    });
    Persist::pause(&t).unwrap();
    releaser.join().unwrap();
    let state = Persist::save(&t).unwrap();
    assert_eq!(state["common"]["registers"]["reset_pending"], true);
    assert!(
        state["common"]["positions"].is_null(),
        "the device thread let go"
    );
    let (fresh, _w2, _routes2, _io2) = transport();
    Persist::restore(&fresh, state).unwrap();
    Persist::resume(&fresh);
    assert_eq!(read(&fresh, VIRTIO_MMIO_STATUS), 0, "reset when restored");
    Persist::resume(&t);
    assert_eq!(read(&t, VIRTIO_MMIO_STATUS), 0, "reset at the next read");
}
