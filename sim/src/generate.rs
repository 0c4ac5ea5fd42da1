//! The seeded generator of scenarios: [`Scenario::generate`] draws a scenario of a size from a
//! seed (keys and their endpoints, faults, the lease model, pin changes), each part from a
//! generator of its own so that adding one part leaves the others' draws unchanged.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use keyorder::PartitionCount;

use crate::scenario::{
    EndpointSpec, ExpirySpec, Fault, FaultKind, KeySpec, LeaseModel, Scenario, Size,
};

impl Scenario {
    /// A random scenario of `size`, drawn from `seed`.
    pub fn generate(size: Size, seed: u64) -> Scenario {
        let mut scenario = Scenario::generate_without_pins(size, seed);
        // Pin changes come from a generator of their own, drawn last: a seed
        // without one is the scenario it was before pins existed.
        let mut pin_rng = StdRng::seed_from_u64(seed ^ PIN_STREAM);
        if pin_rng.random_bool(PIN_SHARE) {
            pin_changes(&mut pin_rng, &mut scenario, false);
        }
        scenario
    }

    /// [`Scenario::generate`] before its pin changes are drawn.
    pub(crate) fn generate_without_pins(size: Size, seed: u64) -> Scenario {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5C3A_A10E);
        let (partitions, workers, producers, keys, events, load_ms) = match size {
            Size::Small => (4u16, 2usize, 1usize, 8usize, 12u32, 1_000u64),
            Size::Medium => (16, 4, 2, 96, 25, 3_000),
            Size::Large => (64, 8, 4, 480, 25, 8_000),
        };
        let keys = (0..keys).map(|i| key_spec(&mut rng, i, events)).collect();
        let mut scenario = Scenario::new(partitions, workers, producers, keys, load_ms);
        scenario.max_latency_ms = rng.random_range(1..=4);
        scenario.faults = faults(&mut rng, &scenario);
        // The lease model comes from a generator of its own, so a session-lock scenario is the
        // same as before expiry leases existed, and an expiry one differs only by its lease and
        // the faults aimed at it.
        let mut lease_rng = StdRng::seed_from_u64(seed ^ 0x1EA5_E0E0);
        if lease_rng.random_bool(0.5) {
            expiry_lease(&mut lease_rng, &mut scenario);
        } else {
            // Pauses of session-lock workers come from a generator of their own as well.
            session_pauses(&mut StdRng::seed_from_u64(seed ^ 0x5E55_1011), &mut scenario);
        }
        scenario
    }
}

/// Switches `s` to an expiry lease with random clock offsets within the bound, and adds the
/// faults aimed at it: up to two pauses (some shorter, some longer than the expiry) and up to
/// one spell of late renewals.
fn expiry_lease(rng: &mut StdRng, s: &mut Scenario) {
    let mut spec = ExpirySpec::standard();
    let bound = spec.skew_bound_ms as i64;
    spec.skew_ms = (0..s.workers).map(|_| rng.random_range(-bound..=bound)).collect();
    let e = spec.expiry_ms;
    s.lease = LeaseModel::Expiry(spec);
    let at = |rng: &mut StdRng| rng.random_range(100..s.load_ms + 1_000);
    for _ in 0..rng.random_range(0..=2) {
        let worker = rng.random_range(0..s.workers);
        let kind = FaultKind::Pause { worker, for_ms: rng.random_range(e / 2..=e * 2) };
        s.faults.push(Fault { at_ms: at(rng), kind });
    }
    if rng.random_bool(0.5) {
        let worker = rng.random_range(0..s.workers);
        let extra_ms = rng.random_range(e / 3..=e);
        let kind =
            FaultKind::LateRenewals { worker, extra_ms, for_ms: rng.random_range(1_000..=4_000) };
        s.faults.push(Fault { at_ms: at(rng), kind });
    }
    s.faults.sort_by_key(|f| f.at_ms);
}

/// Up to two pauses of session-lock workers (a frozen process: its connections open and
/// silent), some shorter and some longer than the store's detection: the store ends a stopped
/// worker's sessions and their locks after `detection_ms`, the others take its partitions, and
/// on waking it must not deliver or acknowledge with the leases it lost.
fn session_pauses(rng: &mut StdRng, s: &mut Scenario) {
    let d = s.detection_ms;
    let at = |rng: &mut StdRng| rng.random_range(100..s.load_ms + 1_000);
    for _ in 0..rng.random_range(0..=2) {
        let worker = rng.random_range(0..s.workers);
        let kind = FaultKind::Pause { worker, for_ms: rng.random_range(d / 2..=d * 2) };
        s.faults.push(Fault { at_ms: at(rng), kind });
    }
    s.faults.sort_by_key(|f| f.at_ms);
}

/// The seed of the pin-change generator is the scenario's seed XOR this.
const PIN_STREAM: u64 = 0x0091_4E5C_4A4E;
/// The share of generated scenarios with a pin change.
const PIN_SHARE: f64 = 0.4;

/// A pin change under load: the heaviest key becomes a whale (three times its
/// events, an endpoint slow enough that it often carries a backlog: each answer takes one to
/// two of its mean gaps between events) and is pinned to another partition in the middle of the
/// load; half the time it is unpinned or pinned elsewhere later. `forced` (the
/// `pin-without-barrier` trigger) pins it once, early, with an endpoint that answers in half the
/// delivery timeout, several gaps at every size: its backlog grows from the start, so rows of it
/// are always queued on the old partition when the new one gets its first.
pub(crate) fn pin_changes(rng: &mut StdRng, s: &mut Scenario, forced: bool) {
    let smallest = s.smallest_count();
    let Some(i) = (0..s.keys.len()).max_by_key(|i| (s.keys[*i].events, std::cmp::Reverse(*i)))
    else {
        return;
    };
    if smallest < 2 {
        return;
    }
    let whale = &mut s.keys[i];
    whale.events *= 3;
    let gap = (s.load_ms / u64::from(whale.events)).max(1);
    // Well below the delivery timeout, or answers would time out.
    let cap = s.delivery_timeout_ms / 2;
    whale.endpoint.latency_ms =
        if forced { cap } else { rng.random_range(gap.min(cap)..=(2 * gap).min(cap)) };
    let key = whale.key.clone();
    let home = PartitionCount::new(i64::from(s.partitions))
        .map_or(0, |count| keyorder::partition_for(&key, count).0);
    let elsewhere = |rng: &mut StdRng, from: u16| {
        let p = rng.random_range(0..smallest);
        if p == from {
            (p + 1) % smallest
        } else {
            p
        }
    };
    let first = elsewhere(rng, home);
    let at_ms = if forced {
        rng.random_range(s.load_ms / 4..s.load_ms / 2)
    } else {
        rng.random_range(s.load_ms / 4..s.load_ms * 3 / 4)
    };
    s.faults
        .push(Fault { at_ms, kind: FaultKind::Pin { key: key.clone(), partition: Some(first) } });
    if !forced && rng.random_bool(0.5) {
        let later = at_ms + rng.random_range(s.load_ms / 8..=s.load_ms / 2);
        let partition = rng.random_bool(0.5).then(|| elsewhere(rng, first));
        s.faults.push(Fault { at_ms: later, kind: FaultKind::Pin { key, partition } });
    }
    s.faults.sort_by_key(|f| f.at_ms);
}

pub(crate) fn key_spec(rng: &mut StdRng, i: usize, events: u32) -> KeySpec {
    let mut endpoint = EndpointSpec { latency_ms: rng.random_range(0..=3), ..Default::default() };
    match rng.random_range(0..100) {
        0..=5 => endpoint.fail_first = rng.random_range(1..=2),
        6..=8 => {
            endpoint.fail_first = 1;
            endpoint.retry_after_ms = Some(rng.random_range(50..=300));
        }
        9..=12 => endpoint.slow_first = 1,
        13..=15 => endpoint.poison = vec![rng.random_range(0..events)],
        16..=19 => endpoint.flaky_percent = rng.random_range(10..=40),
        20 => endpoint.cut_reply_first = 1,
        21..=23 => endpoint.close_on_reuse_first = 1,
        24 => endpoint.silent_first = 1,
        25 => endpoint.slow_body_first = 1,
        _ => {}
    }
    let n = events + rng.random_range(0..=events / 5);
    KeySpec { key: format!("sub_{i:04}_{:08x}", rng.random::<u32>()), events: n, endpoint }
}

fn faults(rng: &mut StdRng, s: &Scenario) -> Vec<Fault> {
    let mut out = Vec::new();
    let at = |rng: &mut StdRng| rng.random_range(100..s.load_ms + 1_000);
    for _ in 0..rng.random_range(0..=2) {
        let worker = rng.random_range(0..s.workers);
        let kind = FaultKind::CrashWorker { worker, down_ms: rng.random_range(100..=1_500) };
        out.push(Fault { at_ms: at(rng), kind });
    }
    for _ in 0..rng.random_range(0..=2) {
        let worker = rng.random_range(0..s.workers);
        let kind =
            FaultKind::LeaseLoss { worker, for_ms: s.detection_ms + rng.random_range(200..=2_000) };
        out.push(Fault { at_ms: at(rng), kind });
    }
    if rng.random_bool(0.3) {
        out.push(Fault {
            at_ms: at(rng),
            kind: FaultKind::StoreRestart { down_ms: rng.random_range(50..=800) },
        });
    }
    if rng.random_bool(0.3) {
        let to = match rng.random_range(0..3) {
            0 => s.partitions * 2,
            1 => s.partitions + 1,
            _ => (s.partitions / 2).max(1),
        };
        out.push(Fault {
            at_ms: rng.random_range(s.load_ms / 4..s.load_ms),
            kind: FaultKind::Repartition { to },
        });
    }
    out.sort_by_key(|f| f.at_ms);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaks::Break;

    #[test]
    fn generated_scenarios_are_valid_and_round_trip() {
        for size in [Size::Small, Size::Medium, Size::Large] {
            for seed in 0..20 {
                let s = Scenario::generate(size, seed);
                s.validate().expect("generated scenarios are valid");
                let back = Scenario::from_json(&serde_json::to_string(&s).unwrap()).unwrap();
                assert_eq!(back, s);
            }
        }
        assert!(Scenario::generate(Size::Medium, 1).total_events() >= 2_000);
    }

    #[test]
    fn session_lock_scenarios_get_pauses_and_the_detection_rule_is_the_shared_one() {
        let paused = (0..20)
            .map(|seed| Scenario::generate(Size::Small, seed))
            .filter(|s| s.lease == LeaseModel::SessionLock)
            .filter(|s| s.faults.iter().any(|f| matches!(f.kind, FaultKind::Pause { .. })))
            .count();
        assert!(paused > 0, "no session-lock scenario of 20 pauses a worker");
        let mut s = Scenario::generate(Size::Small, 1);
        s.lease = LeaseModel::SessionLock;
        s.faults = vec![Fault { at_ms: 10, kind: FaultKind::Pause { worker: 0, for_ms: 9_000 } }];
        s.validate().expect("a session-lock worker may be paused");
        // Rebalancing every 2.3 s leaves 2.3 + 0.8 > 3 s of silence on a healthy membership.
        s.rebalance_ms = 2_300;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("longest quiet period"), "{err}");
    }

    #[test]
    fn some_seeds_pin_their_heaviest_key_and_the_others_are_unchanged() {
        let mut pinned = 0;
        for seed in 0..20 {
            let s = Scenario::generate(Size::Small, seed);
            let plain = Scenario::generate_without_pins(Size::Small, seed);
            let pins: Vec<_> =
                s.faults.iter().filter(|f| matches!(f.kind, FaultKind::Pin { .. })).collect();
            if pins.is_empty() {
                assert_eq!(s, plain, "seed {seed}: no pin, so the scenario of before pins");
                continue;
            }
            pinned += 1;
            assert!(pins.len() <= 2, "seed {seed}: a pin and at most one change of it");
            let FaultKind::Pin { key, .. } = &pins[0].kind else { unreachable!() };
            let whale = s.keys.iter().find(|k| k.key == *key).expect("a key of the scenario");
            assert!(s.keys.iter().all(|k| k.events <= whale.events), "seed {seed}: the heaviest");
        }
        assert!(pinned > 0, "no small seed of 20 pins a key");
        // A broken design runs as it did before pins, except the one about pins.
        let b = Scenario::generate_broken(Size::Small, 1, Break::PinWithoutBarrier);
        assert_eq!(b.faults.iter().filter(|f| matches!(f.kind, FaultKind::Pin { .. })).count(), 1);
        let other = Scenario::generate_broken(Size::Small, 1, Break::TwoReaders);
        assert!(other.faults.iter().all(|f| !matches!(f.kind, FaultKind::Pin { .. })));
    }
}
