//! The knobs of `exitless bench` (its command line, which the binary parses with clap), the
//! scenarios it runs when none is named, and the scenario benches the knobs make.

use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;

use crate::iommu::{IommuBench, MAX_FRAME_PAYLOAD};
use crate::msix::MsixBench;
use crate::pci::PciBench;
use crate::restore::RestoreBench;
use crate::rr::RrBench;
use crate::soak::SoakBench;
use crate::vhost_net::VhostPorts;
use exitless_peer::host_tap::TapLink;

/// A scenario of `exitless bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// PCI config space by port I/O, trapped ECAM and shadowed ECAM.
    Pci,
    /// virtio-net request/response over virtio-pci (MSI-X), virtio-mmio (legacy line) and
    /// virtio-mmio (MSI extension), each with doorbells that exit, hit a datamatch ioeventfd or
    /// an address-only ioeventfd, MSI delivered through irqfds and directly.
    Rr,
    /// MSI-X Enable, unmask bursts and interrupts on multiqueue virtio-net functions with every
    /// vector programmed: GSI routes committed per vector, once per guest access, at a vector's
    /// first message, or no routes (KVM_SIGNAL_MSI).
    Msix,
    /// Unmaps behind a virtual VT-d IOMMU: strict invalidation against deferred and batched
    /// (the seed's list and array, per-domain, Linux's flush queue) and a high-water-mark
    /// sweep, on a small-frame transmit stream and request/response. Not in the default run.
    Iommu,
    /// A hostile guest: bursts of random accesses into every device window and config space,
    /// BAR moves, resets with requests in flight, random descriptor chains and MSI messages,
    /// each followed by correct transactions on every device; reports accesses, resets,
    /// transactions, VMM memory before and after, panics. Not in the default run.
    Soak,
    /// Restoring a snapshot whose virtio-net functions have every MSI-X vector live, traffic
    /// in flight: once per strategy, the restore's phases, commits and first interrupts, the
    /// seed's per-function table; each strategy's restore again in a new exitless process, timed
    /// from the process's start to its vCPUs running and to each function's first interrupt
    /// (the figure set against QEMU's resume). Not in the default run.
    Restore,
}

impl Scenario {
    /// What `exitless bench` runs when no scenario is named: the three that finish in minutes.
    pub const DEFAULT: [Scenario; 3] = [Scenario::Pci, Scenario::Rr, Scenario::Msix];
}

/// The VMMs `exitless bench --against` can measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PeerVmm {
    /// qemu-system-x86_64 with KVM.
    Qemu,
}

/// What `exitless bench` was asked to run, and with which sizes.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchOptions {
    /// Scenarios to run (default: pci, rr and msix).
    #[arg(value_enum)]
    pub scenarios: Vec<Scenario>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Also draw the results as SVG charts, one file per chart, into this folder (made if
    /// missing): `SCENARIO.svg` for each scenario's time per op, `msix-per-device.svg`,
    /// `iommu-hwm-sweep.svg`.
    #[arg(long, value_name = "DIR", value_parser = parse_chart_dir)]
    pub svg: Option<PathBuf>,
    /// Config reads per read variant of `pci` (the seed used 100000).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub reads: u64,
    /// Enumerations per method in `pci`; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=100))]
    pub enumerations: u16,
    /// Request/response transactions per variant of `rr` and of `iommu`.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub transactions: u64,
    /// Request frame size of `rr` in bytes (netperf -r REQUEST,RESPONSE).
    #[arg(long, default_value_t = 32)]
    pub request_size: u64,
    /// Response frame size of `rr` in bytes.
    #[arg(long, default_value_t = 1024)]
    pub response_size: u64,
    /// virtio-net PCI functions in `msix` and `restore` (whose traffic takes one more).
    #[arg(long, default_value_t = 8)]
    pub devices: usize,
    /// Queue pairs per function in `msix` and `restore` (2 × pairs + 1 MSI-X vectors; the seed
    /// had 65).
    #[arg(long, default_value_t = 32)]
    pub queue_pairs: u16,
    /// Frames streamed per variant of `iommu`.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub packets: u64,
    /// Frames in flight at most in `iommu` (the transmit queue holds 16).
    #[arg(long, default_value_t = 8)]
    pub in_flight: u64,
    /// Payload bytes of the frames `iommu` streams, comma-separated, 1 to 28660 each (the
    /// seed's, an MTU's and a jumbo frame's by default): each size gets its own none, strict,
    /// deferred-list and deferred-array (named `none-1500` and so on), each against its size's
    /// none; 32, the seed's size, keeps the plain names and every variant, the
    /// high-water-mark sweep included.
    #[arg(
        long,
        value_name = "BYTES",
        value_delimiter = ',',
        default_value = "32,1500,9000",
        value_parser = clap::value_parser!(u64).range(1..=MAX_FRAME_PAYLOAD)
    )]
    pub frame_sizes: Vec<u64>,
    /// Hostile bursts in `soak` (50 per boot of the probe).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub bursts: u64,
    /// Random accesses per burst in `soak`.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub accesses: u64,
    /// Seed of the first `soak` burst (the report names it, to reproduce a run).
    #[arg(long, default_value_t = 0x5eed, value_parser = parse_seed)]
    pub seed: u64,
    /// Rounds per scenario (pci, rr, msix, iommu): every variant is measured once per round, the
    /// scenario's boots rotated round by round; the median and its interval are reported. 5 by
    /// default: about a minute for the default run here, and min..max of 5 rounds covers the
    /// median with 93.75% (6 would reach 95%).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub rounds: u16,
    /// Give up on a guest run after this many seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout: u64,
    /// Also boot the same probe binary under another VMM, with the same guest ops, and print
    /// its time per op beside each variant's: `qemu` (Debian's qemu-system-x86: q35 with KVM,
    /// its own virtio-net-pci and config space, and its intel-iommu for iommu's stream).
    /// Scenarios pci, msix, rr and iommu (rr: ICMP echo with the host's kernel through a tap
    /// the bench makes, which needs CAP_NET_ADMIN); without QEMU installed the bench says how
    /// to install it and runs without the column.
    #[arg(long, value_enum, value_name = "VMM")]
    pub against: Option<PeerVmm>,
    /// Also write the report to this file as JSON (as --json prints it), to compare a later
    /// run against with --baseline.
    #[arg(long, value_name = "FILE")]
    pub save_baseline: Option<PathBuf>,
    /// After the report, compare each variant (matched by scenario and variant name) with the
    /// one in this file (written by --save-baseline): the change in time per op in percent,
    /// its interval, and a verdict. "no change within noise" when the two 95% intervals of
    /// the median overlap; "improved" or "regressed" when this run's interval lies entirely
    /// below or above the baseline's; "not established" when either side has no interval
    /// (never a verdict from one sample). A changed exits/op, irqs/op or commit count is named
    /// as a real change whatever the timing. With --json the comparison goes to stderr.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// With --baseline: exit with status 1, naming the variants, when any regressed beyond its
    /// interval (a baseline that cannot be read gives status 2).
    #[arg(long, requires = "baseline")]
    pub fail_on_regression: bool,
}

/// The `--svg` folder: any path but one ending in `.svg`, which names a file (the option took
/// one file before it drew several charts).
fn parse_chart_dir(s: &str) -> Result<PathBuf, String> {
    if s.to_ascii_lowercase().ends_with(".svg") {
        return Err(format!(
            "{s} names a file: --svg takes a folder and writes one chart per file into it"
        ));
    }
    Ok(PathBuf::from(s))
}

/// A seed in decimal or, with 0x, hexadecimal.
fn parse_seed(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("not a seed ({e}): give a number such as 42 or 0x5eed"))
}

impl BenchOptions {
    /// The scenarios named, in order, or [`Scenario::DEFAULT`].
    pub fn scenarios(&self) -> Vec<Scenario> {
        if self.scenarios.is_empty() {
            Scenario::DEFAULT.to_vec()
        } else {
            self.scenarios.clone()
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }

    /// `pci`'s bench.
    pub fn pci(&self) -> PciBench {
        PciBench {
            reads: self.reads,
            enumerations: self.enumerations,
            timeout: self.timeout(),
            rounds: usize::from(self.rounds),
        }
    }

    /// `rr`'s bench, with its tap variant on `tap` and its vhost-user variants on `vhost_user`
    /// where there are; checked.
    pub fn rr(
        &self,
        tap: Option<TapLink>,
        vhost_user: Option<VhostPorts>,
    ) -> Result<RrBench, String> {
        let rr = RrBench {
            transactions: self.transactions,
            request_size: self.request_size,
            response_size: self.response_size,
            timeout: self.timeout(),
            tap,
            rounds: usize::from(self.rounds),
            vhost_user,
        };
        rr.validate()?;
        Ok(rr)
    }

    /// `msix`'s bench, with its vhost-user boots on `vhost_user`'s sockets where there are;
    /// checked.
    pub fn msix(&self, vhost_user: Option<&VhostPorts>) -> Result<MsixBench, String> {
        let msix = MsixBench {
            devices: self.devices,
            queue_pairs: self.queue_pairs,
            timeout: self.timeout(),
            rounds: usize::from(self.rounds),
            vhost_user: vhost_user.cloned(),
        };
        msix.validate()?;
        Ok(msix)
    }

    /// `iommu`'s bench, checked.
    pub fn iommu(&self) -> Result<IommuBench, String> {
        let iommu = IommuBench {
            packets: self.packets,
            in_flight: self.in_flight,
            transactions: self.transactions,
            frame_sizes: self.frame_sizes.clone(),
            rounds: usize::from(self.rounds),
            timeout: self.timeout(),
        };
        iommu.validate()?;
        Ok(iommu)
    }

    /// `restore`'s bench (`--devices`, `--queue-pairs` as `msix`'s), with its vhost-user pass
    /// on `vhost_user`'s sockets where there are; checked.
    pub fn restore(&self, vhost_user: Option<&VhostPorts>) -> Result<RestoreBench, String> {
        let restore = RestoreBench {
            devices: self.devices,
            queue_pairs: self.queue_pairs,
            timeout: self.timeout(),
            vhost_user: vhost_user.cloned(),
        };
        restore.validate()?;
        Ok(restore)
    }

    /// `soak`'s bench, checked.
    pub fn soak(&self) -> Result<SoakBench, String> {
        let soak = SoakBench {
            bursts: self.bursts,
            accesses: self.accesses,
            seed: self.seed,
            timeout: self.timeout(),
        };
        soak.validate()?;
        Ok(soak)
    }
}
