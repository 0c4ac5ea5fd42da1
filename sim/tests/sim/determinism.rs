//! Same seed, same trace hash: three runs in this process and two in separate processes.
//! Different seeds: different interleavings.

use std::process::Command;

use keyorder_sim::{run, Break, Scenario, Size};

#[test]
fn the_same_seed_gives_the_same_hash_three_times() {
    let scenario = Scenario::generate(Size::Medium, 11);
    let hashes: Vec<String> =
        (0..3).map(|_| run(&scenario, 11, false).expect("runs").trace_hash).collect();
    assert_eq!(hashes[0], hashes[1]);
    assert_eq!(hashes[1], hashes[2]);
}

#[test]
fn the_same_seed_gives_the_same_hash_in_two_processes() {
    let in_process = run(&Scenario::generate(Size::Small, 5), 5, false).expect("runs").trace_hash;
    for _ in 0..2 {
        let out = Command::new(env!("CARGO_BIN_EXE_keyorder-sim"))
            .args(["replay", "5", "--size", "small", "--json"])
            .output()
            .expect("keyorder-sim runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(json["trace_hash"], in_process.as_str());
        assert_eq!(json["seed"], 5);
    }
}

#[test]
fn different_seeds_give_different_interleavings() {
    // One scenario, so only the seed differs: the network's latencies and the event times.
    let scenario = Scenario::generate(Size::Small, 1);
    let hashes: std::collections::BTreeSet<String> =
        (0..5).map(|seed| run(&scenario, seed, false).expect("runs").trace_hash).collect();
    assert_eq!(hashes.len(), 5, "five seeds gave only {} distinct traces", hashes.len());
}

/// Every fault the runner injects replays to the same trace: each seed here runs twice, and
/// between them the seeds inject every fault, with both lease kinds and a broken design.
#[test]
fn every_fault_kind_replays_to_the_same_trace() {
    let mut runs: Vec<(Scenario, u64)> =
        (0..12).map(|seed| (Scenario::generate(Size::Small, seed), seed)).collect();
    runs.push((Scenario::generate(Size::Medium, 100), 100));
    runs.push((Scenario::generate_broken(Size::Small, 2, Break::UnfencedExpiry), 2));
    runs.push((Scenario::generate_broken(Size::Small, 1, Break::TwoReaders), 1));
    let mut faults = std::collections::BTreeSet::new();
    for (scenario, seed) in &runs {
        let first = run(scenario, *seed, false).expect("runs");
        let again = run(scenario, *seed, false).expect("runs");
        assert_eq!(first.trace_hash, again.trace_hash, "seed {seed}: the traces differ");
        assert_eq!(first.simulated_ms, again.simulated_ms, "seed {seed}");
        faults.extend(first.faults.into_keys());
    }
    for fault in [
        "crash",
        "store_restart",
        "pause",
        "pause_past_expiry",
        "lease_loss",
        "late_renewal",
        "repartition",
        "pin",
        "expiry_lease",
        "clock_skew",
        "slow_endpoint",
        "failing_endpoint",
        "reply_cut",
        "close_on_reuse",
        "half_open",
        "slow_body",
    ] {
        assert!(faults.contains(fault), "no run injected {fault}: {faults:?}");
    }
}
