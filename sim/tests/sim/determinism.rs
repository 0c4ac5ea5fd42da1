//! Same seed, same trace hash: three runs in this process and two in separate processes.
//! Different seeds: different interleavings.

use std::process::Command;

use keyorder_sim::{run, Scenario, Size};

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
