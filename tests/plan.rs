//! Repartition plans over the fixed 100,000-key sample: moved fractions against the modulo
//! formula, skew recomputed independently, report snapshots, and the CLI's JSON and errors.

use std::process::Command;

use keyorder::plan::{Plan, Planner};
use keyorder::{partition_for, Overrides, PartitionCount};

fn sample() -> Vec<(String, f64)> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/keys_100k.csv"))
            .expect("sample");
    text.lines()
        .skip(1)
        .map(|l| {
            let (k, w) = l.rsplit_once(',').expect("key,weight");
            (k.to_owned(), w.parse().expect("a weight"))
        })
        .collect()
}

fn count(n: i64) -> PartitionCount {
    PartitionCount::new(n).expect("valid")
}

fn plan(from: i64, to: i64, keys: &[(String, f64)]) -> Plan {
    let mut p =
        Planner::new(count(from), count(to), Overrides::new(), Overrides::new()).expect("valid");
    let (k, w): (Vec<&str>, Vec<f64>) = keys.iter().map(|(k, w)| (k.as_str(), *w)).unzip();
    for (ks, ws) in k.chunks(4096).zip(w.chunks(4096)) {
        p.add_batch(ks, ws).expect("good weights");
    }
    p.finish(Some(4), None)
}

/// Max/mean weight per partition, computed straight from `partition_for`.
fn independent_skew(keys: &[(String, f64)], n: i64) -> f64 {
    let mut sums = vec![0.0f64; n as usize];
    for (k, w) in keys {
        sums[usize::from(partition_for(k, count(n)).0)] += w;
    }
    let total: f64 = sums.iter().sum();
    sums.iter().copied().fold(0.0, f64::max) / (total / n as f64)
}

#[test]
fn moved_fractions_match_the_formula_and_skew_is_recomputed() {
    let keys = sample();
    assert_eq!(keys.len(), 100_000);
    for (from, to, kept) in [(16, 32, 0.5), (16, 17, 1.0 / 17.0)] {
        let p = plan(from, to, &keys);
        assert!((p.expected_moved_fraction - (1.0 - kept)).abs() < 1e-12);
        assert!(
            (p.moved_fraction - (1.0 - kept)).abs() < 0.01,
            "{from}->{to}: moved {} vs formula {}",
            p.moved_fraction,
            1.0 - kept
        );
        assert!((p.skew_before - independent_skew(&keys, from)).abs() < 1e-9);
        assert!((p.skew_after - independent_skew(&keys, to)).abs() < 1e-9);
        assert_eq!(p.keys_after.iter().sum::<u64>(), 100_000);
    }
}

#[test]
fn reports_are_snapshotted() {
    let keys = sample();
    for (from, to) in [(16, 32), (16, 17)] {
        let report = plan(from, to, &keys).report();
        insta::with_settings!({ snapshot_path => "../testdata/snapshots", prepend_module_to_snapshot => false }, {
            insta::assert_snapshot!(format!("plan_{from}_to_{to}"), report);
        });
    }
}

fn keyorder(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_keyorder")).args(args).output().expect("keyorder runs")
}

#[test]
fn the_json_form_has_the_fields_automation_reads() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/keys_100k.csv");
    let out = keyorder(&["plan", "--from", "16", "--to", "32", "--keys", path, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    for field in [
        "from",
        "to",
        "keys",
        "moved_keys",
        "moved_fraction",
        "moved_weight_fraction",
        "skew_before",
        "skew_after",
    ] {
        assert!(json[field].is_number(), "{field} missing");
    }
    assert_eq!(json["partitions_before"].as_array().map(Vec::len), Some(16));
    assert_eq!(json["partitions_after"].as_array().map(Vec::len), Some(32));
    assert_eq!(json["keys"], 100_000);
}

#[test]
fn bad_input_exits_2_naming_what_is_wrong() {
    let dir = std::env::temp_dir().join(format!("keyorder-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, "sub_1,2.5\nsub_2,-4\n").unwrap();
    let out = keyorder(&["plan", "--from", "16", "--to", "32", "--keys", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2") && err.contains("-4"), "{err}");
    let out = keyorder(&["plan", "--from", "0", "--to", "32"]);
    assert_eq!(out.status.code(), Some(2));
    let out = keyorder(&["plan", "--from", "16", "--to", "32", "--keys", "/nonexistent/keys.csv"]);
    assert_eq!(out.status.code(), Some(2));
    // A drain rate that predicts nothing (zero, not a number) is refused, not printed as inf.
    for rate in ["0", "nan", "fast"] {
        let out = keyorder(&["plan", "--from", "16", "--to", "32", "--drain-rate", rate]);
        assert_eq!(out.status.code(), Some(2), "--drain-rate {rate}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--drain-rate"), "{err}");
    }
}
