//! Sweeps that must pass: the correct design under every fault kind shows no violation, and
//! the faults really happened (a sweep that injects nothing proves nothing).

use keyorder::check::Kind;
use keyorder_sim::scenario::{FaultKind, Procedure};
use keyorder_sim::sweep::{sweep, Summary};
use keyorder_sim::{run, Break, Scenario, Size};

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

#[test]
fn a_pin_change_during_an_online_change_of_count_passes() {
    // Seeds with a change of count and a pin, run with the online procedure and the pin moved
    // into the change (its old rows still queued): both epochs' barriers hold at once, and the
    // change ends only once the rows older than its own epoch are gone.
    let mut ran = 0;
    for seed in 0..200 {
        let mut s = Scenario::generate(Size::Small, seed);
        let Some(change) =
            s.faults.iter().find(|f| matches!(f.kind, FaultKind::Repartition { .. })).cloned()
        else {
            continue;
        };
        let Some(pin) = s.faults.iter_mut().find(|f| matches!(f.kind, FaultKind::Pin { .. }))
        else {
            continue;
        };
        pin.at_ms = change.at_ms + 20;
        s.faults.sort_by_key(|f| f.at_ms);
        s.procedure = Procedure::Online;
        let outcome = run(&s, seed, false).expect("runs");
        assert!(outcome.verdict.is_ok(), "seed {seed}:\n{}", outcome.verdict);
        assert!(outcome.quiesced, "seed {seed}: not drained");
        assert!(outcome.switches.iter().all(|r| r.switched), "seed {seed}: {:?}", outcome.switches);
        ran += 1;
    }
    assert!(ran >= 5, "only {ran} small seeds of 200 change both count and a pin");
}

/// Commits held open behind the cursor (`slow_commits`): SQLite's drain (an expiry lease; seqs
/// taken at commit, since SQLite serialises its writers) and PostgreSQL's (a session lock;
/// a read again from below once a transaction it saw running committed a row behind the
/// cursor) keep every key in order on every seed. Trusting the cursor (`cursor-past-late-commit`, PostgreSQL's drain before 2026-12-06
/// evening) reorders on some, which shows the scenario reaches the window at all.
#[test]
fn commits_held_open_keep_order_with_both_drains_and_a_trusted_cursor_reorders() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/regressions");
    let text = std::fs::read_to_string(dir.join("commit-behind-cursor-session.json"))
        .expect("the saved case");
    let session = keyorder_sim::regression::Regression::from_json(&text).expect("a case").scenario;
    assert!(session.lease.expiry().is_none() && session.breaks.is_empty());
    let text = std::fs::read_to_string(dir.join("commit-behind-cursor-expiry.json"))
        .expect("the saved case");
    let expiry = keyorder_sim::regression::Regression::from_json(&text).expect("a case").scenario;
    assert!(expiry.lease.expiry().is_some());
    let mut trusting = session.clone();
    trusting.breaks = vec![Break::CursorPastLateCommit];
    let mut reordered = 0;
    for seed in 0..10 {
        for (name, scenario) in [("expiry lease", &expiry), ("session lock", &session)] {
            let outcome = run(scenario, seed, false).expect("runs");
            assert!(outcome.verdict.is_ok(), "{name}, seed {seed}:\n{}", outcome.verdict);
            assert!(outcome.faults.get("slow_commit").is_some_and(|n| *n > 0));
        }
        let outcome = run(&trusting, seed, false).expect("runs");
        if outcome.verdict.violated().contains(&Kind::Reorder) {
            reordered += 1;
        }
    }
    assert!(reordered >= 3, "a trusted cursor reordered on {reordered} of 10 seeds, not 6");
}
