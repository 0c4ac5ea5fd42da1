//! Every broken design in the catalogue is caught with its named violation within
//! `SEED_BOUND` seeds of small scenarios, and the same scenarios without the switch pass.

use keyorder_sim::{run, Break, Scenario, Size};

/// Seeds a sweep may need to catch a broken design. The catalogue command measures the median
/// at 1 for every design but `unserialised-producers` and `unfenced-lease` (2 or less).
const SEED_BOUND: u64 = 10;

fn check(b: Break) {
    let mut caught = None;
    for seed in 0..SEED_BOUND {
        let scenario = Scenario::generate_broken(Size::Small, seed, b);
        let outcome = run(&scenario, seed, false).expect("runs");
        if outcome.verdict.violated().contains(&b.expected()) {
            caught = Some(seed);
            break;
        }
    }
    let Some(last) = caught else {
        panic!("{}: no {} in {SEED_BOUND} seeds", b.name(), b.expected());
    };
    // The same scenarios, with the same faults and triggers, are clean without the switch.
    for seed in 0..=last {
        let mut scenario = Scenario::generate_broken(Size::Small, seed, b);
        scenario.breaks.clear();
        let outcome = run(&scenario, seed, false).expect("runs");
        assert!(
            outcome.verdict.is_ok(),
            "{} switched off, seed {seed}:\n{}",
            b.name(),
            outcome.verdict
        );
    }
}

#[test]
fn random_hash_is_caught_as_split_key() {
    check(Break::RandomHash);
}

#[test]
fn two_readers_are_caught_as_concurrent() {
    check(Break::TwoReaders);
}

#[test]
fn an_unfenced_lease_is_caught_as_concurrent() {
    check(Break::UnfencedLease);
}

#[test]
fn a_flip_without_drain_is_caught_as_split_key() {
    check(Break::FlipWithoutDrain);
}

#[test]
fn requeue_at_tail_is_caught_as_reorder() {
    check(Break::RequeueAtTail);
}

#[test]
fn parallel_in_partition_is_caught_as_concurrent() {
    check(Break::ParallelInPartition);
}

#[test]
fn unserialised_producers_are_caught_as_reorder() {
    check(Break::UnserialisedProducers);
}

#[test]
fn unbounded_retry_is_caught_as_stall() {
    check(Break::UnboundedRetry);
}
