//! A vhost-user card with two queue pairs: MQ and the control queue offered, the control queue
//! served by exitless (never handed to the backend), VQ_PAIRS_SET turned into the backend's
//! ring enables, a bad count answered VIRTIO_NET_ERR, and the pairs' state across a reset and
//! a Bus Master clear.

use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, VIRTIO_NET_ERR, VIRTIO_NET_F_CTRL_VQ,
    VIRTIO_NET_F_MQ, VIRTIO_NET_OK,
};
use vm_memory::{Bytes, GuestAddress};

use super::*;

/// The driver's features in bits 0-31 of a multiqueue card: MQ and the control queue.
pub(super) const MQ_FEATURES: u32 = 1 << VIRTIO_NET_F_MQ | 1 << VIRTIO_NET_F_CTRL_VQ;
/// The control queue of two pairs.
const CONTROL: u32 = 4;
/// Where the control commands go (one 0x100 apart each), their ack byte 0x80 further.
const COMMANDS: u64 = 0x80000;

pub(super) fn two_pairs(quirks: Quirks) -> Rig {
    rig_of(
        CommitStrategy::PerVector,
        quirks,
        VhostUserSpec {
            queues: 2,
            ..spec(PathBuf::new(), NET)
        },
    )
}

impl Rig {
    /// The driver's control rings start empty again after a reset (the commands it made
    /// available before are gone).
    fn empty_control_rings(&self) {
        let [desc, ..] = rings(u64::from(CONTROL));
        self.mem
            .write_slice(&[0; 0x3000], GuestAddress(desc))
            .unwrap();
    }

    /// Lines of the backend's log that start with `prefix`.
    pub(super) fn told_of(&self, prefix: &str) -> Vec<String> {
        self.log()
            .into_iter()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }

    /// The driver's `n`th control command (from 0): VQ_PAIRS_SET `pairs`, its doorbell rung.
    /// Returns its ack once the device used it.
    pub(super) fn pairs_set(&mut self, n: u16, pairs: u16) -> u8 {
        let command = COMMANDS + 0x100 * u64::from(n);
        let [desc, avail, used] = rings(u64::from(CONTROL));
        let mut bytes = vec![
            VIRTIO_NET_CTRL_MQ as u8,
            VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8,
        ];
        bytes.extend_from_slice(&pairs.to_le_bytes());
        let m = &self.mem;
        m.write_slice(&bytes, GuestAddress(command)).unwrap();
        m.write_obj(0xffu8, GuestAddress(command + 0x80)).unwrap();
        // Descriptors 2n (the command, readable) and 2n+1 (the ack, writable): virtio 1.2 §2.7.5.
        let head = 2 * n;
        for (i, (addr, len, flags, next)) in
            [(command, 4u32, 1u16, head + 1), (command + 0x80, 1, 2, 0)]
                .into_iter()
                .enumerate()
        {
            let at = desc + 16 * (u64::from(head) + i as u64);
            m.write_obj(addr, GuestAddress(at)).unwrap();
            m.write_obj(len, GuestAddress(at + 8)).unwrap();
            m.write_obj(flags, GuestAddress(at + 12)).unwrap();
            m.write_obj(next, GuestAddress(at + 14)).unwrap();
        }
        m.write_obj(head, GuestAddress(avail + 4 + 2 * u64::from(n)))
            .unwrap();
        m.write_obj(n + 1, GuestAddress(avail + 2)).unwrap();
        self.write(
            VIRTIO_PCI_BAR_NOTIFY + CONTROL * VIRTIO_PCI_NOTIFY_MULTIPLIER,
            2,
            CONTROL,
        );
        eventually("the command used", || {
            self.mem.read_obj::<u16>(GuestAddress(used + 2)).unwrap() == n + 1
        });
        self.mem.read_obj(GuestAddress(command + 0x80)).unwrap()
    }
}

#[test]
fn two_pairs_offer_mq_and_a_control_queue_the_backend_never_sees() {
    let mut r = two_pairs(Quirks::default());
    r.write(VIRTIO_PCI_COMMON_DFSELECT, 4, 0);
    let offered = r.read(VIRTIO_PCI_COMMON_DF, 4);
    assert_eq!(offered & MQ_FEATURES, MQ_FEATURES);
    assert_eq!(
        r.read(VIRTIO_PCI_COMMON_NUMQ, 2),
        5,
        "two pairs and the control queue"
    );
    assert_eq!(
        r.read(VIRTIO_PCI_BAR_DEVICE + 8, 2),
        2,
        "max_virtqueue_pairs"
    );
    r.start_driver();
    let rec = r.record.lock().unwrap();
    // MQ goes to the backend that offers it; the control queue is exitless's.
    assert_ne!(rec.features & 1 << VIRTIO_NET_F_MQ, 0);
    assert_eq!(rec.features & 1 << VIRTIO_NET_F_CTRL_VQ, 0);
    drop(rec);
    assert_eq!(r.told_of("SET_VRING_KICK").len(), 4, "{:#?}", r.log());
    assert!(r.told_of("SET_VRING_NUM 4").is_empty(), "{:#?}", r.log());
    // Only the first pair runs until the driver says otherwise (virtio 1.2 §5.1.6.5.5).
    assert_eq!(
        r.told_of("SET_VRING_ENABLE"),
        ["SET_VRING_ENABLE 0 true", "SET_VRING_ENABLE 1 true"]
    );
}

#[test]
fn vq_pairs_set_enables_and_disables_the_second_pairs_rings_and_interrupts_on_its_vector() {
    let mut r = two_pairs(Quirks::default());
    r.start_driver();
    let _ = r.routes.take_delivered();
    assert_eq!(r.pairs_set(0, 2), VIRTIO_NET_OK as u8);
    // Acknowledged by the backend before the command was used.
    assert_eq!(
        r.told_of("SET_VRING_ENABLE")[2..],
        ["SET_VRING_ENABLE 2 true", "SET_VRING_ENABLE 3 true"]
    );
    eventually("the control queue's interrupt", || {
        r.routes
            .take_delivered()
            .contains(&Some((0xfee0_0000, 0x40 + CONTROL)))
    });
    assert_eq!(r.pairs_set(1, 1), VIRTIO_NET_OK as u8);
    assert_eq!(
        r.told_of("SET_VRING_ENABLE")[4..],
        ["SET_VRING_ENABLE 2 false", "SET_VRING_ENABLE 3 false"]
    );
}

#[test]
fn a_count_outside_one_to_the_pairs_gets_err_and_changes_nothing() {
    let mut r = two_pairs(Quirks::default());
    r.start_driver();
    for (n, pairs) in [0u16, 3, 0x8000].into_iter().enumerate() {
        assert_eq!(
            r.pairs_set(n as u16, pairs),
            VIRTIO_NET_ERR as u8,
            "{pairs}"
        );
    }
    assert_eq!(r.told_of("SET_VRING_ENABLE").len(), 2, "{:#?}", r.log());
    assert_eq!(r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET, 0);
}

/// A backend that refuses to enable the second pair: the command is answered VIRTIO_NET_ERR
/// and the device needs a reset, as after any message the backend refuses.
#[test]
fn a_backend_that_refuses_the_second_pairs_enable_fails_the_command_and_the_device() {
    let mut r = two_pairs(Quirks {
        refuse_pair_2: true,
        ..Quirks::default()
    });
    r.start_driver();
    let _ = r.routes.take_delivered();
    assert_eq!(r.pairs_set(0, 2), VIRTIO_NET_ERR as u8);
    eventually("DEVICE_NEEDS_RESET", || {
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
}

/// After a Bus Master clear the rings start again with both pairs enabled; after a reset only
/// the first is.
#[test]
fn the_active_pairs_survive_a_bus_master_clear_and_not_a_reset() {
    let mut r = two_pairs(Quirks::default());
    r.start_driver();
    assert_eq!(r.pairs_set(0, 2), VIRTIO_NET_OK as u8);
    r.c.set_u16(PCI_COMMAND, PCI_COMMAND_MEMORY);
    r.f.config_written(&r.c, PCI_COMMAND, 2);
    for q in 0..4 {
        r.wait_for(&format!("GET_VRING_BASE {q}"));
    }
    r.c.set_u16(PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    r.f.config_written(&r.c, PCI_COMMAND, 2);
    r.wait_n("SET_VRING_ENABLE 3 true", 2);
    r.write(VIRTIO_PCI_COMMON_STATUS, 1, 0);
    r.empty_control_rings();
    r.start_driver();
    r.wait_n("SET_VRING_ENABLE 1 true", 3);
    assert_eq!(
        r.told_of("SET_VRING_ENABLE 2 true").len(),
        2,
        "not enabled again after the reset: {:#?}",
        r.log()
    );
}

/// A hangup: DEVICE_NEEDS_RESET; the driver's reset connects again, only the first pair runs,
/// and the control queue serves the new backend.
#[test]
fn after_a_hangup_and_the_drivers_reset_the_control_queue_drives_the_new_connection() {
    let mut r = two_pairs(Quirks::default());
    r.start_driver();
    assert_eq!(r.pairs_set(0, 2), VIRTIO_NET_OK as u8);
    let stream = r.record.lock().unwrap().stream.take().unwrap();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    eventually("DEVICE_NEEDS_RESET", || {
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
    r.write(VIRTIO_PCI_COMMON_STATUS, 1, 0);
    assert_eq!(r.record.lock().unwrap().connections, 2);
    r.empty_control_rings();
    r.start_driver();
    r.wait_n("SET_VRING_ENABLE 1 true", 2);
    assert_eq!(
        r.told_of("SET_VRING_ENABLE 2 true").len(),
        1,
        "{:#?}",
        r.log()
    );
    assert_eq!(r.pairs_set(0, 2), VIRTIO_NET_OK as u8);
    assert_eq!(
        r.told_of("SET_VRING_ENABLE 3 true").len(),
        2,
        "{:#?}",
        r.log()
    );
    assert_eq!(r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET, 0);
}

#[test]
fn two_pairs_from_a_backend_without_protocol_mq_is_one_line_naming_it() {
    let path = socket();
    let _rec = backend::serve(
        &path,
        Quirks {
            no_mq: true,
            ..Quirks::default()
        },
    );
    let two = VhostUserSpec {
        queues: 2,
        ..spec(path, NET)
    };
    let line = connect(&two, &shared_memory()).err().unwrap().to_string();
    assert!(
        line.contains("does not offer VHOST_USER_PROTOCOL_F_MQ"),
        "{line}"
    );
    assert!(!line.contains('\n'));
}
