//! Repartition planning, sans-IO: from a key sample with weights, what a change of partition
//! count does — keys and weight that move (overall and per source → target pair), load and
//! skew per partition before and after, whale keys no count can spread, the over-provisioned
//! alternative that moves nothing, and the drain-and-switch checklist with a predicted drain.
//!
//! Streaming: [`Planner::add_batch`] takes keys in batches and keeps only per-partition sums,
//! the move matrix and the heaviest keys, so ten million keys plan in bounded memory.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::ids::PartitionId;
use crate::routing::{digest_many, partition_of_digest, Overrides, PartitionCount, RoutingError};

/// Heaviest keys kept for the report.
const TOP_KEYS: usize = 10;
/// The move matrix is kept only while it has at most this many cells.
const MAX_MATRIX_CELLS: u64 = 1 << 20;
/// Source → target pairs shown in the report.
const TOP_MOVES: usize = 10;

/// Errors of planning input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A weight is negative, infinite or not a number.
    #[error("key {key:?} has weight {weight}, but a weight must be a finite number >= 0")]
    BadWeight {
        /// The key.
        key: String,
        /// The weight as given.
        weight: f64,
    },
    /// An override does not exist under one of the counts.
    #[error(transparent)]
    Routing(#[from] RoutingError),
}

/// A key that moves between partitions, or stays.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeyLoad {
    /// The key.
    pub key: String,
    /// Its weight (events/s, or any unit the sample uses).
    pub weight: f64,
    /// Its partition before.
    pub before: PartitionId,
    /// Its partition after.
    pub after: PartitionId,
}

/// Keys and weight moving from one source partition to one target partition.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Move {
    /// The partition before.
    pub from: PartitionId,
    /// The partition after.
    pub to: PartitionId,
    /// Keys that make the move.
    pub keys: u64,
    /// Their weight.
    pub weight: f64,
}

/// Keeping the count and assigning partitions to more workers instead.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Assignment {
    /// Workers.
    pub workers: usize,
    /// Partitions (the unchanged count).
    pub partitions: u16,
    /// Most partitions one worker holds (the lease's fair share).
    pub partitions_per_worker: usize,
    /// Max/mean worker load when partitions are assigned by weight (largest first).
    pub balance: f64,
}

/// Current queue depth per partition and the measured drain rate, for the drain prediction.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DrainInput {
    /// Queued events per partition (index = partition).
    pub depth: Vec<u64>,
    /// Deliveries per second one partition drains.
    pub rate_per_partition: f64,
}

/// The plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The count before.
    pub from: u16,
    /// The count after.
    pub to: u16,
    /// Keys in the sample.
    pub keys: u64,
    /// Their total weight.
    pub weight: f64,
    /// Keys whose partition changes.
    pub moved_keys: u64,
    /// `moved_keys / keys`.
    pub moved_fraction: f64,
    /// Weight of the keys that move / total weight.
    pub moved_weight_fraction: f64,
    /// What plain modulo predicts moves: `1 - gcd(from, to) / max(from, to)`.
    pub expected_moved_fraction: f64,
    /// Weight per partition before.
    pub partitions_before: Vec<f64>,
    /// Weight per partition after.
    pub partitions_after: Vec<f64>,
    /// Distinct keys per partition before.
    pub keys_before: Vec<u64>,
    /// Distinct keys per partition after.
    pub keys_after: Vec<u64>,
    /// Max/mean weight per partition before.
    pub skew_before: f64,
    /// Max/mean weight per partition after.
    pub skew_after: f64,
    /// The heaviest keys.
    pub heaviest_keys: Vec<KeyLoad>,
    /// Keys heavier than a target partition's mean load: no count spreads them; pin them
    /// with an override instead.
    pub whales: Vec<KeyLoad>,
    /// A pin for each whale not pinned yet: the least loaded target partition (after the
    /// change, without the whale) not proposed for another, heaviest whale first.
    pub proposed_pins: Vec<ProposedPin>,
    /// The heaviest source → target moves (empty when the matrix was too large to keep).
    pub top_moves: Vec<Move>,
    /// The over-provisioned alternative, when workers were given.
    pub assignment: Option<Assignment>,
    /// Predicted drain time of drain-and-switch in seconds, when depth and rate were given.
    pub predicted_drain_seconds: Option<f64>,
    /// The drain-and-switch steps.
    pub checklist: Vec<String>,
    /// The online procedure: no write pause; a moving key waits for its old partition.
    pub online: Online,
}

/// A pin `keyorder plan` proposes for a whale: `keyorder pin KEY PARTITION`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProposedPin {
    /// The whale key.
    pub key: String,
    /// The partition proposed for it.
    pub partition: u16,
    /// The load that partition carries without the whale.
    pub partition_load: f64,
}

/// For each whale not pinned in `pinned`, the least loaded partition of `load_after` (the
/// whale's own load taken out), each partition proposed once; deterministic (ties: lowest).
fn propose_pins(whales: &[KeyLoad], load_after: &[f64], pinned: &Overrides) -> Vec<ProposedPin> {
    let mut load = load_after.to_vec();
    for w in whales {
        load[usize::from(w.after.0)] -= w.weight;
    }
    let mut taken = vec![false; load.len()];
    for w in whales.iter().filter(|w| pinned.lookup(&w.key).is_some()) {
        taken[usize::from(w.after.0)] = true;
    }
    let mut out = Vec::new();
    for w in whales.iter().filter(|w| pinned.lookup(&w.key).is_none()) {
        let best = (0..load.len())
            .filter(|&p| !taken[p])
            .min_by(|&a, &b| load[a].total_cmp(&load[b]).then(a.cmp(&b)));
        let Some(p) = best else { break };
        taken[p] = true;
        out.push(ProposedPin {
            key: w.key.clone(),
            partition: p as u16,
            partition_load: load[p].max(0.0),
        });
    }
    out
}

/// The online alternative to drain-and-switch (see [`crate::repartition`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Online {
    /// Keys whose new rows wait for their old partition (the keys that move).
    pub held_keys: u64,
    /// The longest a moving key waits, in seconds: its old partition's drain of what was
    /// queued at the switch (needs the live depth).
    pub predicted_hold_back_seconds: Option<f64>,
}

/// Accumulates a key sample; [`Planner::finish`] makes the [`Plan`].
#[derive(Debug)]
pub struct Planner {
    from: PartitionCount,
    to: PartitionCount,
    overrides_from: Overrides,
    overrides_to: Overrides,
    weight_before: Vec<f64>,
    weight_after: Vec<f64>,
    keys_before: Vec<u64>,
    keys_after: Vec<u64>,
    keys: u64,
    moved_keys: u64,
    moved_weight: f64,
    matrix: Option<BTreeMap<(PartitionId, PartitionId), (u64, f64)>>,
    top: Vec<KeyLoad>,
    digests: Vec<u64>,
}

impl Planner {
    /// A planner for `from → to`, with pins in force before and after (each validated against
    /// its count).
    pub fn new(
        from: PartitionCount,
        to: PartitionCount,
        overrides_from: Overrides,
        overrides_to: Overrides,
    ) -> Result<Self, PlanError> {
        overrides_from.validate(from)?;
        overrides_to.validate(to)?;
        let cells = u64::from(from.get()) * u64::from(to.get());
        Ok(Self {
            from,
            to,
            overrides_from,
            overrides_to,
            weight_before: vec![0.0; usize::from(from.get())],
            weight_after: vec![0.0; usize::from(to.get())],
            keys_before: vec![0; usize::from(from.get())],
            keys_after: vec![0; usize::from(to.get())],
            keys: 0,
            moved_keys: 0,
            moved_weight: 0.0,
            matrix: (cells <= MAX_MATRIX_CELLS).then(BTreeMap::new),
            top: Vec::with_capacity(TOP_KEYS + 1),
            digests: Vec::new(),
        })
    }

    /// Adds a batch of `(key, weight)`; a bad weight is refused and nothing of the batch counts.
    pub fn add_batch<K: AsRef<str>>(
        &mut self,
        keys: &[K],
        weights: &[f64],
    ) -> Result<(), PlanError> {
        // `add_digested` refuses a bad weight before it counts anything.
        let mut digests = std::mem::take(&mut self.digests);
        digest_many(keys, &mut digests);
        let added = self.add_digested(keys, &digests, weights);
        self.digests = digests;
        added
    }

    /// [`Planner::add_batch`] for keys whose routing digests the caller computed already
    /// (with [`digest_many`], for instance on several threads): `digests[i]` must be
    /// [`key_digest`](crate::routing::key_digest) of `keys[i]`. Batches must still be added in
    /// input order; a bad weight is refused and nothing of the batch counts.
    pub fn add_digested<K: AsRef<str>>(
        &mut self,
        keys: &[K],
        digests: &[u64],
        weights: &[f64],
    ) -> Result<(), PlanError> {
        debug_assert_eq!(keys.len(), weights.len(), "one weight per key");
        debug_assert_eq!(keys.len(), digests.len(), "one digest per key");
        if let Some(i) = weights.iter().position(|w| !w.is_finite() || *w < 0.0) {
            return Err(PlanError::BadWeight {
                key: keys[i].as_ref().to_owned(),
                weight: weights[i],
            });
        }
        for ((key, &weight), &digest) in keys.iter().zip(weights).zip(digests) {
            let key = key.as_ref();
            let before = self
                .overrides_from
                .lookup(key)
                .unwrap_or_else(|| partition_of_digest(digest, self.from));
            let after = self
                .overrides_to
                .lookup(key)
                .unwrap_or_else(|| partition_of_digest(digest, self.to));
            self.add_one(key, weight, before, after);
        }
        Ok(())
    }

    fn add_one(&mut self, key: &str, weight: f64, before: PartitionId, after: PartitionId) {
        self.keys += 1;
        self.weight_before[usize::from(before.0)] += weight;
        self.weight_after[usize::from(after.0)] += weight;
        self.keys_before[usize::from(before.0)] += 1;
        self.keys_after[usize::from(after.0)] += 1;
        if before != after {
            self.moved_keys += 1;
            self.moved_weight += weight;
            if let Some(m) = &mut self.matrix {
                let cell = m.entry((before, after)).or_default();
                cell.0 += 1;
                cell.1 += weight;
            }
        }
        let lightest = self.top.last().map_or(f64::NEG_INFINITY, |k| k.weight);
        if self.top.len() < TOP_KEYS || weight > lightest {
            let at = self.top.partition_point(|k| k.weight >= weight);
            self.top.insert(at, KeyLoad { key: key.to_owned(), weight, before, after });
            self.top.truncate(TOP_KEYS);
        }
    }

    /// The plan; `workers` adds the over-provisioned alternative, `drain` the prediction.
    pub fn finish(self, workers: Option<usize>, drain: Option<&DrainInput>) -> Plan {
        let total: f64 = self.weight_before.iter().sum();
        let (from, to) = (self.from.get(), self.to.get());
        let g = gcd(from, to);
        let mut top_moves: Vec<Move> = self
            .matrix
            .unwrap_or_default()
            .into_iter()
            .map(|((f, t), (keys, weight))| Move { from: f, to: t, keys, weight })
            .collect();
        top_moves.sort_by(|a, b| {
            b.weight.total_cmp(&a.weight).then(a.from.cmp(&b.from)).then(a.to.cmp(&b.to))
        });
        top_moves.truncate(TOP_MOVES);
        let target_mean = total / f64::from(to);
        let whales: Vec<KeyLoad> =
            self.top.iter().filter(|k| k.weight > target_mean).cloned().collect();
        let proposed_pins = propose_pins(&whales, &self.weight_after, &self.overrides_to);
        let predicted_drain_seconds = drain.map(|d| {
            let deepest = d.depth.iter().copied().max().unwrap_or(0) as f64;
            if d.rate_per_partition > 0.0 {
                deepest / d.rate_per_partition
            } else {
                f64::INFINITY
            }
        });
        let assignment = workers.map(|w| assign(&self.weight_before, w));
        let hold_back = drain.and_then(|d| {
            let deepest = d.depth.iter().copied().max().unwrap_or(0);
            crate::repartition::predicted_hold_back(deepest, d.rate_per_partition)
                .map(|t| t.as_secs_f64())
        });
        let online = Online { held_keys: self.moved_keys, predicted_hold_back_seconds: hold_back };
        Plan {
            from,
            to,
            keys: self.keys,
            weight: total,
            moved_keys: self.moved_keys,
            moved_fraction: ratio(self.moved_keys as f64, self.keys as f64),
            moved_weight_fraction: ratio(self.moved_weight, total),
            expected_moved_fraction: 1.0 - f64::from(g) / f64::from(from.max(to)),
            skew_before: skew(&self.weight_before),
            skew_after: skew(&self.weight_after),
            partitions_before: self.weight_before,
            partitions_after: self.weight_after,
            keys_before: self.keys_before,
            keys_after: self.keys_after,
            heaviest_keys: self.top,
            whales,
            proposed_pins,
            top_moves,
            assignment,
            predicted_drain_seconds,
            checklist: checklist(from, to, predicted_drain_seconds),
            online,
        }
    }
}

/// One key-sample line: JSON `{"key": .., "weight": ..}` or CSV `key[,weight]`. The last comma
/// splits off a weight only if what follows is a number, so keys may contain commas. The
/// weight defaults to 1 and must be finite and not negative; the key must not be empty.
pub fn parse_sample_line(text: &str) -> Result<(String, f64), String> {
    if text.starts_with('{') {
        #[derive(serde::Deserialize)]
        struct Row {
            key: String,
            #[serde(default = "one")]
            weight: f64,
        }
        fn one() -> f64 {
            1.0
        }
        let row: Row =
            serde_json::from_str(text).map_err(|e| format!("not a JSON key row: {e}"))?;
        return checked(row.key, row.weight);
    }
    match text.rsplit_once(',').map(|(k, w)| (k, w.trim().parse::<f64>())) {
        Some((key, Ok(weight))) => checked(key.to_owned(), weight),
        _ => checked(text.to_owned(), 1.0),
    }
}

fn checked(key: String, weight: f64) -> Result<(String, f64), String> {
    if key.is_empty() {
        return Err("empty key".into());
    }
    if !weight.is_finite() || weight < 0.0 {
        return Err(format!("weight {weight} of key {key:?} is not a finite number >= 0"));
    }
    Ok((key, weight))
}

/// Max/mean of `loads`; 0 for an empty or weightless layout.
pub fn skew(loads: &[f64]) -> f64 {
    let total: f64 = loads.iter().sum();
    if loads.is_empty() || total <= 0.0 {
        return 0.0;
    }
    let max = loads.iter().copied().fold(0.0, f64::max);
    max / (total / loads.len() as f64)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn gcd(a: u16, b: u16) -> u16 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Partitions over `workers`, heaviest first onto the least loaded worker.
fn assign(loads: &[f64], workers: usize) -> Assignment {
    let workers = workers.max(1);
    let mut order: Vec<usize> = (0..loads.len()).collect();
    order.sort_by(|a, b| loads[*b].total_cmp(&loads[*a]).then(a.cmp(b)));
    let mut per_worker = vec![0.0f64; workers];
    for p in order {
        let (i, _) = per_worker
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(&b.0)))
            .expect("at least one worker");
        per_worker[i] += loads[p];
    }
    Assignment {
        workers,
        partitions: loads.len() as u16,
        partitions_per_worker: loads.len().div_ceil(workers),
        balance: skew(&per_worker),
    }
}

fn checklist(from: u16, to: u16, drain: Option<f64>) -> Vec<String> {
    let drain = match drain {
        Some(s) if s.is_finite() => format!("about {s:.0} s at the measured rate"),
        Some(_) => "no estimate: the measured drain rate is zero".to_owned(),
        None => "give --database for a prediction from the live depth".to_owned(),
    };
    vec![
        format!("Freeze the mapping: deploy partition count {to} as configuration only, inactive; every producer keeps {from}."),
        "Pause producers (or buffer upstream in the outbox): the write pause starts.".to_owned(),
        format!("Drain to zero: wait until every partition reports depth 0 ({drain})."),
        format!("Flip the modulus to {to}; restart producers and consumers together."),
        "Verify that no key is queued on two partitions (`keyorder plan --database URL` reports SAFE TO SWITCH).".to_owned(),
    ]
}

impl Plan {
    /// The human report: figures, a histogram of load per partition, moves, whales, the
    /// alternative and the checklist.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let pct = |f: f64| format!("{:.2}%", f * 100.0);
        let _ = writeln!(
            out,
            "repartition plan: {} -> {} partitions (plain modulo)",
            self.from, self.to
        );
        let _ =
            writeln!(out, "keys in sample        {} (total weight {:.1})", self.keys, self.weight);
        let _ = writeln!(
            out,
            "keys that move        {} ({}); modulo predicts {} (kept gcd/max = {})",
            self.moved_keys,
            pct(self.moved_fraction),
            pct(self.expected_moved_fraction),
            pct(1.0 - self.expected_moved_fraction)
        );
        let _ = writeln!(out, "weight that moves     {}", pct(self.moved_weight_fraction));
        let _ = writeln!(
            out,
            "skew (max/mean)       before {:.3}, after {:.3}",
            self.skew_before, self.skew_after
        );
        histogram(
            &mut out,
            "load per partition before",
            &self.partitions_before,
            &self.keys_before,
        );
        histogram(&mut out, "load per partition after", &self.partitions_after, &self.keys_after);
        if !self.top_moves.is_empty() {
            let _ = writeln!(out, "heaviest moves (from -> to: keys, weight):");
            for m in &self.top_moves {
                let _ =
                    writeln!(out, "  p{} -> p{}: {} keys, {:.1}", m.from, m.to, m.keys, m.weight);
            }
        }
        let _ = writeln!(out, "heaviest keys (weight, before -> after):");
        for k in &self.heaviest_keys {
            let _ =
                writeln!(out, "  {:<32} {:>10.1}  p{} -> p{}", k.key, k.weight, k.before, k.after);
        }
        if self.whales.is_empty() {
            let _ = writeln!(
                out,
                "whale keys            none heavier than a target partition's mean load"
            );
        } else {
            for k in &self.whales {
                let _ = writeln!(
                    out,
                    "WHALE {:?} ({:.1}) outweighs a partition's mean load at {}: no count spreads it",
                    k.key, k.weight, self.to
                );
            }
            for p in &self.proposed_pins {
                let _ = writeln!(
                    out,
                    "  pin it to the least loaded partition ({:.1} without it): keyorder pin {} {}",
                    p.partition_load, p.key, p.partition
                );
            }
        }
        if let Some(a) = &self.assignment {
            let _ = writeln!(
                out,
                "alternative: keep {} partitions over {} workers ({} each at most), worker balance (max/mean) {:.3}; no key moves",
                a.partitions, a.workers, a.partitions_per_worker, a.balance
            );
        }
        let _ = writeln!(out, "drain-and-switch:");
        for (i, step) in self.checklist.iter().enumerate() {
            let _ = writeln!(out, "  {}. {step}", i + 1);
        }
        let hold = self.online.predicted_hold_back_seconds.map_or_else(
            || "give --database for a prediction".to_owned(),
            |s| format!("at most about {s:.0} s"),
        );
        let _ = writeln!(
            out,
            "online (no write pause): producers and workers switch at once; the {} moving keys are each held until their old partition has delivered what was queued at the switch ({hold}); workers lease {} partitions meanwhile; `keyorder switch --from {} --to {} --producers-follow`",
            self.online.held_keys,
            self.from.max(self.to),
            self.from,
            self.to
        );
        out
    }
}

/// Bars for up to 64 partitions; beyond that, the ten heaviest.
fn histogram(out: &mut String, title: &str, loads: &[f64], keys: &[u64]) {
    const WIDTH: f64 = 40.0;
    let max = loads.iter().copied().fold(0.0, f64::max);
    let mut rows: Vec<usize> = (0..loads.len()).collect();
    let _ = if loads.len() > 64 {
        rows.sort_by(|a, b| loads[*b].total_cmp(&loads[*a]).then(a.cmp(b)));
        rows.truncate(10);
        writeln!(out, "{title} (the 10 heaviest of {}):", loads.len())
    } else {
        writeln!(out, "{title}:")
    };
    for p in rows {
        let n = if max > 0.0 { (loads[p] / max * WIDTH).round() as usize } else { 0 };
        let _ =
            writeln!(out, "  p{p:<5} {:<40} {:>10.1} ({} keys)", "#".repeat(n), loads[p], keys[p]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: i64) -> PartitionCount {
        PartitionCount::new(n).unwrap()
    }

    fn plan(from: i64, to: i64, keys: &[(&str, f64)]) -> Plan {
        let mut p =
            Planner::new(count(from), count(to), Overrides::new(), Overrides::new()).unwrap();
        let (k, w): (Vec<&str>, Vec<f64>) = keys.iter().copied().unzip();
        p.add_batch(&k, &w).unwrap();
        p.finish(Some(4), Some(&DrainInput { depth: vec![10, 40], rate_per_partition: 20.0 }))
    }

    #[test]
    fn moves_agree_with_routing() {
        let keys: Vec<(String, f64)> = (0..2000).map(|i| (format!("sub_{i}"), 1.0)).collect();
        let refs: Vec<(&str, f64)> = keys.iter().map(|(k, w)| (k.as_str(), *w)).collect();
        let p = plan(16, 32, &refs);
        let moved = keys
            .iter()
            .filter(|(k, _)| {
                crate::partition_for(k, count(16)) != crate::partition_for(k, count(32))
            })
            .count() as u64;
        assert_eq!(p.moved_keys, moved);
        assert!((p.expected_moved_fraction - 0.5).abs() < 1e-12);
        assert_eq!(p.keys_before.iter().sum::<u64>(), 2000);
        assert_eq!(p.predicted_drain_seconds, Some(2.0));
        assert_eq!(p.checklist.len(), 5);
        // The heaviest moves, from the move matrix: real moves, heaviest first, each counted
        // exactly as routing moves its keys.
        assert_eq!(p.top_moves.len(), TOP_MOVES, "16 -> 32 has 16 move pairs, 10 shown");
        for m in &p.top_moves {
            let keys = keys
                .iter()
                .filter(|(k, _)| {
                    crate::partition_for(k, count(16)) == m.from
                        && crate::partition_for(k, count(32)) == m.to
                })
                .count() as u64;
            assert_eq!((m.keys, m.weight), (keys, keys as f64), "{m:?}");
        }
        assert!(p.top_moves.windows(2).all(|w| w[0].weight >= w[1].weight));
    }

    #[test]
    fn weights_and_counts_add_up_per_partition() {
        // Weights other than 1, so a product in place of a sum shows.
        let keys: Vec<(String, f64)> =
            (0..300).map(|i| (format!("sub_{i}"), 0.5 + f64::from(i % 7))).collect();
        let refs: Vec<(&str, f64)> = keys.iter().map(|(k, w)| (k.as_str(), *w)).collect();
        let p = plan(8, 12, &refs);
        let (mut before, mut after) = (vec![0.0; 8], vec![0.0; 12]);
        let (mut kb, mut ka) = (vec![0u64; 8], vec![0u64; 12]);
        let (mut moved, mut moved_weight) = (0u64, 0.0);
        for (k, w) in &keys {
            let (b, a) = (crate::partition_for(k, count(8)), crate::partition_for(k, count(12)));
            before[usize::from(b.0)] += w;
            after[usize::from(a.0)] += w;
            kb[usize::from(b.0)] += 1;
            ka[usize::from(a.0)] += 1;
            if b != a {
                moved += 1;
                moved_weight += w;
            }
        }
        let total: f64 = keys.iter().map(|(_, w)| w).sum();
        assert_eq!(p.keys, 300);
        assert_eq!((p.partitions_before, p.partitions_after), (before, after));
        assert_eq!((p.keys_before, p.keys_after), (kb, ka));
        assert_eq!(p.moved_keys, moved);
        assert!((p.weight - total).abs() < 1e-9);
        assert!((p.moved_fraction - moved as f64 / 300.0).abs() < 1e-12);
        assert!((p.moved_weight_fraction - moved_weight / total).abs() < 1e-12);
    }

    #[test]
    fn the_heaviest_keys_are_kept_heaviest_first_whatever_the_input_order() {
        // Descending, ascending and interleaved input orders give the same ten.
        let weights: Vec<f64> = (0..30).map(|i| f64::from(i) + 1.0).collect();
        let names: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
        let want: Vec<(String, f64)> =
            (20..30).rev().map(|i| (names[i].clone(), weights[i])).collect();
        let orders: [Vec<usize>; 3] =
            [(0..30).rev().collect(), (0..30).collect(), (0..30).map(|i| (i * 7) % 30).collect()];
        for order in orders {
            let keys: Vec<(&str, f64)> =
                order.iter().map(|&i| (names[i].as_str(), weights[i])).collect();
            let p = plan(4, 8, &keys);
            let got: Vec<(String, f64)> =
                p.heaviest_keys.iter().map(|k| (k.key.clone(), k.weight)).collect();
            assert_eq!(got, want, "input order {order:?}");
        }
    }

    #[test]
    fn the_small_helpers_hold_at_their_edges() {
        // A JSON row without a weight weighs 1; a CSV weight of 0 is allowed.
        assert_eq!(parse_sample_line(r#"{"key":"k"}"#), Ok(("k".into(), 1.0)));
        assert_eq!(parse_sample_line("k,0"), Ok(("k".into(), 0.0)));
        // Skew of nothing, or of weightless partitions, is 0 (not NaN).
        assert_eq!(skew(&[]), 0.0);
        assert_eq!(skew(&[0.0, 0.0]), 0.0);
        assert_eq!(skew(&[1.0, 3.0]), 1.5);
        assert_eq!((gcd(12, 18), gcd(18, 12), gcd(7, 0), gcd(16, 32)), (6, 6, 7, 16));
        // 12 -> 18 keeps gcd/max = 6/18 of the keys in place.
        let p = plan(12, 18, &[("a", 1.0)]);
        assert!((p.expected_moved_fraction - 2.0 / 3.0).abs() < 1e-12);
        // An empty sample moves nothing, rather than 0/0.
        let p = plan(4, 8, &[]);
        assert_eq!((p.keys, p.moved_fraction, p.moved_weight_fraction), (0, 0.0, 0.0));
    }

    #[test]
    fn the_report_draws_bars_to_scale_and_lists_the_moves() {
        // Exactly: find keys for partitions 0 and 1 of 2, weigh them 4 and 1.
        let key_on = |p: u16, n: i64| {
            (0..)
                .map(|i| format!("k{i}"))
                .find(|k| crate::partition_for(k, count(n)).0 == p)
                .unwrap()
        };
        let (heavy, light) = (key_on(0, 2), key_on(1, 2));
        let p = plan(2, 3, &[(heavy.as_str(), 4.0), (light.as_str(), 1.0)]);
        let report = p.report();
        let bar = |title: &str, partition: usize| {
            let section = report.split(title).nth(1).expect(title);
            let line = section.lines().nth(1 + partition).expect("a bar line");
            line.chars().filter(|&c| c == '#').count()
        };
        assert_eq!(bar("load per partition before", 0), 40, "{report}");
        assert_eq!(bar("load per partition before", 1), 10, "{report}");
        assert_eq!(report.contains("heaviest moves"), !p.top_moves.is_empty(), "{report}");
        // Past 64 partitions only the ten heaviest get a bar.
        let p = plan(100, 101, &[("a", 1.0)]);
        let report = p.report();
        let m = p.top_moves.first().expect("\"a\" moves from 100 to 101 partitions");
        let listed = format!(
            "heaviest moves (from -> to: keys, weight):\n  p{} -> p{}: 1 keys",
            m.from, m.to
        );
        assert!(report.contains(&listed), "{report}");
        assert!(report.contains("load per partition before (the 10 heaviest of 100):"), "{report}");
        let section = report.split("(the 10 heaviest of 100):").nth(1).unwrap();
        assert_eq!(section.lines().skip(1).take_while(|l| l.starts_with("  p")).count(), 10);
        // A zero drain rate gives no estimate rather than "about inf s".
        let mut planner =
            Planner::new(count(4), count(8), Overrides::new(), Overrides::new()).unwrap();
        planner.add_batch(&["k"], &[1.0]).unwrap();
        let drain = DrainInput { depth: vec![5], rate_per_partition: 0.0 };
        let p = planner.finish(None, Some(&drain));
        assert!(p.checklist.iter().any(|c| c.contains("no estimate")), "{:?}", p.checklist);
        assert!(!p.checklist.iter().any(|c| c.contains("inf")), "{:?}", p.checklist);
    }

    #[test]
    fn a_zero_weight_is_accepted() {
        let mut p = Planner::new(count(4), count(8), Overrides::new(), Overrides::new()).unwrap();
        assert_eq!(p.add_batch(&["k"], &[0.0]), Ok(()));
        assert!(matches!(
            p.add_batch(&["k"], &[f64::NEG_INFINITY]),
            Err(PlanError::BadWeight { .. })
        ));
        assert!(matches!(p.add_batch(&["k"], &[f64::INFINITY]), Err(PlanError::BadWeight { .. })));
    }

    #[test]
    fn a_move_matrix_too_large_to_keep_is_left_out() {
        // 32767 x 32766 cells is far past the bound: the moves are still counted.
        let p = plan(32767, 32766, &[("a", 1.0), ("b", 1.0), ("c", 1.0)]);
        assert!(p.top_moves.is_empty());
        assert_eq!(p.keys_before.iter().sum::<u64>(), 3);
        // 2048 x 512 cells is exactly the bound: kept.
        let keys: Vec<(String, f64)> = (0..200).map(|i| (format!("sub_{i}"), 1.0)).collect();
        let refs: Vec<(&str, f64)> = keys.iter().map(|(k, w)| (k.as_str(), *w)).collect();
        assert!(!plan(2048, 512, &refs).top_moves.is_empty());
    }

    #[test]
    fn a_whale_is_flagged_and_skew_is_max_over_mean() {
        let mut keys = vec![("whale", 1000.0)];
        keys.extend([("a", 1.0), ("b", 1.0), ("c", 1.0)]);
        let p = plan(4, 8, &keys);
        assert_eq!(p.whales.len(), 1);
        assert_eq!(p.whales[0].key, "whale");
        let max = p.partitions_after.iter().copied().fold(0.0, f64::max);
        assert!((p.skew_after - max / (1003.0 / 8.0)).abs() < 1e-9);
        assert!(p.report().contains("WHALE \"whale\""));
        // A pin is proposed for it: the least loaded partition once the whale is taken out.
        assert_eq!(p.proposed_pins.len(), 1);
        let pin = &p.proposed_pins[0];
        let lightest = (0..p.partitions_after.len())
            .map(|i| {
                p.partitions_after[i]
                    - if i == usize::from(p.whales[0].after.0) { 1000.0 } else { 0.0 }
            })
            .fold(f64::INFINITY, f64::min);
        assert_eq!(pin.partition_load, lightest.max(0.0));
        assert!(p.report().contains(&format!("keyorder pin whale {}", pin.partition)));
        // A key above the remainder of total / count but below the mean is no whale.
        let p = plan(4, 8, &[("whale", 1000.0), ("a", 10.0), ("b", 1.0), ("c", 1.0)]);
        assert_eq!(p.whales.iter().map(|k| k.key.as_str()).collect::<Vec<_>>(), ["whale"]);
        // Keys exactly at the mean are no whales: an even spread has none.
        let p = plan(2, 4, &[("a", 1.0), ("b", 1.0), ("c", 1.0), ("d", 1.0)]);
        assert!(p.whales.is_empty(), "{:?}", p.whales);
    }

    #[test]
    fn bad_weights_and_bad_pins_are_refused() {
        let mut p = Planner::new(count(4), count(8), Overrides::new(), Overrides::new()).unwrap();
        assert!(matches!(p.add_batch(&["k"], &[-1.0]), Err(PlanError::BadWeight { .. })));
        assert!(matches!(p.add_batch(&["k"], &[f64::NAN]), Err(PlanError::BadWeight { .. })));
        let mut pins = Overrides::new();
        pins.pin("k", PartitionId(6));
        assert!(Planner::new(count(4), count(8), pins, Overrides::new()).is_err());
    }

    #[test]
    fn sample_lines_parse_as_csv_or_json() {
        assert_eq!(parse_sample_line("sub_1,2.5"), Ok(("sub_1".into(), 2.5)));
        assert_eq!(parse_sample_line("sub_1"), Ok(("sub_1".into(), 1.0)));
        assert_eq!(parse_sample_line("a,b"), Ok(("a,b".into(), 1.0)));
        assert_eq!(parse_sample_line(r#"{"key":"k","weight":3}"#), Ok(("k".into(), 3.0)));
        assert!(parse_sample_line("k,-1").is_err());
        assert!(parse_sample_line(",5").is_err());
        assert!(parse_sample_line("{nope").is_err());
    }

    #[test]
    fn the_over_provisioned_alternative_balances_by_weight() {
        let a = assign(&[4.0, 3.0, 2.0, 1.0], 2);
        assert_eq!(a.partitions_per_worker, 2);
        assert!((a.balance - 1.0).abs() < 1e-12, "4+1 and 3+2 balance exactly");
    }

    #[test]
    fn a_zero_drain_rate_of_either_sign_predicts_an_infinite_drain() {
        // The library takes any rate (the CLI refuses zero): a partition that drains nothing
        // never empties, whatever is queued and whatever the sign of the zero.
        let drain_seconds = |depth: Vec<u64>, rate: f64| {
            let p = Planner::new(count(4), count(8), Overrides::new(), Overrides::new()).unwrap();
            p.finish(None, Some(&DrainInput { depth, rate_per_partition: rate }))
                .predicted_drain_seconds
        };
        assert_eq!(drain_seconds(vec![5, 0], -0.0), Some(f64::INFINITY));
        assert_eq!(drain_seconds(vec![0, 0], 0.0), Some(f64::INFINITY));
        assert_eq!(drain_seconds(vec![5, 0], 2.5), Some(2.0));
    }

    #[test]
    fn sixty_four_partitions_all_get_a_bar_and_a_finite_drain_is_estimated() {
        // 64 is the last count drawn in full; only past it are the ten heaviest cut out.
        let p = plan(64, 65, &[("a", 1.0), ("b", 2.0)]);
        let report = p.report();
        assert!(!report.contains("before (the 10 heaviest"), "{report}");
        assert!(report.contains("after (the 10 heaviest of 65):"), "{report}");
        let section = report.split("load per partition before:").nth(1).expect("a full chart");
        assert_eq!(section.lines().skip(1).take_while(|l| l.starts_with("  p")).count(), 64);
        // 40 queued at 20 per second: the checklist's drain step says so.
        assert!(p.checklist[2].contains("(about 2 s at the measured rate)"), "{:?}", p.checklist);
    }
}
