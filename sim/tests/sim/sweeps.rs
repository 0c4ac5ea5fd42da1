//! Sweeps that must pass: the correct design under every fault kind shows no violation, and
//! the faults really happened (a sweep that injects nothing proves nothing).

use keyorder::check::Kind;
use keyorder_sim::sweep::{sweep, Summary};
use keyorder_sim::{Scenario, Size};

fn summary(size: Size, seeds: std::ops::Range<u64>) -> Summary {
    let seeds: Vec<u64> = seeds.collect();
    let outcomes =
        sweep(&seeds, &|seed| Scenario::generate(size, seed), 2, &|_| {}).expect("sweep runs");
    let mut s = Summary::default();
    outcomes.iter().for_each(|o| s.add(o));
    s
}

#[test]
fn small_sweep_has_no_violation_and_injects_every_fault() {
    let s = summary(Size::Small, 0..60);
    assert_eq!(s.violation_total(), 0, "failed seeds {:?}: {:?}", s.failed_seeds, s.violations);
    assert!(s.unquiesced_seeds.is_empty(), "not drained: {:?}", s.unquiesced_seeds);
    for kind in [
        "crash",
        "lease_loss",
        "store_restart",
        "repartition",
        "slow_endpoint",
        "failing_endpoint",
        "poison_endpoint",
        "latency_jitter",
        "expiry_lease",
        "pause",
        "pause_past_expiry",
        "expired_takeover",
        "late_renewal",
        "clock_skew",
        "pin",
        "pin_under_load",
    ] {
        assert!(
            s.faults.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} in 60 small seeds: {:?}",
            s.faults
        );
    }
    assert!(s.count(Kind::Duplicate) > 0, "lease loss must cause redeliveries");
    assert!(s.count(Kind::Gap) > 0, "poison events must be dead-lettered");
}

#[test]
fn medium_sweep_has_no_violation() {
    let s = summary(Size::Medium, 1000..1006);
    assert_eq!(s.violation_total(), 0, "failed seeds {:?}: {:?}", s.failed_seeds, s.violations);
    assert!(s.events >= 6 * 2000);
}
