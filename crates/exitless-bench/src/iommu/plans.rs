//! The variants of `bench iommu`: how unmaps are invalidated, and at which frame sizes.
//!
//! The seed's stream (netperf UDP_STREAM `-m 32`) has 32-byte frames: its rows keep their
//! plain names (`none`, `deferred-array`, the high-water-mark sweep), so baselines still match.
//! The seed's packets/s ratios, though, come from frames that cost tens of µs each in
//! netperf's UDP path; a probe frame of 32 bytes costs less than the map and unmap around it.
//! So the stream also runs at other sizes (1500, an MTU, and 9000, a jumbo frame, by default),
//! where the device reads every byte: `none`, `strict` and the two deferred designs, named
//! `none-1500` and so on.

use exitless::contract::{
    IOMMU_MODE_DEFERRED_ARRAY, IOMMU_MODE_DEFERRED_LIST, IOMMU_MODE_LINUX_FQ,
    IOMMU_MODE_PER_DOMAIN, IOMMU_MODE_STRICT,
};

/// Payload bytes of the seed's streamed frames (netperf UDP_STREAM -m 32).
pub(crate) const SEED_PAYLOAD: u64 = 32;
/// The high-water mark of the deferred modes outside the sweep (the seed's default).
pub(crate) const DEFAULT_HWM: u64 = 250;
/// The seed's high-water-mark sweep (at the seed's frame size only).
const HWM_SWEEP: [u64; 7] = [1, 16, 32, 64, 128, 250, 1000];
/// The seed's figures, as ratios of packets/s to `none`: the list run (strict 58, none 71,
/// batched 66) and the array run (strict 73, none 74, batched 72).
const SEED_LIST_STRICT: f64 = 58.0 / 71.0;
pub(super) const SEED_LIST_BATCHED: f64 = 66.0 / 71.0;
pub(super) const SEED_ARRAY_BATCHED: f64 = 72.0 / 74.0;

/// `IOMMU_MODE_*` and high-water mark; `None`: not behind the IOMMU.
pub(super) type Unmap = Option<(u64, u64)>;

/// The variants at the default high-water mark: name, how unmaps are invalidated, the seed's
/// packets/s ratio to `none`.
const VARIANTS: [(&str, Unmap, Option<f64>); 6] = [
    ("none", None, Some(1.0)),
    (
        "strict",
        Some((IOMMU_MODE_STRICT, 0)),
        Some(SEED_LIST_STRICT),
    ),
    (
        "deferred-list",
        Some((IOMMU_MODE_DEFERRED_LIST, DEFAULT_HWM)),
        Some(SEED_LIST_BATCHED),
    ),
    (
        "deferred-array",
        Some((IOMMU_MODE_DEFERRED_ARRAY, DEFAULT_HWM)),
        Some(SEED_ARRAY_BATCHED),
    ),
    (
        "per-domain",
        Some((IOMMU_MODE_PER_DOMAIN, DEFAULT_HWM)),
        None,
    ),
    ("linux-fq", Some((IOMMU_MODE_LINUX_FQ, 0)), None),
];

/// The variants streamed at the other frame sizes: the seed's and the reference points.
const SIZED: [&str; 4] = ["none", "strict", "deferred-list", "deferred-array"];

/// One boot's variant: how unmaps are invalidated, if the device is behind the IOMMU at all,
/// and the stream's frame size.
pub(super) struct Plan {
    pub(super) name: String,
    pub(super) unmap: Unmap,
    /// The seed's packets/s ratio to `none` for this kind of variant.
    pub(super) seed: Option<f64>,
    /// Payload bytes of each streamed frame.
    pub(super) payload: u64,
}

impl Plan {
    /// The name of the `none` this plan's ratios are taken against: its size's.
    pub(super) fn none(&self) -> String {
        sized("none", self.payload)
    }
}

/// The name of variant `name` streaming `payload`-byte frames: the plain name at the seed's
/// size, `name-payload` at the others.
pub(super) fn sized(name: &str, payload: u64) -> String {
    if payload == SEED_PAYLOAD {
        name.into()
    } else {
        format!("{name}-{payload}")
    }
}

/// The variants at the default high-water mark streamed at `payload`: name, unmaps, seed.
pub(super) fn at_default_hwm(
    payload: u64,
) -> impl Iterator<Item = (&'static str, Unmap, Option<f64>)> {
    VARIANTS
        .into_iter()
        .filter(move |(name, ..)| payload == SEED_PAYLOAD || SIZED.contains(name))
}

/// Every boot of a round: at each size its variants, and at the seed's size the sweep too.
pub(super) fn plans(sizes: &[u64]) -> Vec<Plan> {
    let mut plans = Vec::new();
    for &payload in sizes {
        plans.extend(at_default_hwm(payload).map(|(name, unmap, seed)| Plan {
            name: sized(name, payload),
            unmap,
            seed,
            payload,
        }));
        if payload != SEED_PAYLOAD {
            continue;
        }
        plans.extend(
            HWM_SWEEP
                .iter()
                .filter(|&&h| h != DEFAULT_HWM)
                .map(|&hwm| Plan {
                    name: format!("deferred-array-hwm{hwm}"),
                    unmap: Some((IOMMU_MODE_DEFERRED_ARRAY, hwm)),
                    seed: None,
                    payload,
                }),
        );
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's size keeps today's twelve rows by name; another size adds its four,
    /// suffixed, each measured against its own size's `none`.
    #[test]
    fn the_seed_size_keeps_its_names_and_the_others_are_suffixed() {
        let names =
            |sizes: &[u64]| -> Vec<String> { plans(sizes).into_iter().map(|p| p.name).collect() };
        let seed = names(&[32]);
        assert_eq!(seed.len(), 12);
        assert_eq!(
            seed[..4],
            ["none", "strict", "deferred-list", "deferred-array"]
        );
        assert!(seed.contains(&"deferred-array-hwm1000".to_owned()));
        let all = plans(&[32, 1500, 9000]);
        assert_eq!(all.len(), 20);
        let jumbo: Vec<&Plan> = all.iter().filter(|p| p.payload == 9000).collect();
        let jumbo_names: Vec<&str> = jumbo.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            jumbo_names,
            [
                "none-9000",
                "strict-9000",
                "deferred-list-9000",
                "deferred-array-9000"
            ]
        );
        assert!(jumbo.iter().all(|p| p.none() == "none-9000"));
        assert_eq!(all[0].none(), "none");
    }
}
