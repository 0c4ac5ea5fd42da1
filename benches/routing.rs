//! Routing throughput over 1M realistic keys (`sub_` + 20–26 alphanumerics), short (1–4 byte)
//! and 200-byte keys, in one criterion run so the ratios are comparable:
//!
//! * `blake2-per-key`: [`partition_for`], the `blake2` crate one key at a time (the baseline);
//! * `simd-per-key`: `blake2b_simd::Params::hash` one key at a time;
//! * `simd-many`: `blake2b_simd::many::hash_many` over every key, 64 jobs a call, no split by
//!   length;
//! * `batch`: the batch router [`route_many`]: keys of one block (at most 128 bytes) through its
//!   own compression specialised for routing's parameter block, four at a time in AVX2 lanes;
//!   longer keys through `blake2b_simd::many`;
//! * `batch-portable`: the same router with SIMD forced off (the specialised compression one
//!   key at a time in portable code; `blake2b_simd`'s portable code for longer keys).
//!
//! The machine this runs on is shared, so the benchmark measures the *CPU time of the
//! benchmarking thread* (`/proc/thread-self/schedstat`, Linux), not wall time: time the thread
//! spends descheduled by other processes does not count, and the figures are per core. Ratios
//! within one run are what to compare; absolute figures still drift with frequency and cache
//! pressure from neighbours.
//!
//! Compare with the reference Python function: `python3 benches/routing_reference.py`.

// criterion's macros generate undocumented items.
#![allow(missing_docs)]

use blake2b_simd::many::{hash_many, HashManyJob};
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use keyorder::routing::{route_many_with, Lanes};
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

fn params() -> blake2b_simd::Params {
    let mut p = blake2b_simd::Params::new();
    p.hash_length(8);
    p
}

fn be(hash: &blake2b_simd::Hash) -> u64 {
    u64::from_be_bytes(hash.as_bytes().try_into().expect("8 bytes"))
}

/// CPU time consumed by the calling thread so far, from `/proc/thread-self/schedstat` (its first
/// field, nanoseconds on the CPU).
fn thread_cpu() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("Linux /proc/thread-self/schedstat");
    let ns = text.split_whitespace().next().and_then(|f| f.parse().ok()).expect("run time in ns");
    Duration::from_nanos(ns)
}

/// A criterion measurement of the benchmarking thread's CPU time (see the module docs).
struct ThreadCpu {
    wall: WallTime,
}

impl Measurement for ThreadCpu {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        self.wall.formatter()
    }
}

fn bench(c: &mut Criterion<ThreadCpu>) {
    let count = PartitionCount::new(64).expect("valid");
    let modulus = u64::from(count.get());
    let sets = [
        ("realistic", keys(|r| r.random_range(20..=26), "sub_")),
        ("short", keys(|r| r.random_range(1..=4), "")),
        ("200-byte", keys(|_| 200, "")),
    ];
    let params = params();
    eprintln!("one-block keys: {}", keyorder::routing::one_block_backend(Lanes::Detect));
    let mut group = c.benchmark_group("routing");
    group.sample_size(10);
    group.throughput(Throughput::Elements(KEYS as u64));
    for (name, set) in &sets {
        group.bench_function(format!("blake2-per-key/{name}"), |b| {
            b.iter(|| {
                set.iter().map(|k| u64::from(partition_for(black_box(k), count).0)).sum::<u64>()
            })
        });
        group.bench_function(format!("simd-per-key/{name}"), |b| {
            b.iter(|| {
                set.iter().map(|k| be(&params.hash(black_box(k).as_bytes())) % modulus).sum::<u64>()
            })
        });
        group.bench_function(format!("simd-many/{name}"), |b| {
            b.iter(|| {
                let mut sum = 0u64;
                let mut jobs = Vec::with_capacity(64);
                for chunk in black_box(set).chunks(64) {
                    jobs.clear();
                    jobs.extend(chunk.iter().map(|k| HashManyJob::new(&params, k.as_bytes())));
                    hash_many(jobs.iter_mut());
                    sum += jobs.iter().map(|j| be(&j.to_hash()) % modulus).sum::<u64>();
                }
                sum
            })
        });
        group.bench_function(format!("batch/{name}"), |b| {
            b.iter_batched_ref(
                || Vec::with_capacity(KEYS),
                |out| route_many(black_box(set), count, out),
                BatchSize::LargeInput,
            )
        });
        group.bench_function(format!("batch-portable/{name}"), |b| {
            b.iter_batched_ref(
                || Vec::with_capacity(KEYS),
                |out| route_many_with(black_box(set), count, out, Lanes::Portable),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu { wall: WallTime });
    targets = bench
}
criterion_main!(benches);
