//! Parking in the simulation (issue #21), through the same worker loop: one key fails for long
//! stretches (every event refused three times with a `Retry-After`) beside healthy keys on the
//! same partition. With parking the healthy keys are not held up; in partition FIFO they wait
//! out every backoff. Both runs are correct.

use std::time::Duration;

use keyorder::check::Kind;
use keyorder::retry::RetryPolicy;
use keyorder_sim::{run, Scenario};

use super::fixtures;

/// One partition, one worker: `sub_a` fails its first three attempts of every event, with
/// `Retry-After: 300 ms`; `sub_b` and `sub_c` are healthy.
fn failing_beside_healthy(strict: bool) -> Scenario {
    let mut s = fixtures::clean();
    s.partitions = 1;
    s.workers = 1;
    s.retry =
        RetryPolicy::new(5, Duration::from_millis(50), Duration::from_millis(400)).expect("valid");
    s.keys[0].endpoint.fail_first = 3;
    s.keys[0].endpoint.retry_after_ms = Some(300);
    for k in &mut s.keys[1..] {
        k.events = 12;
    }
    s.load_ms = 600;
    s.strict_partition_order = strict;
    s
}

#[test]
fn a_key_failing_for_long_stretches_holds_up_only_itself() {
    for seed in 0..4 {
        let parked = run(&failing_beside_healthy(false), seed, false).expect("runs");
        let strict = run(&failing_beside_healthy(true), seed, false).expect("runs");
        assert!(parked.verdict.is_ok(), "seed {seed}, parking:\n{}", parked.verdict);
        assert!(strict.verdict.is_ok(), "seed {seed}, strict:\n{}", strict.verdict);
        assert_eq!(parked.verdict.dead_lettered, 0, "the attempt cap is not reached");
        let (p, s) =
            (parked.verdict.count(Kind::HeadOfLine), strict.verdict.count(Kind::HeadOfLine));
        // Four events, three 300 ms backoffs each: partition FIFO holds the healthy keys for
        // seconds; parking for at most an idle poll here and there.
        assert!(s >= 2_000, "seed {seed}: strict head-of-line {s} ms");
        assert!(p * 4 < s, "seed {seed}: parking {p} ms against strict {s} ms");
    }
}
