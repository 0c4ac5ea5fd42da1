//! Simulating a repartition plan: the operator's key distribution, sampled into scenarios,
//! run through drain-and-switch, the online procedure, and the unsafe flip, on the same seeds.

use std::collections::BTreeMap;
use std::io::BufRead;

use keyorder::check::Kind;
use keyorder::PartitionCount;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::run::{run, RunError};
use crate::scenario::Procedure;
use crate::scenario::{Fault, FaultKind, KeySpec, Scenario, Size};

/// Keys sampled into a scenario.
pub const SAMPLED_KEYS: usize = 96;
/// Events spread over the sampled keys, in proportion to their weights.
pub const SAMPLED_EVENTS: u64 = 2_400;
/// The most events one sampled key gets, as a multiple of the mean.
pub const MAX_KEY_SHARE: f64 = 4.0;

/// A weighted key sample kept by weighted reservoir sampling (A-Res): one pass, bounded memory.
#[derive(Debug, Default)]
pub struct KeySample {
    /// (priority, key, weight), the `SAMPLED_KEYS` highest priorities.
    kept: Vec<(f64, String, f64)>,
    /// Keys read.
    pub read: u64,
}

impl KeySample {
    /// Reads `key[,weight]` or JSON lines, sampling with a generator seeded by `seed`.
    pub fn read(input: impl BufRead, seed: u64) -> Result<Self, String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut sample = KeySample::default();
        for (i, line) in input.lines().enumerate() {
            let line = line.map_err(|e| format!("line {}: {e}", i + 1))?;
            let text = line.trim_end();
            if text.is_empty() || (i == 0 && (text == "key" || text == "key,weight")) {
                continue;
            }
            let (key, weight) = keyorder::plan::parse_sample_line(text)
                .map_err(|e| format!("line {}: {e}", i + 1))?;
            sample.offer(key, weight, &mut rng);
        }
        Ok(sample)
    }

    fn offer(&mut self, key: String, weight: f64, rng: &mut StdRng) {
        self.read += 1;
        if weight <= 0.0 {
            return;
        }
        let priority = rng.random::<f64>().powf(1.0 / weight);
        if self.kept.len() < SAMPLED_KEYS {
            self.kept.push((priority, key, weight));
        } else if let Some((i, _)) =
            self.kept.iter().enumerate().min_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
        {
            if priority > self.kept[i].0 {
                self.kept[i] = (priority, key, weight);
            }
        }
    }

    /// The sampled keys with event counts in proportion to their weights: at least one each,
    /// and at most `MAX_KEY_SHARE` times the mean, so that a whale the weighted sample is sure
    /// to pick cannot turn a procedure test into a capacity test (`keyorder plan` reports
    /// whales; this judges the procedure).
    pub fn keys(&self) -> Vec<(String, u32)> {
        let total: f64 = self.kept.iter().map(|k| k.2).sum();
        let cap = (SAMPLED_EVENTS as f64 / self.kept.len().max(1) as f64) * MAX_KEY_SHARE;
        let mut keys: Vec<(String, u32)> = self
            .kept
            .iter()
            .map(|(_, k, w)| {
                (k.clone(), ((w / total) * SAMPLED_EVENTS as f64).round().clamp(1.0, cap) as u32)
            })
            .collect();
        keys.sort();
        keys
    }
}

/// The scenario of `seed` for a `from → to` plan: medium-sized, the usual faults (other
/// changes of count removed), the operator's keys if given, endpoints slow enough to keep a
/// backlog, and the change at a third of the load window.
pub fn plan_scenario(
    from: PartitionCount,
    to: PartitionCount,
    keys: Option<&[(String, u32)]>,
    seed: u64,
    procedure: Procedure,
) -> Scenario {
    // Without pin changes: a plan judges a change of count alone (and a pin may not exist
    // under the plan's counts).
    let mut s = Scenario::generate_without_pins(Size::Medium, seed);
    s.partitions = from.get();
    if let Some(keys) = keys {
        let behaviours: Vec<_> = s.keys.iter().map(|k| k.endpoint.clone()).collect();
        s.keys = keys
            .iter()
            .enumerate()
            .map(|(i, (key, events))| KeySpec {
                key: key.clone(),
                events: *events,
                endpoint: behaviours[i % behaviours.len()].clone(),
            })
            .collect();
    }
    // Endpoints slow enough that partitions carry a backlog when the count changes: the
    // moment a change is dangerous, and the one a plan must be judged in.
    for (i, k) in s.keys.iter_mut().enumerate() {
        k.endpoint.latency_ms = k.endpoint.latency_ms.max(15 + (i as u64 % 20));
    }
    s.faults.retain(|f| !matches!(f.kind, FaultKind::Repartition { .. }));
    s.faults.push(Fault { at_ms: s.load_ms / 3, kind: FaultKind::Repartition { to: to.get() } });
    s.faults.sort_by_key(|f| f.at_ms);
    s.procedure = procedure;
    s
}

/// One procedure's result on one seed.
#[derive(Clone, Debug, Serialize)]
pub struct ProcedureRun {
    /// The procedure.
    pub procedure: Procedure,
    /// Violations by kind.
    pub violations: BTreeMap<String, u64>,
    /// Redeliveries.
    pub duplicates: u64,
    /// Producers' write pause, in ms.
    pub write_pause_ms: u64,
    /// Drain (or, online, old-row) time, in ms.
    pub drain_ms: u64,
    /// Whether the count changed.
    pub switched: bool,
}

/// Runs the three procedures on one seed.
pub fn compare(
    from: PartitionCount,
    to: PartitionCount,
    keys: Option<&[(String, u32)]>,
    seed: u64,
) -> Result<Vec<ProcedureRun>, RunError> {
    [Procedure::DrainAndSwitch, Procedure::Online, Procedure::FlipWithoutDrain]
        .into_iter()
        .map(|procedure| {
            let outcome = run(&plan_scenario(from, to, keys, seed, procedure), seed, false)?;
            let switch = outcome.switches.first();
            Ok(ProcedureRun {
                procedure,
                violations: outcome
                    .verdict
                    .findings
                    .iter()
                    .filter(|f| f.kind.is_violation() && f.count > 0)
                    .map(|f| (f.kind.name().to_owned(), f.count))
                    .collect(),
                duplicates: outcome.verdict.count(Kind::Duplicate),
                write_pause_ms: switch.map_or(0, |s| s.write_pause_ms),
                drain_ms: switch.map_or(0, |s| s.drain_ms),
                switched: switch.is_some_and(|s| s.switched),
            })
        })
        .collect()
}
