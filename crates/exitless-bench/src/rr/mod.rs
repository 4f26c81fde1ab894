//! `exitless bench rr`: request/response transactions over virtio-net, netperf TCP_RR style,
//! for every transport and interrupt mode (virtio-pci with MSI-X, virtio-mmio with its legacy
//! line, virtio-mmio with the MSI extension) and every doorbell path (exit to the VMM,
//! datamatch ioeventfd, address-only ioeventfd).
//!
//! One boot holds six devices: three virtio-mmio and three virtio-pci, one per doorbell path.
//! The guest drives each virtio-mmio device twice, resetting it in between: once on its line,
//! once with MSI, so the two interrupt modes share everything else.
//!
//! With `--against qemu`, one more boot: [`TAP_VARIANT`], a virtio-pci device whose backend is
//! a host tap ([`super::host_tap`]), doing ICMP echo transactions with the host's kernel; QEMU
//! runs the same ops on its virtio-net-pci on the same tap ([`RrBench::peer_plan`]).
//!
//! Where DPDK testpmd is installed, one more boot (issue 21): [`VHOST_PCI_VARIANT`] and
//! [`VHOST_MMIO_VARIANT`], a virtio-pci and a virtio-mmio (MSI, per-queue doorbells) device
//! whose queues testpmd serves over vhost-user ([`super::vhost_net`]), the same ICMP echo ops
//! against its icmpecho; no kick and no interrupt passes through exitless (target: 0 exits per
//! transaction). QEMU runs the echo on a vhost-user virtio-net-pci on the same testpmd.

use std::time::Duration;

use crate::against::{Counterpart, PeerPlan};
use crate::measure::{
    Clock, combine_rounds, in_rounds, ratio_target, rounds_line, run_ok, set_baseline, set_twin,
    variant,
};
use crate::model::{ScenarioReport, TargetCheck, Variant};
use crate::vhost_net::{BACKEND_IP, BACKEND_MAC, GUEST_IP, VhostPorts};
use exitless::contract::{
    ICMP_MAX_PAYLOAD, Op, RR_FLAG_DOORBELLS, RR_FLAG_MSI, RR_MAX_REQUEST, RR_RX_BUFFER_SIZE,
    TRANSPORT_MMIO, TRANSPORT_PCI,
};
use exitless::exits::ExitKind;
use exitless::irq::CommitStrategy;
use exitless::machine::{
    NetBackendKind, ProbeConfig, ProbeError, Transport, VhostUserConfig, VirtioNetConfig, ops,
};
use exitless::pci::PciAddress;
use exitless::virtio::notify::NotifyPath;
use exitless::virtio::regs::VIRTIO_NET_HDR_SIZE;
use exitless_peer::host_tap::TapLink;
use exitless_peer::{QemuMachine, QemuTap};

/// The seed's TCP_RR figures (trans/s, three runs each): virtio-pci, virtio-mmio, and
/// virtio-mmio with MSI.
const SEED_PCI: (f64, f64) = (9536.0, 9894.0);
const SEED_MMIO: (f64, f64) = (6939.0, 7095.0);
const SEED_MMIO_MSI: (f64, f64) = (9318.0, 9749.0);

/// What `exitless bench rr` runs.
#[derive(Clone, Debug)]
pub struct RrBench {
    /// Transactions per variant.
    pub transactions: u64,
    /// Request frame size in bytes.
    pub request_size: u64,
    /// Response frame size in bytes.
    pub response_size: u64,
    /// Longest the boot may take.
    pub timeout: Duration,
    /// The host tap of [`TAP_VARIANT`] (`--against qemu`): none, no such variant.
    pub tap: Option<TapLink>,
    /// Rounds: each boots once with irqfds, once with direct MSI (and once on the tap, once
    /// on testpmd).
    pub rounds: usize,
    /// testpmd's ports for the vhost-user variants: none, no such variants.
    pub vhost_user: Option<VhostPorts>,
}

/// The vhost-user variant on virtio-pci with MSI-X, served by testpmd.
pub const VHOST_PCI_VARIANT: &str = "pci-msix-vhost-user";
/// The vhost-user variant on virtio-mmio with MSI and per-queue doorbells, served by testpmd.
pub const VHOST_MMIO_VARIANT: &str = "mmio-msi-vhost-user";

/// The variant on a host tap: ICMP echo with the host's kernel, `request_size` data bytes each
/// way, doorbells on address-only ioeventfds (QEMU's path for its own).
pub const TAP_VARIANT: &str = "pci-msix-tap";

/// Echo ops of [`TAP_VARIANT`] per boot, `transactions` each; the median is reported, on both
/// VMMs, so that a burst of other work on the host moves one of them, not the figure.
const TAP_REPEATS: usize = 5;

impl Default for RrBench {
    fn default() -> Self {
        RrBench {
            transactions: 2000,
            request_size: 32,
            response_size: 1024,
            timeout: Duration::from_secs(600),
            tap: None,
            rounds: 1,
            vhost_user: None,
        }
    }
}

/// The interrupt modes compared.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    PciMsix,
    MmioLegacy,
    MmioMsi,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::PciMsix, Mode::MmioLegacy, Mode::MmioMsi];

    fn name(self) -> &'static str {
        match self {
            Mode::PciMsix => "pci-msix",
            Mode::MmioLegacy => "mmio-legacy",
            Mode::MmioMsi => "mmio-msi",
        }
    }

    fn seed(self) -> (f64, f64) {
        match self {
            Mode::PciMsix => SEED_PCI,
            Mode::MmioLegacy => SEED_MMIO,
            Mode::MmioMsi => SEED_MMIO_MSI,
        }
    }
}

fn mean((lo, hi): (f64, f64)) -> f64 {
    (lo + hi) / 2.0
}

/// The devices of the boot: virtio-mmio then virtio-pci, one per doorbell path each.
fn devices() -> Vec<VirtioNetConfig> {
    [Transport::Mmio, Transport::Pci]
        .into_iter()
        .flat_map(|transport| {
            NotifyPath::ALL
                .into_iter()
                .map(move |notify| VirtioNetConfig::new(transport, notify))
        })
        .collect()
}

/// Name suffix of the variants whose MSI messages are injected directly.
const DIRECT_SUFFIX: &str = "-direct";

fn variant_name(mode: Mode, path: NotifyPath) -> String {
    format!("{}-{}", mode.name(), path.name())
}

impl RrBench {
    /// Check the sizes against what the probe's buffers hold.
    pub fn validate(&self) -> Result<(), String> {
        let max_response = RR_RX_BUFFER_SIZE - u64::from(VIRTIO_NET_HDR_SIZE);
        if self.request_size == 0 || self.request_size > RR_MAX_REQUEST {
            return Err(format!(
                "--request-size must be 1..={RR_MAX_REQUEST} bytes (got {})",
                self.request_size
            ));
        }
        if self.response_size == 0 || self.response_size > max_response {
            return Err(format!(
                "--response-size must be 1..={max_response} bytes (got {})",
                self.response_size
            ));
        }
        if self.tap.is_some() && self.request_size > ICMP_MAX_PAYLOAD {
            return Err(format!(
                "--request-size must be at most {ICMP_MAX_PAYLOAD} bytes with --against qemu \
                 (the ICMP data of one 1500-byte packet; got {})",
                self.request_size
            ));
        }
        Ok(())
    }

    /// The ops of [`TAP_VARIANT`] on the function at `f`: bring it up, then echo
    /// [`TAP_REPEATS`] times (ops 1 ..= `TAP_REPEATS`).
    fn tap_ops(&self, link: &TapLink, f: PciAddress) -> Vec<Op> {
        let init = ops::virtio_init(TRANSPORT_PCI, f.ecam_offset(), 0);
        self.echo_ops(init, link.host_ip, link.guest_ip, link.host_mac)
    }

    /// `init`, then [`TAP_REPEATS`] echoes from `guest` to `host` at `host_mac`.
    fn echo_ops(
        &self,
        init: Op,
        host: std::net::Ipv4Addr,
        guest: std::net::Ipv4Addr,
        host_mac: [u8; 6],
    ) -> Vec<Op> {
        let echo = ops::icmp_echo(
            host,
            guest,
            host_mac,
            self.request_size,
            self.transactions.max(1),
        );
        let mut list = vec![init];
        list.extend([echo; TAP_REPEATS]);
        list
    }

    /// The ops of a vhost-user variant: bring up the device `init` names, echo with testpmd.
    fn vhost_ops(&self, init: Op) -> Vec<Op> {
        self.echo_ops(init, BACKEND_IP, GUEST_IP, BACKEND_MAC)
    }

    /// What QEMU runs (`--against qemu`): [`TAP_VARIANT`]'s ops on a virtio-net-pci on the
    /// same host tap, and [`VHOST_PCI_VARIANT`]'s on a vhost-user virtio-net-pci on the same
    /// testpmd port, each where this run has it; `None` where it has neither.
    pub fn peer_plan(&self) -> Option<PeerPlan> {
        let machine = QemuMachine {
            virtio_net: u8::from(self.tap.is_some()) + u8::from(self.vhost_user.is_some()),
            tap: self.tap.as_ref().map(|link| QemuTap {
                ifname: link.name.clone(),
                mac: link.guest_mac,
            }),
            vhost_user: self.vhost_user.iter().map(|p| p.rr_pci.clone()).collect(),
            ..QemuMachine::default()
        };
        let n = self.transactions.max(1);
        let mut ops = Vec::new();
        let mut counterparts = Vec::new();
        let mut add = |list: Vec<Op>, variant: &'static str, path| {
            let first = ops.len() + 1;
            ops.extend(list);
            counterparts.push(Counterpart {
                variant: variant.into(),
                ops: (first..first + TAP_REPEATS).collect(),
                per_op: n,
                path,
                control: false,
            });
        };
        if let Some(link) = &self.tap {
            let list = self.tap_ops(link, crate::against::virtio_net_function(&machine, 0));
            let path = "its virtio-net-pci on the same tap, ioeventfd doorbells, no vhost";
            add(list, TAP_VARIANT, path);
        }
        if self.vhost_user.is_some() {
            let f = crate::against::virtio_net_function(&machine, u8::from(self.tap.is_some()));
            let list = self.vhost_ops(ops::virtio_init(TRANSPORT_PCI, f.ecam_offset(), 0));
            let path = "its vhost-user virtio-net-pci on the same testpmd port, memfd RAM";
            add(list, VHOST_PCI_VARIANT, path);
        }
        (!counterparts.is_empty()).then_some(PeerPlan {
            machine,
            ops,
            counterparts,
            exit_avoiding: &[],
            timeout: self.timeout,
        })
    }

    /// What the vhost-user variants are, for the report's notes.
    fn vhost_note(&self) -> String {
        format!(
            "`{VHOST_PCI_VARIANT}`, `{VHOST_MMIO_VARIANT}`: ICMP echo (RFC 792) with DPDK \
             testpmd's icmpecho over vhost-user (guest RAM a shared memfd; the kick is the \
             doorbell's ioeventfd, the call a KVM irqfd on the vector's committed route), {} \
             data bytes each way, the median of {TAP_REPEATS} runs of {} per round; testpmd's \
             forwarding core busy-polls one host CPU for the whole run; time ratio against \
             `{}`, the built-in responder in exitless's own thread",
            self.request_size,
            self.transactions.max(1),
            variant_name(Mode::PciMsix, NotifyPath::Address)
        )
    }

    /// Boot with one virtio-pci device on the host tap and run [`TAP_VARIANT`].
    fn tap_variant(&self, link: &TapLink) -> Result<Variant, ProbeError> {
        let n = self.transactions.max(1);
        let device = VirtioNetConfig {
            backend: NetBackendKind::Tap(link.name.clone()),
            mac: Some(link.guest_mac),
            ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
        };
        let run = run_ok(&ProbeConfig {
            ops: self.tap_ops(link, ProbeConfig::virtio_pci_address(0)),
            virtio: vec![device],
            timeout: self.timeout,
            ..Default::default()
        })?;
        let echoes: Vec<usize> = (1..=TAP_REPEATS).collect();
        let mut v = variant(TAP_VARIANT, &run, &Clock::of(&run), &echoes, n, n);
        v.trans_per_s = Some(1e9 / v.ns_per_op);
        let irqs: u64 = echoes.iter().map(|&i| run.results[i].irqs).sum();
        v.irqs_per_op = Some(irqs as f64 / (TAP_REPEATS as u64 * n) as f64);
        v.delivery = Some("irqfd");
        Ok(v)
    }

    /// Boot with a virtio-pci and a virtio-mmio device served by testpmd on `ports` and run
    /// [`VHOST_PCI_VARIANT`] and [`VHOST_MMIO_VARIANT`].
    fn vhost_variants(&self, ports: &VhostPorts) -> Result<Vec<Variant>, ProbeError> {
        let n = self.transactions.max(1);
        let device = |transport, socket: &std::path::PathBuf| VirtioNetConfig {
            backend: NetBackendKind::VhostUser(VhostUserConfig {
                socket: socket.clone(),
                queues: 1,
                reconnect: None,
            }),
            ..VirtioNetConfig::new(transport, NotifyPath::Address)
        };
        let pci = ProbeConfig::virtio_pci_address(0).ecam_offset();
        let mut list = self.vhost_ops(ops::virtio_init(TRANSPORT_PCI, pci, 0));
        let mmio_flags = RR_FLAG_DOORBELLS | RR_FLAG_MSI;
        list.extend(self.vhost_ops(ops::virtio_init(TRANSPORT_MMIO, 0, mmio_flags)));
        let _polling = ports.polling();
        let run = run_ok(&ProbeConfig {
            ops: list,
            virtio: vec![
                device(Transport::Mmio, &ports.rr_mmio),
                device(Transport::Pci, &ports.rr_pci),
            ],
            timeout: self.timeout,
            ..Default::default()
        })?;
        let clock = Clock::of(&run);
        let variants = [VHOST_PCI_VARIANT, VHOST_MMIO_VARIANT]
            .into_iter()
            .enumerate()
            .map(|(d, name)| {
                let first = d * (TAP_REPEATS + 1) + 1;
                let echoes: Vec<usize> = (first..first + TAP_REPEATS).collect();
                let mut v = variant(name, &run, &clock, &echoes, n, n);
                v.trans_per_s = Some(1e9 / v.ns_per_op);
                let irqs: u64 = echoes.iter().map(|&i| run.results[i].irqs).sum();
                v.irqs_per_op = Some(irqs as f64 / (TAP_REPEATS as u64 * n) as f64);
                // testpmd signals KVM irqfds on committed routes (`Signaller::Outside`).
                v.delivery = Some("irqfd");
                v
            })
            .collect();
        Ok(variants)
    }

    /// The guest's ops for `modes`: for each, every doorbell path; and the op indexes timed.
    fn ops(&self, modes: &[Mode]) -> (Vec<Op>, Vec<(Mode, NotifyPath, usize)>) {
        let n = self.transactions.max(1);
        let mut ops: Vec<Op> = Vec::new();
        let mut timed = Vec::new();
        for &mode in modes {
            for (i, path) in NotifyPath::ALL.into_iter().enumerate() {
                let doorbells = if path == NotifyPath::Address {
                    RR_FLAG_DOORBELLS
                } else {
                    0
                };
                let init = match mode {
                    Mode::PciMsix => ops::virtio_init(
                        TRANSPORT_PCI,
                        ProbeConfig::virtio_pci_address(i).ecam_offset(),
                        0,
                    ),
                    Mode::MmioLegacy => ops::virtio_init(TRANSPORT_MMIO, i as u64, doorbells),
                    Mode::MmioMsi => {
                        ops::virtio_init(TRANSPORT_MMIO, i as u64, doorbells | RR_FLAG_MSI)
                    }
                };
                ops.push(init);
                timed.push((mode, path, ops.len()));
                ops.push(ops::virtio_rr(self.request_size, n));
            }
        }
        (ops, timed)
    }

    /// Boot with MSI messages delivered by `delivery`, run `modes`, return their variants.
    fn boot(
        &self,
        delivery: CommitStrategy,
        modes: &[Mode],
    ) -> Result<(Vec<Variant>, Clock), ProbeError> {
        let n = self.transactions.max(1);
        let (ops, timed) = self.ops(modes);
        let run = run_ok(&ProbeConfig {
            ops,
            virtio: devices(),
            response_size: usize::try_from(self.response_size).expect("validated size"),
            timeout: self.timeout,
            gsi_commits: delivery,
            ..Default::default()
        })?;
        let clock = Clock::of(&run);
        let direct = delivery == CommitStrategy::Direct;
        let variants = timed
            .iter()
            .map(|&(mode, path, op)| {
                let name = variant_name(mode, path) + if direct { DIRECT_SUFFIX } else { "" };
                let mut v = variant(&name, &run, &clock, &[op], n, n);
                v.trans_per_s = Some(1e9 / v.ns_per_op);
                v.seed_trans_per_s = Some(mode.seed());
                v.irqs_per_op = Some(run.results[op].irqs as f64 / n as f64);
                // The legacy line is an IOAPIC pin: always an irqfd.
                v.delivery = Some(if direct && mode != Mode::MmioLegacy {
                    "signal-msi"
                } else {
                    "irqfd"
                });
                v
            })
            .collect();
        Ok((variants, clock))
    }

    /// One boot of a round: `0` MSI routes and irqfds (every mode), `1` direct MSI (the MSI
    /// modes), `2` the host tap's variant, `3` the vhost-user variants.
    fn round_boot(&self, which: usize) -> Result<(Vec<Variant>, Option<String>), ProbeError> {
        match (which, &self.tap, &self.vhost_user) {
            (0, ..) => self
                .boot(CommitStrategy::Batched, &Mode::ALL)
                .map(|(v, c)| (v, Some(c.describe()))),
            (1, ..) => self
                .boot(CommitStrategy::Direct, &[Mode::PciMsix, Mode::MmioMsi])
                .map(|(v, _)| (v, None)),
            (2, Some(link), _) => Ok((vec![self.tap_variant(link)?], None)),
            (3, _, Some(ports)) => Ok((self.vhost_variants(ports)?, None)),
            _ => Ok((Vec::new(), None)),
        }
    }

    /// The boots of a round, in [`RrBench::round_boot`]'s numbering, and what they are.
    fn boots(&self) -> (usize, String) {
        let mut names = vec!["irqfds", "direct MSI"];
        names.extend(self.tap.as_ref().map(|_| "host tap"));
        names.extend(self.vhost_user.as_ref().map(|_| "vhost-user on testpmd"));
        let count = if self.vhost_user.is_some() {
            4
        } else {
            2 + usize::from(self.tap.is_some())
        };
        (count, names.join(", "))
    }

    /// `rounds` rounds, each booting once with MSI routes and irqfds (every mode), once with
    /// direct MSI (the MSI modes) and, with a tap, once on it; then the report.
    pub fn run(&self) -> Result<ScenarioReport, ProbeError> {
        let n = self.transactions.max(1);
        let rounds = self.rounds.max(1);
        let (boots, boot_names) = self.boots();
        let results = in_rounds(rounds, boots, |which| self.round_boot(which))?;
        let clock = results[0][0].1.clone().unwrap_or_default();
        let per_round: Vec<Vec<Variant>> = (0..rounds)
            .map(|r| results.iter().flat_map(|b| b[r].0.clone()).collect())
            .collect();
        let (vhost, all): (Vec<Variant>, Vec<Variant>) = combine_rounds(per_round)
            .into_iter()
            .partition(|v| v.name == VHOST_PCI_VARIANT || v.name == VHOST_MMIO_VARIANT);
        let (mut variants, rest): (Vec<Variant>, Vec<Variant>) = all
            .into_iter()
            .partition(|v| !v.name.ends_with(DIRECT_SUFFIX) && v.name != TAP_VARIANT);
        let (mut direct, tap): (Vec<Variant>, Vec<Variant>) =
            rest.into_iter().partition(|v| v.name != TAP_VARIANT);
        baselines_by_path(&mut variants);
        let mut notes = vec![against_irqfds(&mut direct, &variants)];
        variants.extend(direct);
        if let (Some(link), Some(mut tap)) = (&self.tap, tap.into_iter().next()) {
            let twin = variant_name(Mode::PciMsix, NotifyPath::Address);
            if let Some(t) = variants.iter().find(|v| v.name == twin) {
                set_twin(&mut tap, t);
            }
            notes.push(format!(
                "`{TAP_VARIANT}`: ICMP echo (RFC 792) with the host's kernel through tap {} \
                 ({} to {}), {} data bytes each way, the median of {TAP_REPEATS} runs of {n} on \
                 each VMM (per round, on exitless); its time ratio is against the built-in responder on the same \
                 transport and doorbell path",
                link.name, link.guest_ip, link.host_ip, self.request_size
            ));
            variants.push(tap);
        }
        if !vhost.is_empty() {
            notes.push(self.vhost_note());
            let twin = variant_name(Mode::PciMsix, NotifyPath::Address);
            for mut v in vhost {
                if let Some(t) = variants.iter().find(|v| v.name == twin) {
                    set_twin(&mut v, t);
                }
                variants.push(v);
            }
        }
        notes.extend(varying_counts_note(&variants));
        let mut targets = targets(&variants);
        targets.extend(vhost_target(&variants));
        Ok(ScenarioReport {
            name: "rr".into(),
            title: format!(
                "virtio-net request/response (T2 + T4, seeds 001 and 004): {n} transactions of {} → {} bytes per variant, interrupt-driven",
                self.request_size, self.response_size
            ),
            timing: format!(
                "{clock}; each variant's time ratio is against mmio-legacy with the same doorbell path (a `-direct` one's: against the same variant with irqfds); {}",
                rounds_line(rounds, &boot_names)
            ),
            variants,
            targets,
            notes,
            soak: None,
        })
    }
}

/// The vhost-user variants' target: no kick and no interrupt passes through exitless, so not
/// one exit per transaction; `None` where they did not run.
fn vhost_target(variants: &[Variant]) -> Option<TargetCheck> {
    let vhost: Vec<&Variant> = variants
        .iter()
        .filter(|v| v.name == VHOST_PCI_VARIANT || v.name == VHOST_MMIO_VARIANT)
        .collect();
    (!vhost.is_empty()).then(|| TargetCheck {
        target: "vhost-user transactions never exit to userspace".into(),
        measured: vhost
            .iter()
            .map(|v| format!("{}: {:.2} exits/op", v.name, v.exits_per_op))
            .collect::<Vec<_>>()
            .join(", "),
        met: vhost.iter().all(|v| v.exits_per_op == 0.0),
        ..Default::default()
    })
}

/// Each doorbell path's variants against mmio-legacy on the same path, with the seed's ratios.
fn baselines_by_path(variants: &mut [Variant]) {
    for path in NotifyPath::ALL {
        let base = variant_name(Mode::MmioLegacy, path);
        let seed: Vec<(String, f64)> = Mode::ALL
            .iter()
            .map(|&m| (variant_name(m, path), mean(SEED_MMIO) / mean(m.seed())))
            .collect();
        let seed: Vec<(&str, f64)> = seed.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        let mut group: Vec<Variant> = variants
            .iter()
            .filter(|v| v.name.ends_with(&format!("-{}", path.name())))
            .cloned()
            .collect();
        set_baseline(&mut group, &base, &seed);
        for g in group {
            if let Some(v) = variants.iter_mut().find(|v| v.name == g.name) {
                *v = g;
            }
        }
    }
}

/// Each `-direct` variant against the same device and path with irqfds; the note that says so.
fn against_irqfds(direct: &mut [Variant], variants: &[Variant]) -> String {
    for d in direct.iter_mut() {
        let twin = d.name.trim_end_matches(DIRECT_SUFFIX);
        if let Some(t) = variants.iter().find(|v| v.name == twin) {
            set_twin(d, t);
        }
    }
    format!(
        "`{DIRECT_SUFFIX}` variants: the same devices with MSI messages injected by \
         KVM_SIGNAL_MSI (no routes, no irqfds; `exitless bench msix` strategy direct), their \
         time ratio against the irqfd variant of the same device and doorbell path: {}",
        direct
            .iter()
            .map(|d| format!("{} {:.3}x", d.name, d.time_ratio))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Which variants' exit or interrupt counts differed between rounds, said plainly: on the
/// legacy line they follow timing (a completion that arrives while the line's interrupt is
/// still pending is taken by the same handler run, with one InterruptACK write fewer).
fn varying_counts_note(variants: &[Variant]) -> Option<String> {
    let varied: Vec<&str> = variants
        .iter()
        .filter(|v| v.counts_vary)
        .map(|v| v.name.as_str())
        .collect();
    (!varied.is_empty()).then(|| {
        format!(
            "exit or interrupt counts varied between rounds for {} (flagged `counts_vary`): on \
             the legacy line this is real, not a counting error: completions that arrive while \
             the line's interrupt is pending share one handler run, so interrupts and \
             InterruptACK writes per transaction follow timing; the table shows the median \
             round's counts",
            varied.join(", ")
        )
    })
}

fn targets(variants: &[Variant]) -> Vec<TargetCheck> {
    let get = |mode: Mode, path: NotifyPath| {
        variants
            .iter()
            .find(|v| v.name == variant_name(mode, path))
            .expect("every variant ran")
    };
    let tps = |v: &Variant| v.trans_per_s.unwrap_or(f64::NAN);
    let mut checks = Vec::new();
    for path in NotifyPath::ALL {
        let (pci, legacy, msi) = (
            get(Mode::PciMsix, path),
            get(Mode::MmioLegacy, path),
            get(Mode::MmioMsi, path),
        );
        // Transactions per second are 1/time: msi >= pci in trans/s is pci/msi >= 1 in time.
        let ns = |v: &Variant| v.each_round(|r| r.ns_per_op);
        checks.push(ratio_target(
            format!("{} >= {}", msi.name, pci.name),
            format!(
                "{:.0} vs {:.0} trans/s ({:.3}x)",
                tps(msi),
                tps(pci),
                tps(msi) / tps(pci)
            ),
            (&ns(pci), &ns(msi)),
            1.0,
            false,
        ));
        checks.push(ratio_target(
            format!("{} >= 1.35x {}", msi.name, legacy.name),
            format!(
                "{:.3}x ({:.0} vs {:.0} trans/s)",
                tps(msi) / tps(legacy),
                tps(msi),
                tps(legacy)
            ),
            (&ns(legacy), &ns(msi)),
            1.35,
            false,
        ));
    }
    // Doorbell writes that reached the VMM: MMIO writes, less the legacy handler's one
    // InterruptACK write per interrupt.
    let mut doorbell_exits = Vec::new();
    for mode in Mode::ALL {
        let v = get(mode, NotifyPath::Address);
        let writes = v
            .exits_by_kind
            .get(ExitKind::MmioWrite.name())
            .copied()
            .unwrap_or(0.0);
        let acks = if mode == Mode::MmioLegacy {
            v.irqs_per_op.unwrap_or(0.0)
        } else {
            0.0
        };
        doorbell_exits.push((v.name.clone(), (writes - acks).max(0.0)));
    }
    checks.push(TargetCheck {
        target: "address-only doorbells never exit to userspace".into(),
        measured: doorbell_exits
            .iter()
            .map(|(n, e)| format!("{n}: {e:.2} doorbell exits/op"))
            .collect::<Vec<_>>()
            .join(", "),
        met: doorbell_exits.iter().all(|(_, e)| *e == 0.0),
        ..Default::default()
    });
    checks
}

#[cfg(test)]
mod tests;
