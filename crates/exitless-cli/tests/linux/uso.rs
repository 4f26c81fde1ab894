//! UDP segmentation offload (USO, virtio 1.2 §5.1.6.2: HOST_USO, GUEST_USO4/6) on a tap, in
//! process and on the kernel's vhost-net: offered where the outer VM's taps carry UDP segments
//! (Linux 6.2 and later, `EXITLESS_LAB_KERNEL=linux-image-6.12-amd64`) and taken by a guest
//! whose virtio_net has it (Debian's 6.12 here: the lab's usual guest, 6.1, has none). The
//! host sends UDP segments of eight 1000-byte datagrams (a socket with `UDP_SEGMENT`); with
//! USO the guest's card receives each whole, one frame per segment, and its UDP stack takes
//! it whole, its checksum good; without, the host's kernel cuts them and every datagram is a
//! frame. Either way every byte arrives. On an outer kernel without USO on its taps, the case
//! checks that the card does not offer it. In process and on the kernel's vhost-net.

use std::time::Duration;

use crate::guest::{Guest, Job, Run, exitless_command};
use crate::lab::Lab;
use crate::net::{network, tap};

/// Debian's kernel for this case's guest: its virtio_net driver takes USO (Linux 6.2).
const GUEST_KERNEL: &str = "linux-image-6.12-amd64";

/// How many segments the host sends, and the datagrams in each.
const SEGMENTS: u32 = 50;
const DATAGRAMS: u32 = 8;

/// The guest's side, after [`network`]'s: the frames and bytes its card received while the
/// host sent (the job sends once the guest says it is ready; the guest gives it 20 s), and
/// the datagrams its UDP stack took, checksums checked, to port 9, where nothing listens
/// (UDP's NoPorts: counted per buffer the stack gets, a whole segment counting once).
const RECEIVE: &str = r#"
noports() { awk '/^Udp: [0-9]/ { print $3 }' /proc/net/snmp; }
rp=$(stat rx_packets) rb=$(stat rx_bytes) np=$(noports)
echo "GUEST uso_ready"
sleep 20
echo "GUEST uso_rx_frames $(( $(stat rx_packets) - rp ))"
echo "GUEST uso_rx_bytes $(( $(stat rx_bytes) - rb ))"
echo "GUEST uso_udp_buffers $(( $(noports) - np ))"
"#;

/// The host's sender: python3 (in the outer VM, from this host's root) with UDP_SEGMENT
/// (103, udp(7)) at 1000 bytes, each `sendto` one segment of `DATAGRAMS` datagrams.
fn sender(to: &str) -> String {
    format!(
        "python3 -c 'import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_UDP, 103, 1000)
for i in range({SEGMENTS}): s.sendto(bytes({}), (\"{to}\", 9))'",
        DATAGRAMS * 1000
    )
}

/// The bits of USO in a device's `features` (one character per bit).
const USO_BITS: [usize; 3] = [54, 55, 56];

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn udp_segments_reach_a_linux_guest_whole_where_the_tap_carries_them() {
    let Some(lab) = Lab::or_skip("uso") else {
        return;
    };
    let mut job = Job::new("uso");
    let script = format!("{}\n{RECEIVE}", network(9));
    let guest = Guest::with_kernel(&job.dir, "uso", &script, &[], GUEST_KERNEL);
    job.sh("uname -r > outer-kernel");
    job.sh(&tap("lab-tap9", 9, ""));
    let to = "10.0.9.15";
    for (name, vhost) in [("uso", ""), ("uso-vhost", ",vhost=on")] {
        let run = exitless_command(
            &guest,
            "",
            &format!("--memory 512 --cpus 2 --net tap=lab-tap9{vhost}"),
        );
        job.start_exitless_until(name, &run, "uso_ready");
        job.sh(&format!(
            "[ -e {name}.status ] || {{ ping -c 1 -W 5 {to} > /dev/null; {}; wait $guest; echo $? > {name}.status; }}",
            sender(to)
        ));
    }
    job.sh("ip link del lab-tap9");
    let done = job.run(&lab, Duration::from_secs(900));
    let outer = std::fs::read_to_string(done.dir.join("outer-kernel")).unwrap_or_default();
    let carried = tap_carries_uso(outer.trim());
    println!(
        "uso: the outer kernel {} {} UDP segments on its taps",
        outer.trim(),
        if carried { "carries" } else { "does not carry" }
    );
    for name in ["uso", "uso-vhost"] {
        let run = done.run(name);
        run.expect_done(0);
        expect_uso(&run, carried);
    }
}

/// Whether a kernel of release `release` (`6.12.57+deb13-amd64`) carries UDP segments on a
/// tap: 6.2 and later.
fn tap_carries_uso(release: &str) -> bool {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (6, 2)
}

/// Every byte reached the guest's card and every segment its UDP stack; with USO negotiated
/// (`carried`), each segment in one frame and taken whole by the stack, else not offered and
/// each datagram on its own.
fn expect_uso(run: &Run, carried: bool) {
    let number = |key: &str| -> u32 {
        run.value(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{}: no {key}; {}", run.name, run.tail()))
    };
    let (frames, bytes, buffers) = (
        number("uso_rx_frames"),
        number("uso_rx_bytes"),
        number("uso_udp_buffers"),
    );
    println!(
        "{}: {frames} frames, {bytes} bytes, {buffers} UDP buffers ({SEGMENTS} segments of {DATAGRAMS} datagrams sent)",
        run.name
    );
    assert!(
        bytes >= SEGMENTS * DATAGRAMS * 1000,
        "{}: {bytes} bytes",
        run.name
    );
    let features = run.value("features").unwrap_or_default().as_bytes();
    let offered = USO_BITS.map(|bit| features.get(bit) == Some(&b'1'));
    if carried {
        run.expect_features("features", &USO_BITS);
        assert_eq!(buffers, SEGMENTS, "{}: each segment whole", run.name);
        // The ping's echo and an ARP or two besides the segments.
        assert!(
            frames < SEGMENTS + 10,
            "{}: {frames} frames for {SEGMENTS} segments",
            run.name
        );
    } else {
        assert_eq!(offered, [false; 3], "{}: USO not offered", run.name);
        assert_eq!(buffers, SEGMENTS * DATAGRAMS, "{}: each datagram", run.name);
        assert!(
            frames >= SEGMENTS * DATAGRAMS,
            "{}: {frames} frames",
            run.name
        );
    }
}

#[test]
fn a_kernel_from_6_2_carries_udp_segments_on_a_tap() {
    assert!(tap_carries_uso("6.12.57+deb13-amd64"));
    assert!(tap_carries_uso("6.2.0"));
    assert!(!tap_carries_uso("6.1.0-57-amd64"));
    assert!(!tap_carries_uso("5.19.3"));
    assert!(!tap_carries_uso(""));
}
