//! Wall time of one medium simulation run (16 partitions, 4 workers, about 2,600 events with
//! faults), and of a small one, for the seeds-per-minute figure in the README.

// criterion's macros generate undocumented items.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use keyorder_sim::{run, Scenario, Size};

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim");
    group.sample_size(10);
    for (name, size, seed) in [("small", Size::Small, 1), ("medium", Size::Medium, 1)] {
        let scenario = Scenario::generate(size, seed);
        group.bench_function(name, |b| b.iter(|| run(&scenario, seed, false).expect("runs")));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
