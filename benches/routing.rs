//! Routing throughput: single-key and batch routing of 1M realistic keys (`sub_` + 20–26
//! alphanumerics), and of short (1–4 byte) and 200-byte keys. Compare with the reference
//! Python function: `python3 benches/routing_reference.py`.

// criterion's macros generate undocumented items.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use keyorder::{partition_for, route_many, PartitionCount};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: usize = 1_000_000;

fn keys(len: impl Fn(&mut StdRng) -> usize, prefix: &str) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(20261202);
    (0..KEYS)
        .map(|_| {
            let n = len(&mut rng);
            let tail: String =
                (0..n).map(|_| rng.sample(rand::distr::Alphanumeric) as char).collect();
            format!("{prefix}{tail}")
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let count = PartitionCount::new(64).expect("valid");
    let sets = [
        ("realistic", keys(|r| r.random_range(20..=26), "sub_")),
        ("short", keys(|r| r.random_range(1..=4), "")),
        ("200-byte", keys(|_| 200, "")),
    ];
    let mut group = c.benchmark_group("routing");
    group.sample_size(10);
    group.throughput(Throughput::Elements(KEYS as u64));
    for (name, set) in &sets {
        group.bench_function(format!("single/{name}"), |b| {
            b.iter(|| {
                set.iter().map(|k| u64::from(partition_for(black_box(k), count).0)).sum::<u64>()
            })
        });
        group.bench_function(format!("batch/{name}"), |b| {
            b.iter_batched_ref(
                || Vec::with_capacity(KEYS),
                |out| route_many(black_box(set), count, out),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
