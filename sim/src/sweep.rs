//! Sweeps: many seeds, one summary. Runs are independent and each is deterministic, so a
//! sweep may spread them over threads and still report per seed exactly what a replay prints.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use keyorder::check::Kind;
use serde::Serialize;

use crate::run::{run, RunError, RunOutcome};
use crate::scenario::Scenario;

/// The sums of a sweep.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Runs made.
    pub runs: u64,
    /// Seeds whose verdict had a violation, ascending.
    pub failed_seeds: Vec<u64>,
    /// Seeds that did not drain before the time limit.
    pub unquiesced_seeds: Vec<u64>,
    /// Violations by kind.
    pub violations: BTreeMap<String, u64>,
    /// Counted findings by kind.
    pub counted: BTreeMap<String, u64>,
    /// Faults and endpoint behaviours by kind.
    pub faults: BTreeMap<String, u64>,
    /// Delivery attempts simulated.
    pub deliveries: u64,
    /// Events simulated.
    pub events: u64,
    /// Simulated time, in ms.
    pub simulated_ms: u64,
}

impl Summary {
    /// Adds one run.
    pub fn add(&mut self, outcome: &RunOutcome) {
        self.runs += 1;
        if !outcome.verdict.is_ok() {
            self.failed_seeds.push(outcome.seed);
        }
        if !outcome.quiesced {
            self.unquiesced_seeds.push(outcome.seed);
        }
        for f in &outcome.verdict.findings {
            let bucket =
                if f.kind.is_violation() { &mut self.violations } else { &mut self.counted };
            *bucket.entry(f.kind.name().to_owned()).or_default() += f.count;
        }
        for (k, v) in &outcome.faults {
            *self.faults.entry(k.clone()).or_default() += v;
        }
        self.deliveries += outcome.verdict.deliveries as u64;
        self.events += outcome.verdict.events as u64;
        self.simulated_ms += outcome.simulated_ms;
    }

    /// Total violations.
    pub fn violation_total(&self) -> u64 {
        self.violations.values().sum()
    }

    /// The count of one kind.
    pub fn count(&self, kind: Kind) -> u64 {
        let bucket = if kind.is_violation() { &self.violations } else { &self.counted };
        bucket.get(kind.name()).copied().unwrap_or(0)
    }
}

/// Runs `seeds` on `jobs` threads, calling `progress` after each run (in completion order),
/// and returns the outcomes in seed order. A scenario or simulator error stops the sweep.
pub fn sweep(
    seeds: &[u64],
    scenario_for: &(dyn Fn(u64) -> Scenario + Sync),
    jobs: usize,
    progress: &(dyn Fn(&RunOutcome) + Sync),
) -> Result<Vec<RunOutcome>, RunError> {
    let next = AtomicU64::new(0);
    let results: Mutex<Vec<Result<RunOutcome, RunError>>> =
        Mutex::new(Vec::with_capacity(seeds.len()));
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&seed) = seeds.get(i) else { break };
                let result = run(&scenario_for(seed), seed, false);
                if let Ok(outcome) = &result {
                    progress(outcome);
                }
                let failed = result.is_err();
                results.lock().unwrap_or_else(|e| e.into_inner()).push(result);
                if failed {
                    break;
                }
            });
        }
    });
    let mut outcomes = Vec::with_capacity(seeds.len());
    for r in results.into_inner().unwrap_or_else(|e| e.into_inner()) {
        outcomes.push(r?);
    }
    outcomes.sort_by_key(|o| o.seed);
    Ok(outcomes)
}
