//! The targets of `bench iommu` (issue 20's T5), checked at each frame size: deferred-array
//! ≥ 0.95× `none`'s packets/s (the seed: 0.97×), deferred-list ≥ 0.90× (the seed: 0.93×),
//! deferred-array's device CPU per frame ≤ 1.1× `none`'s, and strict the slowest. At the
//! seed's size the targets it always had keep their words.

use super::plans::{
    DEFAULT_HWM, SEED_ARRAY_BATCHED, SEED_LIST_BATCHED, SEED_PAYLOAD, at_default_hwm, sized,
};
use crate::measure::ratio_target;
use crate::model::{IommuFigures, TargetCheck, Variant};
use crate::stats::Verdict;

/// deferred-array must reach this share of `none`'s packets/s (the target).
const TARGET_ARRAY_RATIO: f64 = 0.95;
/// deferred-list must reach this share of `none`'s packets/s.
const TARGET_LIST_RATIO: f64 = 0.90;
/// deferred-array's device CPU per frame may be at most this much `none`'s.
const TARGET_DEVICE_CPU_RATIO: f64 = 1.1;

/// The variants of one frame size, found by their base names.
struct Size<'a> {
    variants: &'a [Variant],
    payload: u64,
}

impl Size<'_> {
    fn find(&self, name: &str) -> Option<&Variant> {
        let name = sized(name, self.payload);
        self.variants.iter().find(|v| v.name == name)
    }

    /// The median round's figures of variant `name` (zero when it was not run).
    fn fig(&self, name: &str) -> IommuFigures {
        self.find(name)
            .and_then(|v| v.iommu.clone())
            .unwrap_or_default()
    }

    /// Each round's `figure` of variant `name`, for a ratio's interval (paired by round).
    fn each_round(&self, name: &str, figure: impl Fn(&IommuFigures) -> f64) -> Vec<f64> {
        self.find(name)
            .map(|v| v.each_round(|r| r.iommu.as_ref().map_or(0.0, &figure)))
            .unwrap_or_default()
    }

    /// How the size's targets are introduced: nothing at the seed's size (its words stay).
    fn label(&self) -> String {
        if self.payload == SEED_PAYLOAD {
            String::new()
        } else {
            format!("{}-byte frames: ", self.payload)
        }
    }

    /// A packets/s ratio target of deferred variant `name` against `none`.
    fn packets_target(&self, name: &str, threshold: f64, seed: f64) -> TargetCheck {
        let f = self.fig(name);
        let pps = |n: &str| self.each_round(n, |f| f.packets_per_s);
        let mut target = ratio_target(
            format!(
                "{}{name} ≥ {threshold}× none's packets/s (seed {seed:.2}×) with ≤ \
                 1/{DEFAULT_HWM} IOMMU exits per packet",
                self.label()
            ),
            format!(
                "{:.3}× with {:.4} IOMMU exits per packet",
                f.packets_ratio, f.iommu_exits_per_packet
            ),
            (&pps(name), &pps("none")),
            threshold,
            false,
        );
        // The exits are a count, not a sample: too many is a miss whatever the time.
        if f.iommu_exits_per_packet > 1.0 / DEFAULT_HWM as f64 {
            target.met = false;
            target.verdict = Some(Verdict::Missed);
        }
        target
    }

    /// deferred-array's device CPU per frame against `none`'s.
    fn device_cpu_target(&self) -> TargetCheck {
        let cpu = |n: &str| self.each_round(n, |f| f.device_cpu_ns_per_packet);
        let (array, none) = (self.fig("deferred-array"), self.fig("none"));
        ratio_target(
            format!(
                "{}deferred-array's device-thread CPU per packet ≤ {TARGET_DEVICE_CPU_RATIO}× \
                 none's",
                self.label()
            ),
            format!(
                "{:.0} against {:.0} ns",
                array.device_cpu_ns_per_packet, none.device_cpu_ns_per_packet
            ),
            (&cpu("deferred-array"), &cpu("none")),
            TARGET_DEVICE_CPU_RATIO,
            true,
        )
    }

    /// strict's packets/s below every other variant's of the size at the default high-water
    /// mark (the sweep's lowest marks flush as often as strict does).
    fn strict_slowest(&self) -> TargetCheck {
        let slowest_other = at_default_hwm(self.payload)
            .filter(|&(name, ..)| name != "strict")
            .filter_map(|(name, ..)| Some((name, self.find(name)?.iommu.as_ref()?)))
            .map(|(name, f)| (name, f.packets_per_s))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let pps = self.fig("strict").packets_per_s;
        let (other, other_pps) = slowest_other.unwrap_or(("none", f64::NAN));
        let other = sized(other, self.payload);
        TargetCheck {
            target: format!("{}strict the slowest", self.label()),
            measured: format!(
                "strict {pps:.0} packets/s, the slowest other {other} {other_pps:.0}"
            ),
            met: pps < other_pps,
            ..Default::default()
        }
    }

    /// The ordering the seed's service demand shows, as the bench always checked it.
    fn device_cpu_order(&self) -> TargetCheck {
        let (none, strict, array) = (
            self.fig("none"),
            self.fig("strict"),
            self.fig("deferred-array"),
        );
        TargetCheck {
            target: "device-thread CPU per packet ordered strict > deferred-array > none (the \
                     seed's service demand)"
                .into(),
            measured: format!(
                "strict {:.0} ns, deferred-array {:.0} ns, none {:.0} ns",
                strict.device_cpu_ns_per_packet,
                array.device_cpu_ns_per_packet,
                none.device_cpu_ns_per_packet
            ),
            met: strict.device_cpu_ns_per_packet > array.device_cpu_ns_per_packet
                && array.device_cpu_ns_per_packet > none.device_cpu_ns_per_packet,
            ..Default::default()
        }
    }
}

/// The targets at each of `sizes`, in their order.
pub(super) fn targets(variants: &[Variant], sizes: &[u64]) -> Vec<TargetCheck> {
    let mut all = Vec::new();
    for &payload in sizes {
        let size = Size { variants, payload };
        all.push(size.packets_target("deferred-array", TARGET_ARRAY_RATIO, SEED_ARRAY_BATCHED));
        if payload == SEED_PAYLOAD {
            all.push(size.device_cpu_order());
        }
        all.push(size.packets_target("deferred-list", TARGET_LIST_RATIO, SEED_LIST_BATCHED));
        all.push(size.device_cpu_target());
        all.push(size.strict_slowest());
    }
    all
}
