//! How the report writes numbers: durations in the unit that suits them, ratios with the
//! precision that tells them apart.

/// A duration in the unit that suits it.
pub fn human_ns(ns: f64) -> String {
    match ns {
        ns if !ns.is_finite() => "n/a".into(),
        ns if ns < 1e3 => format!("{ns:.2} ns"),
        ns if ns < 1e6 => format!("{:.2} us", ns / 1e3),
        ns if ns < 1e9 => format!("{:.2} ms", ns / 1e6),
        ns => format!("{:.2} s", ns / 1e9),
    }
}

/// A duration with the half-width of its interval `lo..hi` in the same unit (the larger side,
/// as the interval of a median need not be symmetric): `48.20 us ±3.10`.
pub fn human_ns_pm(ns: f64, lo: f64, hi: f64) -> String {
    let half = (hi - ns).max(ns - lo);
    let scale = match ns {
        ns if !ns.is_finite() => return "n/a".into(),
        ns if ns < 1e3 => 1.0,
        ns if ns < 1e6 => 1e3,
        ns if ns < 1e9 => 1e6,
        _ => 1e9,
    };
    if !half.is_finite() {
        return human_ns(ns);
    }
    format!("{} ±{:.2}", human_ns(ns), half / scale)
}

/// A ratio's interval: `0.931..1.050`; `-` where there is none.
pub fn ratio_interval([lo, hi]: [f64; 2]) -> String {
    if !(lo.is_finite() && hi.is_finite()) {
        return "-".into();
    }
    let one = |r: f64| {
        if r >= 100.0 {
            format!("{r:.0}")
        } else if r >= 0.01 {
            format!("{r:.3}")
        } else {
            format!("{r:.2e}")
        }
    };
    format!("{}..{}", one(lo), one(hi))
}

/// A time ratio: three decimals, or scientific notation below 0.01; `-` where there is none.
pub fn ratio(r: f64) -> String {
    match r {
        r if !r.is_finite() => "-".into(),
        r if r >= 0.01 => format!("{r:.3}x"),
        r => format!("{r:.2e}x"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_ns(1.5), "1.50 ns");
        assert_eq!(human_ns(35_000.0), "35.00 us");
        assert_eq!(human_ns(2.5e7), "25.00 ms");
        assert_eq!(human_ns(f64::NAN), "n/a");
    }

    #[test]
    fn intervals() {
        assert_eq!(human_ns_pm(48_200.0, 45_100.0, 50_000.0), "48.20 us ±3.10");
        assert_eq!(human_ns_pm(5.0, 5.0, 5.0), "5.00 ns ±0.00");
        assert_eq!(ratio_interval([0.931, 1.05]), "0.931..1.050");
        assert_eq!(ratio_interval([f64::NAN, 1.0]), "-");
        assert_eq!(ratio_interval([128977.9, 180685.5]), "128978..180686");
    }
}
