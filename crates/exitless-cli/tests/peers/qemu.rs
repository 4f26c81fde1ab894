//! The probe under QEMU (`exitless_peer`): the same image, booted by QEMU's multiboot loader on
//! q35 with SeaBIOS, finds ECAM, its devices and its ops itself and reports through the serial
//! port, and its results pass the checks the exitless side's tests make. Skipped, with the
//! reason printed, where qemu-system-x86_64 is not installed. Each boot takes ~5 s here.

use std::time::Duration;

use exitless::contract::*;
use exitless::machine::{ProbeConfig, ops, run_probe};
use exitless::pci::PciAddress;
use exitless::pci::regs::*;
use exitless_bench::against::virtio_net_function;
use exitless_bench::iommu::IommuBench;
use exitless_bench::msix::MsixBench;
use exitless_bench::rr::RrBench;
use exitless_bench::vhost_net::VhostNet;
use exitless_peer::host_tap::{HostTap, TapLink};
use exitless_peer::{PeerError, PeerRun, Qemu, QemuMachine};

const LIMIT: Duration = Duration::from_secs(120);

/// QEMU's virtio-net-pci, transitional: vendor 0x1af4, device 0x1000.
const VIRTIO_NET_ID: u64 = 0x1000_1af4;
/// q35's host bridge (82G33/P35 MCH DRAM controller): vendor 0x8086, device 0x29c0.
const Q35_HOST_BRIDGE_ID: u64 = 0x29c0_8086;

fn qemu() -> Option<Qemu> {
    Qemu::find().inspect_err(|e| println!("skipped: {e}")).ok()
}

/// testpmd with the bench's ports (`msix` devices more), or None with the reason printed.
fn testpmd(msix: usize) -> Option<VhostNet> {
    VhostNet::start(msix)
        .inspect_err(|why| println!("skipped: {why}"))
        .ok()
}

fn boot(qemu: &Qemu, machine: &QemuMachine, ops: &[Op]) -> PeerRun {
    qemu.run_probe(machine, ops, LIMIT)
        .unwrap_or_else(|e| panic!("the probe under {}: {e}", qemu.version()))
}

fn ok(run: &PeerRun, i: usize) -> OpResult {
    let r = run.results[i];
    assert_eq!(r.status, STATUS_OK, "op {i}: {r:?}\n{}", run.serial);
    r
}

fn caps(r: &EnumRecord) -> &[u64] {
    &r.caps[..usize::try_from(r.cap_count).unwrap()]
}

#[test]
fn the_pci_ops_read_the_same_functions_by_port_io_and_ecam_under_qemu() {
    let Some(qemu) = qemu() else { return };
    let machine = QemuMachine {
        virtio_net: 2,
        ..QemuMachine::default()
    };
    let (nic, host_bridge) = (
        virtio_net_function(&machine, 0),
        PciAddress::new(0, 0, 0).unwrap(),
    );
    let n = 100;
    let mut list = vec![
        ops::ram_read_loop(n),
        ops::cfg_read_loop(METHOD_PIO, nic, 0, n),
        ops::cfg_read_loop(METHOD_ECAM, nic, 0, n),
        ops::cfg_read_loop(METHOD_AUTO, host_bridge, 0, n),
        ops::enumerate(METHOD_PIO),
    ];
    // The whole header of the second function, dword by dword, by both methods.
    let nic2 = virtio_net_function(&machine, 1);
    for method in [METHOD_PIO, METHOD_ECAM] {
        list.extend((0..16).map(|d| ops::cfg_read(method, nic2, d * 4, 4)));
    }
    list.push(ops::cfg_read(METHOD_PIO, nic, 0x100, 4)); // beyond mechanism #1's reach
    list.push(ops::enumerate(METHOD_ECAM));
    // Mapped for 64-bit BARs, though no RAM or device is there: nothing faults.
    list.push(ops::mmio_read(63 << 30, 4));
    let run = boot(&qemu, &machine, &list);
    println!("{}: {:?} for the run", qemu.version(), run.wall);

    assert!(ok(&run, 0).cycles > 0, "the RAM floor is timed");
    let reads = [1, 2, 3].map(|i| ok(&run, i));
    // A read loop sums its warm-up read and `n` more of the same dword.
    assert_eq!(reads[0].value, (n + 1) * VIRTIO_NET_ID, "{nic} by port I/O");
    assert_eq!(reads[1].value, (n + 1) * VIRTIO_NET_ID, "{nic} by ECAM");
    assert_eq!(reads[2].value, (n + 1) * Q35_HOST_BRIDGE_ID);
    assert_eq!(
        (
            reads[0].method_used,
            reads[1].method_used,
            reads[2].method_used
        ),
        (METHOD_PIO, METHOD_ECAM, METHOD_ECAM),
        "auto picks ECAM under a hypervisor once the MCFG describes it"
    );
    assert!(reads.iter().all(|r| r.cycles > 0));
    let header =
        |from: usize| -> Vec<u64> { (from..from + 16).map(|i| ok(&run, i).value).collect() };
    assert_eq!(
        header(5),
        header(21),
        "{nic2}'s header by port I/O and by ECAM"
    );
    assert_eq!(header(5)[0], VIRTIO_NET_ID);
    assert_eq!(run.results[37].status, STATUS_UNSUPPORTED);

    ok(&run, 39);

    let by_pio = ok(&run, 4).value;
    let by_ecam = ok(&run, 38).value;
    assert_eq!(by_pio, by_ecam, "both methods find every function");
    let found: Vec<u64> = run.enum_records.iter().map(|r| r.address).collect();
    assert_eq!(found.len() as u64, by_ecam);
    for f in [host_bridge, nic, nic2] {
        assert!(found.contains(&f.ecam_offset()), "{f} among {found:x?}");
    }
    let record = &run.enum_records[found.iter().position(|&a| a == nic.ecam_offset()).unwrap()];
    assert_eq!(record.header[0], VIRTIO_NET_ID);
    // I/O BAR 0 (legacy; its size follows the device's config), MSI-X in memory BAR 1, the
    // modern structures in 64-bit BAR 4.
    assert_ne!(record.bar_sizes[0], 0);
    assert_eq!(record.bar_sizes[1..], [0x1000, 0, 0, 0x4000, 0]);
    assert!(
        caps(record).contains(&u64::from(PCI_CAP_ID_MSIX)),
        "{record:?}"
    );
    assert!(
        caps(record).contains(&u64::from(PCI_CAP_ID_VNDR)),
        "{record:?}"
    );

    // The probe's clock, measured against the PM timer, is the vCPU's TSC that KVM reports
    // for exitless's probe, within 1%.
    let exitless_khz = run_probe_tsc_khz();
    let qemu_khz = f64::from(run.tsc_khz.expect("a calibrated TSC"));
    assert!(
        (qemu_khz / f64::from(exitless_khz) - 1.0).abs() < 0.01,
        "TSC {qemu_khz} kHz under QEMU, {exitless_khz} kHz under exitless"
    );
}

/// The TSC frequency exitless gives its probe (KVM_GET_TSC_KHZ).
fn run_probe_tsc_khz() -> u32 {
    let config = ProbeConfig {
        ops: vec![ops::ram_read_loop(1)],
        ..Default::default()
    };
    let run = run_probe(&config).expect("the probe runs under exitless");
    assert_eq!(run.results[0].status, STATUS_OK, "{:?}", run.results[0]);
    run.tsc_khz.expect("KVM reports it")
}

#[test]
fn msix_programming_enable_and_masks_work_on_qemus_virtio_net_and_sends_are_refused() {
    let Some(qemu) = qemu() else { return };
    let machine = QemuMachine {
        virtio_net: 1,
        queue_pairs: 32,
        ..QemuMachine::default()
    };
    let f = virtio_net_function(&machine, 0);
    let vectors = u64::from(machine.msix_vectors());
    assert_eq!(vectors, 65, "the seed's table size");
    let list = [
        ops::msix_program(f, 0x40, 0, true),
        ops::msix_control(f, PCI_MSIX_FLAGS_ENABLE),
        ops::msix_check(f, false),
        ops::msix_mask_each(f, true),
        ops::msix_check(f, false),
        ops::msix_mask_each(f, false),
        ops::msix_control(f, PCI_MSIX_FLAGS_ENABLE | PCI_MSIX_FLAGS_MASKALL),
        ops::msix_check(f, false),
        ops::msix_control(f, 0),
        ops::msix_check(f, false),
        // What only exitless's machine can do.
        ops::msix_check(f, true),
        ops::msix_latency(f, 0, 1, 1),
        ops::virtio_rr(32, 1),
        ops::hostile(1, 10),
        // A slot with no function.
        ops::msix_program(virtio_net_function(&machine, 5), 0x40, 0, true),
    ];
    let run = boot(&qemu, &machine, &list);
    for i in [0, 3, 5] {
        assert_eq!(ok(&run, i).value, vectors, "op {i}: every entry written");
    }
    for i in [2, 4, 7, 9] {
        let r = ok(&run, i);
        assert_eq!(r.value, vectors, "op {i}: every entry behaved");
        assert_eq!((r.irqs, r.stray_irqs), (0, 0), "op {i}: nothing was sent");
    }
    for i in [1, 6, 8] {
        assert!(ok(&run, i).cycles > 0, "op {i}: the control write is timed");
    }
    for i in 10..list.len() {
        assert_eq!(
            run.results[i].status, STATUS_UNSUPPORTED,
            "op {i}: {:?}",
            run.results[i]
        );
    }
}

#[test]
fn the_iommu_streams_run_through_qemus_intel_iommu_strict_and_deferred() {
    let Some(qemu) = qemu() else { return };
    // 300 frames: past the high-water mark of 250, so every deferred mode flushes at least once.
    let frames = 300;
    let bench = IommuBench {
        packets: frames,
        in_flight: 8,
        transactions: 1,
        // The seed's frames, and jumbo frames over three pages of each mapping.
        frame_sizes: vec![32, 9000],
        rounds: 1,
        timeout: LIMIT,
    };
    let plan = bench.peer_plan();
    let mut list = plan.ops.clone();
    list.push(ops::iommu_report(0));
    let run = boot(&qemu, &plan.machine, &list);
    println!("{}: {:?} for the run", qemu.version(), run.wall);

    // Every device came up (behind the unit: the probe found it in QEMU's DMAR and turned
    // translation on), every mode was taken.
    for i in 0..plan.ops.len() {
        ok(&run, i);
    }
    let names: Vec<&str> = plan.counterparts.iter().map(|c| &*c.variant).collect();
    assert_eq!(
        names,
        [
            "none",
            "strict",
            "deferred-list",
            "deferred-array",
            "per-domain",
            "linux-fq",
            "none-9000",
            "strict-9000",
            "deferred-list-9000",
            "deferred-array-9000"
        ]
    );
    for c in &plan.counterparts {
        assert_eq!(
            c.ops.len(),
            3,
            "{}: its median is of three streams",
            c.variant
        );
        for &i in &c.ops {
            assert_eq!(plan.ops[i].kind, OP_NET_STREAM, "{}", c.variant);
            // Behind the unit the rings and frames are at IOVAs from 4 GiB, where this machine
            // has no RAM: only translated DMA finds them.
            let r = ok(&run, i);
            assert_eq!(
                r.value, frames,
                "{} op {i}: every frame came back",
                c.variant
            );
            assert!(r.cycles > 0, "{} op {i}: timed", c.variant);
        }
    }
    assert_eq!(
        run.results[plan.ops.len()].status,
        STATUS_UNSUPPORTED,
        "the unit's counters are exitless's to read"
    );
}

#[test]
fn a_run_past_its_time_limit_is_killed_and_says_so() {
    let Some(qemu) = qemu() else { return };
    let limit = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let e = qemu
        .run_probe(&QemuMachine::default(), &[ops::ram_read_loop(1)], limit)
        .expect_err("SeaBIOS alone takes longer");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "killed at its limit"
    );
    assert!(
        matches!(e, PeerError::Timeout { limit: l, .. } if l == limit),
        "{e}"
    );
    assert!(e.to_string().contains("did not finish within 300ms"), "{e}");
}

#[test]
fn a_fault_under_qemu_ends_the_run_at_once_and_names_the_exception() {
    let Some(qemu) = qemu() else { return };
    // 1 TiB: beyond the probe's identity map (0-64 GiB, or 0-512 GiB in 1 GiB pages), so the
    // read takes a page fault, vector 14.
    let e = qemu
        .run_probe(
            &QemuMachine::default(),
            &[ops::mmio_read(1 << 40, 4)],
            LIMIT,
        )
        .expect_err("a page fault");
    assert!(
        matches!(&e, PeerError::Failed { status, .. } if status.code() == Some((14 << 1) | 1)),
        "{e}"
    );
    assert!(
        e.to_string().contains("status 0xe in the low 7 bits"),
        "{e}"
    );
}

/// `bench rr --against qemu`'s counterpart: the probe's virtio-pci driver brings up QEMU's
/// transitional virtio-net-pci (its structures in BAR 4, MSI-X in BAR 1, the MAC QEMU was
/// given in its config space) and does ICMP echo with the host's kernel through a tap behind
/// it, each reply on the receive vector and checked by the guest.
#[test]
fn icmp_echo_through_qemus_virtio_net_pci_on_a_tap_is_answered_by_the_host_kernel() {
    let Some(qemu) = qemu() else { return };
    let tap = match HostTap::create(TapLink::numbered("xl-rr-qemu", 2)) {
        Ok(tap) => tap,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let l = tap.link();
    // The bench's own machine for the comparison.
    let rr = RrBench {
        tap: Some(l.clone()),
        ..RrBench::default()
    };
    let machine = rr.peer_plan().expect("a plan").machine;
    let f = virtio_net_function(&machine, 0);
    let n = 200;
    let list = [
        ops::virtio_init(TRANSPORT_PCI, f.ecam_offset(), 0),
        ops::icmp_echo(l.host_ip, l.guest_ip, l.host_mac, 100, n),
        // A wrong MAC for the host: its kernel drops the frame, and nothing comes back.
        ops::icmp_echo(l.host_ip, l.guest_ip, [0x02, 0, 0, 0, 0, 9], 100, 1),
    ];
    let run = boot(&qemu, &machine, &list);
    ok(&run, 0);
    let r = ok(&run, 1);
    assert_eq!((r.value, r.bytes), (n, n * 100), "{r:?}");
    assert!(r.irqs >= n, "a receive interrupt per reply: {r:?}");
    // QEMU signals a queue's first used buffer whatever used_event says (hw/virtio/virtio.c,
    // `signalled_used_valid`): at most that one transmit interrupt.
    assert!(r.stray_irqs <= 1, "{r:?}");
    assert_eq!(
        run.results[2].status, STATUS_TIMEOUT,
        "{:?}",
        run.results[2]
    );
}

/// `bench rr --against qemu`'s vhost-user counterpart (issue 21): QEMU's virtio-net-pci on a
/// vhost-user netdev (guest RAM a shared memfd) served by DPDK testpmd's icmpecho, which
/// answers the probe's ICMP echo requests; every reply arrives on the receive vector, which
/// testpmd raises through the irqfd QEMU gave it. Skipped where testpmd is not installed.
#[test]
fn icmp_echo_through_qemus_vhost_user_virtio_net_pci_is_answered_by_testpmd() {
    let Some(qemu) = qemu() else { return };
    let Some(net) = testpmd(0) else { return };
    let n = 200;
    let rr = RrBench {
        vhost_user: Some(net.ports().clone()),
        transactions: n,
        ..RrBench::default()
    };
    let plan = rr.peer_plan().expect("a plan");
    let _polling = net.ports().polling();
    let run = boot(&qemu, &plan.machine, &plan.ops);
    ok(&run, 0);
    let khz = run.tsc_khz.expect("the TSC rate") as f64;
    for &i in &plan.counterparts[0].ops {
        let r = ok(&run, i);
        assert_eq!((r.value, r.bytes), (n, n * rr.request_size), "{r:?}");
        assert!(r.irqs >= n, "a receive interrupt per reply: {r:?}");
        let ns = r.cycles as f64 * 1e6 / khz / n as f64;
        println!(
            "qemu vhost-user echo {i}: {ns:.0} ns/transaction, {} irqs",
            r.irqs
        );
    }
}

/// `bench msix --against qemu`'s vhost-user counterpart (issue 21): 8 vhost-user
/// virtio-net-pci functions × 65 MSI-X vectors on one testpmd; each is brought up, its table
/// programmed, MSI-X enabled, and the first interrupt testpmd raises after Enable arrives.
#[test]
fn msix_enable_on_qemus_vhost_user_functions_then_testpmd_interrupts() {
    let Some(qemu) = qemu() else { return };
    let Some(net) = testpmd(8) else { return };
    let msix = MsixBench {
        devices: 8,
        queue_pairs: 32,
        timeout: LIMIT,
        rounds: 1,
        vhost_user: Some(net.ports().clone()),
    };
    let plan = msix.peer_plan();
    let _polling = net.ports().polling();
    let run = boot(&qemu, &plan.machine, &plan.ops);
    let khz = run.tsc_khz.expect("the TSC rate") as f64;
    let ms = |i: usize| ok(&run, i).cycles as f64 / khz;
    for c in plan
        .counterparts
        .iter()
        .filter(|c| c.variant.contains("vhost-user"))
    {
        let per_device: Vec<String> = c.ops.iter().map(|&i| format!("{:.3}", ms(i))).collect();
        println!("qemu {}: {} ms", c.variant, per_device.join(" "));
    }
    let first = plan.counterparts.last().expect("the first interrupt's");
    for &i in &first.ops {
        let r = ok(&run, i);
        assert!(
            r.irqs >= 1,
            "testpmd's reply raised the receive vector: {r:?}"
        );
    }
}
