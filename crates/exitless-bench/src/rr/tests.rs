//! `bench rr`'s unit tests: what each VMM is given to run.

use super::*;

#[test]
fn with_a_tap_the_request_is_one_unfragmented_icmp_packet_at_most() {
    let rr = |request_size, tap| RrBench {
        request_size,
        tap,
        ..RrBench::default()
    };
    let tap = Some(TapLink::bench());
    assert_eq!(rr(ICMP_MAX_PAYLOAD, tap.clone()).validate(), Ok(()));
    let e = rr(ICMP_MAX_PAYLOAD + 1, tap).validate().unwrap_err();
    assert!(
        e.starts_with("--request-size must be at most 1472 bytes"),
        "{e}"
    );
    // Without one, the built-in responder takes up to RR_MAX_REQUEST.
    assert_eq!(rr(RR_MAX_REQUEST, None).validate(), Ok(()));
}

#[test]
fn qemu_runs_the_same_echo_ops_on_its_function_behind_the_same_tap() {
    let link = TapLink::bench();
    let rr = RrBench {
        tap: Some(link.clone()),
        ..RrBench::default()
    };
    let plan = rr.peer_plan().expect("a plan");
    let f = crate::against::virtio_net_function(&plan.machine, 0);
    assert_eq!(plan.ops, rr.tap_ops(&link, f));
    assert_eq!(
        plan.ops[0],
        ops::virtio_init(TRANSPORT_PCI, f.ecam_offset(), 0)
    );
    let tap = plan.machine.tap.as_ref().expect("a tap backend");
    assert_eq!(
        (tap.ifname.as_str(), tap.mac),
        ("exitless-rr0", link.guest_mac)
    );
    let [c] = &plan.counterparts[..] else {
        panic!("one counterpart")
    };
    assert_eq!(c.variant, TAP_VARIANT);
    assert_eq!(c.ops, (1..=TAP_REPEATS).collect::<Vec<_>>());
    assert!(
        c.ops
            .iter()
            .all(|&i| plan.ops[i].kind == exitless::contract::OP_ICMP_ECHO)
    );
}

fn ports() -> VhostPorts {
    VhostPorts {
        pid: 0,
        rr_pci: "/s/rr-pci.sock".into(),
        rr_mmio: "/s/rr-mmio.sock".into(),
        msix: Vec::new(),
    }
}

#[test]
fn qemu_echoes_with_testpmd_on_a_vhost_user_function_after_the_tap_one() {
    let rr = RrBench {
        tap: Some(TapLink::bench()),
        vhost_user: Some(ports()),
        ..RrBench::default()
    };
    let plan = rr.peer_plan().expect("a plan");
    assert_eq!(plan.machine.virtio_net, 2);
    assert_eq!(plan.machine.vhost_user, [ports().rr_pci]);
    let [tap, vhost] = &plan.counterparts[..] else {
        panic!("two counterparts")
    };
    assert_eq!(
        (&*tap.variant, &*vhost.variant),
        (TAP_VARIANT, VHOST_PCI_VARIANT)
    );
    let f = crate::against::virtio_net_function(&plan.machine, 1);
    let init = TAP_REPEATS + 1;
    assert_eq!(
        plan.ops[init],
        ops::virtio_init(TRANSPORT_PCI, f.ecam_offset(), 0)
    );
    assert_eq!(
        vhost.ops,
        (init + 1..=init + TAP_REPEATS).collect::<Vec<_>>()
    );
    for &i in &vhost.ops {
        assert_eq!(plan.ops[i].kind, exitless::contract::OP_ICMP_ECHO);
        assert_eq!(
            plan.ops[i].value,
            u64::from_be_bytes({
                let mut b = [0; 8];
                b[2..].copy_from_slice(&BACKEND_MAC);
                b
            })
        );
    }
    // Without a tap the vhost-user function is the first; with neither, no QEMU boot.
    let alone = RrBench {
        vhost_user: Some(ports()),
        ..RrBench::default()
    };
    let plan = alone.peer_plan().expect("a plan");
    assert_eq!(
        plan.counterparts[0].ops,
        (1..=TAP_REPEATS).collect::<Vec<_>>()
    );
    assert!(RrBench::default().peer_plan().is_none());
}

#[test]
fn the_vhost_user_target_wants_no_exit_per_transaction() {
    let v = |name: &str, exits_per_op| Variant {
        name: name.into(),
        exits_per_op,
        ..Variant::default()
    };
    assert!(vhost_target(&[v("pci-msix-addr", 3.0)]).is_none());
    let met = vhost_target(&[v(VHOST_PCI_VARIANT, 0.0), v(VHOST_MMIO_VARIANT, 0.0)]);
    assert!(met.expect("a target").met);
    let missed = vhost_target(&[v(VHOST_PCI_VARIANT, 0.0), v(VHOST_MMIO_VARIANT, 0.5)]);
    let missed = missed.expect("a target");
    assert!(!missed.met);
    assert!(
        missed
            .measured
            .contains("mmio-msi-vhost-user: 0.50 exits/op")
    );
}
