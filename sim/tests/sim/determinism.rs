//! Same seed, same trace hash: three runs in this process and two in separate processes.
//! Different seeds: different interleavings.

use std::process::Command;

use keyorder_sim::{run, run_with, Break, Scenario, Size, Stepping};

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
    // One scenario, so only the seed differs: turmoil's network and the event times.
    let scenario = Scenario::generate(Size::Small, 1);
    let hashes: std::collections::BTreeSet<String> =
        (0..5).map(|seed| run(&scenario, seed, false).expect("runs").trace_hash).collect();
    assert_eq!(hashes.len(), 5, "five seeds gave only {} distinct traces", hashes.len());
}

/// Skipping idle hosts and idle steps (the patched turmoil's default) must not change a run:
/// every seed here gives the same trace hash with every host ticked every millisecond. The
/// seeds cover every fault the runner injects, both lease kinds and a broken design.
#[test]
fn skipping_idle_hosts_and_steps_leaves_every_trace_unchanged() {
    let mut runs: Vec<(Scenario, u64)> =
        (0..12).map(|seed| (Scenario::generate(Size::Small, seed), seed)).collect();
    runs.push((Scenario::generate(Size::Medium, 100), 100));
    runs.push((Scenario::generate_broken(Size::Small, 2, Break::UnfencedExpiry), 2));
    runs.push((Scenario::generate_broken(Size::Small, 1, Break::TwoReaders), 1));
    let mut faults = std::collections::BTreeSet::new();
    for (scenario, seed) in &runs {
        let skipping = run_with(scenario, *seed, false, Stepping::SkipIdle).expect("runs");
        let ticking = run_with(scenario, *seed, false, Stepping::EveryTick).expect("runs");
        assert_eq!(skipping.trace_hash, ticking.trace_hash, "seed {seed}: the traces differ");
        assert_eq!(skipping.simulated_ms, ticking.simulated_ms, "seed {seed}");
        faults.extend(skipping.faults.into_keys());
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
    ] {
        assert!(faults.contains(fault), "no run injected {fault}: {faults:?}");
    }
}

/// A failing seed of a sweep run with `--every-tick` is printed with the flag, so its replay
/// steps as the sweep did; and the replay's hash is the one the default stepping prints.
#[test]
fn a_sweep_with_every_tick_prints_replays_that_keep_it() {
    let bin = env!("CARGO_BIN_EXE_keyorder-sim");
    let out = Command::new(bin)
        .args(["sweep", "--seeds", "1", "--size", "small", "--break", "random-hash"])
        .args(["--every-tick", "--no-html", "--jobs", "1"])
        .output()
        .expect("keyorder-sim runs");
    assert_eq!(out.status.code(), Some(1), "the broken design must fail the sweep");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let wanted = "replay: keyorder-sim replay 0 --size small --break random-hash --every-tick";
    assert!(stderr.contains(wanted), "{stderr}");
    let hash = |extra: &[&str]| {
        let out = Command::new(bin)
            .args(["replay", "0", "--size", "small", "--break", "random-hash", "--json"])
            .args(extra)
            .output()
            .expect("keyorder-sim runs");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        json["trace_hash"].as_str().expect("a hash").to_owned()
    };
    assert_eq!(hash(&["--every-tick"]), hash(&[]));
}
