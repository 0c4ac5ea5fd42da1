//! Property tests of routing: determinism, range, single == batch, overrides win, and a
//! chi-square bound on the distribution over random keys.

use keyorder::{partition_for, route_many, Overrides, PartitionCount, PartitionId, Router};
use proptest::prelude::*;

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
    fn batch_equals_single(keys in prop::collection::vec(".{0,40}", 0..200), count in count()) {
        let mut out = Vec::new();
        route_many(&keys, count, &mut out);
        let single: Vec<_> = keys.iter().map(|k| partition_for(k, count)).collect();
        prop_assert_eq!(out, single);
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
