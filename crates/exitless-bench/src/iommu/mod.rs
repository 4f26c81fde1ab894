//! `exitless bench iommu`: what an IOMMU's unmaps cost the guest, strict against deferred and
//! batched invalidation.
//!
//! The seed's workload: a stream of frames on a virtio-pci net transmit queue into a sink,
//! every buffer mapped before it is posted and unmapped when the device returns it, several
//! in flight, at the seed's 32-byte payload and at realistic sizes ([`plans`]); and the `rr`
//! transaction with both buffers mapped per transaction. The sink reads and checks every byte
//! of every frame, as a NIC's DMA read would. Each variant is one boot of the probe, so the
//! unit's own counters (IOTLB hits, misses, invalidations) are the variant's alone.

mod plans;
mod targets;

use std::time::Duration;

use crate::against::{Counterpart, PeerPlan};
use crate::measure::{
    Clock, combine_rounds, in_rounds, rounds_line, run_ok, set_baseline, set_twin, variant,
};
use crate::model::{IommuFigures, ScenarioReport, Variant};
use exitless::contract::{IommuReport, NET_STREAM_FRAME_SIZE, Op, RR_FLAG_IOMMU, TRANSPORT_PCI};
use exitless::machine::wiring::names;
use exitless::machine::{
    NetBackendKind, ProbeConfig, ProbeError, ProbeRun, Transport, VirtioNetConfig, ops,
};
use exitless::virtio::notify::NotifyPath;
use exitless::virtio::regs::VIRTIO_NET_HDR_SIZE;
use exitless::vm::run_control::StopReason;
use exitless_peer::QemuMachine;
pub(crate) use plans::DEFAULT_HWM;
use plans::{Plan, SEED_PAYLOAD, at_default_hwm, plans, sized};

/// The largest payload a streamed frame may carry: the probe's frame buffer less the header.
pub const MAX_FRAME_PAYLOAD: u64 = NET_STREAM_FRAME_SIZE - VIRTIO_NET_HDR_SIZE as u64;
/// Most frame sizes one run streams.
const MAX_FRAME_SIZES: usize = 8;
/// Request size of the request/response transactions.
const RR_REQUEST: u64 = 32;
/// Streams of each variant under QEMU (`--against qemu`), whose median is its figure: one
/// boot holds them all, and on a shared 2-core host one stream can catch another process's
/// burst.
const PEER_STREAMS: usize = 3;

/// What `exitless bench iommu` runs.
#[derive(Clone, Debug)]
pub struct IommuBench {
    /// Frames streamed per variant.
    pub packets: u64,
    /// Frames in flight at most (the transmit queue holds 16).
    pub in_flight: u64,
    /// Request/response transactions per variant.
    pub transactions: u64,
    /// Payload bytes of the streamed frames: one set of variants per size.
    pub frame_sizes: Vec<u64>,
    /// Rounds: every variant boots once per round, the variants' order rotated round by round.
    pub rounds: usize,
    /// Longest one boot may take.
    pub timeout: Duration,
}

/// The stream device (a sink) and the request/response device, both virtio-pci with
/// address-only doorbells, so the IOMMU's cost is what differs between variants.
fn devices() -> Vec<VirtioNetConfig> {
    vec![
        VirtioNetConfig {
            backend: NetBackendKind::Sink,
            ..VirtioNetConfig::new(Transport::Pci, NotifyPath::Address)
        },
        VirtioNetConfig::new(Transport::Pci, NotifyPath::Address),
    ]
}

/// Microseconds in `cycles` of a `khz` TSC.
fn cycles_us(cycles: f64, khz: Option<u32>) -> f64 {
    khz.map_or(f64::NAN, |k| cycles / f64::from(k) * 1e3)
}

/// The 99th percentile of a log2 histogram, as the upper bound of its bucket, in cycles.
fn p99(r: &IommuReport) -> f64 {
    let total: u64 = r.exposure_log2.iter().sum();
    let mut seen = 0;
    for (b, &n) in r.exposure_log2.iter().enumerate() {
        seen += n;
        if total > 0 && seen * 100 >= total * 99 {
            return 2f64.powi(i32::try_from(b).expect("32 buckets") + 1);
        }
    }
    0.0
}

impl IommuBench {
    /// Check the parameters against what the probe holds.
    pub fn validate(&self) -> Result<(), String> {
        if self.packets == 0 || self.transactions == 0 {
            return Err("--packets and --transactions must be at least 1".into());
        }
        if !(1..=16).contains(&self.in_flight) {
            return Err(format!(
                "--in-flight must be 1..=16, the transmit queue's size (got {})",
                self.in_flight
            ));
        }
        let sizes = &self.frame_sizes;
        let repeated = (1..sizes.len()).any(|i| sizes[..i].contains(&sizes[i]));
        if sizes.is_empty() || sizes.len() > MAX_FRAME_SIZES || repeated {
            return Err(format!(
                "--frame-sizes takes 1 to {MAX_FRAME_SIZES} different sizes, such as 32,1500,9000"
            ));
        }
        match sizes.iter().find(|s| !(1..=MAX_FRAME_PAYLOAD).contains(s)) {
            Some(s) => Err(format!(
                "--frame-sizes: {s} bytes; a streamed frame carries 1 to {MAX_FRAME_PAYLOAD}"
            )),
            None => Ok(()),
        }
    }

    /// One variant's ops: the mode, the stream device up, the stream, its report; the
    /// request/response device up, its transactions, their report. Returns the ops and the
    /// indexes of the stream and the transactions.
    fn ops(&self, plan: &Plan) -> (Vec<Op>, usize, usize) {
        let (flags, mode) = match plan.unmap {
            Some((mode, hwm)) => (RR_FLAG_IOMMU, Some(ops::iommu_mode(mode, hwm))),
            None => (0, None),
        };
        let function = |n| ProbeConfig::virtio_pci_address(n).ecam_offset();
        let mut list: Vec<Op> = Vec::new();
        list.push(ops::virtio_init_streaming(
            TRANSPORT_PCI,
            function(0),
            flags,
            plan.payload,
        ));
        list.extend(mode);
        let stream = list.len();
        list.push(ops::net_stream(plan.payload, self.packets, self.in_flight));
        list.push(ops::iommu_report(0));
        list.push(ops::virtio_init(TRANSPORT_PCI, function(1), flags));
        let rr = list.len();
        list.push(ops::virtio_rr(RR_REQUEST, self.transactions));
        list.push(ops::iommu_report(1));
        (list, stream, rr)
    }

    /// The stream under QEMU's intel-iommu (`--against qemu`), in one boot: at each frame size
    /// each variant at the default high-water mark brings its device up and streams as on
    /// exitless, `none` on a virtio-net-pci outside the unit, the others on one behind it (the
    /// probe's same VT-d driver, on the unit QEMU's DMAR describes), three times
    /// (`PEER_STREAMS`); the median counts. The transactions are left out: they need
    /// exitless's responder.
    pub fn peer_plan(&self) -> PeerPlan {
        let machine = QemuMachine {
            virtio_net: 2,
            iommu: Some(1),
            ..QemuMachine::default()
        };
        let mut list = Vec::new();
        let mut counterparts = Vec::new();
        for &payload in &self.frame_sizes {
            for (variant, unmap, _) in at_default_hwm(payload) {
                let (function, flags) = match unmap {
                    Some(_) => (
                        crate::against::virtio_net_function(&machine, 1),
                        RR_FLAG_IOMMU,
                    ),
                    None => (crate::against::virtio_net_function(&machine, 0), 0),
                };
                list.push(ops::virtio_init_streaming(
                    TRANSPORT_PCI,
                    function.ecam_offset(),
                    flags,
                    payload,
                ));
                list.extend(unmap.map(|(mode, hwm)| ops::iommu_mode(mode, hwm)));
                let streams = list.len()..list.len() + PEER_STREAMS;
                list.extend(
                    streams
                        .clone()
                        .map(|_| ops::net_stream(payload, self.packets, self.in_flight)),
                );
                counterparts.push(Counterpart {
                    variant: sized(variant, payload).into(),
                    ops: streams.collect(),
                    per_op: self.packets,
                    path: match unmap {
                        Some(_) => "intel-iommu, the same invalidations",
                        None => "virtio-net-pci, no IOMMU",
                    },
                    // QEMU's device has no backend and drops a frame unread, where the sink
                    // reads every byte: a larger frame is no like-for-like comparison.
                    control: payload != SEED_PAYLOAD,
                });
            }
        }
        PeerPlan {
            machine,
            ops: list,
            counterparts,
            exit_avoiding: &[],
            timeout: self.timeout,
        }
    }

    fn boot(&self, plan: &Plan) -> Result<(Variant, ProbeRun, usize, usize), ProbeError> {
        let (list, stream, rr) = self.ops(plan);
        let run = run_ok(&ProbeConfig {
            ops: list,
            virtio: devices(),
            iommu: plan.unmap.is_some(),
            response_size: 1024,
            timeout: self.timeout,
            ..Default::default()
        })?;
        let clock = Clock::of(&run);
        let packets = run.results[stream].value.max(1);
        let v = variant(&plan.name, &run, &clock, &[stream], packets, packets);
        Ok((v, run, stream, rr))
    }

    /// One boot of `plan`: its variant, with the IOMMU's figures but the ratios to `none`,
    /// which [`Self::against_none`] sets from the same round's `none`.
    fn measure(&self, plan: &Plan) -> Result<(Variant, String), ProbeError> {
        let stream_device = names::virtio_pci(ProbeConfig::virtio_pci_address(0));
        let (mut v, run, stream, rr) = self.boot(plan)?;
        let clock = Clock::of(&run);
        let bad_frames = run.bad_frames_at(stream, &stream_device);
        if bad_frames > 0 {
            // The device read other bytes than the guest wrote: no figure of it counts.
            let why = format!(
                "{}: the sink found {bad_frames} of {} streamed frames with a wrong payload",
                plan.name, run.results[stream].value
            );
            return Err(ProbeError::GuestFailed(
                StopReason::VcpuFailed(why),
                run.console,
            ));
        }
        let packets = run.results[stream].value.max(1) as f64;
        let pps = 1e9 / v.ns_per_op;
        let report = &run.iommu_reports[0];
        let pages = report.pages.max(1) as f64;
        let khz = run.tsc_khz;
        let phase = run.phases[stream].clone().unwrap_or_default();
        v.trans_per_s = Some(pps);
        v.iommu = Some(IommuFigures {
            payload_bytes: plan.payload,
            bad_frames,
            packets_per_s: pps,
            packets_ratio: 1.0,
            seed_packets_ratio: plan.seed,
            guest_cycles_per_packet: run.results[stream].cycles as f64 / packets,
            device_cpu_ns_per_packet: run.thread_cpu_ns_at(stream, &stream_device) as f64 / packets,
            host_cpu_ns_per_packet: phase.host_cpu.as_nanos() as f64 / packets,
            iommu_exits_per_packet: run.exits_at(stream, names::IOMMU) as f64 / packets,
            iqt_writes_per_packet: report.iqt_writes as f64 / packets,
            descriptors_per_packet: report.descriptors as f64 / packets,
            pages_unmapped: report.pages,
            max_pending_pages: report.max_pending,
            exposure_max_us: cycles_us(report.exposure_max as f64, khz),
            exposure_mean_us: cycles_us(report.exposure_sum as f64 / pages, khz),
            exposure_p99_us: cycles_us(p99(report), khz),
            rr_trans_per_s: run.results[rr].value as f64 / (clock.ns(&run, rr) / 1e9),
            rr_ratio: 1.0,
            unit: run.iommu,
        });
        Ok((v, clock.describe()))
    }

    /// Set one round's packets/s and transactions/s ratios against that round's `none` of
    /// the same frame size (`round` holds one variant per plan, in `plans`' order).
    fn against_none(round: &mut [Variant], plans: &[Plan]) {
        let rate = |name: String| {
            round
                .iter()
                .find(|v| v.name == name)
                .and_then(|v| v.iommu.as_ref())
                .map(|f| (f.packets_per_s, f.rr_trans_per_s))
        };
        let nones: Vec<Option<(f64, f64)>> = plans.iter().map(|p| rate(p.none())).collect();
        for (v, none) in round.iter_mut().zip(nones) {
            if let (Some(f), Some((none_pps, none_tps))) = (v.iommu.as_mut(), none) {
                f.packets_ratio = f.packets_per_s / none_pps;
                f.rr_ratio = f.rr_trans_per_s / none_tps;
            }
        }
    }

    /// `rounds` rounds of one boot per variant, and the report.
    pub fn run(&self) -> Result<ScenarioReport, ProbeError> {
        let plans = plans(&self.frame_sizes);
        let rounds = self.rounds.max(1);
        let boots = in_rounds(rounds, plans.len(), |i| self.measure(&plans[i]))?;
        let timing = boots[0][0].1.clone();
        let per_round: Vec<Vec<Variant>> = (0..rounds)
            .map(|r| {
                let mut round: Vec<Variant> = boots.iter().map(|b| b[r].0.clone()).collect();
                Self::against_none(&mut round, &plans);
                round
            })
            .collect();
        let mut variants = combine_rounds(per_round);
        set_baseline(&mut variants, "none", &[]);
        // Each size's time ratios against its own none.
        for plan in plans.iter().filter(|p| p.payload != SEED_PAYLOAD) {
            let none = variants.iter().find(|v| v.name == plan.none()).cloned();
            let v = variants.iter_mut().find(|v| v.name == plan.name);
            if let (Some(v), Some(none)) = (v, none) {
                set_twin(v, &none);
            }
        }
        for v in &mut variants {
            v.seed_time_ratio = v
                .iommu
                .as_ref()
                .and_then(|f| f.seed_packets_ratio)
                .map(|r| 1.0 / r);
        }
        let targets = targets::targets(&variants, &self.frame_sizes);
        let sizes: Vec<String> = self.frame_sizes.iter().map(u64::to_string).collect();
        Ok(ScenarioReport {
            name: "iommu".into(),
            title: format!(
                "virtio-pci net behind a virtual VT-d: {} frames of {} bytes streamed ({} in \
                 flight; variants named -SIZE stream SIZE bytes, the others {SEED_PAYLOAD}) and \
                 {} request/response transactions per variant, every buffer mapped before the \
                 device sees it and unmapped when it comes back",
                self.packets,
                sizes.join(", "),
                self.in_flight,
                self.transactions
            ),
            timing: format!(
                "{timing}; {}; time/op is per streamed frame; the IOMMU's figures are the median \
                 round's, its ratios against that round's none",
                rounds_line(rounds, "one per variant")
            ),
            variants,
            targets,
            notes: vec![
                "strict's one target is to be the slowest: one IQT write per unmap, an \
                 ioeventfd doorbell (~4 us here, docs/host-kvm.md), the queue run on the unit's \
                 thread"
                    .into(),
                "the sink reads and checks every byte of every frame (a variant fails if one \
                 is wrong); the sizes' ratios are against the same size's none. With --against \
                 qemu, QEMU's function has no netdev: QEMU drops each frame without reading \
                 its payload (a sender with no peer, net/net.c)"
                    .into(),
                "exposure: per unmapped page, the time a stale IOTLB entry could still reach \
                 it; strict's is the invalidation itself"
                    .into(),
            ],
            soak: None,
        })
    }
}
