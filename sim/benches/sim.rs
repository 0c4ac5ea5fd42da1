//! Wall time of one medium simulation run (16 partitions, 4 workers, about 2,600 events with
//! faults), and of a small one, for the seeds-per-minute figure in the README; each also with
//! every host ticked every millisecond (`every_tick`, upstream turmoil's stepping), the
//! baseline of the idle-skipping measured in the same run.

// criterion's macros generate undocumented items.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use keyorder_sim::{run_with, Scenario, Size, Stepping};

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("sim");
    group.sample_size(10);
    for (name, size, seed) in [("small", Size::Small, 1), ("medium", Size::Medium, 1)] {
        let scenario = Scenario::generate(size, seed);
        for (mode, stepping) in [("", Stepping::SkipIdle), ("_every_tick", Stepping::EveryTick)] {
            group.bench_function(format!("{name}{mode}"), |b| {
                b.iter(|| run_with(&scenario, seed, false, stepping).expect("runs"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
