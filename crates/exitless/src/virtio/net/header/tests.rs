use super::*;

/// Everything both ways.
fn all() -> Offloads {
    Offloads::negotiated(OFFLOAD_FEATURES)
}

/// A TCP segment over IPv4 as Linux's driver sends it: 14 + 20 + 32 bytes of headers, the
/// checksum at 16 past the TCP header, a 1448-byte MSS.
pub(crate) fn tso4() -> NetHeader {
    NetHeader {
        flags: NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 66,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    }
}

#[test]
fn a_header_reads_back_as_it_was_written_little_endian() {
    let header = NetHeader {
        num_buffers: 3,
        ..tso4()
    };
    let bytes = header.to_bytes();
    assert_eq!(bytes[..4], [1, 1, 66, 0]);
    assert_eq!(bytes[10..], [3, 0]);
    assert_eq!(NetHeader::from_bytes(&bytes), header);
}

#[test]
fn a_feature_counts_only_with_the_features_it_needs() {
    let bit = |b: u32| 1u64 << b;
    let tso_without_csum =
        Offloads::negotiated(bit(VIRTIO_NET_F_HOST_TSO4) | bit(VIRTIO_NET_F_GUEST_TSO6));
    assert_eq!(tso_without_csum, Offloads::default());
    let ecn_without_tso = Offloads::negotiated(bit(VIRTIO_NET_F_CSUM) | bit(VIRTIO_NET_F_HOST_ECN));
    assert!(ecn_without_tso.tx.csum && !ecn_without_tso.tx.ecn);
    let rx_only = Offloads::negotiated(bit(VIRTIO_NET_F_GUEST_CSUM) | bit(VIRTIO_NET_F_GUEST_TSO4));
    assert!(rx_only.rx.tso4 && !rx_only.tx.csum && !rx_only.rx.tso6);
    let all = all();
    for d in [all.tx, all.rx] {
        assert!(d.csum && d.tso4 && d.tso6 && d.ecn);
    }
}

#[test]
fn a_segment_the_driver_negotiated_goes_to_the_backend_unchanged_but_num_buffers() {
    let sent = NetHeader {
        num_buffers: 9,
        ..tso4()
    };
    assert_eq!(sent.for_backend(65_000, all().tx), Ok(tso4()));
    let ecn = NetHeader {
        gso_type: GSO_TCPV6 | GSO_ECN,
        ..tso4()
    };
    assert_eq!(ecn.for_backend(65_000, all().tx), Ok(ecn));
}

#[test]
fn a_plain_frame_passes_without_offloads_and_flags_the_device_does_not_act_on_are_cleared() {
    let none = Direction::default();
    assert_eq!(
        NetHeader::default().for_backend(60, none),
        Ok(NetHeader::default())
    );
    // DATA_VALID and RSC_INFO are the device's to set: ignored from the driver (§5.1.6.2.2).
    let odd = NetHeader {
        flags: DATA_VALID | 4,
        ..NetHeader::default()
    };
    assert_eq!(odd.for_backend(60, none), Ok(NetHeader::default()));
    // Without NEEDS_CSUM the checksum fields mean nothing and are not passed on.
    let stale = NetHeader {
        csum_start: 900,
        csum_offset: 900,
        ..NetHeader::default()
    };
    assert_eq!(stale.for_backend(60, none), Ok(NetHeader::default()));
}

#[test]
fn a_header_against_what_was_negotiated_or_past_its_frame_is_refused() {
    let tx = all().tx;
    let partial = NetHeader {
        gso_type: GSO_NONE,
        gso_size: 0,
        ..tso4()
    };
    let cases = [
        (
            partial,
            Direction::default(),
            1500,
            BadHeader::Flags(NEEDS_CSUM),
        ),
        (
            partial,
            tx,
            49,
            BadHeader::Checksum {
                start: 34,
                offset: 16,
                len: 49,
            },
        ),
        (
            NetHeader {
                csum_start: u16::MAX,
                csum_offset: u16::MAX,
                ..partial
            },
            tx,
            1500,
            BadHeader::Checksum {
                start: u16::MAX,
                offset: u16::MAX,
                len: 1500,
            },
        ),
        (
            tso4(),
            Direction { tso4: false, ..tx },
            65_000,
            BadHeader::GsoType(GSO_TCPV4),
        ),
        (
            NetHeader {
                gso_type: 3,
                ..tso4()
            },
            tx,
            65_000,
            BadHeader::GsoType(3),
        ),
        (
            NetHeader {
                gso_type: 5,
                ..tso4()
            },
            tx,
            65_000,
            BadHeader::GsoType(5),
        ),
        (
            NetHeader {
                gso_type: GSO_TCPV4 | GSO_ECN,
                ..tso4()
            },
            Direction { ecn: false, ..tx },
            65_000,
            BadHeader::GsoType(GSO_TCPV4 | GSO_ECN),
        ),
        (
            NetHeader {
                gso_type: GSO_ECN,
                ..tso4()
            },
            tx,
            65_000,
            BadHeader::GsoType(GSO_ECN),
        ),
        (
            NetHeader {
                gso_size: 0,
                ..tso4()
            },
            tx,
            65_000,
            BadHeader::Gso {
                gso_type: GSO_TCPV4,
                gso_size: 0,
                flags: NEEDS_CSUM,
            },
        ),
        (
            NetHeader { flags: 0, ..tso4() },
            tx,
            65_000,
            BadHeader::Gso {
                gso_type: GSO_TCPV4,
                gso_size: 1448,
                flags: 0,
            },
        ),
        (
            tso4(),
            tx,
            60,
            BadHeader::HdrLen {
                hdr_len: 66,
                len: 60,
            },
        ),
    ];
    for (header, offloads, len, why) in cases {
        assert_eq!(
            header.for_backend(len, offloads),
            Err(why.clone()),
            "{header:?}"
        );
    }
}

#[test]
fn the_driver_sees_checksum_flags_only_with_guest_csum_and_segments_only_it_negotiated() {
    let rx = all().rx;
    let valid = NetHeader {
        flags: DATA_VALID,
        ..NetHeader::default()
    };
    assert_eq!(
        valid.for_driver(60, rx),
        Ok(NetHeader {
            num_buffers: 1,
            ..valid
        })
    );
    assert_eq!(
        valid.for_driver(60, Direction::default()),
        Err(BadHeader::Flags(DATA_VALID))
    );
    // A segment the kernel checksummed comes DATA_VALID, not NEEDS_CSUM: taken.
    let checked = NetHeader {
        flags: DATA_VALID,
        csum_start: 0,
        csum_offset: 0,
        ..tso4()
    };
    assert!(checked.for_driver(65_000, rx).is_ok());
    assert_eq!(
        tso4().for_driver(65_000, Direction { tso4: false, ..rx }),
        Err(BadHeader::GsoType(GSO_TCPV4))
    );
    // No offloads: the header is zeros but num_buffers.
    let plain = NetHeader::default()
        .for_driver(60, Direction::default())
        .unwrap();
    assert_eq!(plain.to_bytes(), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
}

/// A UDP segment as Linux's driver sends it with HOST_USO (14 + 20 + 8 bytes of headers,
/// the checksum 6 into the UDP header, 1400-byte datagrams): passed on only with HOST_USO,
/// never with the ECN bit; toward the driver only with GUEST_USO4 or GUEST_USO6.
#[test]
fn a_udp_segment_passes_each_way_only_with_uso_negotiated() {
    let uso = NetHeader {
        flags: NEEDS_CSUM,
        gso_type: GSO_UDP_L4,
        hdr_len: 42,
        gso_size: 1400,
        csum_start: 34,
        csum_offset: 6,
        num_buffers: 0,
    };
    let with_uso = Offloads::negotiated(OFFLOAD_FEATURES | USO_FEATURES);
    assert!(with_uso.tx.uso4 && with_uso.tx.uso6 && with_uso.rx.uso4 && with_uso.rx.uso6);
    assert_eq!(uso.for_backend(14_042, with_uso.tx), Ok(uso));
    assert_eq!(
        uso.for_backend(14_042, all().tx),
        Err(BadHeader::GsoType(GSO_UDP_L4)),
        "TCP segmentation alone does not let UDP segments through"
    );
    let with_ecn = NetHeader {
        gso_type: GSO_UDP_L4 | GSO_ECN,
        ..uso
    };
    assert_eq!(
        with_ecn.for_backend(14_042, with_uso.tx),
        Err(BadHeader::GsoType(GSO_UDP_L4 | GSO_ECN))
    );
    let bit = |b: u32| 1u64 << b;
    let v6_only = Offloads::negotiated(bit(VIRTIO_NET_F_GUEST_CSUM) | bit(VIRTIO_NET_F_GUEST_USO6));
    assert!(v6_only.rx.uso6 && !v6_only.rx.uso4 && !v6_only.tx.uso4);
    assert!(uso.for_driver(14_042, v6_only.rx).is_ok());
    assert_eq!(
        uso.for_driver(14_042, all().rx),
        Err(BadHeader::GsoType(GSO_UDP_L4))
    );
    let uso_without_csum = Offloads::negotiated(bit(VIRTIO_NET_F_HOST_USO));
    assert!(!uso_without_csum.tx.uso4 && !uso_without_csum.tx.uso6);
}
