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
}
