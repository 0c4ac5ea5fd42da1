//! Property tests of routing: determinism, range, batch router == single key (AVX2 lanes where
//! the CPU has them, and SIMD forced off: the portable one-block compression; keys of every
//! length 0..=300 bytes across the one-block boundary at 128, random batch sizes, into a `Vec`
//! and into a caller's slice), the Python vectors through the batch path, overrides win, and a
//! chi-square bound on the distribution over random keys.
//!
//! The batch properties run 2,000 cases; `KEYORDER_LONG=1` runs 100,000 (3.5 minutes in
//! release on a busy 2-core machine: `KEYORDER_LONG=1 cargo test --release --test
//! prop_routing`), and
//! `KEYORDER_PROPTEST_CASES=N` sets any other number.

use keyorder::routing::{
    digest_into, digest_into_with, digest_many, digest_many_with, key_digest, one_block_backend,
    route_into, route_into_with, route_many_with, Lanes, LANE_KEY_MAX,
};
use keyorder::{partition_for, route_many, Overrides, PartitionCount, PartitionId, Router};
use proptest::prelude::*;

/// Cases of the batch properties: 2,000, or 100,000 with `KEYORDER_LONG=1`, or
/// `KEYORDER_PROPTEST_CASES`.
fn batch_cases() -> u32 {
    if let Some(n) = std::env::var("KEYORDER_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    match std::env::var("KEYORDER_LONG").as_deref() {
        Ok("1") => 100_000,
        _ => 2_000,
    }
}

/// A key of exactly `len` bytes: the given characters (any Unicode, so 1–4 bytes each) while
/// they fit, then ASCII filler.
fn key_of_len(len: usize, chars: &[char]) -> String {
    let mut key = String::with_capacity(len);
    for &c in chars {
        if key.len() + c.len_utf8() > len {
            break;
        }
        key.push(c);
    }
    while key.len() < len {
        key.push(char::from(b'a' + (key.len() % 26) as u8));
    }
    key
}

/// Keys of every length 0..=300 bytes, half of them near the one-block boundary (120..=136).
fn any_key() -> impl Strategy<Value = String> {
    let len = prop_oneof![0usize..=300, 120usize..=136, 0usize..=32];
    (len, prop::collection::vec(any::<char>(), 0..=300))
        .prop_map(|(len, chars)| key_of_len(len, &chars))
}

/// Every path of the batch router, SIMD lanes and forced portable, against the single key.
fn check_batch(keys: &[String], count: PartitionCount) -> Result<(), TestCaseError> {
    let single: Vec<_> = keys.iter().map(|k| partition_for(k, count)).collect();
    let digests: Vec<_> = keys.iter().map(|k| key_digest(k)).collect();
    let mut parts = vec![PartitionId(9999)];
    let mut ds = vec![7u64];
    for lanes in [Lanes::Detect, Lanes::Portable] {
        route_many_with(keys, count, &mut parts, lanes);
        prop_assert_eq!(&parts, &single, "route_many {:?}", lanes);
        digest_many_with(keys, &mut ds, lanes);
        prop_assert_eq!(&ds, &digests, "digest_many {:?}", lanes);
        let mut slots = vec![PartitionId(9999); keys.len()];
        route_into_with(keys, count, &mut slots, lanes);
        prop_assert_eq!(&slots, &single, "route_into {:?}", lanes);
        let mut slots = vec![7u64; keys.len()];
        digest_into_with(keys, &mut slots, lanes);
        prop_assert_eq!(&slots, &digests, "digest_into {:?}", lanes);
    }
    route_many(keys, count, &mut parts);
    prop_assert_eq!(&parts, &single);
    digest_many(keys, &mut ds);
    prop_assert_eq!(&ds, &digests);
    let mut slots = vec![PartitionId(9999); keys.len()];
    route_into(keys, count, &mut slots);
    prop_assert_eq!(&slots, &single);
    let mut slots = vec![7u64; keys.len()];
    digest_into(keys, &mut slots);
    prop_assert_eq!(&slots, &digests);
    Ok(())
}

#[derive(serde::Deserialize)]
struct Row {
    key: String,
    digest: String,
}

fn vector_rows() -> Vec<Row> {
    let text = include_str!("../testdata/routing_vectors.jsonl");
    text.lines().map(|l| serde_json::from_str(l).expect("a vector row")).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(batch_cases()))]

    #[test]
    fn batch_router_equals_single_key(
        keys in prop::collection::vec(any_key(), 0..=300),
        count in count(),
    ) {
        check_batch(&keys, count)?;
    }

    /// Random batches of the Python vectors, in random order (mixed lengths up to 300 bytes),
    /// through the batch path: each digest is the one hashlib gave.
    #[test]
    fn python_vectors_through_random_batches(
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..=200),
    ) {
        let rows = vector_rows_cached();
        let keys: Vec<&str> = picks.iter().map(|i| rows[i.index(rows.len())].key.as_str()).collect();
        for lanes in [Lanes::Detect, Lanes::Portable] {
            let mut ds = Vec::new();
            digest_many_with(&keys, &mut ds, lanes);
            for (i, d) in picks.iter().zip(&ds) {
                let row = &rows[i.index(rows.len())];
                prop_assert_eq!(format!("{d:016x}"), row.digest.clone(), "{:?} {:?}", row.key, lanes);
            }
        }
    }
}

fn vector_rows_cached() -> &'static [Row] {
    static ROWS: std::sync::OnceLock<Vec<Row>> = std::sync::OnceLock::new();
    ROWS.get_or_init(vector_rows)
}

/// Every key length 0..=300 bytes in one batch, ASCII and multi-byte, across the block boundary.
#[test]
fn every_length_through_the_batch_path() {
    let count = PartitionCount::new(1000).expect("valid");
    for chars in [vec![], "é中😀x".chars().cycle().take(300).collect::<Vec<char>>()] {
        let keys: Vec<String> = (0..=300).map(|n| key_of_len(n, &chars)).collect();
        assert!(keys.iter().enumerate().all(|(n, k)| k.len() == n));
        assert!(keys.iter().any(|k| k.len() == LANE_KEY_MAX));
        check_batch(&keys, count).expect("batch == single");
    }
}

/// The batch properties test the SIMD path only if it runs: on a CPU with AVX2 it must.
#[test]
#[cfg(target_arch = "x86_64")]
fn the_simd_path_is_the_one_tested() {
    let expected = if std::is_x86_feature_detected!("avx2") { "avx2" } else { "portable" };
    assert_eq!(one_block_backend(Lanes::Detect), expected);
    assert_eq!(one_block_backend(Lanes::Portable), "portable");
}

/// `route_into` refuses an output slice of the wrong length.
#[test]
#[should_panic(expected = "one output slot per key")]
fn route_into_needs_one_slot_per_key() {
    let count = PartitionCount::new(16).expect("valid");
    route_into(&["a", "b"], count, &mut [PartitionId(0)]);
}

/// All 5,121 Python vectors in one batch, in file order, SIMD on and off.
#[test]
fn python_vectors_through_the_batch_path() {
    let rows = vector_rows();
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    for lanes in [Lanes::Detect, Lanes::Portable] {
        let mut ds = Vec::new();
        digest_many_with(&keys, &mut ds, lanes);
        for (row, d) in rows.iter().zip(&ds) {
            assert_eq!(format!("{d:016x}"), row.digest, "{:?} {lanes:?}", row.key);
        }
    }
}

fn count() -> impl Strategy<Value = PartitionCount> {
    (1i64..=32767).prop_map(|n| PartitionCount::new(n).expect("in range"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn deterministic_and_in_range(key in ".{0,64}", count in count()) {
        let p = partition_for(&key, count);
        prop_assert!(p.0 < count.get());
        prop_assert_eq!(p, partition_for(&key, count));
    }

    #[test]
    fn overrides_win(keys in prop::collection::vec("[a-z]{1,12}", 1..50), pin in 0u16..16) {
        let count = PartitionCount::new(16).expect("valid");
        let mut pins = Overrides::new();
        pins.pin(keys[0].clone(), PartitionId(pin));
        let router = Router::with_overrides(count, pins).expect("pin in range");
        prop_assert_eq!(router.route(&keys[0]), PartitionId(pin));
        let mut out = Vec::new();
        router.route_many(&keys, &mut out);
        for (k, p) in keys.iter().zip(&out) {
            prop_assert_eq!(*p, router.route(k));
        }
    }
}

/// Chi-square goodness of fit of 64,000 random `sub_` keys to the uniform distribution.
/// The bound is the 0.9999 quantile (16 partitions: 15 d.f. → 44.3; 64: 63 d.f. → 117.0), so a
/// correct hash fails about once in 10,000 seeds, and a biased one fails at once.
fn chi_square(count: u16, seed: u64) -> f64 {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let n = 64_000;
    let mut bins = vec![0u64; usize::from(count)];
    let pc = PartitionCount::new(i64::from(count)).expect("valid");
    for _ in 0..n {
        let len = rng.random_range(20..=26);
        let key: String = (0..len).map(|_| rng.sample(rand::distr::Alphanumeric) as char).collect();
        bins[usize::from(partition_for(&format!("sub_{key}"), pc).0)] += 1;
    }
    let expected = n as f64 / f64::from(count);
    bins.iter().map(|&o| (o as f64 - expected).powi(2) / expected).sum()
}

#[test]
fn distribution_passes_chi_square_for_16_and_64() {
    for (count, bound) in [(16u16, 44.3), (64, 117.0)] {
        let x2 = chi_square(count, 20261202);
        assert!(x2 < bound, "{count} partitions: chi-square {x2:.1} >= {bound}");
    }
}

#[test]
fn chi_square_catches_a_biased_router() {
    // A deliberately broken variant: keys routed by their length alone pile into few bins.
    let mut bins = [0u64; 16];
    for i in 0..64_000u64 {
        bins[(20 + i % 7) as usize % 16] += 1;
    }
    let expected = 4000.0;
    let x2: f64 = bins.iter().map(|&o| (o as f64 - expected).powi(2) / expected).sum();
    assert!(x2 > 44.3, "the bound must reject a biased router: {x2}");
}
