//! `exitless bench msix` with vhost-user devices (issue 21): the seed's own case, where the
//! signaller is outside the VMM (there VFIO, here DPDK testpmd) and holds a KVM irqfd per
//! queue, so a GSI route must be committed before it signals, whatever the strategy
//! (`Signaller::Outside`, `irq/msi/mod.rs`).
//!
//! Each device is a virtio-net function whose queues testpmd serves: one queue pair
//! ([`QUEUE_PAIRS`]: the probe drives pair 0 only, and more pairs would only make testpmd poll
//! more rings), its MSI-X table sized apart from the queues to the in-process rows' vectors (the
//! seed's 65) as `--net vhost-user=SOCKET,vectors=65` does (QEMU's `virtio-net-pci,vectors=`).
//! Every entry is programmed and enabled as the in-process rows' are, so Enable makes the same
//! routes live; testpmd's call fds are on the two queue vectors.
//! For each device in turn the guest programs and unmasks every entry with MSI-X disabled,
//! sets Enable (timed: the routes the outside signaller needs, committed per strategy), brings
//! the device up (DRIVER_OK: testpmd gets its rings, and the irqfds of the now deliverable
//! vectors as call fds), lets testpmd start polling ([`SETTLE_READS`]), then does one ICMP
//! echo with testpmd (the time to the first
//! backend-raised interrupt: under `first-use` its route is committed on it, from the watch
//! fd), then the unmask burst on the running device (MSI-X off, entries masked with new
//! messages, Enable, unmasked one by one: each unmask of a queue's vector a swap of its call
//! fd from the watch fd to the irqfd, acknowledged by testpmd).

use std::path::PathBuf;

use crate::against::Counterpart;
use crate::measure::{Clock, variant};
use crate::model::{RoutingFigures, TargetCheck, Variant};
use crate::vhost_net::{BACKEND_IP, BACKEND_MAC, GUEST_IP};
use exitless::contract::{Op, TRANSPORT_PCI};
use exitless::irq::CommitStrategy;
use exitless::machine::{
    NetBackendKind, ProbeConfig, ProbeError, ProbeRun, Transport, VhostUserConfig, VirtioNetConfig,
    ops,
};
use exitless::pci::PciAddress;
use exitless::pci::regs::PCI_MSIX_FLAGS_ENABLE;
use exitless::virtio::notify::NotifyPath;

/// The variants' names, in `CommitStrategy::ALL` order.
pub const NAMES: [&str; 4] = [
    "per-vector-vhost-user",
    "batched-vhost-user",
    "first-use-vhost-user",
    "direct-vhost-user",
];

/// Guest RAM reads between DRIVER_OK and the first echo (about 0.2 s at ~1 ns each): time for
/// testpmd to notice the new device and start polling its rings (tens to hundreds of ms on a
/// busy host), so that the first interrupt times the path from the kick to the guest, the
/// route's commit under `first-use` included, not the backend's start.
const SETTLE_READS: u64 = 200_000_000;

/// Queue pairs of each exitless device: what `--net vhost-user=` takes.
pub const QUEUE_PAIRS: u16 = 1;

/// IDT vector of entry 0: the probe's own queue vectors (`IRQ_VECTOR_BASE`), so the echo's
/// receive interrupt reaches the driver.
const FIRST_VECTOR: u8 = 0x40;
/// Where the unmask burst moves the entries (each unmask then brings a new message).
const BURST_FIRST_VECTOR: u8 = 0x90;

/// Op indexes of one device's steps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct VhostSteps {
    program: usize,
    enable: usize,
    first_interrupt: usize,
    burst: Option<usize>,
}

/// The name of `strategy`'s vhost-user variant.
pub fn name(strategy: CommitStrategy) -> &'static str {
    let i = CommitStrategy::ALL.iter().position(|&s| s == strategy);
    NAMES[i.expect("every strategy is in ALL")]
}

/// The guest's work on the functions `functions` (in order), appended to `list`; the unmask
/// burst only with `burst` (QEMU 7.2 aborts in `msix_fire_vector_notifier` when a started
/// vhost-user function's MSI-X is enabled again or its entries unmasked with new messages,
/// so its plan leaves the burst out).
pub(crate) fn ops(list: &mut Vec<Op>, functions: &[PciAddress], burst: bool) -> Vec<VhostSteps> {
    let mut push = |op| {
        list.push(op);
        list.len() - 1
    };
    functions
        .iter()
        .map(|&f| {
            let program = push(ops::msix_program(f, FIRST_VECTOR, 0, true));
            let enable = push(ops::msix_control(f, PCI_MSIX_FLAGS_ENABLE));
            push(ops::virtio_init(TRANSPORT_PCI, f.ecam_offset(), 0));
            push(ops::ram_read_loop(SETTLE_READS));
            let first_interrupt = push(ops::icmp_echo(BACKEND_IP, GUEST_IP, BACKEND_MAC, 32, 1));
            let burst = burst.then(|| {
                // The program op clears Enable first.
                push(ops::msix_program(f, BURST_FIRST_VECTOR, 0, false));
                push(ops::msix_control(f, PCI_MSIX_FLAGS_ENABLE));
                push(ops::msix_mask_each(f, false))
            });
            VhostSteps {
                program,
                enable,
                first_interrupt,
                burst,
            }
        })
        .collect()
}

/// The exitless devices: one per socket, [`QUEUE_PAIRS`] each, served by testpmd, with
/// `vectors` MSI-X vectors.
pub fn devices(sockets: &[PathBuf], vectors: u16) -> Vec<VirtioNetConfig> {
    sockets
        .iter()
        .map(|socket| VirtioNetConfig {
            queue_pairs: QUEUE_PAIRS,
            backend: NetBackendKind::VhostUser(VhostUserConfig {
                socket: socket.clone(),
                queues: QUEUE_PAIRS,
                reconnect: None,
            }),
            vectors: Some(vectors),
            ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
        })
        .collect()
}

/// Boot with `strategy`, each device with `vectors` MSI-X vectors, and return its vhost-user
/// variant.
pub(crate) fn boot(
    strategy: CommitStrategy,
    sockets: &[PathBuf],
    vectors: u16,
    timeout: std::time::Duration,
    figures: fn(&ProbeRun, &Clock, &[usize]) -> RoutingFigures,
) -> Result<Variant, ProbeError> {
    let functions: Vec<PciAddress> = (0..sockets.len())
        .map(ProbeConfig::virtio_pci_address)
        .collect();
    let mut list = Vec::new();
    let steps = ops(&mut list, &functions, true);
    let run = crate::measure::run_ok(&ProbeConfig {
        ops: list,
        virtio: devices(sockets, vectors),
        gsi_commits: strategy,
        timeout,
        ..Default::default()
    })?;
    let clock = Clock::of(&run);
    let pick = |f: fn(&VhostSteps) -> usize| steps.iter().map(f).collect::<Vec<_>>();
    let enables = pick(|s| s.enable);
    let mut v = variant(name(strategy), &run, &clock, &enables, 1, 1);
    let mut enable = figures(&run, &clock, &enables);
    enable.table_programming = Some(Box::new(figures(&run, &clock, &pick(|s| s.program))));
    enable.first_interrupt = Some(Box::new(figures(
        &run,
        &clock,
        &pick(|s| s.first_interrupt),
    )));
    let bursts: Vec<usize> = steps.iter().filter_map(|s| s.burst).collect();
    enable.unmask_one_by_one = Some(Box::new(figures(&run, &clock, &bursts)));
    v.routing = Some(enable);
    v.delivery = Some("irqfd");
    Ok(v)
}

/// QEMU's counterparts: each strategy's Enable against QEMU's, on the same steps.
pub(crate) fn counterparts(steps: &[VhostSteps]) -> Vec<Counterpart> {
    NAMES
        .iter()
        .map(|&variant| Counterpart {
            variant: variant.into(),
            ops: steps.iter().map(|s| s.enable).collect(),
            per_op: 1,
            path: "MSI-X Enable on its vhost-user virtio-net-pci (vhost's irqfds)",
            control: false,
        })
        .chain([Counterpart {
            variant: "vhost-user first interrupt after enable (median device)".into(),
            ops: steps.iter().map(|s| s.first_interrupt).collect(),
            per_op: 1,
            path: "one ICMP echo with testpmd right after Enable",
            control: false,
        }])
        .collect()
}

/// What the vhost-user rows are, for the report's notes; `vectors`: each function's, exitless's
/// and QEMU's.
pub fn note(vectors: u64) -> String {
    format!(
        "`*-vhost-user` rows: the same Enable on vhost-user virtio-net functions served by \
         DPDK testpmd, whose vectors an outside signaller raises, so routes are kept under \
         every strategy; each has {vectors} vectors, all programmed and enabled (exitless's: \
         {QUEUE_PAIRS} queue pair, the only one the probe drives, the table \
         sized apart as `vectors={vectors}` does; QEMU's: {} queue pairs); then DRIVER_OK, \
         one ICMP echo with testpmd (`first_interrupt`: the first backend-raised interrupt) \
         and the unmask burst on the running device (each unmask of a queue's vector a \
         call-fd swap acknowledged by testpmd)",
        (vectors - 1) / 2
    )
}

/// The targets for the vhost-user devices: batched and first-use Enable in all at most
/// 0.1× per-vector's, each flat across devices (last at most 1.5× first).
pub fn targets(variants: &[Variant]) -> Vec<TargetCheck> {
    let get = |s: CommitStrategy| {
        variants
            .iter()
            .find(|v| v.name == name(s))
            .and_then(|v| v.routing.as_ref())
    };
    let Some(per_vector) = get(CommitStrategy::PerVector) else {
        return Vec::new();
    };
    let mut checks = Vec::new();
    for s in [CommitStrategy::Batched, CommitStrategy::FirstUse] {
        let Some(f) = get(s) else { continue };
        let ratio = f.total_ms / per_vector.total_ms;
        checks.push(TargetCheck {
            target: format!("{} total <= 0.1x {} total", name(s), NAMES[0]),
            measured: format!(
                "{:.2} ms vs {:.2} ms ({ratio:.3}x)",
                f.total_ms, per_vector.total_ms
            ),
            met: ratio <= 0.1,
            ..Default::default()
        });
        let (first, last) = (
            f.per_device_ms.first().copied().unwrap_or(f64::NAN),
            f.per_device_ms.last().copied().unwrap_or(f64::NAN),
        );
        checks.push(TargetCheck {
            target: format!("{} flat: last <= 1.5x first", name(s)),
            measured: format!(
                "first {first:.3} ms, last {last:.3} ms ({:.2}x)",
                last / first
            ),
            met: last <= 1.5 * first,
            ..Default::default()
        });
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_device_is_brought_up_then_enabled_then_echoes_then_bursts() {
        let f = [
            ProbeConfig::virtio_pci_address(0),
            ProbeConfig::virtio_pci_address(1),
        ];
        let mut list = vec![ops::ram_read_loop(1)];
        let steps = ops(&mut list, &f, true);
        assert_eq!(steps.len(), 2);
        let s = &steps[1];
        // Device 1's ops come after device 0's: its table, Enable, then its bring-up.
        assert_eq!(
            list[s.program],
            ops::msix_program(f[1], FIRST_VECTOR, 0, true)
        );
        assert_eq!(
            list[s.enable],
            ops::msix_control(f[1], PCI_MSIX_FLAGS_ENABLE)
        );
        assert_eq!(
            list[s.enable + 1],
            ops::virtio_init(TRANSPORT_PCI, f[1].ecam_offset(), 0)
        );
        assert_eq!(list[s.enable + 2], ops::ram_read_loop(SETTLE_READS));
        assert_eq!(s.first_interrupt, s.enable + 3);
        assert_eq!(
            list[s.first_interrupt].kind,
            exitless::contract::OP_ICMP_ECHO
        );
        assert_eq!(list[s.burst.unwrap()], ops::msix_mask_each(f[1], false));
        assert!(steps[0].burst.unwrap() < s.program);
        // QEMU's plan: no burst.
        let mut list = Vec::new();
        let steps = ops(&mut list, &f, false);
        assert!(steps.iter().all(|s| s.burst.is_none()));
        assert_eq!(list.len(), 10);
        assert_eq!(name(CommitStrategy::FirstUse), "first-use-vhost-user");
    }

    #[test]
    fn every_device_gets_its_own_socket_one_queue_pair_and_the_seeds_vectors() {
        let sockets = [PathBuf::from("/s/0.sock"), PathBuf::from("/s/1.sock")];
        let d = devices(&sockets, 65);
        let NetBackendKind::VhostUser(c) = &d[1].backend else {
            panic!("a vhost-user backend")
        };
        assert_eq!((c.socket.as_path(), c.queues), (sockets[1].as_path(), 1));
        assert_eq!((d[1].queue_pairs, d[1].transport), (1, Transport::Pci));
        assert_eq!(d[1].msix_vectors(), Ok(65));
        assert!(note(65).contains("each has 65 vectors"), "{}", note(65));
    }

    #[test]
    fn the_targets_want_a_tenth_of_per_vector_and_flat_devices() {
        let v = |s, per_device_ms: Vec<f64>| Variant {
            name: name(s).into(),
            routing: Some(RoutingFigures {
                total_ms: per_device_ms.iter().sum(),
                per_device_ms,
                ..Default::default()
            }),
            ..Default::default()
        };
        let variants = [
            v(CommitStrategy::PerVector, vec![10.0, 20.0]),
            v(CommitStrategy::Batched, vec![1.0, 1.0]),
            v(CommitStrategy::FirstUse, vec![0.5, 2.0]),
        ];
        let t = targets(&variants);
        assert_eq!(t.len(), 4);
        assert!(t[0].met && t[1].met, "{t:?}");
        assert!(t[2].met, "2.5 of 30 ms: {t:?}");
        assert!(!t[3].met, "2.0 > 1.5 × 0.5: {t:?}");
        assert!(targets(&variants[1..]).is_empty());
    }
}
