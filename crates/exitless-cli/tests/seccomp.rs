//! Confinement: with seccomp on, every thread of a running machine is under a filter and the
//! guest's work still completes on every interrupt path; a forbidden call ends the process
//! with a report naming the thread and the call. Its own test binary: `seccomp::enable` is for
//! the whole process.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use exitless::contract::*;
use exitless::irq::CommitStrategy;
use exitless::machine::{ProbeConfig, Transport, VirtioNetConfig, ops, run_probe};
use exitless::seccomp::{self, EXIT_VIOLATION, ThreadKind};
use exitless::virtio::notify::NotifyPath;

/// The `Seccomp:` line of a task's status: 0 off, 2 filtered (proc(5)).
fn seccomp_mode(status: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(|m| m.trim().to_owned())
}

/// Every seccomp mode seen per thread name, sampling this process's threads until `stop`.
fn observe(stop: Arc<AtomicBool>) -> BTreeMap<String, BTreeSet<String>> {
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let path = task.path();
            // A thread that ended between the listing and the reads is skipped.
            let (Ok(comm), Ok(status)) = (
                std::fs::read_to_string(path.join("comm")),
                std::fs::read_to_string(path.join("status")),
            ) else {
                continue;
            };
            if let Some(mode) = seccomp_mode(&status) {
                seen.entry(comm.trim().to_owned()).or_default().insert(mode);
            }
        }
        thread::sleep(Duration::from_micros(200));
    }
    seen
}

#[test]
fn every_thread_of_a_running_machine_is_confined_and_the_guest_still_works() {
    seccomp::enable().unwrap();
    // The log writer, confined as it starts; a line through it proves it can write.
    exitless::logging::init();
    log::warn!("crates/exitless-cli/tests/seccomp.rs: the log writer writes under its filter");
    exitless::logging::flush();
    // Started before this thread confines itself, which it would otherwise inherit.
    let stop = Arc::new(AtomicBool::new(false));
    let observer = {
        let stop = stop.clone();
        thread::spawn(move || observe(stop))
    };
    // This thread stands for the binary's main thread.
    seccomp::confine(ThreadKind::Main).unwrap();
    let own = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    assert_eq!(seccomp_mode(&own).as_deref(), Some("2"), "{own}");
    const N: u64 = 20;
    for strategy in CommitStrategy::ALL {
        let run = run_probe(&ProbeConfig {
            ops: vec![
                ops::virtio_init(TRANSPORT_MMIO, 0, 0),
                ops::virtio_rr(32, N),
                ops::virtio_init(TRANSPORT_MMIO, 0, RR_FLAG_MSI | RR_FLAG_DOORBELLS),
                ops::virtio_rr(32, N),
                ops::virtio_init(
                    TRANSPORT_PCI,
                    ProbeConfig::virtio_pci_address(0).ecam_offset(),
                    0,
                ),
                ops::virtio_rr(32, N),
            ],
            virtio: vec![
                VirtioNetConfig::new(Transport::Mmio, NotifyPath::Datamatch),
                VirtioNetConfig::new(Transport::Pci, NotifyPath::Address),
            ],
            vcpus: 2,
            console_to_stdout: true,
            gsi_commits: strategy,
            timeout: Duration::from_secs(120),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{}: {e}", strategy.name()));
        for op in [1, 3, 5] {
            let r = run.results[op];
            assert_eq!(r.status, STATUS_OK, "{} op {op}: {r:?}", strategy.name());
            assert_eq!(r.value, N, "{} op {op}: transactions", strategy.name());
            assert_eq!(
                r.bytes,
                N * 1024,
                "{} op {op}: response bytes",
                strategy.name()
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    // Every thread of these names: the kernel's own threads of a VM (`kvm-nx-lpage-recovery`,
    // which run no user code) and the test harness's are not exitless's.
    let seen = observer.join().unwrap();
    for prefix in ["vcpu", "virtio-mmio", "virtio-pci", "console", "log writer"] {
        let modes: BTreeSet<&str> = seen
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .flat_map(|(_, modes)| modes.iter().map(String::as_str))
            .collect();
        assert_eq!(modes, BTreeSet::from(["2"]), "{prefix} threads: {seen:?}");
    }
}

/// Set in a child process of the tests below: `KIND:ACT`, the kind of thread its test thread
/// confines itself as, and what it does then.
const CHILD: &str = "EXITLESS_TEST_SECCOMP_CHILD";

/// In a child process: the test thread confined as the kind it was given, and the act.
fn child() -> Option<(ThreadKind, String)> {
    let spec = std::env::var(CHILD).ok()?;
    let (name, act) = spec.split_once(':').unwrap();
    let kind = ThreadKind::ALL.into_iter().find(|k| k.name() == name);
    let kind = kind.unwrap();
    // No core file from the abort below (setrlimit is no confined thread's business).
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit reads the struct passed.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    seccomp::enable().unwrap();
    // The binary's panic hook, and its log writer (no confined kind may start a thread).
    exitless::logging::init();
    seccomp::confine(kind).unwrap();
    Some((kind, act.to_owned()))
}

/// Run this binary's test `test` in a child process that does `act` confined as each kind.
fn as_each_kind(test: &str, act: &str) -> Vec<(ThreadKind, Output, String)> {
    ThreadKind::ALL
        .into_iter()
        .map(|kind| {
            let out = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", test, "--nocapture"])
                .env(CHILD, format!("{}:{act}", kind.name()))
                // A backtrace reads the executable's debug info, which no filter allows: the
                // panic hook must not try.
                .env("RUST_BACKTRACE", "1")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            (kind, out, stderr)
        })
        .collect()
}

#[test]
fn a_forbidden_call_ends_the_process_with_a_report() {
    if let Some((kind, _)) = child() {
        // No kind of thread opens a packet socket (some open Unix and IP ones).
        // SAFETY: socket(2) touches no memory of this process.
        unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        panic!("socket(2) was allowed to the {} thread", kind.name());
    }
    for (kind, out, stderr) in as_each_kind("a_forbidden_call_ends_the_process_with_a_report", "") {
        let name = kind.name();
        assert_eq!(out.status.code(), Some(EXIT_VIOLATION), "{name}: {stderr}");
        let report = format!(
            "({name}) made system call {} (arguments 0x11, 0x3, 0x0), which its filter forbids",
            libc::SYS_socket
        );
        assert!(
            stderr.contains("exitless: seccomp: thread \"") && stderr.contains(&report),
            "{name}: {stderr}"
        );
    }
}

#[test]
fn a_confined_thread_panics_and_aborts_as_it_would_unconfined() {
    if let Some((kind, act)) = child() {
        let name = kind.name();
        match act.as_str() {
            // The message reaches stderr, the stack unwinds, the thread ends.
            "panic" => {
                let caught = std::panic::catch_unwind(|| panic!("deliberate panic in {name}"));
                assert!(caught.is_err());
                return;
            }
            // What a failed allocation or a panic while panicking does.
            _ => std::process::abort(),
        }
    }
    let test = "a_confined_thread_panics_and_aborts_as_it_would_unconfined";
    for (kind, out, stderr) in as_each_kind(test, "panic") {
        let name = kind.name();
        assert!(out.status.success(), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("deliberate panic in {name}")),
            "{stderr}"
        );
    }
    for (kind, out, stderr) in as_each_kind(test, "abort") {
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "{}: {stderr}",
            kind.name()
        );
    }
}

/// A page mapped from a file that was then cut short: reading it raises SIGBUS (mmap(2)).
fn cut_short_page() -> *const u8 {
    // SAFETY: memfd_create reads the name; ftruncate and mmap act on the new descriptor only,
    // and the mapping is left for the process's life.
    unsafe {
        let fd = libc::memfd_create(c"cut".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, 4096), 0);
        let page = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(page, libc::MAP_FAILED);
        assert_eq!(libc::ftruncate(fd, 0), 0);
        page.cast()
    }
}

/// A fault in a confined thread (a bad pointer, a file cut short under its mapping) ends the
/// process by its signal, as it would unconfined: std's handler puts the default action back
/// (rt_sigaction), which the filters allow for these two signals, and the fault is taken again.
/// Once it ended as a seccomp violation (status 159), hiding the crash.
#[test]
fn a_confined_thread_that_faults_ends_by_its_signal_not_as_a_violation() {
    // Mapped before the child confines itself: no kind may create a memfd.
    let cut = std::env::var_os(CHILD).map(|_| cut_short_page());
    if let Some((kind, act)) = child() {
        // SAFETY: neither is safe, on purpose: each faults, which is the test.
        unsafe {
            match act.as_str() {
                "segv" => std::ptr::write_volatile(std::ptr::dangling_mut::<u8>(), 1),
                _ => drop(std::ptr::read_volatile(cut.unwrap())),
            }
        }
        panic!("no fault in the {} thread", kind.name());
    }
    let test = "a_confined_thread_that_faults_ends_by_its_signal_not_as_a_violation";
    for (act, signal) in [("segv", libc::SIGSEGV), ("bus", libc::SIGBUS)] {
        for (kind, out, stderr) in as_each_kind(test, act) {
            let name = kind.name();
            assert_eq!(out.status.signal(), Some(signal), "{name} {act}: {stderr}");
            assert!(!stderr.contains("seccomp"), "{name} {act}: {stderr}");
        }
    }
}

/// Set with `device:disk` in the child of the test below: the disk file it opens before it
/// confines itself, as the main thread opens a disk before the device thread starts.
const DISK: &str = "EXITLESS_TEST_SECCOMP_DISK";

/// A device thread does a virtio-blk device's file work under its filter: vectored reads and
/// writes at offsets straight into and out of buffers (`preadv`, `pwritev`) and an fsync
/// (`sync_all`), as `virtio::block` does.
#[test]
fn a_device_thread_reads_writes_and_flushes_its_disk_file() {
    use std::os::fd::AsRawFd;
    let test = "a_device_thread_reads_writes_and_flushes_its_disk_file";
    if let Ok(path) = std::env::var(DISK) {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let Some((ThreadKind::Device, _)) = child() else {
            panic!("run as a device thread");
        };
        let mut sector = [0u8; 512];
        let iov = [libc::iovec {
            iov_base: sector.as_mut_ptr().cast(),
            iov_len: 512,
        }];
        // SAFETY: the iovec is `sector`, writable for its 512 bytes.
        let n = unsafe { libc::preadv(file.as_raw_fd(), iov.as_ptr(), 1, 512) };
        assert_eq!((n, sector), (512, [1u8; 512]));
        let nines = [9u8; 512];
        let iov = [libc::iovec {
            iov_base: nines.as_ptr().cast_mut().cast(),
            iov_len: 512,
        }];
        // SAFETY: the iovec is `nines`, readable for its 512 bytes.
        let n = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), 1, 0) };
        assert_eq!(n, 512);
        file.sync_all().unwrap();
        return;
    }
    let path = std::env::temp_dir().join(format!("exitless-seccomp-disk-{}", std::process::id()));
    std::fs::write(&path, [[0u8; 512], [1u8; 512]].concat()).unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(CHILD, "device:disk")
        .env(DISK, &path)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let written = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(written[..512], [9u8; 512], "the write reached the file");
}

#[test]
fn no_seccomp_turns_the_filters_off_and_help_says_so() {
    let exitless = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_exitless"))
            .args(args)
            .output()
            .unwrap()
    };
    let help = exitless(&["--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("--no-seccomp"));
    for args in [["probe", "--no-seccomp"], ["--no-seccomp", "probe"]] {
        let out = exitless(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
