//! The trigger each broken design of the catalogue needs to show itself: the faults, keys and
//! endpoint behaviour added to a generated scenario ([`crate::Scenario::generate_broken`]).
//! Without the switch the same scenario is the correct design under the same faults.

use rand::rngs::StdRng;
use rand::Rng;
use rand::SeedableRng;

use crate::breaks::Break;
use crate::generate::{key_spec, pin_changes};
use crate::scenario::{ExpirySpec, Fault, FaultKind, LeaseModel, Scenario, Size};

impl Scenario {
    /// The scenario of `size` and `seed` with `b` switched on, plus the trigger that design
    /// needs to show (a lease loss for an unfenced lease, a modulus change for a flip, a
    /// poison event for unbounded retry, two producers where keys must share them, a store
    /// restart with slow deliveries out for an always-clean hand-back, an expiry lease and
    /// pauses past its expiry for an unfenced expiry lease, a slow whale pinned early for a pin
    /// without barrier). Without the switch the same
    /// scenario is the correct design under the same faults.
    pub fn generate_broken(size: Size, seed: u64, b: Break) -> Scenario {
        // Without the pin changes (and their whale): each design runs on the scenario it was
        // made for; `pin-without-barrier` adds its own.
        let mut s = Scenario::generate_without_pins(size, seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0xB7EA_C0DE);
        // Every other design is about session locks (or about no lease at all): it runs on the
        // session-lock scenario of its seed, as it did before expiry leases existed.
        s.lease = LeaseModel::SessionLock;
        // Without the pauses of the session-lock scenarios: each design runs on the faults it
        // was made for.
        s.faults.retain(|f| !f.kind.needs_expiry() && !matches!(f.kind, FaultKind::Pause { .. }));
        add(b, &mut rng, &mut s);
        s.faults.sort_by_key(|f| f.at_ms);
        s.breaks = vec![b];
        s
    }
}

/// Adds to `s` the trigger design `b` needs, drawing from `rng`.
pub(crate) fn add(b: Break, rng: &mut StdRng, s: &mut Scenario) {
    match b {
        Break::RandomHash | Break::UnserialisedProducers => s.producers = s.producers.max(2),
        Break::UnfencedLease => early_cut(rng, s),
        Break::RequeueAtTail => {
            for k in s.keys.iter_mut().step_by(4) {
                k.endpoint.flaky_percent = k.endpoint.flaky_percent.max(30);
            }
        }
        Break::FlipWithoutDrain => {
            let mid = s.load_ms / 2;
            s.faults.retain(|f| !matches!(f.kind, FaultKind::Repartition { .. }));
            let to = s.partitions * 2;
            s.faults.push(Fault {
                at_ms: rng.random_range(mid / 2..mid.max(1)),
                kind: FaultKind::Repartition { to },
            });
        }
        Break::UnboundedRetry => {
            let k = rng.random_range(0..s.keys.len());
            let events = s.keys[k].events;
            s.keys[k].endpoint.poison = vec![rng.random_range(0..events)];
            // Long enough for the same scenario to drain without the switch (producers run
            // well past load_ms at medium size), and for the stall bound to pass with it.
            s.duration_ms = s.load_ms + 30_000;
        }
        Break::HandoverAlwaysClean => restarts_with_slow_deliveries_out(rng, s),
        Break::UnfencedExpiry => unfenced_expiry_trigger(rng, s),
        Break::SkipWithoutParking => {
            // A key that fails for a long stretch: every event's first three attempts are
            // refused with a Retry-After, so its later events are queued behind a head that
            // backs off.
            let k = rng.random_range(0..s.keys.len());
            s.keys[k].events = s.keys[k].events.max(4);
            s.keys[k].endpoint.fail_first = 3;
            s.keys[k].endpoint.retry_after_ms = Some(100);
            s.keys[k].endpoint.poison.clear();
        }
        Break::SetAsideHead => {
            // Poison heads that end in the dead-letter table: every fourth key has an event
            // early on that always fails, with later events behind it.
            for k in s.keys.iter_mut().step_by(4) {
                k.events = k.events.max(4);
                k.endpoint.poison = vec![1];
            }
        }
        Break::StuckKeyBlocksPartition => {
            // Poison heads with later events of their key behind them, as for `set-aside-head`,
            // and time after the load for the stall bound to pass (the same scenario drains
            // well within it without the switch).
            for k in s.keys.iter_mut().step_by(4) {
                k.events = k.events.max(4);
                k.endpoint.poison = vec![1];
            }
            s.duration_ms = s.duration_ms.max(s.load_ms + 30_000);
        }
        Break::CursorPastParked => parked_keys_beside_busy_ones(rng, s),
        Break::CursorPastLateCommit => late_commits(s),
        Break::PinWithoutBarrier => {
            // A pin change while the whale has rows queued on its old partition, every time:
            // early in the load, no change of count to move the key first, and the whale's
            // endpoint slow enough that its backlog never empties.
            s.faults.retain(|f| !matches!(f.kind, FaultKind::Repartition { .. }));
            pin_changes(rng, s, true);
        }
        Break::TimeoutLeavesCallRunning => slow_answers(s),
        Break::RebalanceOnJoin => {
            // Workers that join while deliveries are out: slow answers on every other key, and
            // three crashes whose restarts register again within the load.
            slow_answers(s);
            for i in 1..=3 {
                let at_ms = s.load_ms * i / 4 + rng.random_range(0..=100);
                let worker = rng.random_range(0..s.workers);
                let down_ms = rng.random_range(50..=300);
                s.faults.push(Fault { at_ms, kind: FaultKind::CrashWorker { worker, down_ms } });
            }
        }
        Break::LocalBatch | Break::PriorityWithinKey | Break::CreatedAtOrder => backlog(s),
        Break::TwoReaders | Break::ParallelInPartition => {}
    }
}

/// Slow answers: every other key's first arrival of each event takes longer than the
/// delivery timeout.
fn slow_answers(s: &mut Scenario) {
    for k in s.keys.iter_mut().step_by(2) {
        k.endpoint.slow_first = k.endpoint.slow_first.max(1);
    }
}

/// A backlog in every partition: endpoints slow enough that rows queue up, so a batch or a
/// head read has several rows of a key to choose from.
fn backlog(s: &mut Scenario) {
    for k in &mut s.keys {
        k.endpoint.latency_ms = k.endpoint.latency_ms.max(20);
    }
}

/// `unfenced-lease`: the cut comes early and events keep coming long after it heals, so the
/// worker that lost its lease has heads to read beside the new holder. A crash of that worker
/// would end its pooled connections with it and hide the design, so the random mix must not
/// crash it. The pooled leases never notice their loss, so the run cannot drain: it ends 30 s
/// after the load (time enough for the same scenario to drain without the switch).
fn early_cut(rng: &mut StdRng, s: &mut Scenario) {
    let worker = rng.random_range(0..s.workers);
    let (at_ms, for_ms) = (rng.random_range(500..1_000), s.detection_ms + 500);
    s.faults.retain(|f| !matches!(f.kind, FaultKind::CrashWorker { worker: w, .. } if w == worker));
    s.faults.push(Fault { at_ms, kind: FaultKind::LeaseLoss { worker, for_ms } });
    s.load_ms = s.load_ms.max(at_ms + for_ms + 3_000);
    s.duration_ms = s.load_ms + 30_000;
}

/// `handover-always-clean`: a store restart drops every lease at once while slow deliveries
/// are out. One worker is cut off from the store across it, so the others count it gone and
/// take its partitions while its deliveries are still out: the new holders must wait those
/// out, and this design tells them not to. Three chances, a quarter of the load apart, each
/// with its own timing.
fn restarts_with_slow_deliveries_out(rng: &mut StdRng, s: &mut Scenario) {
    slow_answers(s);
    let worker = rng.random_range(0..s.workers);
    s.faults.retain(|f| !matches!(f.kind, FaultKind::CrashWorker { worker: w, .. } if w == worker));
    for i in 1..=3 {
        let at_ms = s.load_ms * i / 4 + rng.random_range(0..=100);
        s.faults.push(Fault { at_ms, kind: FaultKind::LeaseLoss { worker, for_ms: 600 } });
        let down_ms = rng.random_range(20..=100);
        s.faults.push(Fault { at_ms, kind: FaultKind::StoreRestart { down_ms } });
    }
}

/// `cursor-past-parked`: at least four keys a partition, every other one failing for
/// stretches: two can be parked at once while a third's acknowledgements move the cursor past
/// their rows, then be unparked, and one parked again while a read after the cursor is due.
fn parked_keys_beside_busy_ones(rng: &mut StdRng, s: &mut Scenario) {
    let events = s.keys.iter().map(|k| k.events).min().unwrap_or(4);
    for i in s.keys.len()..usize::from(s.partitions) * 4 {
        s.keys.push(key_spec(rng, i, events));
    }
    for k in s.keys.iter_mut().step_by(2) {
        k.events = k.events.max(4);
        k.endpoint.fail_first = 2;
        k.endpoint.retry_after_ms = Some(100);
        k.endpoint.poison.clear();
    }
}

/// `cursor-past-late-commit`: two producers taking turns to hold one transaction open for
/// 200 ms, every 100 ms through the load, beside endpoints slow enough that partitions keep a
/// backlog, so the drain reads after its cursor while a row lies uncommitted behind it.
fn late_commits(s: &mut Scenario) {
    s.producers = s.producers.max(2);
    backlog(s);
    for (i, at_ms) in (20..s.load_ms).step_by(100).enumerate() {
        let producer = i % s.producers;
        let kind = FaultKind::SlowCommits { producer, extra_ms: 200, for_ms: 1 };
        s.faults.push(Fault { at_ms, kind });
    }
}

/// `unfenced-expiry`'s trigger: an expiry lease, and one worker (never crashed) stopped three
/// times, each time past its expiry and the takeover by another worker, while events keep
/// coming: its partitions fill up while it is stopped, the new holder drains them, and the
/// stopped worker wakes in the middle of a statement of its old lease.
fn unfenced_expiry_trigger(rng: &mut StdRng, s: &mut Scenario) {
    let mut spec = ExpirySpec::standard();
    let bound = spec.skew_bound_ms as i64;
    spec.skew_ms = (0..s.workers).map(|_| rng.random_range(-bound..=bound)).collect();
    let e = spec.expiry_ms;
    s.lease = LeaseModel::Expiry(spec);
    let worker = rng.random_range(0..s.workers);
    s.faults.retain(|f| !matches!(f.kind, FaultKind::CrashWorker { worker: w, .. } if w == worker));
    let mut at_ms = rng.random_range(300..600);
    for _ in 0..3 {
        // Past the expiry, the rebalance that notices it and the new holder's takeover wait.
        let for_ms = e + rng.random_range(700..=1_500);
        s.faults.push(Fault { at_ms, kind: FaultKind::Pause { worker, for_ms } });
        at_ms += for_ms + rng.random_range(1_000..=2_000);
    }
    s.load_ms = s.load_ms.max(at_ms + 1_000);
    s.duration_ms = s.load_ms + 30_000;
}
