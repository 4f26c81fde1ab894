//! The `exitless` command line. Everything else lives in the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use exitless::bench::against::{self, PeerResult};
use exitless::bench::host_tap::{HostTap, TapLink};
use exitless::bench::{
    Report, host, iommu::IommuBench, msix::MsixBench, pci::PciBench, report, rr::RrBench,
    soak::SoakBench,
};
use exitless::contract::{METHOD_AUTO, METHOD_ECAM, METHOD_PIO, STATUS_OK};
use exitless::inspect;
use exitless::machine::run::{RunConfig, RunError};
use exitless::machine::{
    Console, DiskConfig, MAX_QUEUE_PAIRS, NetBackendKind, ProbeConfig, Transport, VirtioNetConfig,
};
use exitless::pci::EcamMode;
use exitless::peer::Qemu;
use exitless::seccomp::{self, ThreadKind};
use exitless::virtio::notify::NotifyPath;

/// exitless: a KVM VMM whose device I/O avoids VM exits, and the benchmarks that prove it.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Run without seccomp filters, for debugging (backtraces with RUST_BACKTRACE=1, a change
    /// that makes new system calls). By default every thread may make only the system calls
    /// its kind of work needs; a forbidden call ends the process with status 159 and a line
    /// naming the thread and the call.
    #[arg(long, global = true)]
    no_seccomp: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Boot the embedded probe guest once per configuration and print, per scenario, every
    /// variant side by side: time ratios first, the seed's ratios beside them, then time and
    /// exits per operation, with the host named.
    Bench(BenchArgs),
    /// Boot the probe guest, let it enumerate PCI as an operating system would, and print the
    /// functions it found and the exits that took.
    Probe(ProbeArgs),
    /// Boot a multiboot kernel (what `qemu -kernel` boots without a Linux header, such as a
    /// test kernel) on a PC-like machine: ACPI tables, the serial console on stdio, QEMU's
    /// isa-debug-exit and fw_cfg. Runs until the guest exits, powers off or resets.
    #[command(after_help = RUN_STATUS)]
    Run(RunArgs),
}

/// How `exitless run` exits, for its --help.
const RUN_STATUS: &str = "Exit status: (v << 1) | 1 when the guest writes v to isa-debug-exit \
(port 0xf4, as QEMU's -device isa-debug-exit,iobase=0xf4,iosize=4; always odd); 0 when it powers \
off (ACPI S5) or resets (i8042 command 0xfe, or 0x06 to port 0xcf9); 2 with a one-line error \
when exitless cannot run it (a bad option, a missing or unrecognised kernel, a guest that \
triple-faults); 124 when the guest runs past --timeout; 159 when a thread breaks its seccomp \
filter.";

/// `exitless run`'s status for an error of its own: even, so never a guest's isa-debug-exit
/// status (always odd), nor a clean exit.
const RUN_ERROR_STATUS: u8 = 2;
/// The status of a mistake on the command line, for every subcommand: clap's, and
/// `exitless run`'s own error status.
const USAGE_ERROR_STATUS: u8 = RUN_ERROR_STATUS;
/// `exitless run`'s status when the guest runs past --timeout: timeout(1)'s, and even.
const RUN_TIMEOUT_STATUS: u8 = 124;

#[derive(clap::Args)]
struct RunArgs {
    /// The kernel: a Linux bzImage (64-bit boot protocol 2.12 or later), an ELF vmlinux with a
    /// PVH note (XEN_ELFNOTE_PHYS32_ENTRY), or a multiboot v1 image (a 32-bit ELF, a 64-bit ELF
    /// with a multiboot header, or any file whose multiboot header has the address fields).
    #[arg(long, value_name = "FILE")]
    kernel: PathBuf,
    /// An initial ramdisk for a Linux kernel (boot_params' ramdisk_image and ramdisk_size).
    #[arg(long, value_name = "FILE")]
    initrd: Option<PathBuf>,
    /// The kernel command line. A multiboot kernel gets it after its own path, as from QEMU,
    /// Linux as is; fw_cfg's file opt/exitless/cmdline holds it alone.
    #[arg(long, value_name = "STR", default_value = "")]
    cmdline: String,
    /// Guest RAM in MiB (2 to 3072, and no more than the host has).
    #[arg(long, value_name = "MIB", default_value_t = 128)]
    memory: u64,
    /// vCPUs (1 to 64): the first boots the kernel, the others wait for INIT/SIPI.
    #[arg(long, value_name = "N", default_value_t = 1)]
    cpus: u64,
    /// Where the serial console goes: `stdio` (output to stdout, input from stdin), or a file
    /// that receives the output.
    #[arg(long, value_name = "stdio|FILE", default_value = "stdio")]
    console: String,
    /// How the VMM serves the ECAM window (the MCFG table describes it unless `none`).
    #[arg(long, value_enum, default_value = "shadow")]
    ecam: EcamArg,
    /// A virtio-blk disk on a raw file (repeatable): `FILE`, `FILE,ro` for a read-only disk
    /// (writes are refused), `FILE,transport=mmio` for virtio-mmio instead of virtio-pci. Its
    /// capacity is the file's whole 512-byte sectors; its serial the file's name.
    #[arg(long, value_name = "FILE[,ro][,transport=pci|mmio]", value_parser = parse_disk)]
    disk: Vec<DiskConfig>,
    /// A virtio-net device (repeatable). `tap=NAME`: its frames go to and come from the host's
    /// tap interface NAME (`ip tuntap add dev NAME mode tap`, or created for the run if it does
    /// not exist and exitless may), so they reach the host's network stack; `none`: a device
    /// with no link (what the guest sends is dropped, nothing arrives). Options:
    /// `mac=52:54:00:12:34:56` (default 52:54:00:7e:57:N for the Nth device, locally
    /// administered), `queues=N` queue pairs (a tap made with `multi_queue`; default 1),
    /// `transport=mmio` for virtio-mmio instead of virtio-pci.
    #[arg(
        long,
        value_name = "tap=NAME|none[,mac=MAC][,queues=N][,transport=pci|mmio]",
        value_parser = parse_net
    )]
    net: Vec<VirtioNetConfig>,
    /// Give the machine a VT-d IOMMU at 0xFED90000, described by an ACPI DMAR table
    /// (virtio-pci devices offer VIRTIO_F_ACCESS_PLATFORM behind it).
    #[arg(long)]
    iommu: bool,
    /// Stop the guest after this many seconds and exit with status 124 (as timeout(1) does).
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
}

/// Boot the kernel; the status to exit with.
fn run(args: RunArgs) -> Result<u8, String> {
    // A second open of the same single-queue tap is refused as busy, which would blame
    // another process. (A BTreeSet: a HashSet's random seed needs getrandom, which the
    // main thread's filter refuses.)
    let mut taps = std::collections::BTreeSet::new();
    for net in &args.net {
        if let NetBackendKind::Tap(name) = &net.backend
            && !taps.insert(name)
        {
            return Err(format!(
                "--net tap={name} given twice: each device needs a tap of its own"
            ));
        }
    }
    let console = match args.console.as_str() {
        "stdio" => Console::Stdio,
        path => Console::File(path.into()),
    };
    let cfg = RunConfig {
        kernel: args.kernel,
        initrd: args.initrd,
        cmdline: args.cmdline,
        memory_mib: args.memory,
        cpus: args.cpus,
        ecam: ecam_mode(args.ecam),
        iommu: args.iommu,
        console,
        disks: args.disk,
        nets: args.net,
        timeout: args.timeout.map(Duration::from_secs),
    };
    match cfg.run() {
        Ok(outcome) => Ok(outcome.exit_status()),
        Err(e @ RunError::TimedOut(_)) => {
            eprintln!("exitless: {e}");
            Ok(RUN_TIMEOUT_STATUS)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// `--disk FILE[,ro][,transport=pci|mmio]`. The file is opened when the machine is built.
fn parse_disk(s: &str) -> Result<DiskConfig, String> {
    let mut parts = s.split(',');
    let path = parts.next().filter(|p| !p.is_empty()).ok_or("no file")?;
    let mut disk = DiskConfig {
        path: path.into(),
        read_only: false,
        transport: Transport::Pci,
    };
    for option in parts {
        match option {
            "ro" => disk.read_only = true,
            "transport=pci" => disk.transport = Transport::Pci,
            "transport=mmio" => disk.transport = Transport::Mmio,
            _ => {
                return Err(format!(
                    "unknown option `{option}` (ro, transport=pci|mmio)"
                ));
            }
        }
    }
    Ok(disk)
}

/// `--net tap=NAME|none[,mac=MAC][,queues=N][,transport=pci|mmio]`. The tap is opened when the
/// machine is built.
fn parse_net(s: &str) -> Result<VirtioNetConfig, String> {
    let mut parts = s.split(',');
    let backend = match parts.next().unwrap_or_default() {
        "none" => NetBackendKind::Sink,
        tap => match tap.strip_prefix("tap=") {
            Some(name) if !name.is_empty() => NetBackendKind::Tap(name.into()),
            _ => return Err(format!("`{tap}`: tap=NAME or none first")),
        },
    };
    let mut net = VirtioNetConfig {
        backend,
        ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
    };
    for option in parts {
        match option.split_once('=') {
            Some(("mac", mac)) => net.mac = Some(parse_mac(mac)?),
            Some(("queues", n)) => {
                net.queue_pairs = n
                    .parse()
                    .ok()
                    .filter(|&n| (1..=MAX_QUEUE_PAIRS).contains(&usize::from(n)))
                    .ok_or(format!("queues={n}: 1 to {MAX_QUEUE_PAIRS} queue pairs"))?;
            }
            Some(("transport", "pci")) => net.transport = Transport::Pci,
            // QueueNotify with its queue index: the doorbell a standard driver uses never
            // exits (the per-queue pages are the MSI extension's).
            Some(("transport", "mmio")) => {
                (net.transport, net.notify) = (Transport::Mmio, NotifyPath::Datamatch);
            }
            _ => {
                return Err(format!(
                    "unknown option `{option}` (mac=MAC, queues=N, transport=pci|mmio)"
                ));
            }
        }
    }
    Ok(net)
}

/// Six hexadecimal bytes separated by colons, not all zero (no station has that address),
/// unicast (bit 0 of the first byte clear: a
/// multicast source address is invalid, IEEE 802-2014 §8.2).
fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let bad =
        || format!("mac={s}: six hexadecimal bytes, xx:xx:xx:xx:xx:xx, unicast, not all zero");
    let mut mac = [0u8; 6];
    let mut bytes = s.split(':');
    for b in &mut mac {
        let part = bytes.next().filter(|p| p.len() == 2).ok_or_else(bad)?;
        *b = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    if bytes.next().is_some() || mac[0] & 1 != 0 || mac == [0; 6] {
        return Err(bad());
    }
    Ok(mac)
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EcamArg {
    /// ECAM described; every access exits to the VMM.
    Trap,
    /// ECAM described; reads come from a read-only shadow and never exit, writes exit.
    Shadow,
    /// No ECAM: the guest has only port I/O.
    None,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MethodArg {
    /// The guest decides: ECAM under a hypervisor when ECAM is described, else port I/O.
    Auto,
    /// Configuration mechanism #1 (0xCF8/0xCFC).
    Pio,
    /// The ECAM window.
    Ecam,
}

#[derive(clap::Args)]
struct ProbeArgs {
    /// How the VMM serves the ECAM window.
    #[arg(long, value_enum, default_value = "shadow")]
    ecam: EcamArg,
    /// How the guest reaches config space.
    #[arg(long, value_enum, default_value = "auto")]
    method: MethodArg,
    /// vCPUs (the probe runs on the first; the others park).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=64))]
    vcpus: u8,
    /// Also show the guest's serial console, as it is written.
    #[arg(long)]
    console: bool,
}

fn ecam_mode(arg: EcamArg) -> Option<EcamMode> {
    match arg {
        EcamArg::Trap => Some(EcamMode::Trap),
        EcamArg::Shadow => Some(EcamMode::Shadow),
        EcamArg::None => None,
    }
}

fn probe(args: ProbeArgs) -> Result<(), String> {
    let ecam = ecam_mode(args.ecam);
    let method = match args.method {
        MethodArg::Auto => METHOD_AUTO,
        MethodArg::Pio => METHOD_PIO,
        MethodArg::Ecam => METHOD_ECAM,
    };
    let cfg = ProbeConfig {
        ecam,
        vcpus: args.vcpus,
        console_to_stdout: args.console,
        ..Default::default()
    };
    let run = inspect::enumerate(cfg, method).map_err(|e| e.to_string())?;
    if run.results[0].status != STATUS_OK {
        return Err(
            "the guest cannot enumerate by ECAM when none is described (use --ecam trap or shadow)"
                .into(),
        );
    }
    emit(&inspect::describe(&run, ecam))
}

/// Write `text` to stdout. A reader that went away (`exitless probe | head -2`) ends the
/// output normally, as for any Unix filter; other errors are reported.
fn emit(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write the report to stdout: {e}"))
        }
        _ => Ok(()),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// PCI config space by port I/O, trapped ECAM and shadowed ECAM (T1, seed 000).
    Pci,
    /// virtio-net request/response over virtio-pci (MSI-X), virtio-mmio (legacy line) and
    /// virtio-mmio (MSI extension), each with doorbells that exit, hit a datamatch ioeventfd or
    /// an address-only ioeventfd, MSI delivered through irqfds and directly (T2 + T4, seeds
    /// 001 and 004).
    Rr,
    /// MSI-X Enable, unmask bursts and interrupts on multiqueue virtio-net functions with every
    /// vector programmed: GSI routes committed per vector, once per guest access, at a vector's
    /// first message, or no routes (KVM_SIGNAL_MSI) (T3, seed 002, and beyond).
    Msix,
    /// Unmaps behind a virtual VT-d IOMMU: strict invalidation against deferred and batched
    /// (the seed's list and array, per-domain, Linux's flush queue) and a high-water-mark
    /// sweep, on a small-frame transmit stream and request/response (T5, seed 003).
    Iommu,
    /// A hostile guest: bursts of random accesses into every device window and config space,
    /// BAR moves, resets with requests in flight, random descriptor chains and MSI messages,
    /// each followed by correct transactions on every device; reports accesses, resets,
    /// transactions, VMM memory before and after, panics. Not in the default run.
    Soak,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Scenarios to run (default: all).
    #[arg(value_enum)]
    scenarios: Vec<Scenario>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write an SVG chart of the results to this file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Config reads per read variant of `pci` (the seed used 100000).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    reads: u64,
    /// Enumerations per method in `pci`; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=100))]
    enumerations: u16,
    /// Request/response transactions per variant of `rr`.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    transactions: u64,
    /// Request frame size of `rr` in bytes (netperf -r REQUEST,RESPONSE).
    #[arg(long, default_value_t = 32)]
    request_size: u64,
    /// Response frame size of `rr` in bytes.
    #[arg(long, default_value_t = 1024)]
    response_size: u64,
    /// virtio-net PCI functions in `msix`.
    #[arg(long, default_value_t = 8)]
    devices: usize,
    /// Queue pairs per function in `msix` (2 × pairs + 1 MSI-X vectors; the seed had 65).
    #[arg(long, default_value_t = 32)]
    queue_pairs: u16,
    /// Frames streamed per variant of `iommu`.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    packets: u64,
    /// Frames in flight at most in `iommu` (the transmit queue holds 16).
    #[arg(long, default_value_t = 8)]
    in_flight: u64,
    /// Hostile bursts in `soak` (50 per boot of the probe).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    bursts: u64,
    /// Random accesses per burst in `soak`.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    accesses: u64,
    /// Seed of the first `soak` burst (the report names it, to reproduce a run).
    #[arg(long, default_value_t = 0x5eed, value_parser = parse_seed)]
    seed: u64,
    /// Give up on a guest run after this many seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout: u64,
    /// Also boot the same probe binary under another VMM, with the same guest ops, and print
    /// its time per op beside each variant's: `qemu` (Debian's qemu-system-x86: q35 with KVM,
    /// its own virtio-net-pci and config space, and its intel-iommu for iommu's stream).
    /// Scenarios pci, msix, rr and iommu (rr: ICMP echo with the host's kernel through a tap
    /// the bench makes, which needs CAP_NET_ADMIN); without QEMU installed the bench says how
    /// to install it and runs without the column.
    #[arg(long, value_enum, value_name = "VMM")]
    against: Option<PeerArg>,
}

/// The VMMs `exitless bench --against` can measure.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PeerArg {
    /// qemu-system-x86_64 with KVM.
    Qemu,
}

/// A checked `exitless bench` command line, and the peer's figures when it asked for them.
struct PreparedBench {
    args: BenchArgs,
    scenarios: Vec<Scenario>,
    peers: Vec<(Scenario, PeerResult)>,
    /// Why a scenario the peer could have run has no figures from it.
    unpeered: Vec<(Scenario, String)>,
    /// `rr`'s host tap, for exitless's own boot on it; deleted when dropped.
    host_tap: Option<HostTap>,
}

/// Check the bench options and, with `--against`, boot the probe under the peer first. This
/// runs before the main thread confines itself: QEMU inherits a seccomp filter across fork and
/// execve, and cannot run under exitless's.
fn prepare_bench(args: BenchArgs) -> Result<PreparedBench, String> {
    let scenarios = if args.scenarios.is_empty() {
        vec![Scenario::Pci, Scenario::Rr, Scenario::Msix]
    } else {
        args.scenarios.clone()
    };
    let mut peers = Vec::new();
    let (mut unpeered, mut host_tap) = (Vec::new(), None);
    if args.against == Some(PeerArg::Qemu) {
        if scenarios.contains(&Scenario::Soak) {
            let why = "not measured under qemu: the soak counts failures, not time";
            unpeered.push((Scenario::Soak, why.to_owned()));
        }
        match Qemu::find() {
            Err(e) => eprintln!("exitless: {e}; running without the qemu column"),
            Ok(qemu) => {
                for &scenario in &scenarios {
                    let plan = match scenario {
                        Scenario::Pci => pci_bench(&args).peer_plan(),
                        Scenario::Msix => msix_bench(&args)?.peer_plan(),
                        Scenario::Rr => match HostTap::create(TapLink::bench()) {
                            Ok(tap) => {
                                let link = tap.link().clone();
                                host_tap = Some(tap);
                                rr_bench(&args, Some(link.clone()))?.peer_plan(&link)
                            }
                            Err(why) => {
                                unpeered
                                    .push((scenario, format!("not measured under qemu: {why}")));
                                continue;
                            }
                        },
                        Scenario::Iommu => iommu_bench(&args)?.peer_plan(),
                        Scenario::Soak => continue,
                    };
                    let result = against::run(&qemu, plan)
                        .map_err(|e| format!("the probe under {}: {e}", qemu.version()))?;
                    peers.push((scenario, result));
                }
            }
        }
    }
    Ok(PreparedBench {
        args,
        scenarios,
        peers,
        unpeered,
        host_tap,
    })
}

fn rr_bench(args: &BenchArgs, tap: Option<TapLink>) -> Result<RrBench, String> {
    let rr = RrBench {
        transactions: args.transactions,
        request_size: args.request_size,
        response_size: args.response_size,
        timeout: Duration::from_secs(args.timeout),
        tap,
    };
    rr.validate()?;
    Ok(rr)
}

fn pci_bench(args: &BenchArgs) -> PciBench {
    PciBench {
        reads: args.reads,
        enumerations: args.enumerations,
        timeout: Duration::from_secs(args.timeout),
    }
}

fn msix_bench(args: &BenchArgs) -> Result<MsixBench, String> {
    let msix = MsixBench {
        devices: args.devices,
        queue_pairs: args.queue_pairs,
        timeout: Duration::from_secs(args.timeout),
    };
    msix.validate()?;
    Ok(msix)
}

fn iommu_bench(args: &BenchArgs) -> Result<IommuBench, String> {
    let iommu = IommuBench {
        packets: args.packets,
        in_flight: args.in_flight,
        transactions: args.transactions,
        timeout: Duration::from_secs(args.timeout),
    };
    iommu.validate()?;
    Ok(iommu)
}

fn bench(prepared: PreparedBench) -> Result<(), String> {
    let PreparedBench {
        args,
        scenarios,
        peers,
        unpeered,
        host_tap,
    } = prepared;
    let rr = rr_bench(&args, host_tap.as_ref().map(|t| t.link().clone()))?;
    let msix = msix_bench(&args)?;
    let iommu = iommu_bench(&args)?;
    let soak = SoakBench {
        bursts: args.bursts,
        accesses: args.accesses,
        seed: args.seed,
        timeout: Duration::from_secs(args.timeout),
    };
    soak.validate()?;
    let mut report = Report {
        host: host::describe(),
        scenarios: Vec::new(),
    };
    for scenario in scenarios {
        let result = match scenario {
            Scenario::Pci => pci_bench(&args).run(),
            Scenario::Rr => rr.run(),
            Scenario::Msix => msix.run(),
            Scenario::Iommu => iommu.run(),
            Scenario::Soak => soak.run(),
        };
        let mut scenario_report = result.map_err(|e| e.to_string())?;
        match peers.iter().find(|(s, _)| *s == scenario) {
            Some((_, peer)) => peer.attach(&mut scenario_report),
            None => scenario_report.notes.extend(
                unpeered
                    .iter()
                    .filter(|(s, _)| *s == scenario)
                    .map(|(_, why)| why.clone()),
            ),
        }
        report.scenarios.push(scenario_report);
    }
    if args.json {
        emit(&(report::json(&report) + "\n"))?;
    } else {
        emit(&report::text(&report))?;
    }
    if let Some(path) = args.svg {
        std::fs::write(&path, report::svg(&report))
            .map_err(|e| format!("cannot write the chart to {}: {e}", path.display()))?;
    }
    Ok(())
}

/// A seed in decimal or, with 0x, hexadecimal.
fn parse_seed(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("not a seed ({e}): give a number such as 42 or 0x5eed"))
}

/// Raise the soft open-file limit to the hard one: every MSI vector and doorbell holds an
/// eventfd, and 8 devices × 65 vectors alone pass the usual soft limit of 1024.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Parse the command line. A mistake in it gets one line and status 2 (clap's own status for
/// usage errors), as every other bad input does; `--help` and `--version` print as usual.
fn parse_command_line() -> Result<Cli, ExitCode> {
    Cli::try_parse().map_err(|e| {
        if !e.use_stderr() {
            // --help or --version: not an error.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // clap's message is a paragraph (the error, maybe the arguments it names), then a blank
        // line and usage hints: the paragraph, joined into one line, says it all.
        let rendered = e.to_string();
        let paragraph: Vec<&str> = rendered
            .lines()
            .take_while(|line| !line.trim().is_empty())
            .map(str::trim)
            .collect();
        let message = paragraph.join(" ");
        let reason = message.strip_prefix("error: ").unwrap_or(&message);
        eprintln!("exitless: error: {reason} (see --help)");
        ExitCode::from(USAGE_ERROR_STATUS)
    })
}

fn main() -> ExitCode {
    let cli = match parse_command_line() {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    // `exitless run` exits with the guest's status, and its own errors with an even one.
    let error_status = match cli.command {
        Command::Run(_) => ExitCode::from(RUN_ERROR_STATUS),
        _ => ExitCode::FAILURE,
    };
    // Before any thread starts, so that each confines itself as it starts (the log writer now).
    if !cli.no_seccomp
        && let Err(e) = seccomp::enable()
    {
        eprintln!("exitless: error: {e}");
        return error_status;
    }
    exitless::logging::init();
    raise_open_file_limit();
    // The main thread's own filter, before it builds any machine.
    let confine = || seccomp::confine(ThreadKind::Main).map_err(|e| e.to_string());
    let result = match cli.command {
        // The peer's boots (`--against`) come before the filter: QEMU would inherit it.
        Command::Bench(args) => prepare_bench(args)
            .and_then(|prepared| confine().and_then(|()| bench(prepared)))
            .map(|()| ExitCode::SUCCESS),
        Command::Probe(args) => confine()
            .and_then(|()| probe(args))
            .map(|()| ExitCode::SUCCESS),
        Command::Run(args) => confine().and_then(|()| run(args)).map(ExitCode::from),
    };
    // Log lines still queued come before the error, and are not lost at exit.
    exitless::logging::flush();
    result.unwrap_or_else(|e| {
        eprintln!("exitless: error: {e}");
        error_status
    })
}
