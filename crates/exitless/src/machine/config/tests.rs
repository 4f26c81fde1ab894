//! `--disk` and `--net` as `exitless run` parses them, and the MACs a device gets.

use super::*;

/// A tap's MAC is pinned here: a guest keeps its MAC across exitless versions too.
#[test]
fn a_taps_mac_is_its_names_and_prints_as_mac_takes_it() {
    assert_eq!(format_mac(tap_mac("tap0")), "52:54:00:50:e6:72");
    assert_eq!(format_mac(tap_mac("tap1")), "52:54:00:51:e7:ad");
    let printed = format_mac(tap_mac("br0-vm7"));
    assert_eq!(parse_mac(&printed), Ok(tap_mac("br0-vm7")));
}

fn disk(arg: &str) -> Result<DiskConfig, ConfigSyntaxError> {
    DiskConfig::parse(OsStr::new(arg))
}

fn vhost_user(socket: &str, queues: u16, reconnect: Option<u64>) -> VhostUserConfig {
    VhostUserConfig {
        socket: socket.into(),
        queues,
        reconnect: reconnect.map(std::time::Duration::from_secs),
    }
}

#[test]
fn a_vhost_user_disk_is_a_socket_with_queues_transport_and_reconnect() {
    let plain = disk("vhost-user=/run/qsd.sock").unwrap();
    assert_eq!(
        plain,
        DiskConfig {
            path: PathBuf::new(),
            read_only: false,
            locking: false,
            transport: Transport::Pci,
            queues: None,
            aio: DiskAio::IoUring,
            vhost_user: Some(vhost_user("/run/qsd.sock", 1, None)),
        }
    );
    let all = disk("vhost-user=/run/a,,b.sock,queues=4,transport=mmio,reconnect=5").unwrap();
    assert_eq!(all.transport, Transport::Mmio);
    assert_eq!(
        all.vhost_user,
        Some(vhost_user("/run/a,b.sock", 4, Some(5)))
    );
    let once_only = disk("vhost-user=s,reconnect=0").unwrap();
    assert_eq!(once_only.vhost_user, Some(vhost_user("s", 1, None)));
    // A file whose name starts with the keyword is still an image, written as a path.
    let file = disk("./vhost-user=x,ro").unwrap();
    assert_eq!(
        (file.path, file.read_only, file.vhost_user),
        ("./vhost-user=x".into(), true, None)
    );
}

#[test]
fn an_image_has_one_queue_per_vcpu_unless_told_and_an_older_snapshots_disk_had_one() {
    assert_eq!(disk("disk.img").unwrap().queues, None, "one per vCPU");
    assert_eq!(disk("disk.img,queues=4").unwrap().queues, Some(4));
    let mut saved = serde_json::to_value(DiskConfig::new("disk.img")).unwrap();
    saved.as_object_mut().unwrap().remove("queues");
    let old: DiskConfig = serde_json::from_value(saved).unwrap();
    assert_eq!(old.queues, Some(1));
    assert_eq!(old.aio, DiskAio::IoUring);
}

#[test]
fn an_image_takes_aio_io_uring_or_sync_and_a_vhost_user_disk_neither() {
    assert_eq!(disk("disk.img").unwrap().aio, DiskAio::IoUring);
    assert_eq!(disk("disk.img,aio=sync").unwrap().aio, DiskAio::Sync);
    assert_eq!(disk("disk.img,aio=io_uring").unwrap().aio, DiskAio::IoUring);
    assert!(
        disk("disk.img,aio=native")
            .unwrap_err()
            .to_string()
            .starts_with(
                "unknown option `aio=native` (ro, locking=on|off, queues=N, aio=io_uring|sync,"
            )
    );
    assert!(
        disk("vhost-user=s,aio=sync")
            .unwrap_err()
            .to_string()
            .starts_with("`aio` does not go with vhost-user")
    );
}

#[test]
fn a_vhost_user_net_device_takes_the_options_of_the_others_and_reconnect() {
    let net: VirtioNetConfig =
        "vhost-user=/run/tp.sock,mac=52:54:00:00:00:09,queues=2,transport=mmio,reconnect=10"
            .parse()
            .unwrap();
    assert_eq!(
        net,
        VirtioNetConfig {
            transport: Transport::Mmio,
            notify: NotifyPath::Datamatch,
            queue_pairs: 2,
            backend: NetBackendKind::VhostUser(vhost_user("/run/tp.sock", 2, Some(10))),
            mac: Some([0x52, 0x54, 0, 0, 0, 9]),
            vectors: None,
            vhost_net: false,
        }
    );
    let plain: VirtioNetConfig = "vhost-user=s".parse().unwrap();
    assert_eq!(
        plain.backend,
        NetBackendKind::VhostUser(vhost_user("s", 1, None))
    );
    assert_eq!((plain.transport, plain.queue_pairs), (Transport::Pci, 1));
}

#[test]
fn vhost_on_puts_a_taps_queues_on_the_kernels_vhost_net() {
    let on: VirtioNetConfig = "tap=t0,vhost=on,queues=2".parse().unwrap();
    assert_eq!(on.backend, NetBackendKind::Tap("t0".into()));
    assert!(on.vhost_net);
    assert_eq!(on.queue_pairs, 2);
    let off: VirtioNetConfig = "tap=t0,vhost=off".parse().unwrap();
    assert!(!off.vhost_net);
    let plain: VirtioNetConfig = "tap=t0".parse().unwrap();
    assert!(!plain.vhost_net);
}

/// Every refusal is the one line the user sees, saying what to write instead.
#[test]
fn bad_vhost_user_options_get_one_line_each() {
    let disks = [
        (
            "vhost-user=",
            "vhost-user= needs the backend's socket: vhost-user=SOCKET",
        ),
        (
            "vhost-user=,queues=2",
            "vhost-user= needs the backend's socket: vhost-user=SOCKET",
        ),
        (
            "vhost-user=s,ro",
            "`ro` does not go with vhost-user: the backend opens the image and decides \
             (qemu-storage-daemon's --export writable=on|off, its own locking)",
        ),
        (
            "vhost-user=s,locking=off",
            "`locking` does not go with vhost-user",
        ),
        ("vhost-user=s,queues=0", "queues=0: 1 to 255 queues"),
        ("vhost-user=s,queues=256", "queues=256: 1 to 255 queues"),
        ("vhost-user=s,queues=many", "queues=many: 1 to 255 queues"),
        (
            "vhost-user=s,reconnect=1.5",
            "reconnect=1.5: whole seconds, 0 (try once, at the driver's reset) to 3600",
        ),
        (
            "vhost-user=s,reconnect=3601",
            "reconnect=3601: whole seconds",
        ),
        (
            "vhost-user=s,bogus",
            "unknown option `bogus` (queues=N, transport=pci|mmio, reconnect=SECONDS)",
        ),
        (
            "vhost-user=s,transport=usb",
            "unknown option `transport=usb` (queues=N",
        ),
        ("vhost-user=s,queues=2,queues=3", "`queues` given twice"),
        ("disk.img,queues=0", "queues=0: 1 to 255 queues"),
        ("disk.img,queues=2,queues=2", "`queues` given twice"),
        (
            "disk.img,reconnect=5",
            "`reconnect=5`: for vhost-user devices only",
        ),
        (
            "disk.img,bogus",
            "unknown option `bogus` (ro, locking=on|off, queues=N, aio=io_uring|sync, transport=pci|mmio;",
        ),
    ];
    let nets = [
        ("vhost-user=", "vhost-user= needs the backend's socket"),
        (
            "vhost-user=s,ro",
            "unknown option `ro` (mac=MAC, queues=N, vectors=N, transport=pci|mmio, reconnect=SECONDS)",
        ),
        (
            "vhost-user=s,queues=128",
            "queues=128: 1 to 127 queue pairs",
        ),
        ("vhost-user=s,reconnect=x", "reconnect=x: whole seconds"),
        (
            "none,reconnect=5",
            "`reconnect=5`: for vhost-user devices only",
        ),
        (
            "tap=t0,reconnect=5",
            "`reconnect=5`: for vhost-user devices only",
        ),
        (
            "none,speed=10",
            "unknown option `speed=10` (mac=MAC, queues=N, vectors=N, transport=pci|mmio, vhost=on|off)",
        ),
        (
            "none,vhost=on",
            "vhost=on is for tap=NAME: the kernel's vhost-net moves a tap's frames",
        ),
        ("tap=t0,vhost=yes", "unknown option `vhost=yes`"),
        ("tap=t0,vhost=on,vhost=off", "`vhost` given twice"),
        (
            "vhost-user=s,vhost=on",
            "unknown option `vhost=on` (mac=MAC, queues=N, vectors=N, transport=pci|mmio, reconnect=SECONDS)",
        ),
        (
            "vhost=s",
            "`vhost=s`: tap=NAME or none first, or vhost-user=SOCKET",
        ),
        ("none,", "unknown option ``"),
    ];
    let results = disks
        .iter()
        .map(|&(arg, says)| (arg, disk(arg).map(|_| ()), says))
        .chain(
            nets.iter()
                .map(|&(arg, says)| (arg, arg.parse::<VirtioNetConfig>().map(|_| ()), says)),
        );
    for (arg, result, says) in results {
        let line = result.expect_err(arg).to_string();
        assert!(
            line.starts_with(says) && !line.contains('\n'),
            "{arg}: {line}"
        );
    }
}

#[test]
fn a_machine_has_vhost_user_when_any_disk_or_nic_does() {
    let mut cfg = MachineConfig::default();
    cfg.virtio.push("tap=t0".parse().unwrap());
    cfg.disks.push(disk("disk.img").unwrap());
    assert!(!cfg.has_vhost_user());
    let mut with_nic = cfg.clone();
    with_nic.virtio.push("vhost-user=n.sock".parse().unwrap());
    assert!(with_nic.has_vhost_user());
    cfg.disks.push(disk("vhost-user=d.sock").unwrap());
    assert!(cfg.has_vhost_user());
}

/// `vectors=N` sizes the MSI-X table apart from the queues, on every backend, in any order
/// among the options; without it the table is the queues' and the configuration's.
#[test]
fn vectors_sizes_a_pci_nics_msix_table_on_every_backend() {
    let sizes = [
        ("none", 3),
        ("none,queues=4", 9),
        ("none,vectors=65", 65),
        ("tap=t0,vectors=9,queues=4", 9),
        ("vhost-user=s,vectors=65", 65),
        ("vhost-user=s,transport=pci,vectors=256", 256),
    ];
    for (arg, size) in sizes {
        let net: VirtioNetConfig = arg.parse().expect(arg);
        assert_eq!(net.msix_vectors(), Ok(size), "{arg}");
    }
    let net: VirtioNetConfig = "vhost-user=s,vectors=65".parse().unwrap();
    assert_eq!((net.vectors, net.queue_pairs), (Some(65), 1));
    // A config built in code gets the same check when the machine is wired.
    let mmio = VirtioNetConfig {
        vectors: Some(65),
        ..VirtioNetConfig::new(Transport::Mmio, NotifyPath::Datamatch)
    };
    assert_eq!(mmio.msix_vectors(), Err(ConfigSyntaxError::VectorsOnMmio));
}

#[test]
fn vectors_too_few_for_the_queues_too_many_or_on_mmio_get_one_line_each() {
    let refused = [
        (
            "none,vectors=2",
            "vectors=2: 3 (2 × queue pairs + 1) to 256, or leave it out for 3",
        ),
        // queues= after vectors= still counts.
        (
            "none,vectors=8,queues=4",
            "vectors=8: 9 (2 × queue pairs + 1)",
        ),
        (
            "vhost-user=s,vectors=257",
            "vectors=257: 3 (2 × queue pairs + 1) to 256",
        ),
        ("tap=t0,vectors=0", "vectors=0: 3"),
        (
            "none,vectors=many",
            "vectors=many: a number, 2 × queue pairs + 1 to 256",
        ),
        ("none,vectors=70000", "vectors=70000: a number"),
        (
            "none,vectors=65,transport=mmio",
            "vectors= is for transport=pci: a virtio-mmio device has one vector per queue",
        ),
        (
            "vhost-user=s,transport=mmio,vectors=3",
            "vectors= is for transport=pci",
        ),
        ("none,vectors=3,vectors=5", "`vectors` given twice"),
    ];
    for (arg, says) in refused {
        let line = arg.parse::<VirtioNetConfig>().expect_err(arg).to_string();
        assert!(
            line.starts_with(says) && !line.contains('\n'),
            "{arg}: {line}"
        );
    }
}
