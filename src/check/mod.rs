//! The checker: a delivery [`History`] in, a [`Verdict`] out.
//!
//! Violations (the design is broken): **reorder**, **split key**, **lost**, **concurrent**,
//! **skip** (a key's head passed over while still queued), and the liveness verdict **stall**
//! (a partition's head still queued long after enqueue); for logs from outside the simulation
//! also **premature** (delivered before its enqueue committed, or after it rolled back) and
//! **concurrent key** (two deliveries of one key in flight at once).
//! Counted (allowed, but receivers must know): **gap** after a dead-letter, **duplicate**, and
//! **stale duplicate**. Each kind carries its count and its first counterexample in time.
//! Pure and deterministic: the same history gives the same verdict, byte for byte.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{PartitionId, Seq, Time};

mod fast_hash;
pub mod fence;
mod history;
pub mod jsonl;
#[cfg(test)]
mod reference;
mod report;
mod rules;

pub use history::{
    Acked, DeadLettered, Delivery, Enqueued, History, LeaseChange, LeaseEvent, Outcome,
};

/// A kind of finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// For one key, an event's first accepted delivery came after the first accepted delivery
    /// of a later event.
    Reorder,
    /// One key was live on two partitions at once: queued on two partitions under one layout,
    /// or delivered under a newer layout while an older-layout event of it was still queued
    /// on another partition.
    SplitKey,
    /// An event was neither delivered nor dead-lettered by the end.
    Lost,
    /// Two deliveries of one partition were in flight at once.
    Concurrent,
    /// A later event of a key was delivered (any attempt, accepted or not) while an earlier
    /// event of that key was still queued: enqueued, and neither accepted by the endpoint,
    /// acknowledged nor dead-lettered yet. The head of a key must clear first; after a
    /// dead-letter, the key's next delivery is the event right after it.
    Skip,
    /// At the end, a partition's head had waited longer than the stall bound.
    Stall,
    /// A later event was delivered after an earlier one of its key was dead-lettered.
    Gap,
    /// An event was delivered again after the endpoint had accepted it.
    Duplicate,
    /// A duplicate that arrived after a later event of its key.
    StaleDuplicate,
    /// Milliseconds that events of healthy keys (never refused, never retried) waited, next in
    /// line for their key, while another key of their partition was backing off: the cost of
    /// head-of-line blocking, counted, not a violation. Near zero with parking; with partition
    /// FIFO (`strict_partition_order`) it is every backoff of every failing key.
    HeadOfLine,
    /// An event was delivered (any attempt) before it was enqueued, its commit, by more than
    /// the clock-skew tolerance; or an event whose enqueue was rolled back (`aborted`) was
    /// delivered at all. Jepsen's premature and aborted reads (G1a). Judged for logs
    /// ([`CheckConfig::log_rules`]).
    Premature,
    /// Two deliveries of one key were in flight at once (sent, or from a receiver's log
    /// arrived, before the other's answer), whatever their partitions. Judged for logs
    /// ([`CheckConfig::log_rules`]).
    ConcurrentKey,
}

impl Kind {
    /// Every kind, violations first, in report order.
    pub const ALL: [Kind; 10] = [
        Kind::Reorder,
        Kind::SplitKey,
        Kind::Lost,
        Kind::Concurrent,
        Kind::Skip,
        Kind::Stall,
        Kind::Gap,
        Kind::Duplicate,
        Kind::StaleDuplicate,
        Kind::HeadOfLine,
    ];

    /// The kinds judged only for logs from outside the simulation ([`CheckConfig::log_rules`]):
    /// the simulation's histories cannot have them, and its verdicts leave them out.
    pub const FROM_LOGS: [Kind; 2] = [Kind::Premature, Kind::ConcurrentKey];

    /// The kinds a verdict lists, in report order: [`Kind::ALL`], with [`Kind::FROM_LOGS`]
    /// after the other violations when `log_rules`.
    pub fn judged(log_rules: bool) -> Vec<Kind> {
        let mut kinds = Kind::ALL.to_vec();
        if log_rules {
            let at = kinds.iter().position(|k| *k == Kind::Gap).expect("gap is a kind");
            kinds.splice(at..at, Kind::FROM_LOGS);
        }
        kinds
    }

    /// Whether this kind breaks the design's contract (as opposed to being counted).
    pub fn is_violation(self) -> bool {
        matches!(
            self,
            Kind::Reorder
                | Kind::SplitKey
                | Kind::Lost
                | Kind::Concurrent
                | Kind::Skip
                | Kind::Stall
                | Kind::Premature
                | Kind::ConcurrentKey
        )
    }

    /// The kind's name as printed and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Reorder => "reorder",
            Kind::SplitKey => "split_key",
            Kind::Lost => "lost",
            Kind::Concurrent => "concurrent",
            Kind::Skip => "skip",
            Kind::Stall => "stall",
            Kind::Gap => "gap",
            Kind::Duplicate => "duplicate",
            Kind::StaleDuplicate => "stale_duplicate",
            Kind::HeadOfLine => "head_of_line",
            Kind::Premature => "premature",
            Kind::ConcurrentKey => "concurrent_key",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One concrete instance of a finding: enough to find it in a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counterexample {
    /// The key involved.
    pub key: String,
    /// The partitions involved.
    pub partitions: Vec<PartitionId>,
    /// The events involved, in the order the note names them.
    pub event_ids: Vec<String>,
    /// Their sequence numbers.
    pub seqs: Vec<Seq>,
    /// The times that make it a finding.
    pub times: Vec<Time>,
    /// One sentence saying what happened.
    pub note: String,
}

/// The count of one kind and its first counterexample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The kind.
    pub kind: Kind,
    /// How many times it occurred.
    pub count: u64,
    /// The first occurrence, if any.
    pub first: Option<Counterexample>,
}

/// The checker's judgement of one history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Events enqueued.
    pub events: usize,
    /// Delivery attempts observed.
    pub deliveries: usize,
    /// Events dead-lettered.
    pub dead_lettered: usize,
    /// One finding per kind, in [`Kind::judged`] order.
    pub findings: Vec<Finding>,
    /// Kinds the history held too little to judge (a receiver's log has no enqueues, so no
    /// loss): their findings are zero and say nothing. Empty for a simulated history.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_judged: Vec<Kind>,
    /// Records read from a log whose times contradicted each other by less than the clock-skew
    /// tolerance (an arrival before its send, an answer before its send), and were taken as
    /// simultaneous instead of rejecting the file. Zero for a simulated history.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skew_forgiven: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Verdict {
    /// The count of `kind`.
    pub fn count(&self, kind: Kind) -> u64 {
        self.finding(kind).map_or(0, |f| f.count)
    }

    /// The finding of `kind`.
    pub fn finding(&self, kind: Kind) -> Option<&Finding> {
        self.findings.iter().find(|f| f.kind == kind)
    }

    /// The total of all violation counts.
    pub fn violations(&self) -> u64 {
        self.findings.iter().filter(|f| f.kind.is_violation()).map(|f| f.count).sum()
    }

    /// Whether the history keeps the contract.
    pub fn is_ok(&self) -> bool {
        self.violations() == 0
    }

    /// The same verdict with `kinds` marked not judged: their counts zeroed, their
    /// counterexamples dropped, and the table printing them as "not judged".
    pub fn not_judging(mut self, kinds: &[Kind]) -> Verdict {
        for f in self.findings.iter_mut().filter(|f| kinds.contains(&f.kind)) {
            f.count = 0;
            f.first = None;
        }
        self.not_judged.extend_from_slice(kinds);
        self.not_judged.sort();
        self.not_judged.dedup();
        self
    }

    /// The kinds with a non-zero count that are violations.
    pub fn violated(&self) -> Vec<Kind> {
        self.findings
            .iter()
            .filter(|f| f.kind.is_violation() && f.count > 0)
            .map(|f| f.kind)
            .collect()
    }
}

/// Bounds of the liveness verdict, and which rules to judge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckConfig {
    /// A row still queued at the end that was enqueued longer ago than this is a stall.
    pub stall_after: Duration,
    /// Also judge [`Kind::FROM_LOGS`]: on for `keyorder check`, off (the default) for the
    /// simulation, whose verdicts list only [`Kind::ALL`].
    pub log_rules: bool,
    /// How far apart the producer's and the worker's clocks may be: a delivery sent less than
    /// this before its enqueue is not premature. Zero (the default): one clock wrote both.
    pub clock_skew: Duration,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self { stall_after: DEFAULT_STALL_AFTER, log_rules: false, clock_skew: Duration::ZERO }
    }
}

/// The default stall bound: far beyond any retry schedule a sane policy has.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(10);

/// Judges `history` with the default bounds. See [`check_with`].
pub fn check(history: &History) -> Verdict {
    check_with(history, &CheckConfig::default())
}

/// Judges `history`. Never fails: an inconsistent history (a delivery of an event that was
/// never enqueued, say) is judged on what it contains.
pub fn check_with(history: &History, config: &CheckConfig) -> Verdict {
    let index = rules::Index::new(history);
    let findings = Kind::judged(config.log_rules)
        .into_iter()
        .map(|kind| {
            let (count, first) = match kind {
                Kind::Reorder => rules::reorder(&index),
                Kind::SplitKey => rules::split_keys(&index),
                Kind::Lost => rules::lost(&index),
                Kind::Concurrent => rules::concurrent(&index),
                Kind::Skip => rules::skips(&index),
                Kind::Stall => rules::stalls(&index, config.stall_after),
                Kind::Gap => rules::gaps(&index),
                Kind::Duplicate => rules::duplicates(&index, false),
                Kind::StaleDuplicate => rules::duplicates(&index, true),
                Kind::HeadOfLine => rules::head_of_line(&index),
                Kind::Premature => rules::premature(&index, config.clock_skew),
                Kind::ConcurrentKey => rules::concurrent_key(&index),
            };
            Finding { kind, count, first }
        })
        .collect();
    Verdict {
        events: history.enqueued.len(),
        deliveries: history.deliveries.len(),
        dead_lettered: history.dead_letters.len(),
        findings,
        not_judged: Vec::new(),
        skew_forgiven: 0,
    }
}

#[cfg(test)]
mod tests;
