//! The hostile-guest soak, short: every device keeps working after bursts of random accesses.

use std::time::Duration;

use exitless_bench::soak::SoakBench;

#[test]
fn every_device_works_after_every_hostile_burst() {
    let bench = SoakBench {
        bursts: 20,
        accesses: 1000,
        seed: 0x5eed,
        timeout: Duration::from_secs(120),
    };
    let report = bench.run().expect("the hostile guest runs to its end");
    let soak = report.soak.expect("soak figures");
    assert_eq!(soak.bursts, 20);
    assert_eq!(soak.accesses, 20 * 1000, "every access was made");
    assert_eq!(soak.failures, Vec::<String>::new());
    assert_eq!(soak.transactions_failed, 0);
    assert_eq!(
        soak.transactions_ok,
        20 * 4 * 2,
        "two per device after each burst"
    );
    assert_eq!(soak.panics, 0);
    // The attack reached the devices: they refused and counted what was wrong, and were reset
    // with requests in flight.
    assert!(soak.guest_errors > 0, "{soak:?}");
    assert!(soak.resets_in_bursts > 0, "{soak:?}");
}
