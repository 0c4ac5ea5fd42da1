//! Sweeps: many seeds, one summary. Runs are independent and each is deterministic, so a
//! sweep may spread them over threads and still report per seed exactly what a replay prints.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use keyorder::check::Kind;
use serde::{Deserialize, Serialize};

use crate::run::{run, RunError, RunOutcome};
use crate::scenario::Scenario;

/// The sums of a sweep.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

    /// Adds another sweep's sums (of other seeds): the seed lists stay sorted.
    pub fn absorb(&mut self, other: &Summary) {
        self.runs += other.runs;
        self.failed_seeds.extend(&other.failed_seeds);
        self.failed_seeds.sort_unstable();
        self.unquiesced_seeds.extend(&other.unquiesced_seeds);
        self.unquiesced_seeds.sort_unstable();
        for (mine, theirs) in [
            (&mut self.violations, &other.violations),
            (&mut self.counted, &other.counted),
            (&mut self.faults, &other.faults),
        ] {
            for (k, v) in theirs {
                *mine.entry(k.clone()).or_default() += v;
            }
        }
        self.deliveries += other.deliveries;
        self.events += other.events;
        self.simulated_ms += other.simulated_ms;
    }
}

/// The K-th of N disjoint slices of a seed range (`--shard K/N`, K from 1): the seeds whose
/// offset from the range's start leaves remainder K-1 when divided by N. The N slices are
/// disjoint and together are the whole range, and each holds every N-th seed, so slow and
/// fast seeds spread evenly over machines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shard {
    index: u64,
    of: u64,
}

/// A `--shard` value that is not K/N with 1 <= K <= N.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// Not two whole numbers around a slash.
    #[error("shard {0:?} is not K/N (two whole numbers, such as 1/4)")]
    Format(String),
    /// N is zero.
    #[error("shard {0:?}: N, the number of slices, must be at least 1")]
    NoSlices(String),
    /// K is outside 1..=N.
    #[error("shard {given:?}: K counts slices from 1 to {of}")]
    OutOfRange {
        /// What was given.
        given: String,
        /// N.
        of: u64,
    },
}

impl Shard {
    /// Slice `index` (from 1) of `of`.
    pub fn new(index: u64, of: u64) -> Result<Shard, ShardError> {
        let given = format!("{index}/{of}");
        if of == 0 {
            return Err(ShardError::NoSlices(given));
        }
        if index == 0 || index > of {
            return Err(ShardError::OutOfRange { given, of });
        }
        Ok(Shard { index, of })
    }

    /// K, from 1.
    pub fn index(self) -> u64 {
        self.index
    }

    /// N.
    pub fn of(self) -> u64 {
        self.of
    }

    /// This slice of the `count` seeds from `start`, ascending.
    pub fn seeds(self, start: u64, count: u64) -> Vec<u64> {
        (0..count).filter(|i| i % self.of == self.index - 1).map(|i| start + i).collect()
    }
}

impl FromStr for Shard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Shard, ShardError> {
        let format = || ShardError::Format(s.to_owned());
        let (k, n) = s.trim().split_once('/').ok_or_else(format)?;
        let number = |t: &str| {
            let t = t.trim();
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format());
            }
            t.parse::<u64>().map_err(|_| format())
        };
        let (k, n) = (number(k)?, number(n)?);
        Shard::new(k, n).map_err(|e| match e {
            ShardError::NoSlices(_) => ShardError::NoSlices(s.to_owned()),
            ShardError::OutOfRange { of, .. } => ShardError::OutOfRange { given: s.to_owned(), of },
            other => other,
        })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.of)
    }
}

impl Serialize for Shard {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Shard {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Shard, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What `keyorder-sim sweep --json` prints, and what `keyorder-sim merge` reads back: the
/// sums, which seeds they cover, and the flags that replay any of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The sums.
    #[serde(flatten)]
    pub summary: Summary,
    /// The scenario flags every seed ran with (`--size medium`, `--break NAME`, ...).
    pub source: String,
    /// The first seed of the range.
    pub start: u64,
    /// How many seeds the range holds (a shard runs a slice of them).
    pub seeds: u64,
    /// The slice of the range this sweep ran, if not all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

impl Report {
    /// The command that replays `seed`.
    pub fn replay(&self, seed: u64) -> String {
        format!("keyorder-sim replay {seed} {}", self.source)
    }

    fn range(&self) -> std::ops::Range<u64> {
        self.start..self.start.saturating_add(self.seeds)
    }
}

/// Why sweep reports cannot be added up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Nothing to merge.
    #[error("no sweep reports to merge")]
    Nothing,
    /// Two reports ran different scenarios.
    #[error("report {a} ran `{source_a}` and report {b} ran `{source_b}`: only sweeps of one scenario source add up")]
    Sources {
        /// The first report, counting from 1.
        a: usize,
        /// Its flags.
        source_a: String,
        /// The other report.
        b: usize,
        /// Its flags.
        source_b: String,
    },
    /// Two reports may have run a seed twice.
    #[error("reports {a} and {b} overlap ({what}): a seed would be counted twice")]
    Overlap {
        /// The first report, counting from 1.
        a: usize,
        /// The other.
        b: usize,
        /// How.
        what: String,
    },
}

/// Several sweeps added up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    /// The sums over every report.
    pub summary: Summary,
    /// The flags they all ran with.
    pub source: String,
    /// Slices of a sharded range that no report covers, as `start..end K/N`.
    pub missing: Vec<String>,
}

/// Adds up `reports`, which must come from one scenario source and cover disjoint seeds: each
/// pair either runs disjoint ranges, or one range sliced by the same N into different K.
pub fn merge(reports: &[Report]) -> Result<Merged, MergeError> {
    let first = reports.first().ok_or(MergeError::Nothing)?;
    for (i, r) in reports.iter().enumerate() {
        if r.source != first.source {
            return Err(MergeError::Sources {
                a: 1,
                source_a: first.source.clone(),
                b: i + 1,
                source_b: r.source.clone(),
            });
        }
    }
    for (i, a) in reports.iter().enumerate() {
        for (j, b) in reports.iter().enumerate().skip(i + 1) {
            let (ra, rb) = (a.range(), b.range());
            if ra.start >= rb.end || rb.start >= ra.end || ra.is_empty() || rb.is_empty() {
                continue;
            }
            let describe = |r: &Report| match r.shard {
                Some(s) => format!("seeds {:?} shard {s}", r.range()),
                None => format!("seeds {:?}", r.range()),
            };
            let disjoint = ra == rb
                && matches!((a.shard, b.shard), (Some(x), Some(y)) if x.of == y.of && x.index != y.index);
            if !disjoint {
                let what = format!("{} and {}", describe(a), describe(b));
                return Err(MergeError::Overlap { a: i + 1, b: j + 1, what });
            }
        }
    }
    let mut summary = Summary::default();
    reports.iter().for_each(|r| summary.absorb(&r.summary));
    let mut covered: BTreeMap<(u64, u64, u64), Vec<u64>> = BTreeMap::new();
    for r in reports {
        if let Some(s) = r.shard {
            covered.entry((r.start, r.seeds, s.of)).or_default().push(s.index);
        }
    }
    let mut missing = Vec::new();
    for ((start, seeds, of), have) in covered {
        for k in (1..=of).filter(|k| !have.contains(k)) {
            missing.push(format!("{:?} {k}/{of}", start..start.saturating_add(seeds)));
        }
    }
    Ok(Merged { summary, source: first.source.clone(), missing })
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
