//! The vhost-user frontend against an in-process backend ([`backend`]), through a virtio-pci
//! function on the in-memory fakes: what the backend is told at DRIVER_OK, the call-fd swap at
//! mask and unmask, resets, hangups and reconnection, and the one-line errors.

#![allow(clippy::cast_possible_truncation)] // fixtures

mod backend;
mod multiqueue;
mod persist;

use std::fs::File;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend as _, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::fakes::{FakeIoEvents, FakeRoutes};
use crate::irq::CommitStrategy;
use crate::logging::DeviceLog;
use crate::pci::config::{ConfigSpace, ConfigWindow};
use crate::pci::function::PciFunction;
use crate::pci::regs::*;
use crate::virtio::notify::NotifyPath;
use crate::virtio::regs::*;
use crate::virtio::transport::TransportEnv;
use crate::virtio::transport::pci::VirtioPci;
use backend::{Quirks, Record};

/// 1 MiB of guest RAM in a memfd, as `vm::RamBacking::SharedMemfd` maps it.
fn shared_memory() -> GuestMemoryMmap {
    // SAFETY: memfd_create takes a NUL-terminated name and flags, and returns a new fd.
    let fd = unsafe { libc::memfd_create(c"exitless-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(1 << 20).unwrap();
    let at = FileOffset::new(file, 0);
    GuestMemoryMmap::from_ranges_with_files([(GuestAddress(0), 1 << 20, Some(at))]).unwrap()
}

/// A socket path of its own for each test.
fn socket() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::SeqCst);
    std::env::temp_dir().join(format!("exitless-vu-{}-{n}.sock", std::process::id()))
}

fn spec(socket: PathBuf, kind: VhostUserKind) -> VhostUserSpec {
    VhostUserSpec {
        socket,
        kind,
        queues: 1,
        reconnect: None,
    }
}

const NET: VhostUserKind = VhostUserKind::Net {
    mac: [2, 0, 0, 0, 0, 1],
};
/// Where the driver puts queue `q`'s rings.
fn rings(q: u64) -> [u64; 3] {
    [
        0x10000 * (q + 1),
        0x10000 * (q + 1) + 0x1000,
        0x10000 * (q + 1) + 0x2000,
    ]
}

/// A virtio-net function on a fake backend, and what the test looks at.
struct Rig {
    /// Its queue pairs.
    pairs: u16,
    f: VirtioPci,
    _worker: crate::virtio::worker::Worker,
    c: ConfigSpace,
    routes: Arc<FakeRoutes>,
    record: Arc<Mutex<Record>>,
    mem: GuestMemoryMmap,
    path: PathBuf,
}

fn rig(strategy: CommitStrategy, quirks: Quirks) -> Rig {
    rig_with(strategy, quirks, None)
}

/// A rig whose device tries to connect again for `reconnect` after a hangup.
fn rig_with(strategy: CommitStrategy, quirks: Quirks, reconnect: Option<Duration>) -> Rig {
    rig_of(
        strategy,
        quirks,
        VhostUserSpec {
            reconnect,
            ..spec(PathBuf::new(), NET)
        },
    )
}

/// A rig of the card `spec` (its socket a new one): a vector per queue and one for
/// configuration changes, the last.
fn rig_of(strategy: CommitStrategy, quirks: Quirks, spec: VhostUserSpec) -> Rig {
    let path = socket();
    let record = backend::serve(&path, quirks);
    let mem = shared_memory();
    let spec = VhostUserSpec {
        socket: path,
        ..spec
    };
    let pairs = spec.queues;
    let path = spec.socket.clone();
    let parts = connect(&spec, &mem).unwrap();
    let routes = Arc::new(FakeRoutes::with_strategy(strategy));
    let env = TransportEnv {
        ioevents: Arc::new(FakeIoEvents::default()),
        routes: routes.clone(),
        mem: mem.clone(),
        iommu: None,
        log: DeviceLog::new("vhost-user-test"),
    };
    let vectors = 2 * usize::from(pairs) + 1 + usize::from(spec.control_queue());
    let (mut f, worker) = VirtioPci::new(env, parts, 0x18, vectors, NotifyPath::Address).unwrap();
    let layout = f.config_layout(0x02_00_00);
    let window = Arc::new(ConfigWindow::new(1).unwrap());
    let c = ConfigSpace::new(window, 0, &layout, &[0xc000_0000])
        .unwrap()
        .0;
    f.attached(&c);
    Rig {
        pairs,
        f,
        _worker: worker,
        c,
        routes,
        record,
        mem,
        path,
    }
}

impl Rig {
    fn write(&mut self, offset: u32, len: usize, v: u32) {
        self.f
            .bar_write(&self.c, 0, u64::from(offset), &v.to_le_bytes()[..len]);
    }

    fn read(&mut self, offset: u32, len: usize) -> u32 {
        let mut b = [0u8; 4];
        self.f
            .bar_read(&self.c, 0, u64::from(offset), &mut b[..len]);
        u32::from_le_bytes(b)
    }

    /// Mask or unmask MSI-X entry `v`.
    fn mask(&mut self, v: u32, masked: bool) {
        let at = VIRTIO_PCI_BAR_MSIX_TABLE + v * PCI_MSIX_ENTRY_SIZE + PCI_MSIX_ENTRY_VECTOR_CTRL;
        self.write(at, 4, u32::from(masked));
    }

    /// What a driver does up to DRIVER_OK: Bus Master, MSI-X entries programmed and
    /// unmasked, MSI-X enabled, VERSION_1 negotiated (and MQ with the control queue where
    /// there are several pairs), every queue set up on a vector of its own (queue q on q),
    /// configuration changes on the last.
    fn start_driver(&mut self) {
        self.driver_ok();
        self.wait_for("SET_VRING_ENABLE 1 true");
        self.wait_for(&format!("SET_VRING_KICK {}", 2 * self.pairs - 1));
    }

    /// The driver's steps of [`Rig::start_driver`], without waiting for the backend.
    fn driver_ok(&mut self) {
        self.c
            .set_u16(PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
        self.f.config_written(&self.c, PCI_COMMAND, 2);
        let queues = self.queues();
        for v in 0..=queues {
            let entry = VIRTIO_PCI_BAR_MSIX_TABLE + v * PCI_MSIX_ENTRY_SIZE;
            self.write(entry + PCI_MSIX_ENTRY_LOWER_ADDR, 4, 0xfee0_0000);
            self.write(entry + PCI_MSIX_ENTRY_DATA, 4, 0x40 + v);
            self.mask(v, false);
        }
        let cap = self.c.find_capability(PCI_CAP_ID_MSIX).unwrap();
        self.c.set_u16(cap + PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE);
        self.f.config_written(&self.c, cap + PCI_MSIX_FLAGS, 2);
        let s = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
        self.write(VIRTIO_PCI_COMMON_STATUS, 1, s);
        self.write(VIRTIO_PCI_COMMON_GFSELECT, 4, 1);
        self.write(VIRTIO_PCI_COMMON_GF, 4, 1 << (VIRTIO_F_VERSION_1 - 32));
        if self.pairs > 1 {
            self.write(VIRTIO_PCI_COMMON_GFSELECT, 4, 0);
            self.write(VIRTIO_PCI_COMMON_GF, 4, multiqueue::MQ_FEATURES);
        }
        self.write(VIRTIO_PCI_COMMON_STATUS, 1, s | VIRTIO_STATUS_FEATURES_OK);
        self.write(VIRTIO_PCI_COMMON_MSIX, 2, queues);
        for q in 0..queues {
            self.write(VIRTIO_PCI_COMMON_Q_SELECT, 2, q);
            let [desc, avail, used] = rings(u64::from(q));
            self.write(VIRTIO_PCI_COMMON_Q_DESCLO, 4, desc as u32);
            self.write(VIRTIO_PCI_COMMON_Q_AVAILLO, 4, avail as u32);
            self.write(VIRTIO_PCI_COMMON_Q_USEDLO, 4, used as u32);
            self.write(VIRTIO_PCI_COMMON_Q_MSIX, 2, q);
            self.write(VIRTIO_PCI_COMMON_Q_ENABLE, 2, 1);
        }
        let ok = s | VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK;
        self.write(VIRTIO_PCI_COMMON_STATUS, 1, ok);
    }

    /// Its queues: two a pair, and the control queue with several pairs.
    fn queues(&self) -> u32 {
        let pairs = u32::from(self.pairs);
        2 * pairs + u32::from(pairs > 1)
    }

    fn log(&self) -> Vec<String> {
        self.record.lock().unwrap().log.clone()
    }

    /// Wait (up to 5 s) for the backend to have been told `line`, `n` times in all.
    fn wait_n(&self, line: &str, n: usize) {
        told(&self.record, line, n);
    }

    fn wait_for(&self, line: &str) {
        self.wait_n(line, 1);
    }

    fn calls(&self) -> usize {
        self.log()
            .iter()
            .filter(|l| *l == "SET_VRING_CALL 0")
            .count()
    }

    /// Signal the call fd the backend holds for queue 0, as the backend does.
    fn backend_signals(&self) {
        let rec = self.record.lock().unwrap();
        let mut call = rec.call.as_ref().expect("a call fd");
        call.write_all(&1u64.to_ne_bytes()).unwrap();
    }

    /// Whether the backend's call fd of queue 0 is `irqfd` (a count written on one is read
    /// from the other).
    fn backend_holds(&self, irqfd: &EventFd) -> bool {
        // Messages sent through the irqfd so far are read first.
        let _ = self.routes.take_delivered();
        let rec = self.record.lock().unwrap();
        let mut call = rec.call.as_ref().expect("a call fd");
        call.write_all(&7u64.to_ne_bytes()).unwrap();
        irqfd.read().ok() == Some(7)
    }

    fn status(&mut self) -> u32 {
        self.read(VIRTIO_PCI_COMMON_STATUS, 1)
    }
}

/// Wait (up to 5 s) for the backend of `record` to have been told `line`, `n` times in all.
fn told(record: &Mutex<Record>, line: &str, n: usize) {
    let log = || record.lock().unwrap().log.clone();
    eventually(&format!("{line:?} ×{n}"), || {
        log().iter().filter(|l| *l == line).count() >= n
    });
}

fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn at_driver_ok_the_backend_gets_features_memory_rings_the_doorbell_and_the_irqfd() {
    let mut r = rig(CommitStrategy::PerVector, Quirks::default());
    r.start_driver();
    let rec = r.record.lock().unwrap();
    // VERSION_1 as the driver took it, with the vhost-user protocol bit; not the checksum
    // offload (bit 0) the driver did not take.
    assert_eq!(rec.features, 1 << VIRTIO_F_VERSION_1 | 1 << 30);
    let region = r.mem.iter().next().unwrap();
    assert_eq!(rec.regions, vec![(0, 1 << 20, region.as_ptr() as u64)]);
    let host = |gpa: u64| region.as_ptr() as u64 + gpa;
    let [desc, avail, used] = rings(0);
    assert_eq!(rec.addrs[0], (host(desc), host(used), host(avail)));
    assert!(
        rec.log
            .contains(&"SET_MEM_TABLE 1 regions 1 fds".to_owned())
    );
    assert!(rec.log.contains(&"SET_VRING_BASE 0 0".to_owned()));
    drop(rec);
    // The kick is the doorbell: a notify write that exits reaches the backend's fd.
    r.write(VIRTIO_PCI_BAR_NOTIFY, 2, 0);
    let mut count = [0u8; 8];
    let kick = r.record.lock().unwrap().kick.take().unwrap();
    std::io::Read::read_exact(&mut &kick, &mut count).unwrap();
    assert_eq!(u64::from_ne_bytes(count), 1);
    // The call is the vector's irqfd, its route committed.
    let irqfd = r.f.msi().deliverable_irqfd(0).expect("vector 0 delivers");
    assert!(r.routes.committed_route_of(&irqfd).is_some());
    assert!(r.backend_holds(&irqfd));
}

#[test]
fn a_mask_swaps_the_call_before_the_write_completes_and_a_signal_pends_until_unmask() {
    let mut r = rig(CommitStrategy::Batched, Quirks::default());
    r.start_driver();
    let irqfd = r.f.msi().deliverable_irqfd(0).unwrap();
    let before = r.calls();
    r.mask(0, true);
    assert_eq!(
        r.calls(),
        before + 1,
        "the swap is acknowledged within the write"
    );
    assert!(!r.backend_holds(&irqfd), "the backend holds the watch fd");
    // That count of 7, one signal of the backend's, reached the watch fd: the vector is masked,
    // so it pends. (A second signal might be read only at the unmask, and be sent then too.)
    eventually("the pending bit set", || r.f.msi().is_pending(0));
    assert!(
        r.routes.take_delivered().is_empty(),
        "nothing sent while masked"
    );
    r.mask(0, false);
    assert_eq!(r.calls(), before + 2, "back to the irqfd within the write");
    assert_eq!(
        r.routes.take_delivered(),
        vec![Some((0xfee0_0000, 0x40))],
        "the pending message, once"
    );
    assert!(r.backend_holds(&irqfd));
}

#[test]
fn function_mask_and_bus_master_clear_swap_too() {
    let mut r = rig(CommitStrategy::PerVector, Quirks::default());
    r.start_driver();
    let irqfd = r.f.msi().deliverable_irqfd(0).unwrap();
    let cap = r.c.find_capability(PCI_CAP_ID_MSIX).unwrap();
    let flags = PCI_MSIX_FLAGS_ENABLE | PCI_MSIX_FLAGS_MASKALL;
    r.c.set_u16(cap + PCI_MSIX_FLAGS, flags);
    r.f.config_written(&r.c, cap + PCI_MSIX_FLAGS, 2);
    assert!(!r.backend_holds(&irqfd), "Function Mask");
    r.c.set_u16(cap + PCI_MSIX_FLAGS, PCI_MSIX_FLAGS_ENABLE);
    r.f.config_written(&r.c, cap + PCI_MSIX_FLAGS, 2);
    assert!(r.backend_holds(&irqfd), "unmasked");
    r.c.set_u16(PCI_COMMAND, PCI_COMMAND_MEMORY);
    r.f.config_written(&r.c, PCI_COMMAND, 2);
    // Bus Master clear: the rings stop (their bases kept) before the write completes.
    r.wait_for("GET_VRING_BASE 0");
    r.c.set_u16(PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    r.f.config_written(&r.c, PCI_COMMAND, 2);
    r.wait_n("SET_VRING_ENABLE 1 true", 2);
    assert!(r.backend_holds(&irqfd), "started again on the irqfd");
}

#[test]
fn a_reset_stops_the_rings_before_it_is_acknowledged() {
    let mut r = rig(CommitStrategy::PerVector, Quirks::default());
    r.start_driver();
    r.write(VIRTIO_PCI_COMMON_STATUS, 1, 0);
    let log = r.log();
    for q in 0..2 {
        assert!(log.contains(&format!("GET_VRING_BASE {q}")), "{log:#?}");
    }
    assert_eq!(r.status(), 0);
}

#[test]
fn no_backend_ever_holds_the_irqfd_of_an_uncommitted_route() {
    for strategy in CommitStrategy::ALL {
        let mut r = rig(strategy, Quirks::default());
        r.start_driver();
        // Whatever the backend holds, its first signals arrive as the vector's message and
        // none on a GSI without a committed route.
        for _ in 0..2 {
            let _ = r.routes.take_delivered();
            r.backend_signals();
            let mut got = Vec::new();
            eventually("a delivery", || {
                got.extend(r.routes.take_delivered());
                !got.is_empty()
            });
            assert_eq!(got, vec![Some((0xfee0_0000, 0x40))], "{strategy:?}");
        }
        let irqfd =
            r.f.msi()
                .deliverable_irqfd(0)
                .expect("routed after the first");
        assert!(
            r.routes.committed_route_of(&irqfd).is_some(),
            "{strategy:?}"
        );
        assert!(
            r.backend_holds(&irqfd),
            "{strategy:?}: swapped to the irqfd"
        );
    }
}

#[test]
fn a_hangup_needs_a_reset_and_the_driver_reset_connects_again() {
    let mut r = rig(CommitStrategy::PerVector, Quirks::default());
    r.start_driver();
    let _ = r.routes.take_delivered();
    let stream = r.record.lock().unwrap().stream.take().unwrap();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    eventually("DEVICE_NEEDS_RESET", || {
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
    assert!(
        r.routes
            .take_delivered()
            .contains(&Some((0xfee0_0000, 0x42))),
        "a configuration change interrupt"
    );
    r.write(VIRTIO_PCI_COMMON_STATUS, 1, 0);
    assert_eq!(
        r.record.lock().unwrap().connections,
        2,
        "connected again at the reset"
    );
    assert_eq!(r.status(), 0);
    r.start_driver();
    r.wait_n("SET_VRING_ENABLE 0 true", 2);
    let irqfd = r.f.msi().deliverable_irqfd(0).unwrap();
    assert!(r.backend_holds(&irqfd), "the new backend holds the irqfd");
}

#[test]
fn a_hangup_leaves_the_other_devices_working_and_reconnect_retries_before_the_reset() {
    let mut gone = rig_with(
        CommitStrategy::PerVector,
        Quirks::default(),
        Some(Duration::from_secs(5)),
    );
    let mut other = rig(CommitStrategy::PerVector, Quirks::default());
    gone.start_driver();
    other.start_driver();
    let stream = gone.record.lock().unwrap().stream.take().unwrap();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    eventually("DEVICE_NEEDS_RESET", || {
        gone.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
    // reconnect=: connected again (the listener is still there) before any driver reset.
    eventually("connected again", || {
        gone.record.lock().unwrap().connections == 2
    });
    assert_ne!(
        gone.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET,
        0,
        "until the reset"
    );
    let irqfd = other.f.msi().deliverable_irqfd(0).unwrap();
    assert!(other.backend_holds(&irqfd), "the other device is untouched");
    assert_eq!(other.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET, 0);
    gone.write(VIRTIO_PCI_COMMON_STATUS, 1, 0);
    assert_eq!(
        gone.record.lock().unwrap().connections,
        2,
        "no second reconnection"
    );
    gone.start_driver();
    gone.wait_n("SET_VRING_ENABLE 0 true", 2);
}

#[test]
fn a_new_backend_that_offers_less_than_the_driver_was_offered_is_not_used() {
    let mut r = rig(CommitStrategy::PerVector, Quirks::default());
    r.start_driver();
    let stream = r.record.lock().unwrap().stream.take().unwrap();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    eventually("DEVICE_NEEDS_RESET", || {
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
    let lesser = Quirks {
        no_csum: true,
        ..Quirks::default()
    };
    let second = backend::serve(&r.path, lesser);
    r.write(VIRTIO_PCI_COMMON_STATUS, 1, 0);
    assert_eq!(second.lock().unwrap().connections, 1, "it was asked");
    // The driver sets the device up again: it stays broken, nothing is configured.
    r.record = second;
    r.driver_ok();
    eventually("DEVICE_NEEDS_RESET again", || {
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
    assert!(
        !r.log().iter().any(|l| l.starts_with("SET_MEM_TABLE")),
        "{:?}",
        r.log()
    );
}

#[test]
fn a_backend_that_refuses_a_message_leaves_the_device_needing_a_reset() {
    let mut r = rig(
        CommitStrategy::PerVector,
        Quirks {
            refuse_enable: true,
            ..Quirks::default()
        },
    );
    r.driver_ok();
    eventually("DEVICE_NEEDS_RESET", || {
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
}

/// A backend that takes a message and never answers: the exchange ends at its deadline, the
/// device needs a reset (once, the vhost-user thread waited for good, and with it any vCPU
/// or snapshot waiting on the thread).
#[test]
fn a_backend_that_stops_answering_leaves_the_device_needing_a_reset() {
    let mut r = rig(
        CommitStrategy::PerVector,
        Quirks {
            silent_enable: true,
            ..Quirks::default()
        },
    );
    r.driver_ok();
    eventually("DEVICE_NEEDS_RESET", || {
        r.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET != 0
    });
}

/// A backend that takes the connection and never answers (one serving another VMM: the
/// connection waits in its backlog) is refused at connect, naming the message.
#[test]
fn a_backend_that_never_answers_is_refused_at_connect_naming_the_message() {
    let path = socket();
    let _listening = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let e = connect(&spec(path.clone(), NET), &shared_memory())
        .err()
        .expect("refused");
    assert!(
        matches!(
            e,
            VhostUserError::Silent {
                what: "GET_FEATURES",
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("did not answer GET_FEATURES within 1 s"),
        "{e}"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_missing_socket_or_version_1_is_one_line_saying_what_to_do() {
    let mem = shared_memory();
    let missing = connect(&spec(socket(), NET), &mem)
        .err()
        .unwrap()
        .to_string();
    assert!(missing.ends_with("start the backend first"), "{missing}");
    assert!(!missing.contains('\n'));
    let path = socket();
    let _rec = backend::serve(
        &path,
        Quirks {
            no_version_1: true,
            ..Quirks::default()
        },
    );
    let lacks = connect(&spec(path, NET), &mem).err().unwrap().to_string();
    assert!(
        lacks.contains("does not offer VIRTIO_F_VERSION_1"),
        "{lacks}"
    );
    let private = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let refused = connect(&spec(socket(), NET), &private).err().unwrap();
    assert!(matches!(refused, VhostUserError::RamNotShared));
}

#[test]
fn a_disk_shows_the_backends_configuration_space() {
    let path = socket();
    let _rec = backend::serve(&path, Quirks::default());
    let parts = connect(&spec(path, VhostUserKind::Block), &shared_memory()).unwrap();
    let mut capacity = [0u8; 8];
    parts.device.read_config(0, &mut capacity);
    assert_eq!(u64::from_le_bytes(capacity), 32);
    assert_eq!(parts.device.device_type(), 2);
    assert_eq!(parts.device.queue_max_sizes().len(), 1);
}

/// On virtio-mmio without the MSI extension the backend only ever holds the watch fd: its
/// signal sets InterruptStatus and asserts the line; the MMIO features stay exitless's.
#[test]
fn on_virtio_mmio_without_msi_a_backend_signal_sets_the_interrupt_status() {
    use crate::bus::BusDevice;
    use crate::virtio::transport::mmio::{MmioPlacement, MmioTransport};
    let path = socket();
    let record = backend::serve(&path, Quirks::default());
    let mem = shared_memory();
    let parts = connect(&spec(path, NET), &mem).unwrap();
    let env = TransportEnv {
        ioevents: Arc::new(FakeIoEvents::default()),
        routes: Arc::new(FakeRoutes::default()),
        mem,
        iommu: None,
        log: DeviceLog::new("vhost-user-mmio"),
    };
    let at = MmioPlacement {
        base: 0xd000_0000,
        gsi: 16,
        notify: NotifyPath::Datamatch,
    };
    let (t, _worker) = MmioTransport::new(env, parts, at).unwrap();
    let write = |reg: u32, v: u32| t.write(u64::from(reg), &v.to_le_bytes());
    let read = |reg: u32| {
        let mut b = [0u8; 4];
        t.read(u64::from(reg), &mut b);
        u32::from_le_bytes(b)
    };
    let s = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
    write(VIRTIO_MMIO_STATUS, s);
    write(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    write(VIRTIO_MMIO_DRIVER_FEATURES, 1);
    write(VIRTIO_MMIO_STATUS, s | VIRTIO_STATUS_FEATURES_OK);
    write(VIRTIO_MMIO_QUEUE_SEL, 0);
    write(VIRTIO_MMIO_QUEUE_NUM, 256);
    write(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x10000);
    write(VIRTIO_MMIO_QUEUE_AVAIL_LOW, 0x11000);
    write(VIRTIO_MMIO_QUEUE_USED_LOW, 0x12000);
    write(VIRTIO_MMIO_QUEUE_READY, 1);
    write(
        VIRTIO_MMIO_STATUS,
        s | VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK,
    );
    told(&record, "SET_VRING_ENABLE 0 true", 1);
    assert_eq!(
        record.lock().unwrap().features,
        1 << VIRTIO_F_VERSION_1 | 1 << 30
    );
    let mut call = record.lock().unwrap().call.take().unwrap();
    call.write_all(&1u64.to_ne_bytes()).unwrap();
    eventually("InterruptStatus", || {
        read(VIRTIO_MMIO_INTERRUPT_STATUS) == VIRTIO_MMIO_INT_VRING
    });
}
