//! Every broken design in the catalogue is caught with its named violation within a few seeds
//! of small, medium and large scenarios, and the same scenarios without the switch pass. From
//! seed 0 the larger sizes catch every design within a seed or two, so the large runs add
//! seconds, not minutes; `KEYORDER_SIM_LARGE=0` leaves them out.

use keyorder_sim::scenario::{ExpirySpec, LeaseModel};
use keyorder_sim::{run, Break, Scenario, Size};

/// Seeds a sweep may need to catch a broken design, per size: above the worst of 20 sweeps
/// that `keyorder-sim catalogue --size small --size medium --size large` measures (README).
fn seed_bound(size: Size) -> u64 {
    match size {
        Size::Small => 20,
        Size::Medium => 4,
        Size::Large => 5,
    }
}

/// Whether the large scenarios run too (unless `KEYORDER_SIM_LARGE=0`).
fn large() -> bool {
    std::env::var_os("KEYORDER_SIM_LARGE").is_none_or(|v| v != "0")
}

fn check_at(b: Break, size: Size) {
    check_scenarios(b, size, |_| {});
}

/// [`check_at`] on the scenarios changed by `adjust`.
fn check_scenarios(b: Break, size: Size, adjust: impl Fn(&mut Scenario)) {
    let bound = seed_bound(size);
    let mut caught = None;
    for seed in 0..bound {
        let mut scenario = Scenario::generate_broken(size, seed, b);
        adjust(&mut scenario);
        let outcome = run(&scenario, seed, false).expect("runs");
        if outcome.verdict.violated().contains(&b.expected()) {
            caught = Some(seed);
            break;
        }
    }
    let Some(last) = caught else {
        panic!("{} ({size:?}): no {} in {bound} seeds", b.name(), b.expected());
    };
    // The same scenarios, with the same faults and triggers, are clean without the switch.
    for seed in 0..=last {
        let mut scenario = Scenario::generate_broken(size, seed, b);
        adjust(&mut scenario);
        scenario.breaks.clear();
        let outcome = run(&scenario, seed, false).expect("runs");
        assert!(
            outcome.verdict.is_ok(),
            "{} ({size:?}) switched off, seed {seed}:\n{}",
            b.name(),
            outcome.verdict
        );
    }
}

fn check(b: Break) {
    check_at(b, Size::Small);
    check_at(b, Size::Medium);
    if large() {
        check_at(b, Size::Large);
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

#[test]
fn an_always_clean_handover_is_caught_as_concurrent() {
    check(Break::HandoverAlwaysClean);
}

#[test]
fn an_unfenced_expiry_lease_is_caught_as_concurrent() {
    check(Break::UnfencedExpiry);
}

#[test]
fn skip_without_parking_is_caught_as_reorder() {
    check(Break::SkipWithoutParking);
}

#[test]
fn a_pin_without_barrier_is_caught_as_split_key() {
    check(Break::PinWithoutBarrier);
}

#[test]
fn a_cursor_past_parked_rows_is_caught_as_reorder() {
    check(Break::CursorPastParked);
}

/// The same design on SQLite's drain: with expiry leases the simulation runs production
/// SQLite's cursor and buffered acknowledgements, and a cursor that stays past an unparked
/// key's rows is caught there too (the catalogue's own scenarios use session locks).
#[test]
fn a_cursor_past_parked_rows_is_caught_as_reorder_with_expiry_leases() {
    let expiry = |s: &mut Scenario| s.lease = LeaseModel::Expiry(ExpirySpec::standard());
    check_scenarios(Break::CursorPastParked, Size::Small, expiry);
    check_scenarios(Break::CursorPastParked, Size::Medium, expiry);
}

#[test]
fn a_timeout_that_leaves_the_call_running_is_caught_as_concurrent() {
    check(Break::TimeoutLeavesCallRunning);
}

#[test]
fn a_local_batch_of_one_partition_is_caught_as_concurrent() {
    check(Break::LocalBatch);
}

#[test]
fn priority_within_a_key_is_caught_as_reorder() {
    check(Break::PriorityWithinKey);
}

#[test]
fn ordering_by_a_timestamp_with_ties_is_caught_as_reorder() {
    check(Break::CreatedAtOrder);
}

#[test]
fn partitions_handed_to_a_joining_worker_at_once_are_caught_as_concurrent() {
    check(Break::RebalanceOnJoin);
}

#[test]
fn a_head_set_aside_then_dead_lettered_is_caught_as_skip() {
    check(Break::SetAsideHead);
}

#[test]
fn a_stuck_key_that_blocks_its_partition_is_caught_as_stall() {
    check(Break::StuckKeyBlocksPartition);
}
