//! The `exitless` binary's command line: clap's argument structs and the help they print.
//! A module of the binary (`mod cli;` in `main.rs`), not of the library; `exitless bench`'s
//! options are the library's [`BenchOptions`], as the bench's scenarios read them.

use std::path::PathBuf;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::{Parser, Subcommand, ValueEnum};

use exitless::api::client;
use exitless::api::routes::{Endpoint, MigrationRequest, SnapshotRequest};
use exitless::contract::{METHOD_AUTO, METHOD_ECAM, METHOD_PIO};
use exitless::irq::CommitStrategy;
use exitless::machine::migration::{Address, DEFAULT_DOWNTIME, MigrationError};
use exitless::machine::{CpuTemplate, DiskConfig, VirtioNetConfig};
use exitless::pci::EcamMode;
use exitless_bench::options::BenchOptions;
use exitless_bench::restore;

/// exitless: a KVM VMM whose device I/O avoids VM exits, and the benchmarks that prove it.
#[derive(Parser)]
#[command(name = "exitless", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Run without seccomp filters, for debugging (backtraces with RUST_BACKTRACE=1, a change
    /// that makes new system calls). By default every thread may make only the system calls
    /// its kind of work needs; a forbidden call ends the process with status 159 and a line
    /// naming the thread and the call.
    #[arg(long, global = true)]
    pub no_seccomp: bool,
}

#[derive(Subcommand)]
pub enum Command {
    /// Boot the embedded probe guest once per configuration and print, per scenario, every
    /// variant side by side: time ratios first, the seed's ratios beside them, then time and
    /// exits per operation, with the host named.
    Bench(BenchOptions),
    /// Boot the probe guest, let it enumerate PCI as an operating system would, and print the
    /// functions it found and the exits that took.
    Probe(ProbeArgs),
    /// Boot a Linux bzImage, an ELF kernel with a PVH entry or a multiboot kernel (what
    /// `qemu -kernel` boots) on a PC-like machine: ACPI tables, the serial console on stdio,
    /// QEMU's isa-debug-exit and fw_cfg. Runs until the guest exits, powers off or resets.
    #[command(after_help = RUN_STATUS)]
    Run(RunArgs),
    /// Ask a running `exitless run --api-socket PATH` to pause, resume, snapshot or shut down
    /// its VM, or for its state or exit counters; prints the JSON answer.
    #[command(after_help = CTL_STATUS)]
    Ctl(CtlArgs),
    /// `exitless bench restore`'s restore in a new process (not for users): restore the
    /// snapshot in DIR, run the probe to its end, print what was measured as JSON.
    #[command(name = restore::CHILD_COMMAND, hide = true)]
    BenchRestoreChild(RestoreChildArgs),
    /// `exitless bench restore`'s launcher of those processes (not for users): one per JSON
    /// line on stdin, answered with one on stdout.
    #[command(name = restore::LAUNCHER_COMMAND, hide = true)]
    BenchRestoreLauncher,
}

/// `exitless bench-restore-child`'s arguments (given by `exitless bench restore`).
#[derive(clap::Args)]
pub struct RestoreChildArgs {
    /// The snapshot's folder.
    pub dir: PathBuf,
    /// The commit strategy in force (`per-vector`, `batched`, `first-use`, `direct`).
    #[arg(long, value_parser = strategy)]
    pub strategy: CommitStrategy,
    /// The probe's ops, whose results are read at its end.
    #[arg(long)]
    pub ops: usize,
    /// Longest the restored probe may run, in seconds.
    #[arg(long)]
    pub timeout: u64,
}

/// A commit strategy by its name.
fn strategy(name: &str) -> Result<CommitStrategy, String> {
    (CommitStrategy::ALL.into_iter())
        .find(|s| s.name() == name)
        .ok_or_else(|| format!("no strategy `{name}`"))
}

/// How `exitless ctl` exits, for its --help.
const CTL_STATUS: &str = "Exit status: 0 when the VM did what was asked (the answer on stdout); 1 when it refused (its error on stderr); 2 when nothing listens at PATH, or no answer comes within --timeout.";

/// How `exitless run` exits, for its --help.
const RUN_STATUS: &str = "Exit status: (v << 1) | 1 when the guest writes v to isa-debug-exit \
(port 0xf4, as QEMU's -device isa-debug-exit,iobase=0xf4,iosize=4; always odd); 0 when it powers \
off (ACPI S5) or resets (i8042 command 0xfe, or 0x06 to port 0xcf9); 4 when its kernel panicked \
and said so on the pvpanic port (0x505, QEMU's; Linux's pvpanic-mmio driver); 2 with a one-line error \
when exitless cannot run it (a bad option, a missing or unrecognised kernel, a guest that \
triple-faults); 124 when the guest runs past --timeout; 159 when a thread breaks its seccomp \
filter. SIGINT, SIGTERM and SIGHUP stop the guest (its disks hold every write it made, taps \
made for the run are removed) and end exitless by that signal, as if it had not caught it \
(a shell reports 128 + the signal's number); SIGQUIT (Ctrl-\\) first logs where each vCPU \
was, as --timeout does, then stops it the same way and exits with 131, without a core dump.";

// Negative numbers are values, not options: `--memory -5` gets the range's message.
#[derive(clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct RunArgs {
    /// The kernel: a Linux bzImage (64-bit boot protocol 2.12 or later), an ELF vmlinux with a
    /// PVH note (XEN_ELFNOTE_PHYS32_ENTRY), or a multiboot v1 image (a 32-bit ELF, a 64-bit ELF
    /// with a multiboot header, or any file whose multiboot header has the address fields).
    #[arg(long, value_name = "FILE", required_unless_present_any = ["restore", "migrate_from"])]
    pub kernel: Option<PathBuf>,
    /// An initial ramdisk for a Linux kernel (boot_params' ramdisk_image and ramdisk_size).
    #[arg(long, value_name = "FILE")]
    pub initrd: Option<PathBuf>,
    /// The kernel command line. A multiboot kernel gets it after its own path, as from QEMU,
    /// Linux as is; fw_cfg's file opt/exitless/cmdline holds it alone.
    #[arg(long, value_name = "STR", default_value = "")]
    pub cmdline: String,
    /// Guest RAM in MiB (from 2, and no more than the host has; past 3072 the rest is mapped
    /// from 4 GiB).
    #[arg(long, value_name = "MIB", default_value_t = 128)]
    pub memory: i64,
    /// vCPUs (1 to 64): the first boots the kernel, the others wait for INIT/SIPI.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub cpus: i64,
    /// Where the serial console goes: `stdio` (output to stdout, input from stdin), or a file
    /// that receives the output (emptied once every other option is checked). A target that
    /// refuses writes (/dev/full, a FIFO nobody reads, a --disk image) is refused at start; a
    /// write that fails later is reported once, and at exit. While the console's reader is
    /// 64 KiB behind, the guest's UART shows its transmitter busy, as QEMU's does, so nothing
    /// is lost; exit waits until the reader has taken everything.
    #[arg(long, value_name = "stdio|FILE", default_value = "stdio")]
    pub console: PathBuf,
    /// Never hold the guest back for the console's reader: drop what the guest writes while
    /// the reader is 64 KiB behind, and wait at most 2 s for it at exit; how many bytes were
    /// dropped is said at exit. For a console nobody may read.
    #[arg(long)]
    pub console_drop: bool,
    /// How the VMM serves the ECAM window (the MCFG table describes it unless `none`).
    #[arg(long, value_enum, default_value = "shadow")]
    pub ecam: EcamArg,
    /// A virtio-blk disk on a raw image, a regular file or a block device (repeatable):
    /// `FILE`, `FILE,ro` for a read-only disk (writes are refused), `FILE,transport=mmio` for
    /// virtio-mmio instead of virtio-pci. A comma in FILE is written twice (`a,,b`). The image
    /// is locked as QEMU locks its own: one VM writes it, or any number read it; an image in
    /// use elsewhere is refused, unless `locking=off` (for those who know the two may share
    /// it). Its capacity is the image's whole 512-byte sectors; its serial the file's name;
    /// `queues=N` request queues (1 to 255; default one per vCPU); `aio=io_uring` (default:
    /// each pass's requests in flight together on an io_uring) or `aio=sync` (one at a time).
    /// `vhost-user=SOCKET`: a disk whose queues the vhost-user backend listening on SOCKET
    /// serves (qemu-storage-daemon's `--export type=vhost-user-blk`), which opens the image
    /// itself (so no `ro` or `locking=`); `queues=N` queues (1 to 255, default 1);
    /// `reconnect=SECONDS`: how long exitless keeps trying to connect again, every 100 ms,
    /// after the backend goes away (default 0: once, at the driver's reset). Guest RAM is then
    /// a shared memfd the backend maps.
    #[arg(
        long,
        value_name = "FILE[,ro][,locking=on|off][,queues=N][,aio=io_uring|sync][,transport=pci|mmio]|vhost-user=SOCKET[,queues=N][,transport=pci|mmio][,reconnect=SECONDS]",
        value_parser = OsStringValueParser::new().try_map(|arg| DiskConfig::parse(&arg))
    )]
    pub disk: Vec<DiskConfig>,
    /// A virtio-net device (repeatable). `tap=NAME`: its frames go to and come from the host's
    /// tap interface NAME (`ip tuntap add dev NAME mode tap`, or created for the run and
    /// brought up if it does not exist and exitless may), so they reach the host's network
    /// stack; `none`: a device with no link (what the guest sends is dropped, nothing arrives).
    /// Options: `mac=52:54:00:12:34:56` (default: for a tap, 52:54:00 and three bytes derived
    /// from its name, printed at start; with no link, 52:54:00:7e:57:N for the Nth device),
    /// `queues=N` queue pairs (a tap made with `multi_queue`; default 1),
    /// `vectors=N` MSI-X vectors (2 × queue pairs + 1, the default, to 256; virtio-pci only:
    /// QEMU's `virtio-net-pci,vectors=N`), `transport=mmio` for virtio-mmio instead of
    /// virtio-pci, `vhost=on` (a tap only) for the kernel's vhost-net to move the tap's frames
    /// (needs /dev/vhost-net; not with --iommu; docs/vhost-user.md says the trade-off).
    /// `vhost-user=SOCKET`: the vhost-user backend listening on SOCKET (DPDK testpmd's
    /// `net_vhost`, for one) moves the frames, its `queues=N` queue pairs; `reconnect=SECONDS`
    /// as for `--disk vhost-user=`. Guest RAM is then a shared memfd the backend maps.
    #[arg(
        long,
        value_name = "tap=NAME|none|vhost-user=SOCKET[,mac=MAC][,queues=N][,vectors=N][,transport=pci|mmio][,vhost=on|off][,reconnect=SECONDS]",
        value_parser = clap::value_parser!(VirtioNetConfig)
    )]
    pub net: Vec<VirtioNetConfig>,
    /// Give the machine a VT-d IOMMU at 0xFED90000, described by an ACPI DMAR table
    /// (virtio-pci devices offer VIRTIO_F_ACCESS_PLATFORM behind it).
    #[arg(long)]
    pub iommu: bool,
    /// Stop the guest after this many seconds and exit with status 124, as timeout(1) does
    /// (and, as there, 0 is no limit), saying first where each vCPU was.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// The vCPUs' CPU model: `host` (what KVM supports, less xsave and cx16, which this
    /// host's ring-0 emulator lacks) or `baseline` (x86-64-v2 with x2apic and hypervisor, the
    /// same on any host: docs/run.md lists it), then `,+FEATURE` to show a feature (refused
    /// if this host's KVM cannot give it) or `,-FEATURE` to hide one, e.g.
    /// `host,-avx,+xsave`. Features that need a hidden one (avx without xsave) are hidden too.
    /// Feature names are QEMU's: `exitless probe --cpuid --cpu ...` shows what a guest sees.
    #[arg(
        long,
        value_name = "host|baseline[,+FEAT|,-FEAT]...",
        default_value = "host"
    )]
    pub cpu: CpuTemplate,
    /// Keep guest RAM in a core dump of exitless, for debugging a guest. By default it is
    /// left out (MADV_DONTDUMP): it is the guest's data, and as large as --memory.
    #[arg(long)]
    pub dump_guest_memory: bool,
    /// Make guest RAM a memfd mapped shared (as a vhost-user device makes it), so that
    /// `exitless ctl ... migrate local:PATH` can hand it, with the disks and taps, to a new
    /// exitless on this host: a live update of exitless itself, no memory copied.
    #[arg(long)]
    pub shared_memory: bool,
    /// Serve the control API (HTTP/1.1 + JSON, docs/api.md) on a Unix socket at PATH, made
    /// owner-only (0600) and removed at exit: `vm.info`, `vm.counters`, `vm.pause`,
    /// `vm.resume`, `vm.snapshot`, `vm.send-migration`, `vm.shutdown`, as `exitless ctl` or `curl --unix-socket PATH` ask them. A
    /// socket left there by a VMM that is gone is replaced; anything else there is refused.
    #[arg(long, value_name = "PATH")]
    pub api_socket: Option<PathBuf>,
    /// Restore the snapshot in DIR (`exitless ctl ... snapshot DIR`) instead of booting a
    /// kernel: the same machine, its disks, taps and sockets where they were, run on from
    /// where it was. The machine's options come from the snapshot and are refused here;
    /// --console, --console-drop, --timeout, --api-socket and --paused are this run's. A
    /// snapshot of another version, corrupt, with its memory file cut short or a disk gone
    /// is refused with one line (status 2) before anything starts.
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with_all = [
            "kernel", "initrd", "cmdline", "memory", "cpus", "ecam", "disk", "net", "iommu",
            "cpu", "dump_guest_memory", "shared_memory",
        ]
    )]
    pub restore: Option<PathBuf>,
    /// Wait at ADDRESS (tcp:IP:PORT, or unix:PATH or local:PATH, a path that must not exist:
    /// the same here; a source on this host that hands its RAM and files over makes it a
    /// live update) for a VM that
    /// another exitless sends (`exitless ctl ... migrate ADDRESS`), and run it on from where
    /// it was there. The machine's options come from the source, its disks, taps and sockets
    /// named as there; --console, --console-drop, --timeout and --api-socket are this run's.
    /// A stream of another exitless, corrupt or cut short is refused with one line (status
    /// 2) before any vCPU runs, and the source goes on (docs/migration.md).
    #[arg(
        long,
        value_name = "ADDRESS",
        value_parser = migration_address,
        conflicts_with_all = [
            "kernel", "initrd", "cmdline", "memory", "cpus", "ecam", "disk", "net", "iommu",
            "cpu", "dump_guest_memory", "shared_memory", "restore", "paused",
        ]
    )]
    pub migrate_from: Option<Address>,
    /// With --restore: every vCPU stays parked until `exitless ctl ... resume`.
    #[arg(long)]
    pub paused: bool,
}

/// `exitless ctl`'s arguments.
#[derive(clap::Args)]
pub struct CtlArgs {
    /// The socket `exitless run --api-socket` serves (required; before or after the action:
    /// an option of every action, which clap cannot also make required).
    #[arg(long, value_name = "PATH", global = true)]
    pub api_socket: Option<PathBuf>,
    /// Give up on an answer that has not come after SECONDS (a hung VMM); a snapshot of a
    /// large guest may want more.
    #[arg(long, value_name = "SECONDS", global = true, default_value_t = client::DEFAULT_ANSWER_WAIT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// What to ask.
    #[command(subcommand)]
    pub action: CtlAction,
}

/// What `exitless ctl` asks of the VM.
#[derive(Clone, PartialEq, Eq, Subcommand)]
pub enum CtlAction {
    /// Stop every vCPU at an instruction boundary (answers once all are stopped).
    Pause,
    /// Let the paused vCPUs go on.
    Resume,
    /// The VM's state, vCPUs, memory, devices and exitless's version.
    Info,
    /// End the run: `exitless run` exits 0.
    Shutdown,
    /// The exit accounting: every exit so far, by kind and by device.
    Counters,
    /// Save the VM into DIR (made if absent): a running VM is paused meanwhile and goes on
    /// after, a paused one stays paused. `exitless run --restore DIR` brings it back.
    Snapshot {
        /// The directory: guest memory's file and the description (docs/snapshot.md).
        #[arg(value_name = "DIR")]
        destination: PathBuf,
    },
    /// Send the VM, while it runs, to an `exitless run --migrate-from ADDRESS` (tcp:IP:PORT
    /// or unix:PATH): memory is copied in passes, then the VM pauses for its last pages and
    /// its devices' state and runs on there; this run then ends (status 0). If anything fails
    /// before that, the VM goes on here as it was. Prints what was measured (docs/migration.md).
    /// local:PATH, to an exitless on this host, is a live update: guest RAM (--shared-memory),
    /// disk images and taps are handed over as they are, nothing copied.
    Migrate {
        /// Where the target waits.
        #[arg(value_name = "ADDRESS", value_parser = migration_address)]
        destination: Address,
        /// The pause to aim for, in milliseconds: memory is copied again while more is left
        /// than the stream carries in that time (at most 30 passes).
        #[arg(long, value_name = "MS", default_value_t = DEFAULT_DOWNTIME.as_millis() as u64)]
        downtime_ms: u64,
    },
}

/// A migration's address, as `tcp:IP:PORT` or `unix:PATH`.
fn migration_address(text: &str) -> Result<Address, String> {
    text.parse().map_err(|e: MigrationError| e.to_string())
}

impl CtlAction {
    /// The API endpoint it asks.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            CtlAction::Pause => Endpoint::Pause,
            CtlAction::Resume => Endpoint::Resume,
            CtlAction::Info => Endpoint::Info,
            CtlAction::Shutdown => Endpoint::Shutdown,
            CtlAction::Counters => Endpoint::Counters,
            CtlAction::Snapshot { .. } => Endpoint::Snapshot,
            CtlAction::Migrate { .. } => Endpoint::SendMigration,
        }
    }

    /// The request's body: a snapshot's destination or a migration's Unix socket made
    /// absolute (the VMM's working directory is not the client's), as JSON; nothing for the
    /// others.
    pub fn body(&self) -> Result<Vec<u8>, String> {
        let absolute = |path: &PathBuf, what: &str| {
            std::path::absolute(path).map_err(|e| format!("{what} {}: {e}", path.display()))
        };
        let body = match self {
            CtlAction::Snapshot { destination } => serde_json::to_vec(&SnapshotRequest {
                destination: absolute(destination, "snapshot")?,
            }),
            CtlAction::Migrate {
                destination,
                downtime_ms,
            } => {
                let destination = match destination {
                    Address::Unix(path) => Address::Unix(absolute(path, "migrate")?),
                    tcp => tcp.clone(),
                };
                serde_json::to_vec(&MigrationRequest {
                    destination_url: destination.to_string(),
                    downtime_ms: Some(*downtime_ms),
                })
            }
            _ => return Ok(Vec::new()),
        };
        body.map_err(|e| e.to_string())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EcamArg {
    /// ECAM described; every access exits to the VMM.
    Trap,
    /// ECAM described; reads come from a read-only shadow and never exit, writes exit.
    Shadow,
    /// No ECAM: the guest has only port I/O.
    None,
}

impl EcamArg {
    /// How the machine serves ECAM; `None`: not described.
    pub fn mode(self) -> Option<EcamMode> {
        match self {
            EcamArg::Trap => Some(EcamMode::Trap),
            EcamArg::Shadow => Some(EcamMode::Shadow),
            EcamArg::None => None,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MethodArg {
    /// The guest decides: ECAM under a hypervisor when ECAM is described, else port I/O.
    Auto,
    /// Configuration mechanism #1 (0xCF8/0xCFC).
    Pio,
    /// The ECAM window.
    Ecam,
}

impl MethodArg {
    /// The probe's `METHOD_*` for it.
    pub fn method(self) -> u64 {
        match self {
            MethodArg::Auto => METHOD_AUTO,
            MethodArg::Pio => METHOD_PIO,
            MethodArg::Ecam => METHOD_ECAM,
        }
    }
}

#[derive(clap::Args)]
#[command(allow_negative_numbers = true)]
pub struct ProbeArgs {
    /// How the VMM serves the ECAM window.
    #[arg(long, value_enum, default_value = "shadow")]
    pub ecam: EcamArg,
    /// How the guest reaches config space.
    #[arg(long, value_enum, default_value = "auto")]
    pub method: MethodArg,
    /// vCPUs (the probe runs on the first; the others park).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    pub vcpus: u8,
    /// Also show the guest's serial console, as it is written.
    #[arg(long)]
    pub console: bool,
    /// Print the CPUID leaves a guest of `--cpu` sees, instead of booting the probe.
    #[arg(long)]
    pub cpuid: bool,
    /// The CPU template, as `exitless run --cpu` takes it.
    #[arg(
        long,
        value_name = "host|baseline[,+FEAT|,-FEAT]...",
        default_value = "host"
    )]
    pub cpu: CpuTemplate,
}
