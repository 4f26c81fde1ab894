//! `exitless run`'s devices as the test kernel drives them: virtio-blk disks and virtio-net
//! cards on both transports (the file holds what the guest wrote; a tap's frames reach the
//! host's kernel, in a network namespace of the test's own), and the refusals a tap can get.

use std::process::Command;

use crate::common::testkernel::*;

/// Disks on both transports join the machine without disturbing the kernel's checks.
#[test]
fn disks_on_both_transports_join_the_machine() {
    // Two images: one image is never two disks.
    let disks = ["a", "b"].map(|n| {
        let name = format!("exitless-run-disk-{n}-{}", std::process::id());
        let disk = std::env::temp_dir().join(name);
        std::fs::write(&disk, vec![0u8; 64 << 10]).unwrap();
        disk
    });
    let ro = format!("{},ro,transport=mmio", disks[1].display());
    passes(&["--disk", disks[0].to_str().unwrap(), "--disk", &ro], "");
    for disk in disks {
        std::fs::remove_file(disk).unwrap();
    }
}

/// A tap another process holds is busy: one line that says so, status 2, no guest run. The
/// test holds a tap of its own (the kernel makes it, and removes it when the test lets go).
#[test]
fn a_tap_another_process_holds_is_refused_in_one_line() {
    let name = format!("xlbusy{}", std::process::id() % 100_000);
    let _held = match exitless::virtio::net::tap::Tap::open(&name, false) {
        Ok(tap) => tap,
        Err(why) => {
            println!("skipped: cannot make a tap here: {why}");
            return;
        }
    };
    let elf = kernel("testkernel.elf");
    let ran = exitless_run(
        &[
            "--kernel",
            elf.to_str().unwrap(),
            "--net",
            &format!("tap={name}"),
        ],
        b"",
    );
    assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
    assert_eq!(
        ran.stderr,
        format!(
            "exitless: error: cannot open tap {name} (TUNSETIFF): Device or resource busy \
             (os error 16) (busy: another process has it open)\n"
        )
    );
    assert_eq!(ran.stdout, "", "no guest ran");
}

/// `vhost=on` on a host without the kernel's vhost-net: one line that says what to do, status
/// 2, no guest run, and no tap left made (the file is opened before the tap).
#[test]
fn vhost_on_without_the_kernels_vhost_net_is_refused_in_one_line() {
    if std::path::Path::new("/dev/vhost-net").exists() {
        println!("skipped: this host has /dev/vhost-net (the Linux lab runs vhost=on)");
        return;
    }
    let name = format!("xlvh{}", std::process::id() % 100_000);
    let elf = kernel("testkernel.elf");
    let net = format!("tap={name},vhost=on");
    let ran = exitless_run(&["--kernel", elf.to_str().unwrap(), "--net", &net], b"");
    assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
    assert_eq!(
        ran.stderr,
        "exitless: error: cannot open /dev/vhost-net: No such file or directory (os error 2); \
         load the vhost_net module (modprobe vhost_net) and give exitless access to it, or drop \
         vhost=on\n"
    );
    assert_eq!(ran.stdout, "", "no guest ran");
    assert!(
        !std::path::Path::new("/sys/class/net").join(&name).exists(),
        "the tap {name} was made before the refusal"
    );
}

/// Network devices without a link (`--net none`) on both transports join the machine.
#[test]
fn network_devices_without_a_link_join_the_machine() {
    passes(
        &["--net", "none", "--net", "none,transport=mmio,queues=2"],
        "",
    );
}

/// The test kernel drives a virtio-blk disk as a driver does: a write, a flush, a read back,
/// the ID and a read past the end; the file holds the written sector afterwards.
#[test]
fn the_test_kernel_writes_flushes_and_reads_its_disk() {
    drives_its_disk(
        "",
        "",
        "PASS disk: a virtio-blk function on bus 0 (00:03.0)",
        "virtio-pci.00:03.0",
    );
}

/// The same driver on virtio-mmio (virtio 1.2 §4.2, version 2): the disk is found in the
/// window the command line names.
#[test]
fn the_test_kernel_drives_its_disk_on_virtio_mmio() {
    drives_its_disk(
        ",transport=mmio",
        FIRST_MMIO_WINDOW,
        "PASS disk: a virtio-blk device at virtio-mmio e0100000",
        "virtio-mmio.0",
    );
}

/// `disk=1` (and `more` on the command line) on a disk with `options`, found as `found` says,
/// named `device` in the log.
fn drives_its_disk(options: &str, more: &str, found: &str, device: &str) {
    // One file per test (they run at once); the ID is the name's first 20 bytes, the same.
    let name = format!("exitless-guest-disk-{}-{device}", std::process::id());
    let disk = std::env::temp_dir().join(name);
    std::fs::write(&disk, vec![0u8; 16 << 10]).unwrap();
    let elf = kernel("testkernel.elf");
    let cmdline = format!("disk=1 {more}");
    let disk_arg = format!("{}{options}", disk.display());
    let args = ["--kernel", elf.to_str().unwrap(), "--cmdline", &cmdline];
    let ran = exitless_run(&[&args[..], &["--disk", &disk_arg]].concat(), b"");
    // The read past the end is the guest's error, counted and logged.
    assert_passed_saying(
        &ran,
        &format!(
            "exitless: warn: {device}: virtio-blk: 512 bytes at sector 32 are past the disk's \
             32 sectors\n"
        ),
    );
    for line in [
        found,
        "PASS disk: FEATURES_OK, 32 sectors",
        "PASS disk: sector 1 written, status 0",
        "PASS disk: flushed, status 0",
        "PASS disk: sector 1 read back, status 0",
        "PASS disk: ID 'exitless-guest-disk-', status 0", // the file's name, 20 bytes of it
        "PASS disk: a read past the end answered IOERR (status 1)",
    ] {
        assert!(ran.stdout.contains(line), "{line:?} in:\n{}", ran.stdout);
    }
    let file = std::fs::read(&disk).unwrap();
    std::fs::remove_file(&disk).unwrap();
    assert_eq!(
        file[512..1024],
        pattern(1)[..],
        "the guest's sector reached the file"
    );
    assert_eq!(file.len(), 16 << 10, "the file keeps its size");
}

/// A network namespace of this test run, deleted on drop (its taps with it), however the test
/// ends.
struct NetNamespace {
    name: String,
}

const GUEST_IP: &str = "10.0.2.15";
const PEER_IP: &str = "10.0.2.2";
const PEER_MAC: &str = "02:00:00:00:00:02";

impl NetNamespace {
    /// An empty namespace named after this test process and `tag`, or why it cannot be made
    /// here (no iproute2, not root).
    fn empty(tag: &str) -> Result<Self, String> {
        let name = format!("exitless-{tag}-{}", std::process::id());
        ip(&["netns", "add", &name])?;
        Ok(NetNamespace { name })
    }

    /// `ip -n NS ARGS` for each step, in order.
    fn ip(&self, steps: &[&[&str]]) -> Result<(), String> {
        for step in steps {
            ip(&[&["-n", &self.name][..], step].concat())?;
        }
        Ok(())
    }

    /// A namespace with the tap `tap` in it whose host side has `PEER_IP` and `PEER_MAC`, up.
    fn with_tap(tap: &str) -> Result<Self, String> {
        let ns = NetNamespace::empty("net")?;
        // From here on the namespace exists, and `ns` deletes it if a step fails.
        ns.ip(&[
            &["tuntap", "add", "dev", tap, "mode", "tap"],
            &["addr", "add", &format!("{PEER_IP}/24"), "dev", tap],
            &["link", "set", tap, "address", PEER_MAC],
            &["link", "set", tap, "up"],
        ])?;
        Ok(ns)
    }

    /// A namespace with no tap, `PEER_IP` on its loopback interface: the host's kernel
    /// answers ARP requests for any of its addresses on any interface (arp_ignore 0, Linux
    /// `Documentation/networking/ip-sysctl.rst`), so on a tap the run creates as soon as that
    /// tap is up.
    fn with_peer_on_lo(tag: &str) -> Result<Self, String> {
        let ns = NetNamespace::empty(tag)?;
        ns.ip(&[
            &["addr", "add", &format!("{PEER_IP}/32"), "dev", "lo"],
            &["link", "set", "lo", "up"],
        ])?;
        Ok(ns)
    }

    /// The test kernel in the namespace, sending its ARP request for `PEER_IP` from the
    /// virtio-net device `--net NET`.
    fn run_arp(&self, net: &str) -> Ran {
        self.run_arp_saying(net, "")
    }

    /// The same, with `more` on the test kernel's command line.
    fn run_arp_saying(&self, net: &str, more: &str) -> Ran {
        let elf = kernel("testkernel.elf");
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.name,
            env!("CARGO_BIN_EXE_exitless"),
            "run",
        ])
        .arg("--kernel")
        .arg(&elf)
        .args([
            "--cmdline",
            &format!("net=1 ip={GUEST_IP} peer={PEER_IP} {more}"),
        ])
        .args(["--net", net]);
        run_command(cmd, b"", LIMIT)
    }
}

impl Drop for NetNamespace {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

/// `ip ARGS`: its output, or its error.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Frames really reach the host's network stack: in a network namespace of its own, the test
/// kernel sends an ARP request for the tap's host-side address from its virtio-net device,
/// the host's kernel answers it, and the guest checks the answer: from the peer's address, to
/// its own MAC and address, and carrying the MAC the test gave the tap, which only the host's
/// kernel knew.
#[test]
fn a_frame_the_guest_sends_on_a_tap_is_answered_by_the_host_kernel() {
    let tap = "xltap0";
    let ns = match NetNamespace::with_tap(tap) {
        Ok(ns) => ns,
        Err(why) => {
            println!("skipped: cannot make a network namespace with a tap here: {why}");
            return;
        }
    };
    let guest_mac = "52:54:00:12:34:56";
    let ran = ns.run_arp(&format!("tap={tap},mac={guest_mac}"));
    assert_passed(&ran);
    for line in [
        "PASS net: a virtio-net function on bus 0 (00:03.0)",
        &format!("PASS net: FEATURES_OK, MAC {guest_mac}"),
        &format!("PASS net: ARP request for {PEER_IP} sent from {GUEST_IP}"),
        &format!("PASS net: ARP reply: {PEER_IP} is at {PEER_MAC}"),
    ] {
        assert!(
            results(&ran.stdout).contains(&line),
            "{line}:\n{}",
            ran.stdout
        );
    }
}

/// The same exchange through a virtio-net card on virtio-mmio.
#[test]
fn a_frame_the_guest_sends_from_a_virtio_mmio_card_is_answered_by_the_host_kernel() {
    let tap = "xltapm0";
    let ns = match NetNamespace::with_tap(tap) {
        Ok(ns) => ns,
        Err(why) => {
            println!("skipped: cannot make a network namespace with a tap here: {why}");
            return;
        }
    };
    let ran = ns.run_arp_saying(
        &format!("tap={tap},mac=52:54:00:12:34:57,transport=mmio"),
        FIRST_MMIO_WINDOW,
    );
    assert_passed(&ran);
    for line in [
        "PASS net: a virtio-net device at virtio-mmio e0100000",
        &format!("PASS net: ARP reply: {PEER_IP} is at {PEER_MAC}"),
    ] {
        assert!(
            results(&ran.stdout).contains(&line),
            "{line}:\n{}",
            ran.stdout
        );
    }
}

/// A namespace for taps the run creates (`tag` tells the tests' apart), or `None` after saying
/// why there is none here.
fn namespace_for_new_taps(tag: &str) -> Option<NetNamespace> {
    NetNamespace::with_peer_on_lo(tag)
        .map_err(|why| println!("skipped: cannot make a network namespace here: {why}"))
        .ok()
}

/// The MAC the test kernel found in its virtio-net device's configuration space.
fn guest_mac(ran: &Ran) -> &str {
    let prefix = "PASS net: FEATURES_OK, MAC ";
    let line = results(&ran.stdout)
        .into_iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no MAC in:\n{}\n{}", ran.stdout, ran.stderr));
    &line[prefix.len()..]
}

/// A tap the run creates is brought up (its addresses stay the user's business): the guest's
/// ARP request reaches the host's kernel and its answer comes back. The one line on stderr
/// is the MAC exitless chose.
#[test]
fn a_tap_the_run_creates_is_up_and_the_host_kernel_answers_on_it() {
    let Some(ns) = namespace_for_new_taps("up") else {
        return;
    };
    let ran = ns.run_arp("tap=xlnew0");
    let mac = guest_mac(&ran);
    assert_passed_saying(
        &ran,
        &format!("exitless: tap xlnew0: the guest's MAC is {mac} (mac= sets another)\n"),
    );
}

/// Each tap gives its device a MAC of its own, so VMs on one bridge do not collide, and the
/// same one on every run, so the guest's leases and neighbour entries stay valid: locally
/// administered and unicast (IEEE 802-2014 §8.2: bit 1 of the first byte set, bit 0 clear).
#[test]
fn each_tap_gives_the_guest_a_mac_of_its_own_the_same_on_every_run() {
    let Some(ns) = namespace_for_new_taps("mac") else {
        return;
    };
    let mac_on = |tap: &str| guest_mac(&ns.run_arp(&format!("tap={tap}"))).to_owned();
    let first = mac_on("xlmac0");
    assert_eq!(first, mac_on("xlmac0"), "the same tap, the same MAC");
    assert_ne!(first, mac_on("xlmac1"), "another tap, another MAC");
    let byte0 = u8::from_str_radix(&first[..2], 16).unwrap();
    assert_eq!(byte0 & 0b11, 0b10, "{first}: locally administered, unicast");
}

/// Names that are no tap get the kernel's reason: `all` and `default` are reserved (they name
/// /proc/sys/net/ipv4/conf's settings for every interface and for new ones), `lo` exists and
/// is not a tap. Without /dev/net/tun or CAP_NET_ADMIN the test says so and checks nothing.
#[test]
fn names_that_are_no_tap_are_refused_with_the_kernels_reason() {
    let elf = kernel("testkernel.elf");
    for (name, says) in [
        ("all", "the kernel reserves the name"),
        ("default", "the kernel reserves the name"),
        ("lo", "a device of that name exists and is not a tap"),
    ] {
        let net = format!("tap={name}");
        let ran = exitless_run(&["--kernel", elf.to_str().unwrap(), "--net", &net], b"");
        assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
        if ran.stderr.contains("CAP_NET_ADMIN") || ran.stderr.contains("no TUN/TAP driver") {
            println!("skipped: cannot make a tap here: {}", ran.stderr);
            return;
        }
        assert!(
            ran.stderr.starts_with(&format!(
                "exitless: error: cannot open tap {name} (TUNSETIFF): "
            )) && ran.stderr.contains(says)
                && ran.stderr.lines().count() == 1,
            "{name}: {}",
            ran.stderr
        );
    }
}
