//! Cross-language vectors: every row of `testdata/routing_vectors.jsonl` (made by Python's
//! hashlib, see `testdata/gen_vectors.py`) must route identically here.

use blake2::{Blake2b512, Digest};
use keyorder::routing::key_digest;
use keyorder::{partition_for, route_many, PartitionCount};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Row {
    key: String,
    digest: String,
    partitions: BTreeMap<String, u16>,
}

fn rows() -> Vec<Row> {
    let text = include_str!("../testdata/routing_vectors.jsonl");
    text.lines().map(|l| serde_json::from_str(l).expect("a vector row")).collect()
}

fn count(n: &str) -> PartitionCount {
    n.parse().expect("a valid count in the vectors")
}

#[test]
fn every_vector_row_matches_python() {
    let rows = rows();
    assert!(rows.len() >= 5000, "only {} rows", rows.len());
    let mut checked = 0;
    for row in &rows {
        assert_eq!(format!("{:016x}", key_digest(&row.key)), row.digest, "digest of {:?}", row.key);
        for (n, expected) in &row.partitions {
            assert_eq!(
                partition_for(&row.key, count(n)).0,
                *expected,
                "key {:?} count {n}",
                row.key
            );
            checked += 1;
        }
    }
    assert_eq!(checked, rows.len() * 6, "every row has six counts");
}

#[test]
fn the_vectors_cover_the_awkward_keys() {
    let rows = rows();
    let has = |pred: &dyn Fn(&str) -> bool| rows.iter().any(|r| pred(&r.key));
    assert!(has(&|k| k.chars().count() == 1), "a one-character key");
    assert!(has(&|k| k.len() >= 300), "a 300-byte key");
    assert!(has(&|k| k.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))), "CJK");
    assert!(has(&|k| k.chars().any(|c| c as u32 >= 0x1F600)), "emoji");
    assert!(has(&|k| k.contains('é')), "accents");
    let subs = rows.iter().filter(|r| r.key.starts_with("sub_")).count();
    assert!(subs >= 4000, "realistic sub_ ids: {subs}");
    for n in ["1", "7", "16", "64", "1000", "32767"] {
        assert!(rows[0].partitions.contains_key(n), "count {n}");
    }
}

#[test]
fn batch_routing_matches_the_vectors() {
    let rows = rows();
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    let mut out = Vec::new();
    route_many(&keys, count("1000"), &mut out);
    for (row, p) in rows.iter().zip(&out) {
        assert_eq!(p.0, row.partitions["1000"]);
    }
}

/// The vector test can fail: the two classic mistakes give different answers on most rows.
#[test]
fn truncated_digest_or_little_endian_would_fail_the_vectors() {
    let rows = rows();
    let truncated = |k: &str| {
        let full = Blake2b512::digest(k.as_bytes());
        u64::from_be_bytes(full[..8].try_into().expect("8 bytes"))
    };
    let little = |k: &str| key_digest(k).swap_bytes();
    for (name, wrong) in [
        ("truncated 64-byte digest", &truncated as &dyn Fn(&str) -> u64),
        ("little-endian", &little),
    ] {
        let mismatches =
            rows.iter().filter(|r| wrong(&r.key) % 1000 != u64::from(r.partitions["1000"])).count();
        assert!(
            mismatches > rows.len() * 9 / 10,
            "{name} matched too often: {mismatches} mismatches"
        );
    }
}
