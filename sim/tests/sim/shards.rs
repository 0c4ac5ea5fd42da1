//! Sweeps beyond one machine: `sweep --shard K/N` runs disjoint slices that together are the
//! whole seed range, and `merge` adds their reports up to exactly the single sweep's verdict.

use std::path::Path;
use std::process::Command;

use keyorder_sim::sweep::{merge, Report, Shard};

const SEEDS: &str = "40";

fn sweep(extra: &[&str], out: &Path) -> i32 {
    let run = Command::new(env!("CARGO_BIN_EXE_keyorder-sim"))
        .args(["sweep", "--seeds", SEEDS, "--size", "small", "--json", "--no-html", "--jobs", "2"])
        .args(extra)
        .output()
        .expect("keyorder-sim runs");
    std::fs::write(out, &run.stdout).expect("report written");
    run.status.code().expect("exited")
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("readable")).expect("JSON")
}

/// The fields of a verdict: the sums, not this machine's wall time.
fn verdict(v: &serde_json::Value) -> serde_json::Value {
    let keys = [
        "runs",
        "failed_seeds",
        "unquiesced_seeds",
        "violations",
        "counted",
        "faults",
        "deliveries",
        "events",
        "simulated_ms",
        "replay",
    ];
    keys.iter().map(|k| (k.to_string(), v[k].clone())).collect()
}

#[test]
fn four_shards_merged_equal_one_sweep() {
    let dir = std::env::temp_dir().join(format!("keyorder-shards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let whole = dir.join("whole.json");
    let code = sweep(&[], &whole);
    let mut parts = Vec::new();
    for k in 1..=4 {
        let part = dir.join(format!("shard-{k}.json"));
        assert_eq!(sweep(&["--shard", &format!("{k}/4")], &part), code, "shard {k}/4 exit");
        assert_eq!(json(&part)["shard"], format!("{k}/4"));
        parts.push(part);
    }
    let merged = Command::new(env!("CARGO_BIN_EXE_keyorder-sim"))
        .arg("merge")
        .args(&parts)
        .arg("--json")
        .output()
        .expect("merge runs");
    assert_eq!(merged.status.code(), Some(code), "{}", String::from_utf8_lossy(&merged.stderr));
    let merged: serde_json::Value = serde_json::from_slice(&merged.stdout).expect("JSON");
    let whole = json(&whole);
    assert_eq!(whole["runs"], 40);
    assert_eq!(verdict(&merged), verdict(&whole));
    assert_eq!(merged["missing_shards"], serde_json::json!([]));
    // Three of the four: fewer runs, and the missing slice named.
    let three = Command::new(env!("CARGO_BIN_EXE_keyorder-sim"))
        .arg("merge")
        .args(&parts[..3])
        .arg("--json")
        .output()
        .expect("merge runs");
    let three: serde_json::Value = serde_json::from_slice(&three.stdout).expect("JSON");
    assert_eq!(three["runs"], 30);
    assert_eq!(three["missing_shards"], serde_json::json!(["0..40 4/4"]));
    // One shard twice would count its seeds twice: refused with exit 2.
    let twice = Command::new(env!("CARGO_BIN_EXE_keyorder-sim"))
        .arg("merge")
        .args([&parts[0], &parts[1], &parts[0]])
        .output()
        .expect("merge runs");
    assert_eq!(twice.status.code(), Some(2));
    let err = String::from_utf8_lossy(&twice.stderr);
    assert!(err.contains("overlap") && err.contains("shard 1/4"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_merged_violation_names_each_failing_seed_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("keyorder-shards-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut parts = Vec::new();
    for k in 1..=2 {
        let part = dir.join(format!("shard-{k}.json"));
        let run = Command::new(env!("CARGO_BIN_EXE_keyorder-sim"))
            .args(["sweep", "--seeds", "4", "--size", "medium", "--break", "two-readers"])
            .args(["--json", "--no-html", "--shard", &format!("{k}/2")])
            .output()
            .expect("keyorder-sim runs");
        std::fs::write(&part, &run.stdout).expect("written");
        parts.push(part);
    }
    let merged = Command::new(env!("CARGO_BIN_EXE_keyorder-sim"))
        .arg("merge")
        .args(&parts)
        .output()
        .expect("merge runs");
    assert_eq!(merged.status.code(), Some(1));
    let text = String::from_utf8_lossy(&merged.stdout);
    let reports: Vec<Report> = parts
        .iter()
        .map(|p| serde_json::from_slice(&std::fs::read(p).expect("readable")).expect("report"))
        .collect();
    let failed = merge(&reports).expect("adds up").summary.failed_seeds;
    assert!(!failed.is_empty(), "two readers caught in 4 medium seeds");
    for seed in failed {
        let replay =
            format!("replay: keyorder-sim replay {seed} --size medium --break two-readers");
        assert!(text.contains(&replay), "{replay} missing from:\n{text}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn shards_are_disjoint_and_cover_the_range() {
    let mut all: Vec<u64> = (1..=4).flat_map(|k| Shard::new(k, 4).unwrap().seeds(10, 23)).collect();
    all.sort_unstable();
    assert_eq!(all, (10..33).collect::<Vec<u64>>());
    assert_eq!(Shard::new(2, 4).unwrap().seeds(0, 10), vec![1, 5, 9]);
}

#[test]
fn a_shard_must_be_k_of_n_with_k_from_1_to_n() {
    assert_eq!("3/4".parse::<Shard>().map(|s| (s.index(), s.of())), Ok((3, 4)));
    for (bad, says) in [
        ("0/4", "K counts slices from 1 to 4"),
        ("5/4", "K counts slices from 1 to 4"),
        ("1/0", "must be at least 1"),
        ("garbage", "is not K/N"),
        ("1/", "is not K/N"),
        ("-1/4", "is not K/N"),
        ("1/4/2", "is not K/N"),
    ] {
        let err = bad.parse::<Shard>().expect_err(bad).to_string();
        assert!(err.contains(says) && err.contains(bad), "{bad}: {err}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_keyorder-sim"))
        .args(["sweep", "--seeds", "4", "--shard", "5/4"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("K counts slices from 1 to 4"));
}
