//! A virtio-pci net function snapshotted in the middle of its work and restored into a fresh
//! one on the same guest memory: the registers the driver reads are the same, the next request
//! is answered at the right used index through the restored vector, a masked vector keeps its
//! pending bit, and corrupted states are refused with the field named.

#![allow(clippy::cast_possible_truncation)] // fixtures

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_queue::desc::RawDescriptor;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::super::testing::{
    bar_read, bar_write, config, enable_queue, negotiate_version_1, set_command,
};
use super::*;
use crate::fakes::FakeRoutes;
use crate::irq::CommitStrategy;
use crate::pci::function::PciFunction;
use crate::pci::regs::*;
use crate::virtio::notify::NotifyPath;
use crate::virtio::regs::*;
use crate::virtio::worker::Worker;

const MSG: u64 = 0xfee0_0000;
const RX: u64 = 0x4000;
const TX: u64 = 0x8000;
const BUFFERS: u64 = 0x10_000;

/// A fresh function on `mem`, with its configuration space placed, its routes and its thread.
fn fresh(mem: &GuestMemoryMmap) -> (VirtioPci, ConfigSpace, Arc<FakeRoutes>, Worker) {
    let mut p = crate::virtio::test_parts();
    p.env.mem = mem.clone();
    let routes = Arc::new(FakeRoutes::with_strategy(CommitStrategy::Batched));
    p.env.routes = routes.clone();
    let (mut f, w) = VirtioPci::new(p.env, p.net, 0x18, 3, NotifyPath::Exit).unwrap();
    let c = config();
    f.attached(&c);
    (f, c, routes, w)
}

/// Bring the function up as a driver does: features, both queues, vectors 1 and 2 for rx and
/// tx, vector 2 masked, MSI-X enabled, Bus Master set, DRIVER_OK.
fn bring_up(
    f: &mut VirtioPci,
    c: &ConfigSpace,
    mem: &GuestMemoryMmap,
) -> [MockSplitQueue<'static, GuestMemoryMmap>; 2] {
    let mem: &'static GuestMemoryMmap = Box::leak(Box::new(mem.clone()));
    let common = |f: &mut VirtioPci, offset, len, value| bar_write(f, c, offset, len, value);
    common(f, VIRTIO_PCI_COMMON_STATUS, 1, 3);
    common(f, VIRTIO_PCI_COMMON_GFSELECT, 4, 1);
    common(f, VIRTIO_PCI_COMMON_GF, 4, 1 << (VIRTIO_F_VERSION_1 - 32));
    common(f, VIRTIO_PCI_COMMON_STATUS, 1, 0xb);
    let queues = [
        MockSplitQueue::create(mem, GuestAddress(RX), 16),
        MockSplitQueue::create(mem, GuestAddress(TX), 16),
    ];
    for (index, mock) in queues.iter().enumerate() {
        common(f, VIRTIO_PCI_COMMON_Q_SELECT, 2, index as u32);
        common(f, VIRTIO_PCI_COMMON_Q_SIZE, 2, 16);
        common(f, VIRTIO_PCI_COMMON_Q_MSIX, 2, index as u32 + 1);
        let rings = [mock.desc_table_addr(), mock.avail_addr(), mock.used_addr()];
        for (n, ring) in rings.into_iter().enumerate() {
            common(
                f,
                VIRTIO_PCI_COMMON_Q_DESCLO + 8 * n as u32,
                4,
                ring.0 as u32,
            );
        }
        common(f, VIRTIO_PCI_COMMON_Q_ENABLE, 2, 1);
    }
    for vector in 1..3u32 {
        let entry = VIRTIO_PCI_BAR_MSIX_TABLE + vector * PCI_MSIX_ENTRY_SIZE;
        bar_write(f, c, entry + PCI_MSIX_ENTRY_LOWER_ADDR, 4, MSG as u32);
        bar_write(f, c, entry + PCI_MSIX_ENTRY_DATA, 4, 0x40 + vector);
        bar_write(
            f,
            c,
            entry + PCI_MSIX_ENTRY_VECTOR_CTRL,
            4,
            u32::from(vector == 2),
        );
    }
    let cap = c.find_capability(PCI_CAP_ID_MSIX).unwrap();
    c.write(cap + PCI_MSIX_FLAGS, &PCI_MSIX_FLAGS_ENABLE.to_le_bytes());
    f.config_written(c, cap + PCI_MSIX_FLAGS, 2);
    set_command(f, c, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    common(f, VIRTIO_PCI_COMMON_STATUS, 1, 0xf);
    queues
}

/// Send request `n` (4 bytes of `n`) on tx with a receive buffer on rx, kick tx, and wait
/// until rx's used index reaches `until`.
fn request(
    f: &mut VirtioPci,
    c: &ConfigSpace,
    mem: &GuestMemoryMmap,
    q: &[MockSplitQueue<'_, GuestMemoryMmap>; 2],
    n: u8,
    until: u16,
) {
    let slot = u64::from(n) * 0x1000;
    let mut req = [n; VIRTIO_NET_HDR_SIZE as usize + 4];
    req[..VIRTIO_NET_HDR_SIZE as usize].fill(0); // a plain frame: no offloads in its header
    mem.write_slice(&req, GuestAddress(BUFFERS + slot + 0x800))
        .unwrap();
    let desc = |addr, len, flags| RawDescriptor::from(Descriptor::new(addr, len, flags, 0));
    let at = u16::from(n);
    q[0].add_desc_chains(
        &[desc(BUFFERS + slot, 0x800, VIRTQ_DESC_F_WRITE as u16)],
        at,
    )
    .unwrap();
    q[1].add_desc_chains(&[desc(BUFFERS + slot + 0x800, req.len() as u32, 0)], at)
        .unwrap();
    bar_write(
        f,
        c,
        VIRTIO_PCI_BAR_NOTIFY + VIRTIO_PCI_NOTIFY_MULTIPLIER,
        2,
        1,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while q[0].used().idx().load() < until && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(q[0].used().idx().load(), until, "answered");
    let response = mem
        .read_obj::<u8>(GuestAddress(BUFFERS + slot + 12))
        .unwrap();
    assert_eq!(response, !n, "request {n}'s response");
}

/// Everything the driver can read of the function: the common configuration of each queue,
/// the MSI-X table and PBA, and configuration space.
fn guest_view(f: &mut VirtioPci, c: &ConfigSpace) -> Vec<u32> {
    let mut view = Vec::new();
    for q in 0..2 {
        bar_write(f, c, VIRTIO_PCI_COMMON_Q_SELECT, 2, q);
        for (offset, len) in [
            (VIRTIO_PCI_COMMON_DF, 4),
            (VIRTIO_PCI_COMMON_GF, 4),
            (VIRTIO_PCI_COMMON_MSIX, 2),
            (VIRTIO_PCI_COMMON_STATUS, 1),
            (VIRTIO_PCI_COMMON_Q_SIZE, 2),
            (VIRTIO_PCI_COMMON_Q_MSIX, 2),
            (VIRTIO_PCI_COMMON_Q_ENABLE, 2),
            (VIRTIO_PCI_COMMON_Q_DESCLO, 4),
            (VIRTIO_PCI_COMMON_Q_AVAILLO, 4),
            (VIRTIO_PCI_COMMON_Q_USEDLO, 4),
        ] {
            view.push(bar_read(f, c, offset, len));
        }
    }
    for dword in (0..3 * PCI_MSIX_ENTRY_SIZE).step_by(4) {
        view.push(bar_read(f, c, VIRTIO_PCI_BAR_MSIX_TABLE + dword, 4));
    }
    view.push(bar_read(f, c, VIRTIO_PCI_BAR_MSIX_PBA, 4));
    view.extend(
        c.save()
            .chunks(4)
            .map(|d| u32::from_le_bytes(d.try_into().unwrap())),
    );
    view
}

/// The snapshot of a function that answered `answered` requests and holds a message pending
/// on masked vector 2, with its guest view and memory.
struct Taken {
    mem: GuestMemoryMmap,
    /// The driver's queues.
    queues: [MockSplitQueue<'static, GuestMemoryMmap>; 2],
    config: Vec<u8>,
    state: serde_json::Value,
    view: Vec<u32>,
}

fn take(answered: u8) -> Taken {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let (mut f, c, routes, _w) = fresh(&mem);
    let q = bring_up(&mut f, &c, &mem);
    for n in 0..answered {
        request(&mut f, &c, &mem, &q, n, u16::from(n) + 1);
    }
    assert_eq!(
        routes.take_delivered().len(),
        usize::from(answered),
        "rx's vector 1"
    );
    f.msi().trigger(2);
    PciFunction::pause(&mut f).unwrap();
    let state = PciFunction::save(&f).unwrap().unwrap();
    let view = guest_view(&mut f, &c);
    Taken {
        mem,
        queues: q,
        config: c.save(),
        state,
        view,
    }
}

fn restore_into(t: &Taken) -> (VirtioPci, ConfigSpace, Arc<FakeRoutes>, Worker) {
    let (mut f, c, routes, w) = fresh(&t.mem);
    c.restore("pci.00:03.0", &t.config).unwrap();
    PciFunction::restore(&mut f, "pci.00:03.0", &c, Some(t.state.clone())).unwrap();
    PciFunction::resume(&mut f);
    (f, c, routes, w)
}

#[test]
fn a_restored_function_reads_the_same_and_answers_at_the_next_used_index() {
    let t = take(3);
    let (mut f, c, routes, _w) = restore_into(&t);
    assert_eq!(guest_view(&mut f, &c), t.view, "what the driver reads");
    assert_eq!(
        routes.commits(),
        1,
        "the live vectors routed in one commit (batched)"
    );
    let q = &t.queues;
    let _ = routes.take_delivered();
    let answer = |n: u64| GuestAddress(BUFFERS + n * 0x1000 + 12);
    for n in 0..3 {
        t.mem.write_obj(0u8, answer(n)).unwrap();
    }
    request(&mut f, &c, &t.mem, q, 3, 4);
    for n in 0..3 {
        let byte = t.mem.read_obj::<u8>(answer(n)).unwrap();
        assert_eq!(
            byte, 0,
            "request {n} was answered before the snapshot, not again"
        );
    }
    assert_eq!(
        q[0].used().ring().ref_at(3).unwrap().load().id(),
        3,
        "used entry 3 names the chain at avail entry 3"
    );
    assert_eq!(
        routes.take_delivered(),
        vec![Some((MSG, 0x41))],
        "through vector 1"
    );
}

#[test]
fn a_masked_vector_keeps_its_pending_bit_and_fires_once_at_unmask() {
    let t = take(1);
    let (mut f, c, routes, _w) = restore_into(&t);
    let _ = routes.take_delivered();
    assert_eq!(
        bar_read(&mut f, &c, VIRTIO_PCI_BAR_MSIX_PBA, 4),
        0b100,
        "pending"
    );
    assert!(routes.take_delivered().is_empty(), "held while masked");
    let ctrl = VIRTIO_PCI_BAR_MSIX_TABLE + 2 * PCI_MSIX_ENTRY_SIZE + PCI_MSIX_ENTRY_VECTOR_CTRL;
    bar_write(&mut f, &c, ctrl, 4, 0);
    assert_eq!(routes.take_delivered(), vec![Some((MSG, 0x42))], "once");
    assert_eq!(bar_read(&mut f, &c, VIRTIO_PCI_BAR_MSIX_PBA, 4), 0);
}

/// Restore `state` changed by `edit` into a fresh function; the error's field.
fn refused(t: &Taken, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut state = t.state.clone();
    edit(&mut state);
    let (mut f, c, _routes, _w) = fresh(&t.mem);
    c.restore("pci.00:03.0", &t.config).unwrap();
    PciFunction::restore(&mut f, "pci.00:03.0", &c, Some(state))
        .unwrap_err()
        .what
}

#[test]
fn corrupted_states_are_refused_naming_the_field() {
    let t = take(1);
    fn common(s: &mut serde_json::Value) -> &mut serde_json::Value {
        &mut s["common"]
    }
    assert_eq!(
        refused(&t, |s| common(s)["registers"]["queues"][1]["size"] =
            12.into()),
        "pci.00:03.0.queue[1].size"
    );
    assert_eq!(
        refused(&t, |s| common(s)["positions"][0]["next_avail"] = 40.into()),
        "pci.00:03.0.positions[0]"
    );
    assert_eq!(
        refused(&t, |s| common(s)["interrupts"]["queue_vectors"][1] =
            7.into()),
        "pci.00:03.0.interrupts.queue_vectors[1]"
    );
    assert_eq!(
        refused(&t, |s| common(s)["registers"]["offered"] = 0.into()),
        "pci.00:03.0.offered"
    );
    assert_eq!(
        refused(&t, |s| s["msix"]["vectors"]
            .as_array_mut()
            .unwrap()
            .truncate(2)),
        "pci.00:03.0.msix.vectors"
    );
    assert_eq!(
        refused(&t, |s| common(s)["positions"] = serde_json::Value::Null),
        "pci.00:03.0.positions"
    );
    assert_eq!(
        refused(&t, |s| common(s)["registers"]["queues"][0]["desc"] =
            0x1000_0000.into()),
        "pci.00:03.0.queue[0].ready"
    );
    assert_eq!(
        refused(&t, |s| common(s)["registers"]["status"] = 0x4f.into()),
        "pci.00:03.0.status"
    );
}

/// Wait (up to 10 s) for `q`'s used index to reach `until`.
fn wait_used(q: &MockSplitQueue<'_, GuestMemoryMmap>, until: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while q.used().idx().load() < until && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(q.used().idx().load(), until);
}

/// The responder's answer to a request sent while the driver had no receive buffer is held
/// by the device: it is in the snapshot, and the restored device delivers it.
#[test]
fn a_response_held_for_a_receive_buffer_survives_the_restore() {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let (mut f, c, _routes, _w) = fresh(&mem);
    let q = bring_up(&mut f, &c, &mem);
    let mut req = [9u8; VIRTIO_NET_HDR_SIZE as usize + 4];
    req[..VIRTIO_NET_HDR_SIZE as usize].fill(0); // a plain frame: no offloads in its header
    mem.write_slice(&req, GuestAddress(BUFFERS + 0x800))
        .unwrap();
    let desc = |addr, len, flags| RawDescriptor::from(Descriptor::new(addr, len, flags, 0));
    q[1].add_desc_chains(&[desc(BUFFERS + 0x800, req.len() as u32, 0)], 0)
        .unwrap();
    bar_write(
        &mut f,
        &c,
        VIRTIO_PCI_BAR_NOTIFY + VIRTIO_PCI_NOTIFY_MULTIPLIER,
        2,
        1,
    );
    wait_used(&q[1], 1);
    PciFunction::pause(&mut f).unwrap();
    let state = PciFunction::save(&f).unwrap().unwrap();
    assert_eq!(state["common"]["handler"]["enabled"], 1);
    let (mut g, c2, _routes2, _w2) = fresh(&mem);
    c2.restore("pci.00:03.0", &c.save()).unwrap();
    PciFunction::restore(&mut g, "pci.00:03.0", &c2, Some(state)).unwrap();
    PciFunction::resume(&mut g);
    q[0].add_desc_chains(&[desc(BUFFERS, 0x800, VIRTQ_DESC_F_WRITE as u16)], 0)
        .unwrap();
    bar_write(&mut g, &c2, VIRTIO_PCI_BAR_NOTIFY, 2, 0);
    wait_used(&q[0], 1);
    let response = mem.read_obj::<u8>(GuestAddress(BUFFERS + 12)).unwrap();
    assert_eq!(response, !9, "the held response");
}

/// A snapshot taken while a reset waits for the device thread: the reset is in it, and the
/// restored function completes it (the driver reads the status until it is 0).
#[test]
fn a_snapshot_during_a_late_reset_holds_the_reset_function() {
    use crate::virtio::transport::mmio::tests::Recording;
    use std::sync::mpsc::channel;

    let mut p = crate::virtio::test_parts();
    let (entered_tx, entered) = channel();
    let (release, gate) = channel();
    let handler = Recording {
        calls: Arc::default(),
        gate: Some(gate),
        entered: entered_tx,
    };
    let parts = crate::virtio::DeviceParts {
        device: p.net.device,
        work: crate::virtio::DeviceWork::InProcess(Box::new(handler)),
    };
    p.env.mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let (mut f, _w) = VirtioPci::new(p.env, parts, 0x18, 3, NotifyPath::Exit).unwrap();
    let c = config();
    f.attached(&c);
    negotiate_version_1(&mut f, &c);
    enable_queue(&mut f, &c, 0, [0x1000, 0x2000, 0x3000]);
    set_command(&mut f, &c, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    bar_write(&mut f, &c, VIRTIO_PCI_COMMON_STATUS, 1, 0xf);
    entered.recv().unwrap(); // activation's look at the queues
    release.send(()).unwrap();
    bar_write(&mut f, &c, VIRTIO_PCI_BAR_NOTIFY, 2, 0);
    entered.recv().unwrap(); // the device thread is inside its work
    bar_write(&mut f, &c, VIRTIO_PCI_COMMON_STATUS, 1, 0); // returns after the timeout
    assert_ne!(
        bar_read(&mut f, &c, VIRTIO_PCI_COMMON_STATUS, 1),
        0,
        "not yet"
    );
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        release.send(()).unwrap();
    });
    PciFunction::pause(&mut f).unwrap();
    releaser.join().unwrap();
    let state = PciFunction::save(&f).unwrap().unwrap();
    assert_eq!(state["common"]["registers"]["reset_pending"], true);
    assert!(
        state["common"]["positions"].is_null(),
        "the device thread let go"
    );
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let (mut g, c2, _routes, _w2) = fresh(&mem);
    c2.restore("pci.00:03.0", &c.save()).unwrap();
    PciFunction::restore(&mut g, "pci.00:03.0", &c2, Some(state)).unwrap();
    PciFunction::resume(&mut g);
    assert_eq!(
        bar_read(&mut g, &c2, VIRTIO_PCI_COMMON_STATUS, 1),
        0,
        "reset when restored"
    );
    PciFunction::resume(&mut f);
    assert_eq!(
        bar_read(&mut f, &c, VIRTIO_PCI_COMMON_STATUS, 1),
        0,
        "reset at the next read"
    );
}
