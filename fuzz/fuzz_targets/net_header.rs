#![no_main]
//! The virtio-net header checks (virtio 1.2 §5.1.6) over arbitrary headers, frame lengths and
//! negotiated features, both ways. Beyond "no panic": a header let through to the backend
//! asks only for what the driver negotiated and points inside its frame, and one let
//! through to the driver carries only what the driver takes.

use exitless::virtio::net::header::{Direction, NetHeader, Offloads};
use libfuzzer_sys::fuzz_target;

/// NEEDS_CSUM, DATA_VALID; GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4, GSO_ECN (§5.1.6).
const NEEDS_CSUM: u8 = 1;
const DATA_VALID: u8 = 2;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
const GSO_UDP_L4: u8 = 5;
const GSO_ECN: u8 = 0x80;

/// What a passed header may ask of its receiver, against `offloads` and a `len`-byte frame.
fn within(header: &NetHeader, len: usize, offloads: Direction, flags: u8) {
    assert_eq!(header.flags & !flags, 0, "{header:?}");
    assert!(header.flags == 0 || offloads.csum, "{header:?} {offloads:?}");
    if header.flags & NEEDS_CSUM != 0 {
        let end = usize::from(header.csum_start) + usize::from(header.csum_offset) + 2;
        assert!(end <= len, "{header:?} {len}");
    }
    assert!(usize::from(header.hdr_len) <= len, "{header:?} {len}");
    match header.gso_type & !GSO_ECN {
        0 => assert_eq!(header.gso_type, 0, "{header:?}"),
        GSO_TCPV4 => assert!(offloads.tso4 && header.gso_size > 0, "{header:?}"),
        GSO_TCPV6 => assert!(offloads.tso6 && header.gso_size > 0, "{header:?}"),
        GSO_UDP_L4 => assert!(
            (offloads.uso4 || offloads.uso6) && header.gso_size > 0,
            "{header:?}"
        ),
        _ => panic!("{header:?} passed"),
    }
    if header.gso_type & GSO_ECN != 0 {
        assert!(offloads.ecn, "{header:?}");
        assert_ne!(header.gso_type & !GSO_ECN, GSO_UDP_L4, "{header:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((raw, rest)) = data.split_first_chunk::<12>() else {
        return;
    };
    let Some((features, rest)) = rest.split_first_chunk::<8>() else {
        return;
    };
    let len = rest
        .first_chunk::<2>()
        .map_or(0, |b| usize::from(u16::from_le_bytes(*b)));
    let offloads = Offloads::negotiated(u64::from_le_bytes(*features));
    let header = NetHeader::from_bytes(raw);
    assert_eq!(NetHeader::from_bytes(&header.to_bytes()), header);
    if let Ok(out) = header.for_backend(len, offloads.tx) {
        within(&out, len, offloads.tx, NEEDS_CSUM);
        assert_eq!(out.num_buffers, 0);
    }
    if let Ok(out) = header.for_driver(len, offloads.rx) {
        within(&out, len, offloads.rx, NEEDS_CSUM | DATA_VALID);
        assert_eq!(out.num_buffers, 1);
    }
});
