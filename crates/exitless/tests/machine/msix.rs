//! MSI-X delivery under every strategy (routes committed per vector, batched, at first use, or
//! no routes and direct injection): after every kind
//! of change a guest makes (enable, re-programming an unmasked vector, mask/unmask, function
//! mask, MSI-X and virtio resets), each vector the VMM sends reaches the IDT vector it was
//! programmed with, exactly once, and nothing else arrives. And each burst costs the commits
//! its strategy promises.

use exitless::contract::*;
use exitless::irq::CommitStrategy;
use exitless::machine::{ProbeConfig, ProbeRun, ops};
use exitless::pci::regs::{PCI_MSIX_FLAGS_ENABLE, PCI_MSIX_FLAGS_MASKALL};

/// 32 queue pairs: 64 queue vectors and the configuration vector, as in the seed.
const PAIRS: u16 = 32;
const VECTORS: u64 = 2 * PAIRS as u64 + 1;
const ENABLE: u16 = PCI_MSIX_FLAGS_ENABLE;
const MASKALL: u16 = PCI_MSIX_FLAGS_MASKALL;

fn boot(strategy: CommitStrategy, ops: Vec<Op>) -> ProbeRun {
    crate::common::run_msix(strategy, PAIRS, false, ops)
}

fn device() -> exitless::pci::PciAddress {
    ProbeConfig::virtio_pci_address(0)
}

/// Op `i` completed with status OK.
fn assert_ok(run: &ProbeRun, i: usize) -> OpResult {
    let r = run.results[i];
    assert_eq!(r.status, STATUS_OK, "op {i}: {r:?}\n{}", run.console);
    r
}

/// Check op `i` saw every entry behave, with `delivered` interrupts and none astray.
fn assert_delivered(run: &ProbeRun, i: usize, delivered: u64) {
    let r = assert_ok(run, i);
    assert_eq!(r.value, VECTORS, "op {i}: every entry behaved");
    assert_eq!(
        r.irqs, delivered,
        "op {i}: interrupts on the programmed vectors"
    );
    assert_eq!(r.stray_irqs, 0, "op {i}: interrupts elsewhere");
}

/// Routing commits during op `i`.
fn commits(run: &ProbeRun, i: usize) -> u64 {
    run.phases[i]
        .as_ref()
        .expect("op completed")
        .routing
        .commits
}

#[test]
fn every_vector_arrives_where_it_was_programmed_after_every_change() {
    let d = device();
    for strategy in CommitStrategy::ALL {
        let run = boot(
            strategy,
            vec![
                ops::msix_program(d, 0x40, 0, true), // 0: all unmasked, MSI-X off
                ops::msix_control(d, ENABLE),        // 1: every vector live at once
                ops::msix_check(d, true),            // 2
                ops::msix_retarget(d, 0x90),         // 3: unmasked entries re-programmed
                ops::msix_check(d, true),            // 4
                ops::msix_mask_each(d, true),        // 5
                ops::msix_check(d, true),            // 6: held pending
                ops::msix_mask_each(d, false),       // 7: pending ones sent at unmask
                ops::msix_check(d, false),           // 8
                ops::msix_control(d, ENABLE | MASKALL), // 9
                ops::msix_check(d, true),            // 10: held pending
                ops::msix_retarget(d, 0x40),         // 11: changed under Function Mask
                ops::msix_control(d, ENABLE),        // 12: sent with the new messages
                ops::msix_check(d, false),           // 13
                ops::msix_control(d, 0),             // 14: MSI-X reset
                ops::msix_program(d, 0x60, 0, true), // 15
                ops::msix_control(d, ENABLE),        // 16
                ops::msix_check(d, true),            // 17
                ops::virtio_init(TRANSPORT_PCI, d.ecam_offset(), 0), // 18: virtio reset
                ops::msix_check(d, true),            // 19
                ops::virtio_rr(32, 20),              // 20: the device's own interrupts
            ],
        );
        let name = strategy.name();
        for check in [2, 4, 8, 13, 17, 19] {
            assert_delivered(&run, check, VECTORS);
        }
        for held in [6, 10] {
            assert_delivered(&run, held, 0);
        }
        assert_eq!(assert_ok(&run, 20).value, 20);
        // What each op costs in routing commits. A burst of route changes (enable, function
        // unmask with 65 new messages, disable) is one commit batched, one per vector
        // per-vector; first-use pays one commit at the first message after it (in the check,
        // or in the same access when pending messages go out at a function unmask); direct
        // messages need no routes at all. Masks and changes under a mask cost nothing.
        let expected: [u64; 18] = match strategy {
            CommitStrategy::PerVector => {
                let v = VECTORS;
                [0, v, 0, v, 0, 0, 0, 0, 0, 0, 0, 0, v, 0, v, 0, v, 0]
            }
            CommitStrategy::Batched => {
                let v = VECTORS;
                [0, 1, 0, v, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0]
            }
            CommitStrategy::FirstUse => [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1],
            CommitStrategy::Direct => [0; 18],
        };
        for (op, &want) in expected.iter().enumerate() {
            assert_eq!(commits(&run, op), want, "{name}: op {op}");
        }
    }
}

#[test]
fn messages_outside_the_interrupt_window_are_dropped_not_fatal() {
    let d = device();
    for strategy in CommitStrategy::ALL {
        let run = boot(
            strategy,
            vec![
                ops::msix_program(d, 0x40, 0x1000, true),
                ops::msix_control(d, ENABLE),
                ops::msix_check(d, true),
                // Fixed by the guest: delivered again.
                ops::msix_control(d, 0),
                ops::msix_program(d, 0x40, 0, true),
                ops::msix_control(d, ENABLE),
                ops::msix_check(d, true),
            ],
        );
        let name = strategy.name();
        assert_delivered(&run, 2, 0);
        assert_eq!(
            commits(&run, 1),
            0,
            "{name}: nothing routable, nothing committed"
        );
        assert_eq!(commits(&run, 2), 0, "{name}: nothing injected or routed");
        assert_delivered(&run, 6, VECTORS);
    }
}

/// The first interrupt of every vector after an enable, then steady traffic on one, under every
/// strategy: each arrives once on its own vector; first-use pays its one commit at the first of
/// them, the others none.
#[test]
fn the_first_interrupt_after_enable_pays_first_use_commit_and_no_more() {
    let d = device();
    for strategy in CommitStrategy::ALL {
        let run = boot(
            strategy,
            vec![
                ops::msix_program(d, 0x40, 0, true),
                ops::msix_control(d, ENABLE),
                ops::msix_latency(d, 0, VECTORS, 1), // 2: every vector's first interrupt
                ops::msix_latency(d, 3, 1, 20),      // 3: steady state on one vector
                ops::msix_check(d, true),
            ],
        );
        let name = strategy.name();
        for (op, n) in [(2, VECTORS), (3, 20)] {
            let r = assert_ok(&run, op);
            assert_eq!((r.value, r.irqs), (n, n), "{name}: op {op}");
        }
        let first = u64::from(strategy == CommitStrategy::FirstUse);
        assert_eq!(commits(&run, 2), first, "{name}: first interrupts");
        assert_eq!(commits(&run, 3), 0, "{name}: steady state");
        assert_delivered(&run, 4, VECTORS);
    }
}

/// `--net ...,vectors=N` sizes the table apart from the queues (QEMU's
/// `virtio-net-pci,vectors=N`): a one-pair device with 65 vectors shows the guest 65 entries,
/// each delivered where it was programmed; without it, the queues' 3.
#[test]
fn a_table_has_the_vectors_asked_for_not_only_the_queues() {
    let d = device();
    let ops = vec![
        ops::msix_program(d, 0x40, 0, true),
        ops::msix_control(d, ENABLE),
        ops::msix_check(d, true),
    ];
    let mut sized = crate::common::msix_config(CommitStrategy::Batched, 1, false, ops.clone());
    sized.virtio[0].vectors = Some(u16::try_from(VECTORS).unwrap());
    let run = crate::common::run_all_ok(&sized);
    assert_delivered(&run, 2, VECTORS);
    assert_eq!(
        commits(&run, 1),
        1,
        "one batched commit for the whole table"
    );
    let plain = crate::common::run_msix(CommitStrategy::Batched, 1, false, ops);
    assert_eq!(assert_ok(&plain, 2).value, 3, "2 × 1 pair + 1");
}
