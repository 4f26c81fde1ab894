//! `exitless run`'s machine: a PC-like platform for kernels this project did not build.
//!
//! It is the standard machine (console, PCI bus 0, ECAM shadowed, trapped or absent) with the
//! PC platform devices of QEMU's conventions ([`Platform`]: isa-debug-exit, fw_cfg, the ACPI
//! power-management block, the i8042 and 0xCF9 resets), a memory map and ACPI tables
//! ([`memmap`], [`acpi`]), and a kernel loader behind the [`Loader`]
//! trait, chosen by what the kernel file is: an ELF with a PVH note ([`pvh`]), a Linux bzImage
//! ([`bzimage`]) or multiboot v1 ([`multiboot`]); what the three share (placement, the ACPI
//! tables, the 32-bit entry) is [`boot`]. The boot vCPU enters the kernel; the others wait
//! for INIT/SIPI. The run ends when the guest exits through isa-debug-exit, powers off or
//! resets; nothing else ends it.

pub mod acpi;
pub mod boot;
pub mod bzimage;
pub mod incoming;
pub mod memmap;
pub mod multiboot;
pub mod pvh;
pub mod restore;

use std::path::PathBuf;
use std::time::Duration;

use crate::devices::debug_exit;
use crate::machine::Loader;
use crate::machine::config::{
    Console, CpuTemplate, DiskConfig, MachineConfig, NetBackendKind, Overflow, Platform,
    VirtioNetConfig, format_mac, tap_mac,
};
use crate::machine::layout::{MAX_RAM_SIZE, low_ram_end};
use crate::machine::loader::file::{FileError, ImageFile, ReadError};
use crate::machine::vcpus::RunEnd;
use crate::machine::{Machine, MachineError, MachineView, Ran};
use crate::pci::EcamMode;
use crate::vm::run_control::StopReason;

use bzimage::{BzImage, BzImageError};
use memmap::MIN_RAM;
use multiboot::{MultibootError, MultibootKernel};
use pvh::{PvhError, PvhKernel};

pub use crate::machine::config::MAX_CPUS;
/// The fw_cfg file that holds the command line as given (fw_cfg.rst: `opt/` names are for
/// the VMM's own items, under its name).
pub const FW_CFG_CMDLINE: &str = "opt/exitless/cmdline";

/// What to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The kernel file.
    pub kernel: PathBuf,
    /// An initial ramdisk, for a Linux kernel.
    pub initrd: Option<PathBuf>,
    /// The command line. A multiboot kernel gets it after its own path, as QEMU and GRUB pass
    /// it (kvm-unit-tests read the first word as the program's name); Linux gets it as is.
    pub cmdline: String,
    /// RAM in MiB (signed, as given: a negative size gets the range's message).
    pub memory_mib: i64,
    /// vCPUs, 1 to [`MAX_CPUS`] (signed, as `memory_mib`).
    pub cpus: i64,
    /// How ECAM is served; `None` leaves it undescribed.
    pub ecam: Option<EcamMode>,
    /// A VT-d IOMMU, described by a DMAR table.
    pub iommu: bool,
    /// Where the serial console goes.
    pub console: Console,
    /// What the console does when its reader is behind.
    pub console_overflow: Overflow,
    /// virtio-blk disks.
    pub disks: Vec<DiskConfig>,
    /// virtio-net devices (a tap, or no link).
    pub nets: Vec<VirtioNetConfig>,
    /// Give up on a guest that has not ended after this long.
    pub timeout: Option<Duration>,
    /// Keep guest RAM in the VMM's core dumps.
    pub dump_guest_memory: bool,
    /// Guest RAM in a shared memfd (`migrate local:` hands it over).
    pub shared_memory: bool,
    /// The vCPUs' CPU template.
    pub cpu: CpuTemplate,
}

/// How a run ended, as the guest ended it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// It wrote this value to isa-debug-exit.
    DebugExit(u64),
    /// It powered off (ACPI S5).
    PowerOff,
    /// It reset the machine.
    Reset,
    /// The VMM's user shut it down (the control socket's `vm.shutdown`).
    Requested,
    /// Its kernel panicked and said so on the pvpanic port.
    Panicked,
    /// It went to another exitless (`vm.send-migration`), where it runs on.
    Migrated,
}

/// The status of a run whose guest kernel panicked: even, so no runner that reads an odd
/// status as a test kernel's (isa-debug-exit) mistakes it, and apart from 2, exitless's own
/// errors.
pub const PANIC_STATUS: u8 = 4;

impl RunOutcome {
    /// The status `exitless run` exits with: QEMU's `(value << 1) | 1` for isa-debug-exit, 0
    /// for an orderly power-off, a reset, a shutdown the user asked for or a migration,
    /// [`PANIC_STATUS`]
    /// for a panic.
    pub fn exit_status(self) -> u8 {
        match self {
            RunOutcome::DebugExit(value) => debug_exit::exit_status(value),
            RunOutcome::PowerOff
            | RunOutcome::Reset
            | RunOutcome::Requested
            | RunOutcome::Migrated => 0,
            RunOutcome::Panicked => PANIC_STATUS,
        }
    }
}

/// Why a kernel could not be run. Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The kernel file cannot be read.
    #[error("cannot read the kernel {path}: {source}")]
    KernelRead {
        /// The file.
        path: PathBuf,
        /// The error reading it.
        #[source]
        source: std::io::Error,
    },
    /// The initrd file cannot be read.
    #[error("cannot read the initrd {path}: {source}")]
    InitrdRead {
        /// The file.
        path: PathBuf,
        /// The error reading it.
        #[source]
        source: std::io::Error,
    },
    /// The kernel or initrd file cannot be taken: not a regular file, or larger than RAM.
    #[error("--{what} {path}: {why}")]
    File {
        /// "kernel" or "initrd".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why not.
        #[source]
        why: FileError,
    },
    /// An initrd for a kernel that takes none.
    #[error(
        "--initrd {0}: a multiboot kernel is given no initrd (exitless passes no multiboot \
         modules); drop --initrd"
    )]
    InitrdUnused(PathBuf),
    /// The kernel file is not one this machine boots.
    #[error("kernel {path}: {source}")]
    Kernel {
        /// The file.
        path: PathBuf,
        /// What its format's loader refused.
        #[source]
        source: KernelError,
    },
    /// The guest ran past --timeout.
    #[error("the guest did not end within --timeout {0} seconds")]
    TimedOut(u64),
    /// Less RAM than a PC's first megabyte and a kernel need.
    #[error("--memory {0}: a machine needs at least {min} MiB", min = MIN_RAM >> 20)]
    MemoryTooSmall(i64),
    /// More RAM than the guest's physical address space holds.
    #[error(
        "--memory {0}: at most {max} MiB, what a 39-bit guest physical address space holds \
         beside the PCI windows",
        max = MAX_RAM_SIZE >> 20
    )]
    MemoryAboveMax(i64),
    /// More RAM than the host has.
    #[error("--memory {asked}: more than this host's {host} MiB of RAM")]
    MemoryAboveHost {
        /// MiB asked for.
        asked: u64,
        /// MiB the host has.
        host: u64,
    },
    /// A vCPU count out of range.
    #[error("--cpus {0}: 1 to {MAX_CPUS}")]
    Cpus(i64),
    /// Two virtio-net devices on one tap: a second open of a single-queue tap is refused as
    /// busy, which would blame another process.
    #[error("--net tap={0} given twice: each device needs a tap of its own")]
    TapTwice(String),
    /// Building or running the machine.
    #[error(transparent)]
    Machine(#[from] MachineError),
    /// The guest triple-faulted.
    #[error(
        "the guest shut down without exiting: a triple fault (an exception it could not handle)"
    )]
    Shutdown,
    /// A vCPU failed.
    #[error("the guest stopped: {0}")]
    Stopped(String),
    /// A snapshot that cannot be restored.
    #[error(transparent)]
    Snapshot(#[from] crate::machine::snapshot::SnapshotError),
    /// A stop signal ended the run (`vm::run_control::stop_on_signals`).
    #[error("the guest was stopped by signal {0}")]
    Signal(libc::c_int),
    /// A migration that cannot be received.
    #[error(transparent)]
    Migration(#[from] crate::machine::migration::MigrationError),
}

/// Why a kernel file cannot be booted, by the format it was taken for.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A multiboot kernel that cannot be loaded.
    #[error(transparent)]
    Multiboot(MultibootError),
    /// A bzImage that cannot be loaded.
    #[error(transparent)]
    BzImage(#[from] BzImageError),
    /// A PVH kernel that cannot be loaded.
    #[error(transparent)]
    Pvh(#[from] PvhError),
    /// A file of no format exitless boots.
    #[error(
        "not a kernel exitless boots: neither a multiboot v1 kernel (no header in the first \
         8192 bytes), a Linux bzImage (no \"HdrS\" at 0x202) nor an ELF kernel with a PVH \
         note (XEN_ELFNOTE_PHYS32_ENTRY)"
    )]
    Unrecognised,
}

/// Open the kernel or initrd (`what`) at `path` for a machine of `ram` bytes: a regular file
/// no larger than the RAM, the open never blocking ([`ImageFile::open`]).
fn open(path: &std::path::Path, ram: u64, what: &'static str) -> Result<ImageFile, RunError> {
    ImageFile::open(path, ram).map_err(|e| match e {
        FileError::Io(source) if what == "kernel" => RunError::KernelRead {
            path: path.into(),
            source,
        },
        FileError::Io(source) => RunError::InitrdRead {
            path: path.into(),
            source,
        },
        why => RunError::File {
            what,
            path: path.into(),
            why,
        },
    })
}

/// The host's RAM in MiB (MemTotal in /proc/meminfo), if it can be read.
fn host_memory_mib() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib >> 10)
}

impl RunConfig {
    /// The machine to build, once the sizes are checked.
    fn machine(&self) -> Result<MachineConfig, RunError> {
        // A BTreeSet: a HashSet's random seed needs getrandom, which the main thread's filter
        // refuses.
        let mut taps = std::collections::BTreeSet::new();
        for net in &self.nets {
            if let NetBackendKind::Tap(name) = &net.backend
                && !taps.insert(name)
            {
                return Err(RunError::TapTwice(name.clone()));
            }
        }
        let mib = u64::try_from(self.memory_mib)
            .ok()
            .filter(|&mib| mib >= MIN_RAM >> 20)
            .ok_or(RunError::MemoryTooSmall(self.memory_mib))?;
        if mib > MAX_RAM_SIZE >> 20 {
            return Err(RunError::MemoryAboveMax(self.memory_mib));
        }
        if let Some(host) = host_memory_mib().filter(|&host| mib > host) {
            return Err(RunError::MemoryAboveHost { asked: mib, host });
        }
        let vcpus = u8::try_from(self.cpus)
            .ok()
            .filter(|&n| (1..=MAX_CPUS).contains(&n.into()))
            .ok_or(RunError::Cpus(self.cpus))?;
        Ok(MachineConfig {
            ram_size: usize::try_from(mib << 20).expect("at most MAX_RAM_SIZE"),
            ecam: self.ecam,
            iommu: self.iommu,
            // With the unit, its IOAPIC is the VMM's, so that its entries can be remapped.
            split_irqchip: self.iommu,
            dump_guest_memory: self.dump_guest_memory,
            shared_memory: self.shared_memory,
            cpu: self.cpu.clone(),
            vcpus,
            console: self.console.clone(),
            console_overflow: self.console_overflow,
            disks: self.disks.clone(),
            virtio: self.nets.clone(),
            platform: Some(Platform {
                fw_cfg_files: vec![(FW_CFG_CMDLINE.into(), self.cmdline.as_bytes().to_vec())],
            }),
            ..MachineConfig::default()
        })
    }

    /// The kernel, recognised by its format from its headers and checked for this machine's
    /// RAM below 4 GiB (which ends at `ram_end`: every protocol loads there); only what it
    /// loads is read (and the initrd, for a kernel that takes one).
    fn kernel(&self, ram_end: u64) -> Result<Box<dyn Loader>, RunError> {
        let path = &self.kernel;
        let kernel_read = |source| RunError::KernelRead {
            path: path.clone(),
            source,
        };
        let file = open(path, ram_end, "kernel")?;
        let initrd = self
            .initrd
            .as_ref()
            .map(|path| open(path, ram_end, "initrd").map(|file| (path, file)))
            .transpose()?;
        let head = file.kernel_head().map_err(kernel_read)?;
        let read_initrd = || {
            initrd
                .as_ref()
                .map(|(path, initrd)| {
                    initrd.read_all().map_err(|source| RunError::InitrdRead {
                        path: path.to_path_buf(),
                        source,
                    })
                })
                .transpose()
        };
        let refused = |e: ReadError<KernelError>| match e {
            ReadError::Io(source) => kernel_read(source),
            ReadError::Format(source) => RunError::Kernel {
                path: path.clone(),
                source,
            },
        };
        if let Some(entry) = pvh::read_pvh_entry(&file, &head).map_err(kernel_read)? {
            let kernel = PvhKernel::read(&file, &head, entry, &self.cmdline, read_initrd()?)
                .and_then(|k| k.check_fits(ram_end).map(|_| k).map_err(ReadError::Format))
                .map_err(|e| refused(e.map(KernelError::from)))?;
            return Ok(Box::new(kernel));
        }
        if bzimage::is_bzimage(&head) {
            // Linux takes the command line as given (its first word is an option, not a name).
            let kernel = BzImage::read(&file, &head, &self.cmdline, read_initrd()?)
                .and_then(|k| k.check_fits(ram_end).map(|_| k).map_err(ReadError::Format))
                .map_err(|e| refused(e.map(KernelError::from)))?;
            return Ok(Box::new(kernel));
        }
        let cmdline = format!("{} {}", path.display(), self.cmdline);
        let kernel = MultibootKernel::read(&file, &head, &cmdline).and_then(|k| {
            k.check_fits(ram_end).map_err(ReadError::Format)?;
            Ok(k)
        });
        let kernel = kernel.map_err(|e| {
            refused(e.map(|e| match e {
                MultibootError::NoHeader => KernelError::Unrecognised,
                e => KernelError::Multiboot(e),
            }))
        })?;
        // Multiboot modules are not passed: an initrd would be read and dropped unseen.
        if let Some((path, _)) = initrd {
            return Err(RunError::InitrdUnused(path.to_path_buf()));
        }
        Ok(Box::new(kernel))
    }

    /// The MAC chosen for each tap's device that was given none, one line each on stderr as
    /// the run starts, so that the user can find the guest on the network and pin it.
    fn say_chosen_macs(&self) {
        for net in self.nets.iter().filter(|net| net.mac.is_none()) {
            if let NetBackendKind::Tap(name) = &net.backend {
                let mac = format_mac(tap_mac(name));
                eprintln!("exitless: tap {name}: the guest's MAC is {mac} (mac= sets another)");
            }
        }
    }

    /// Boot the kernel and run it until the guest ends the run.
    pub fn run(&self) -> Result<RunOutcome, RunError> {
        self.run_with(|_| Ok(()))
    }

    /// [`RunConfig::run`], with `serve` given the machine's view once it is built and before
    /// the guest starts: what it returns (a control socket's server) lives until the run ends.
    pub fn run_with<G>(
        &self,
        serve: impl FnOnce(MachineView) -> Result<G, MachineError>,
    ) -> Result<RunOutcome, RunError> {
        let machine_cfg = self.machine()?;
        let kernel = self.kernel(low_ram_end(machine_cfg.ram_size))?;
        let machine = Machine::new(&machine_cfg, None)?;
        self.say_chosen_macs();
        serve_and_run(&machine, false, self.timeout, serve, |m, timeout| {
            m.run(kernel.as_ref(), timeout)
        })
    }
}

/// Run `machine` with `run` until the guest ends the run or `timeout` (none: no limit)
/// passes: `serve` is given its view first (what it returns, a control socket's server, lives
/// until the run ends), and if `paused` every vCPU parks before its first entry.
fn serve_and_run<G>(
    machine: &Machine,
    paused: bool,
    timeout: Option<Duration>,
    serve: impl FnOnce(MachineView) -> Result<G, MachineError>,
    run: impl FnOnce(&Machine, Duration) -> Result<Ran, MachineError>,
) -> Result<RunOutcome, RunError> {
    let view = machine.view();
    if paused {
        view.control
            .pause()
            .request()
            .map_err(|e| RunError::Stopped(e.to_string()))?;
    }
    let timeout = timeout.unwrap_or(Duration::MAX);
    let server = serve(view)?;
    let ran = run(machine, timeout);
    drop(server);
    outcome(ran?.end, timeout)
}

/// How the guest ended a run of at most `timeout`.
fn outcome(end: RunEnd, timeout: Duration) -> Result<RunOutcome, RunError> {
    match end {
        RunEnd::Stopped(StopReason::Requested) => Ok(RunOutcome::Requested),
        RunEnd::Stopped(StopReason::Migrated) => Ok(RunOutcome::Migrated),
        RunEnd::Stopped(StopReason::DebugExit(value)) => Ok(RunOutcome::DebugExit(value)),
        RunEnd::Stopped(StopReason::PowerOff) => Ok(RunOutcome::PowerOff),
        RunEnd::Stopped(StopReason::Reset) => Ok(RunOutcome::Reset),
        RunEnd::Stopped(StopReason::GuestPanicked) => Ok(RunOutcome::Panicked),
        RunEnd::Stopped(StopReason::Shutdown) => Err(RunError::Shutdown),
        RunEnd::Stopped(StopReason::VcpuFailed(why)) => Err(RunError::Stopped(why)),
        RunEnd::Stopped(StopReason::Signal(signal)) => Err(RunError::Signal(signal)),
        RunEnd::Stopped(StopReason::GuestDone(status)) => Err(RunError::Stopped(format!(
            "the probe's done port (status {status}) on a run machine"
        ))),
        RunEnd::TimedOut => Err(RunError::TimedOut(timeout.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(memory_mib: i64, cpus: i64) -> RunConfig {
        RunConfig {
            kernel: "/nonexistent/kernel".into(),
            initrd: None,
            cmdline: String::new(),
            memory_mib,
            cpus,
            ecam: Some(EcamMode::Shadow),
            iommu: false,
            console: Console::Buffer,
            console_overflow: Overflow::Hold,
            disks: Vec::new(),
            nets: Vec::new(),
            timeout: None,
            dump_guest_memory: false,
            shared_memory: false,
            cpu: CpuTemplate::default(),
        }
    }

    #[test]
    fn sizes_out_of_range_are_refused_with_one_line() {
        for (memory, cpus, says) in [
            (0, 1, "at least 2 MiB"),
            (1, 1, "at least 2 MiB"),
            (-5, 1, "--memory -5: a machine needs at least 2 MiB"),
            (i64::MAX, 1, "at most 505856 MiB"),
            (64, 0, "--cpus 0: 1 to 64"),
            (64, 65, "--cpus 65"),
            (64, 256, "--cpus 256"),
            (64, -1, "--cpus -1: 1 to 64"),
        ] {
            let e = config(memory, cpus).machine().expect_err("out of range");
            let line = e.to_string();
            assert!(line.contains(says) && !line.contains('\n'), "{line}");
        }
        let cfg = config(64, 2).machine().unwrap();
        assert_eq!((cfg.ram_size, cfg.vcpus), (64 << 20, 2));
        let platform = cfg.platform.expect("the PC platform devices");
        assert_eq!(platform.fw_cfg_files[0].0, FW_CFG_CMDLINE);
    }

    #[test]
    fn more_memory_than_the_host_has_is_refused() {
        let host = host_memory_mib().expect("/proc/meminfo");
        if host >= MAX_RAM_SIZE >> 20 {
            // More than any layout holds: the layout's limit comes first.
            return;
        }
        let e = config(i64::try_from(host).unwrap() + 1, 1)
            .machine()
            .expect_err("more than the host");
        assert!(e.to_string().contains("more than this host"), "{e}");
    }

    #[test]
    fn a_missing_kernel_is_named() {
        let Err(e) = config(64, 1).kernel(64 << 20) else {
            panic!("no such file")
        };
        assert_eq!(
            e.to_string(),
            "cannot read the kernel /nonexistent/kernel: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_missing_initrd_is_named() {
        // Any small file that exists will do as the kernel: the initrd is read first.
        let kernel = std::env::temp_dir().join(format!("exitless-kernel-{}", std::process::id()));
        std::fs::write(&kernel, [0u8; 512]).expect("a scratch kernel");
        let cfg = RunConfig {
            kernel: kernel.clone(),
            initrd: Some("/nonexistent/initrd".into()),
            ..config(64, 1)
        };
        let result = cfg.kernel(64 << 20);
        let _ = std::fs::remove_file(&kernel);
        let Err(e) = result else {
            panic!("no such file")
        };
        assert_eq!(
            e.to_string(),
            "cannot read the initrd /nonexistent/initrd: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn the_exit_status_is_qemus_or_zero_or_a_panics() {
        assert_eq!(RunOutcome::DebugExit(0x10).exit_status(), 0x21);
        assert_eq!(RunOutcome::PowerOff.exit_status(), 0);
        assert_eq!(RunOutcome::Reset.exit_status(), 0);
        assert_eq!(RunOutcome::Panicked.exit_status(), 4);
    }
}
