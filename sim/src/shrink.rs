//! Whole scenarios as proptest strategies, so a failing run shrinks to a small one (fewer
//! keys, events and faults), and the search that finds and shrinks them.

use keyorder::check::Kind;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use crate::breaks::Break;
use crate::run::run;
use crate::scenario::Procedure;
use crate::scenario::{EndpointSpec, Fault, FaultKind, KeySpec, Scenario};

/// A scenario and the seed to run it with.
pub type Case = (Scenario, u64);

fn key(i: usize) -> impl Strategy<Value = KeySpec> {
    (
        1u32..=10,
        0u64..=3,
        0u32..=2,
        prop_oneof![3 => Just(0u32), 1 => 10u32..=40],
        proptest::option::weighted(0.15, 0u32..10),
    )
        .prop_map(move |(events, latency_ms, fail_first, flaky_percent, poison)| KeySpec {
            key: format!("sub_{i}"),
            events,
            endpoint: EndpointSpec {
                latency_ms,
                fail_first,
                flaky_percent,
                poison: poison.filter(|p| *p < events).into_iter().collect(),
                ..Default::default()
            },
        })
}

fn keys() -> impl Strategy<Value = Vec<KeySpec>> {
    (1usize..=8).prop_flat_map(|n| (0..n).map(key).collect::<Vec<_>>())
}

fn fault() -> impl Strategy<Value = Fault> {
    let at = 100u64..2_500;
    prop_oneof![
        (at.clone(), 0usize..3, 100u64..1_500).prop_map(|(at_ms, worker, down_ms)| Fault {
            at_ms,
            kind: FaultKind::CrashWorker { worker, down_ms }
        }),
        (at.clone(), 0usize..3, 200u64..2_000).prop_map(|(at_ms, worker, extra)| Fault {
            at_ms,
            kind: FaultKind::LeaseLoss { worker, for_ms: DETECTION_MS + extra }
        }),
        (at.clone(), 50u64..800).prop_map(|(at_ms, down_ms)| Fault {
            at_ms,
            kind: FaultKind::StoreRestart { down_ms }
        }),
        (at, 1u16..=16)
            .prop_map(|(at_ms, to)| Fault { at_ms, kind: FaultKind::Repartition { to } }),
    ]
}

const DETECTION_MS: u64 = 3_000;

/// Scenarios of 1–8 partitions, 1–3 workers, 1–2 producers, 1–8 keys of 1–10 events and up to
/// four faults (modulus changes by drain-and-switch or online), with the lease model and retry
/// policy of the generated sizes.
pub fn scenarios() -> impl Strategy<Value = Case> {
    let procedure = prop_oneof![Just(Procedure::DrainAndSwitch), Just(Procedure::Online)];
    let shape = (1u16..=8, 1usize..=3, 1usize..=2, keys(), vec(fault(), 0..=4), 200u64..3_000);
    (shape, procedure, any::<u64>()).prop_map(
        |((partitions, workers, producers, keys, mut faults, load_ms), procedure, seed)| {
            for f in &mut faults {
                if let FaultKind::CrashWorker { worker, .. } | FaultKind::LeaseLoss { worker, .. } =
                    &mut f.kind
                {
                    *worker %= workers;
                }
            }
            faults.sort_by_key(|f| f.at_ms);
            let mut scenario = Scenario::new(partitions, workers, producers, keys, load_ms);
            scenario.detection_ms = DETECTION_MS;
            scenario.faults = faults;
            scenario.tail_ms = 1_000;
            scenario.duration_ms = load_ms + 25_000;
            scenario.procedure = procedure;
            (scenario, seed)
        },
    )
}

/// The size of a case, for reports: (keys, events, faults).
pub fn size(s: &Scenario) -> (usize, u64, usize) {
    (s.keys.len(), s.total_events(), s.faults.len())
}

/// What a search found: the shrunk case and the violations its run reports.
#[derive(Debug)]
pub struct Found {
    /// The shrunk scenario (with the break switched on, if any).
    pub scenario: Scenario,
    /// Its seed.
    pub seed: u64,
    /// The violations its run reports.
    pub violated: Vec<Kind>,
}

/// Searches `cases` random scenarios (deterministically from `rng_seed`) with `broken`
/// switched on for one whose run reports `target` (any violation when `None`), and shrinks
/// it. `Ok(None)`: nothing found in `cases` cases.
pub fn search(
    broken: Option<Break>,
    target: Option<Kind>,
    cases: u32,
    rng_seed: u64,
) -> Result<Option<Found>, String> {
    let config =
        Config { cases, failure_persistence: None, max_shrink_iters: 2_000, ..Config::default() };
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&rng_seed.to_le_bytes());
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let with_break = |mut s: Scenario| {
        s.breaks = broken.into_iter().collect();
        s
    };
    let result = runner.run(&scenarios(), |(scenario, seed)| {
        let outcome = run(&with_break(scenario), seed, false)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let violated = outcome.verdict.violated();
        let hit = match target {
            Some(kind) => violated.contains(&kind),
            None => !violated.is_empty(),
        };
        if hit {
            Err(TestCaseError::fail(format!("{violated:?}")))
        } else {
            Ok(())
        }
    });
    match result {
        Ok(()) => Ok(None),
        Err(TestError::Fail(_, (scenario, seed))) => {
            let scenario = with_break(scenario);
            let outcome = run(&scenario, seed, false).map_err(|e| e.to_string())?;
            Ok(Some(Found { scenario, seed, violated: outcome.verdict.violated() }))
        }
        Err(TestError::Abort(reason)) => Err(reason.to_string()),
    }
}
