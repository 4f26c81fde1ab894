//! The tap backend against real taps (skipped where /dev/net/tun or CAP_NET_ADMIN is missing).

use super::*;

#[test]
fn names_that_are_no_interface_name_are_refused_before_any_system_call() {
    for name in [
        "",
        "sixteen-bytes-xx",
        "a/b",
        "a:b",
        "a b",
        "tap%d",
        ".",
        "..",
    ] {
        let e = Tap::open(name, false).err().expect("refused");
        assert!(matches!(e, TapError::Name(_)), "{name}: {e}");
    }
}

/// A unique tap name for this test process.
fn unique(tag: &str) -> String {
    format!("xl{tag}{}", std::process::id() % 100_000)
}

/// Opening a tap needs /dev/net/tun and CAP_NET_ADMIN; without them the test says so and
/// does nothing.
fn open_or_skip(name: &str, multi_queue: bool) -> Option<Tap> {
    match Tap::open(name, multi_queue) {
        Ok(t) => Some(t),
        Err(e @ (TapError::Open { .. } | TapError::Setup { .. })) if skippable(&e) => {
            eprintln!("skipped: cannot create a tap here: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn skippable(e: &TapError) -> bool {
    let source = match e {
        TapError::Open { source, .. } | TapError::Setup { source, .. } => source,
        TapError::Name(_) | TapError::Refused { .. } => return false,
    };
    matches!(
        source.raw_os_error(),
        Some(libc::ENOENT | libc::ENODEV | libc::EPERM | libc::EACCES)
    )
}

#[test]
fn a_second_open_of_a_single_queue_tap_is_busy_and_says_so() {
    let name = unique("b");
    let Some(_first) = open_or_skip(&name, false) else {
        return;
    };
    let e = Tap::open(&name, false).err().expect("busy");
    let line = e.to_string();
    assert!(
        line.contains(&format!("cannot open tap {name} (TUNSETIFF)")),
        "{line}"
    );
    assert!(line.contains("busy"), "{line}");
}

#[test]
fn a_multi_queue_tap_opens_once_per_queue_pair() {
    let name = unique("m");
    let Some(first) = open_or_skip(&name, true) else {
        return;
    };
    let second = Tap::open(&name, true).expect("a second queue");
    assert_ne!(first.wake_fd(), second.wake_fd());
    let e = Tap::open(&name, false).err().expect("not multi-queue");
    assert!(e.to_string().contains("multi_queue"), "{e}");
}

/// The kernel spreads a multiqueue tap's frames over its attached queues: a detached
/// queue leaves the interface's queue count (sysfs), and comes back when attached again.
#[test]
fn a_disabled_pair_detaches_its_queue_and_an_enabled_one_attaches_it() {
    let name = unique("q");
    let Some(_first) = open_or_skip(&name, true) else {
        return;
    };
    let mut second = Tap::open(&name, true).expect("a second queue");
    let rx_queues = || {
        std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with("rx-")
            })
            .count()
    };
    assert_eq!(rx_queues(), 2);
    second.set_enabled(false);
    assert_eq!(rx_queues(), 1, "detached");
    second.set_enabled(true);
    assert_eq!(rx_queues(), 2, "attached again");
}

/// A live update hands a multiqueue tap's queues on as they are: a detached one stays detached
/// until its pair is enabled again, and a file of another tap is refused.
#[test]
fn queues_handed_over_keep_whether_they_are_attached() {
    let name = unique("h");
    let Some(first) = open_or_skip(&name, true) else {
        return;
    };
    let mut second = Tap::open(&name, true).expect("a second queue");
    second.set_enabled(false);
    let files = vec![
        first.duplicate(&name).unwrap(),
        second.duplicate(&name).unwrap(),
    ];
    let mut adopted = Tap::adopt_queues(&name, files).unwrap();
    assert!(adopted[0].attached && !adopted[1].attached);
    adopted[1].set_enabled(true);
    let attached = queue_of(adopted[1].file(), &name, true).unwrap();
    assert!(attached, "attached again by its new owner");
    let other = unique("o");
    let e = Tap::adopt_queues(&other, vec![first.duplicate(&name).unwrap()]).err();
    let e = e.expect("another tap's file refused").to_string();
    assert!(e.contains(&format!("not a queue of tap {other}")), "{e}");
    // One queue of a multiqueue tap is not a single-queue tap.
    let e = Tap::adopt_queues(&name, vec![first.duplicate(&name).unwrap()]).err();
    let e = e
        .expect("a multiqueue tap's queue alone refused")
        .to_string();
    assert!(e.contains(&format!("not a queue of tap {name}")), "{e}");
}

/// The interface's flags as sysfs shows them.
fn sysfs_flags(name: &str) -> u32 {
    let flags = std::fs::read_to_string(format!("/sys/class/net/{name}/flags")).unwrap();
    u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap()
}

/// The kernel makes a tap down; one the queues created is brought up, while one that
/// existed is left down, as its owner set it.
#[test]
fn a_tap_the_queues_create_is_up_and_one_that_existed_is_left_as_it_was() {
    let up = libc::IFF_UP.cast_unsigned();
    let created = unique("c");
    let Some(_held) = open_or_skip(&created, true) else {
        return;
    };
    assert_eq!(sysfs_flags(&created) & up, 0, "made down");
    let _queues = Tap::open_queues(&created, 2).expect("two more queues");
    assert_eq!(sysfs_flags(&created) & up, 0, "left down");
    let new = unique("n");
    let queues = Tap::open_queues(&new, 2).expect("a new tap");
    assert_eq!(queues.len(), 2);
    assert_eq!(sysfs_flags(&new) & up, up, "brought up");
}

/// TUNSETIFF's EINVAL, explained by what the kernel shows: a tun is not a tap, a
/// multiqueue tap needs queues=N, a reserved name is no interface at all.
#[test]
fn a_refused_name_says_why_from_what_the_kernel_shows() {
    let name = unique("r");
    let Some(_held) = open_or_skip(&name, true) else {
        return;
    };
    let e = Tap::open(&name, false).err().expect("multi_queue differs");
    assert!(e.to_string().contains("made with multi_queue"), "{e}");
    let e = Tap::open("all", false).err().expect("reserved");
    assert!(
        e.to_string().contains("the kernel reserves the name"),
        "{e}"
    );
}

/// With the tap down nothing is queued for it: a read finds nothing and does not block,
/// and a frame written is dropped (EIO), not an error of the device.
#[test]
fn a_tap_whose_link_is_down_receives_nothing_and_drops_what_is_sent() {
    let name = unique("d");
    let Some(mut tap) = open_or_skip(&name, false) else {
        return;
    };
    assert_eq!(tap.pending(), None);
    let mem =
        vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(vm_memory::GuestAddress(0), 0x1000)])
            .unwrap();
    let dma = crate::dma::DmaContext::platform(mem);
    let mut frame = Segments::default();
    dma.resolve(
        vm_memory::GuestAddress(0),
        60,
        crate::dma::Access::Read,
        &mut frame,
    )
    .unwrap();
    assert!(!tap.transmit(NetHeader::default(), &frame));
}

/// A raw packet socket on the interface `name` (packet(7)), for the host's side.
fn packet_socket(name: &str) -> OwnedFd {
    let all = u16::try_from(libc::ETH_P_ALL).unwrap().to_be();
    // SAFETY: socket() takes no pointers.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(all),
        )
    };
    check(fd).unwrap();
    // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data, for which all zeros is a valid value.
    let mut at: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    at.sll_family = u16::try_from(libc::AF_PACKET).unwrap();
    at.sll_protocol = all;
    let cname = std::ffi::CString::new(name).unwrap();
    // SAFETY: `cname` is a NUL-terminated string.
    at.sll_ifindex = i32::try_from(unsafe { libc::if_nametoindex(cname.as_ptr()) }).unwrap();
    let len = u32::try_from(std::mem::size_of::<libc::sockaddr_ll>()).unwrap();
    // SAFETY: `at` is a sockaddr_ll of `len` bytes.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const at).cast(), len) }).unwrap();
    fd
}

/// The length of the first frame the packet socket `host` receives into `buf` for which
/// `wanted` holds (the kernel's own frames on the new interface are let go), within about
/// five seconds: a frame that never comes fails the test instead of hanging it.
fn received(host: &OwnedFd, buf: &mut [u8], wanted: impl Fn(&[u8]) -> bool) -> Option<usize> {
    (0..500).find_map(|_| {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe {
            let flags = libc::MSG_DONTWAIT;
            libc::recv(host.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags)
        };
        match usize::try_from(n) {
            Ok(n) if wanted(&buf[..n]) => Some(n),
            Ok(_) => None,
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                None
            }
        }
    })
}

/// Guest memory of two adjacent regions, and the `len` bytes at 0xfe0 resolved: pieces
/// on both sides of the boundary.
fn scattered(len: usize) -> (vm_memory::GuestMemoryMmap, Segments) {
    use vm_memory::GuestAddress;
    let mem = vm_memory::GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 0x1000),
        (GuestAddress(0x1000), 0x1000),
    ])
    .unwrap();
    let dma = crate::dma::DmaContext::platform(mem.clone());
    let mut io = Segments::default();
    dma.resolve(GuestAddress(0xfe0), len, crate::dma::Access::Read, &mut io)
        .unwrap();
    assert_eq!(io.iovecs().len(), 2);
    (mem, io)
}

/// A frame of the local experimental EtherType 0x88b5, so that the kernel's own frames on
/// the new interface are told apart.
fn test_frame() -> Vec<u8> {
    let mut frame = vec![0xff; 6];
    frame.extend([0x02, 0, 0, 0, 0, 0x42, 0x88, 0xb5]);
    frame.extend((0..50u8).map(|i| i.wrapping_mul(7)));
    frame
}

/// The one queue of a tap `name` that `open_queues` creates and brings up, as a device's;
/// None (said) where this host lets no tap be made.
fn created_or_skip(name: &str) -> Option<Tap> {
    match Tap::open_queues(name, 1) {
        Ok(mut queues) => queues.pop(),
        Err(e) if skippable(&e) => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// The guest's buffers go to the tap as they are (one writev, two pieces here) and the
/// host sees the frame whole; a frame from the host lands in scattered receive buffers.
#[test]
fn frames_go_out_of_and_come_in_from_scattered_guest_buffers_whole() {
    use vm_memory::{Bytes, GuestAddress};
    let name = unique("w");
    let Some(mut tap) = created_or_skip(&name) else {
        return;
    };
    let host = packet_socket(&name);
    let frame = test_frame();
    let (mem, io) = scattered(frame.len());
    mem.write_slice(&frame, GuestAddress(0xfe0)).unwrap();
    assert!(tap.transmit(NetHeader::default(), &io));
    let mut got = vec![0u8; 2048];
    let n = received(&host, &mut got, |f| {
        f.len() >= 14 && f[12..14] == [0x88, 0xb5]
    })
    .expect("the frame reached the host");
    assert_eq!(&got[..n], &frame[..]);

    let mut reply: Vec<u8> = frame.iter().map(|b| !b).collect();
    reply[12..14].copy_from_slice(&[0x88, 0xb5]);
    // SAFETY: `reply` is readable for its length.
    let sent = unsafe { libc::send(host.as_raw_fd(), reply.as_ptr().cast(), reply.len(), 0) };
    assert_eq!(usize::try_from(sent).unwrap(), reply.len());
    let (mem, io) = scattered(reply.len() + 4);
    let len = (0..500)
        .find_map(|_| match tap.pending() {
            Some(n) if tap.buf[HDR + 12..HDR + 14] == [0x88, 0xb5] => Some(n),
            Some(_) => {
                tap.discard();
                None
            }
            None => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                None
            }
        })
        .expect("the host's frame reached the tap");
    assert_eq!(len, reply.len());
    tap.deliver(&io, 4);
    let mut landed = vec![0u8; len];
    mem.read_slice(&mut landed, GuestAddress(0xfe4)).unwrap();
    assert_eq!(landed, reply);
    assert_eq!(tap.pending(), None, "delivered, not held");
}

/// An ethtool(8) setting of the interface `name` that reads as one value (SIOCETHTOOL with a
/// `struct ethtool_value`: ETHTOOL_GTXCSUM 0x16, ETHTOOL_GTSO 0x1e in linux/ethtool.h).
fn ethtool_value(name: &str, cmd: u32) -> u32 {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut value = EthtoolValue { cmd, data: 0 };
    let mut req = ifreq(name);
    req.ifr_ifru.ifru_data = (&raw mut value).cast();
    let control = Control::new().unwrap();
    // SAFETY: SIOCETHTOOL reads the ifreq and writes the ethtool_value its data points to.
    check(unsafe { libc::ioctl(control.0.as_raw_fd(), libc::SIOCETHTOOL, &mut req) }).unwrap();
    value.data
}

/// What the driver takes is what the kernel may hand over: the tap's checksum and TSO
/// offloads (its netdev's features, as ethtool shows them) follow set_offloads, and are off
/// as the tap is opened.
#[test]
fn the_taps_offloads_follow_what_the_driver_takes() {
    const GTXCSUM: u32 = 0x16;
    const GTSO: u32 = 0x1e;
    let name = unique("o");
    let Some(mut tap) = open_or_skip(&name, false) else {
        return;
    };
    assert!(tap.passes_headers());
    let seen = |name: &str| (ethtool_value(name, GTXCSUM), ethtool_value(name, GTSO));
    assert_eq!(seen(&name), (0, 0), "nothing before the driver says");
    let all = Direction {
        csum: true,
        tso4: true,
        tso6: true,
        ecn: true,
        uso4: tap.passes_uso(),
        uso6: tap.passes_uso(),
    };
    tap.set_offloads(all);
    assert_eq!(seen(&name), (1, 1));
    tap.set_offloads(Direction {
        csum: true,
        ..Direction::default()
    });
    assert_eq!(seen(&name), (1, 0));
    tap.set_offloads(Direction::default());
    assert_eq!(seen(&name), (0, 0), "a reset takes them away");
}

/// UDP port the USO test's segments go to, so the kernel's own frames are told apart.
const USO_PORT: u16 = 47_011;

/// An Ethernet frame holding one UDP segment of `segments` datagrams of `gso_size` bytes
/// to [`USO_PORT`] (IPv4, 10.99.0.1 to 10.99.0.2), its UDP checksum left for the other side
/// (the pseudo-header's sum in place, as a sender's stack leaves it), and the virtio-net
/// header that says so.
fn udp_segment(segments: usize, gso_size: u16) -> (NetHeader, Vec<u8>) {
    let payload = segments * usize::from(gso_size);
    let udp_len = u16::try_from(8 + payload).unwrap();
    let ip_len = 20 + udp_len;
    let header = NetHeader {
        flags: 1,    // NEEDS_CSUM
        gso_type: 5, // GSO_UDP_L4
        hdr_len: 42,
        gso_size,
        csum_start: 34,
        csum_offset: 6,
        num_buffers: 0,
    };
    let mut frame = vec![0x02, 0, 0, 0, 0, 0x43];
    frame.extend([0x02, 0, 0, 0, 0, 0x42, 0x08, 0x00]);
    let (src, dst) = ([10, 99, 0, 1], [10, 99, 0, 2]);
    let mut ip = vec![0x45, 0];
    ip.extend(ip_len.to_be_bytes());
    ip.extend([0, 0, 0x40, 0, 64, 17, 0, 0]);
    ip.extend(src);
    ip.extend(dst);
    let sum = |words: &[u8], start: u32| {
        let mut sum = words
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>()
            + start;
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        u16::try_from(sum).unwrap()
    };
    let ip_check = !sum(&ip, 0);
    ip[10..12].copy_from_slice(&ip_check.to_be_bytes());
    frame.extend(ip);
    let pseudo = [&src[..], &dst[..], &[0, 17], &udp_len.to_be_bytes()].concat();
    frame.extend(40_000u16.to_be_bytes());
    frame.extend(USO_PORT.to_be_bytes());
    frame.extend(udp_len.to_be_bytes());
    frame.extend(sum(&pseudo, 0).to_be_bytes());
    frame.extend((0..payload).map(|i| u8::try_from(i % 251).unwrap()));
    (header, frame)
}

/// A packet socket on the tap `name` that sends and receives the virtio-net header in front
/// of each frame (packet(7): PACKET_VNET_HDR, the 10-byte header without `num_buffers`).
fn vnet_packet_socket(name: &str) -> OwnedFd {
    let host = packet_socket(name);
    let on: libc::c_int = 1;
    let len = u32::try_from(std::mem::size_of::<libc::c_int>()).unwrap();
    // SAFETY: PACKET_VNET_HDR reads one int, which `on` is.
    check(unsafe {
        libc::setsockopt(
            host.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            (&raw const on).cast(),
            len,
        )
    })
    .unwrap();
    host
}

/// The frames the tap hands over to [`USO_PORT`] within a second: each one's header and
/// length; the others (the kernel's own) let go.
fn udp_frames_from(tap: &mut Tap) -> Vec<(NetHeader, usize)> {
    let mut got = Vec::new();
    for _ in 0..100 {
        match tap.pending() {
            Some(n) => {
                let frame = &tap.buf[HDR..HDR + n];
                let udp = n > 42 && frame[12..14] == [0x08, 0x00] && frame[23] == 17;
                if udp && frame[36..38] == USO_PORT.to_be_bytes() {
                    got.push((tap.held_header(), n));
                }
                tap.discard();
            }
            None => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
    got
}

/// A tap made for the test `tag` whose kernel carries UDP segments, and a packet socket on it
/// that passes virtio-net headers; None (said) where no tap can be made or the kernel's taps
/// take no UDP segments (before Linux 6.2).
fn uso_tap_or_skip(tag: &str) -> Option<(Tap, OwnedFd)> {
    let name = unique(tag);
    let tap = created_or_skip(&name)?;
    if !tap.passes_uso() {
        eprintln!("skipped: this kernel's taps take no UDP segments (Linux 6.2)");
        return None;
    }
    Some((tap, vnet_packet_socket(&name)))
}

/// With the driver taking UDP segments (GUEST_USO4 and GUEST_USO6) the kernel hands a segment
/// over whole, its header saying GSO UDP_L4 with the segment size; with one of them, or the
/// checksum offload alone, it cuts it into datagrams first. Skipped on a kernel whose taps
/// take no UDP segments (before Linux 6.2), where the device does not offer USO.
#[test]
fn a_udp_segment_comes_whole_only_to_a_driver_that_takes_uso() {
    let Some((mut tap, host)) = uso_tap_or_skip("u") else {
        return;
    };
    let send = |frame: &[u8]| {
        // SAFETY: `frame` is readable for its length.
        let sent = unsafe { libc::send(host.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            usize::try_from(sent).ok(),
            Some(frame.len()),
            "{}",
            io::Error::last_os_error()
        );
    };
    let (header, frame) = udp_segment(4, 1000);
    let segment = [&header.to_bytes()[..10], &frame[..]].concat();
    let uso = Direction {
        csum: true,
        uso4: true,
        uso6: true,
        ..Direction::default()
    };
    tap.set_offloads(uso);
    send(&segment);
    let whole = udp_frames_from(&mut tap);
    assert_eq!(whole.len(), 1, "one frame: {whole:?}");
    let (header, len) = whole[0];
    assert_eq!((header.gso_type, header.gso_size, len), (5, 1000, 4042));
    for rx in [
        Direction { uso6: false, ..uso },
        Direction {
            csum: true,
            ..Direction::default()
        },
    ] {
        tap.set_offloads(rx);
        send(&segment);
        let cut = udp_frames_from(&mut tap);
        let cut: Vec<(u8, usize)> = cut.iter().map(|(h, n)| (h.gso_type, *n)).collect();
        assert_eq!(cut, vec![(0, 1042); 4], "{rx:?}: four datagrams");
    }
}

/// A UDP segment the driver sends (HOST_USO) reaches the host whole, as one frame with GSO
/// UDP_L4 and its segment size in its header, for the host's stack to cut. Skipped where the
/// kernel's taps take no UDP segments (before Linux 6.2; the kernel refuses the frame).
#[test]
fn a_udp_segment_the_driver_sends_reaches_the_host_whole() {
    use vm_memory::{Bytes, GuestAddress};
    let Some((mut tap, host)) = uso_tap_or_skip("s") else {
        return;
    };
    let (header, frame) = udp_segment(4, 1000);
    let mem = vm_memory::GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x2000)]).unwrap();
    mem.write_slice(&frame, GuestAddress(0)).unwrap();
    let dma = crate::dma::DmaContext::platform(mem.clone());
    let mut io = Segments::default();
    dma.resolve(
        GuestAddress(0),
        frame.len(),
        crate::dma::Access::Read,
        &mut io,
    )
    .unwrap();
    assert!(tap.transmit(header, &io), "the kernel took the segment");
    let mut got = vec![0u8; 10 + 0x2000];
    let n = received(&host, &mut got, |f| {
        f.len() > 48 && f[10 + 36..10 + 38] == USO_PORT.to_be_bytes()
    })
    .expect("the segment reached the host");
    let mut raw = [0u8; HDR];
    raw[..10].copy_from_slice(&got[..10]);
    let seen = NetHeader::from_bytes(&raw);
    assert_eq!(
        (seen.gso_type, seen.gso_size, n - 10),
        (5, 1000, frame.len())
    );
    assert_eq!(&got[10 + 42..n], &frame[42..], "the payload whole");
}
