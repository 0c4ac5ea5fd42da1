//! The routing configuration recorded in the database, and what queued rows say about it.
//!
//! The database is the one source of truth for routing: the layouts (a partition count from an
//! epoch on, [`LayoutRecord`]) and the key pins ([`PinSpan`], each in force over a range of
//! epochs). A pin change starts a new layout epoch with the same count, so the online switch's
//! per-key barrier ([`crate::repartition`]) holds a moved key's new rows until its old rows are
//! gone: a pin never splits a key.
//!
//! This module is sans-IO: the stores read the records and the queued [`Placement`]s, and
//! [`audit`] judges them (which rows no worker will ever read, which were routed with another
//! count, hash or pin), [`infer_count`] finds the count an unrecorded queue was routed with.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ids::PartitionId;
use crate::routing::{key_digest, partition_of_digest, Overrides, PartitionCount, Router};

/// One recorded layout: `partitions` in force from `epoch` on (until the next epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LayoutRecord {
    /// The epoch rows routed under it carry.
    pub epoch: i32,
    /// Its partition count.
    pub partitions: PartitionCount,
}

/// A pin of `key` to `partition`, in force for rows of layouts `from_epoch..until_epoch`
/// (`until_epoch` `None`: the pin in force now).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PinSpan {
    /// The pinned key.
    pub key: String,
    /// Its partition.
    pub partition: PartitionId,
    /// The first layout epoch it routes.
    pub from_epoch: i32,
    /// The epoch that replaced it, if any.
    pub until_epoch: Option<i32>,
}

impl PinSpan {
    /// Whether this pin routed rows of layout `epoch`.
    pub fn covers(&self, epoch: i32) -> bool {
        self.from_epoch <= epoch && self.until_epoch.is_none_or(|u| epoch < u)
    }
}

/// Queued rows of one key on one partition under one layout epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The key.
    pub key: String,
    /// The partition its rows are on.
    pub partition: i16,
    /// The layout epoch they carry.
    pub layout: i32,
    /// How many rows.
    pub rows: i64,
}

/// What the routing records say: the layout in force and the router producers must use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingState {
    /// Every layout, oldest first (never empty once recorded).
    pub layouts: Vec<LayoutRecord>,
    /// Every pin, current and past.
    pub pins: Vec<PinSpan>,
}

impl RoutingState {
    /// The layout in force (the newest), if one is recorded.
    pub fn current(&self) -> Option<LayoutRecord> {
        self.layouts.last().copied()
    }

    /// The pins in force now.
    pub fn current_pins(&self) -> Overrides {
        let mut pins = Overrides::new();
        for p in self.pins.iter().filter(|p| p.until_epoch.is_none()) {
            pins.pin(p.key.clone(), p.partition);
        }
        pins
    }

    /// The router rows of layout `epoch` were routed with: its count and the pins covering it
    /// (`None` for an epoch no layout records).
    pub fn router_at(&self, epoch: i32) -> Option<Router> {
        let layout = self.layouts.iter().rev().find(|l| l.epoch <= epoch)?;
        let mut pins = Overrides::new();
        for p in self.pins.iter().filter(|p| p.covers(epoch)) {
            pins.pin(p.key.clone(), p.partition);
        }
        // A recorded pin outside its layout's count is not routable: judge by the hash then.
        Some(
            Router::with_overrides(layout.partitions, pins)
                .unwrap_or_else(|_| Router::new(layout.partitions)),
        )
    }
}

/// How many keys of each kind [`Audit`] names.
pub const AUDIT_EXAMPLES: usize = 5;

/// What the queued rows say about the routing records.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Audit {
    /// Rows on a partition no worker leases: at or above every count workers lease under
    /// (they are never delivered until moved).
    pub stranded_rows: i64,
    /// The first keys with stranded rows, with their partition.
    pub stranded_keys: Vec<(String, i16)>,
    /// Rows whose partition is not where their key routes under their layout (count and pins):
    /// a producer with another count, hash or pin. Such a key is split: its order is lost.
    pub misrouted_rows: i64,
    /// The first misrouted keys: the key, the partition it is on, the one it routes to.
    pub misrouted_keys: Vec<(String, i16, u16)>,
}

impl Audit {
    /// Whether every queued row is where routing puts it and within reach of a worker.
    pub fn is_clean(&self) -> bool {
        self.stranded_rows == 0 && self.misrouted_rows == 0
    }

    /// One line for a person, naming the first keys, or `None` when clean.
    pub fn summary(&self) -> Option<String> {
        if self.is_clean() {
            return None;
        }
        let mut parts = Vec::new();
        if self.stranded_rows > 0 {
            let keys: Vec<String> =
                self.stranded_keys.iter().map(|(k, p)| format!("{k:?} on {p}")).collect();
            parts.push(format!(
                "{} rows on partitions no worker reads (never delivered until moved): {}",
                self.stranded_rows,
                keys.join(", ")
            ));
        }
        if self.misrouted_rows > 0 {
            let keys: Vec<String> = self
                .misrouted_keys
                .iter()
                .map(|(k, on, to)| format!("{k:?} on {on}, routes to {to}"))
                .collect();
            parts.push(format!(
                "{} rows not where their key routes (a producer with another count, hash or pin: their keys are split): {}",
                self.misrouted_rows,
                keys.join(", ")
            ));
        }
        Some(parts.join("; "))
    }
}

impl RoutingState {
    /// The count of the layout rows of `epoch` were routed under.
    fn count_at(&self, epoch: i32) -> Option<PartitionCount> {
        self.layouts.iter().rev().find(|l| l.epoch <= epoch).map(|l| l.partitions)
    }

    /// The count workers lease under with `placements` queued: the largest of the layout in
    /// force and of every layout with rows queued (the stores' `consumer_count`).
    pub fn leased_count(&self, placements: &[Placement]) -> Option<PartitionCount> {
        let current = self.current()?.partitions;
        let mut epochs: Vec<i32> = placements.iter().map(|p| p.layout).collect();
        epochs.sort_unstable();
        epochs.dedup();
        Some(epochs.into_iter().filter_map(|e| self.count_at(e)).fold(current, Ord::max))
    }
}

/// Judges `placements` against `state`: rows outside the partitions workers lease
/// ([`RoutingState::leased_count`]) are stranded, rows elsewhere than their layout routes
/// their key are misrouted. With no layout recorded every row is judged stranded.
/// Deterministic: keys are named in the order of `placements` (the stores read them sorted).
pub fn audit(state: &RoutingState, placements: &[Placement]) -> Audit {
    let mut out = Audit::default();
    let leased = state.leased_count(placements).map_or(0, PartitionCount::get);
    let mut routers: BTreeMap<i32, Option<Router>> = BTreeMap::new();
    for p in placements {
        if p.partition < 0 || p.partition as u16 >= leased {
            out.stranded_rows += p.rows;
            if out.stranded_keys.len() < AUDIT_EXAMPLES {
                out.stranded_keys.push((p.key.clone(), p.partition));
            }
            continue;
        }
        let router = routers.entry(p.layout).or_insert_with(|| state.router_at(p.layout));
        let Some(router) = router else { continue };
        let want = router.route(&p.key).0;
        if want as i16 != p.partition {
            out.misrouted_rows += p.rows;
            if out.misrouted_keys.len() < AUDIT_EXAMPLES {
                out.misrouted_keys.push((p.key.clone(), p.partition, want));
            }
        }
    }
    out
}

/// What [`infer_count`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inference {
    /// No row is queued: any count fits.
    Empty,
    /// Exactly one count routes every queued row to its partition.
    Unique(PartitionCount),
    /// Several do (too few keys to tell); the smallest few.
    Ambiguous(Vec<PartitionCount>),
    /// None does (a random hash, pins, or several counts were used).
    None,
}

/// The counts under which every `(key, partition)` is where the hash routes it, for a queue
/// whose count was never recorded (a database older than the layout record).
pub fn infer_count(rows: &[(String, i16)]) -> Inference {
    if rows.is_empty() {
        return Inference::Empty;
    }
    let digests: Vec<(u64, i64)> =
        rows.iter().map(|(k, p)| (key_digest(k), i64::from(*p))).collect();
    let lowest = digests.iter().map(|(_, p)| p + 1).max().unwrap_or(1).max(1);
    let mut found = Vec::new();
    let mut hits = 0usize;
    for n in lowest..=i64::from(PartitionCount::MAX) {
        let Ok(count) = PartitionCount::new(n) else { break };
        if digests.iter().all(|(d, p)| i64::from(partition_of_digest(*d, count).0) == *p) {
            hits += 1;
            if found.len() < AUDIT_EXAMPLES {
                found.push(count);
            }
        }
    }
    match hits {
        0 => Inference::None,
        1 => Inference::Unique(found[0]),
        _ => Inference::Ambiguous(found),
    }
}

/// Whether `key` may be pinned to `partition` under `count` (`None`: unpinned): the reason
/// when not.
pub fn check_pin(
    key: &str,
    partition: Option<PartitionId>,
    count: PartitionCount,
) -> Result<(), String> {
    if key.is_empty() {
        return Err("the key is empty".into());
    }
    match partition {
        Some(p) if !count.contains(p) => Err(format!(
            "partition {} does not exist: the count in force is {count} (partitions 0..{})",
            p.0,
            count.get() - 1
        )),
        _ => Ok(()),
    }
}

/// Why a switch to `to` partitions is refused while `key` is pinned to `partition`.
pub fn pin_outside(key: &str, partition: i16, to: PartitionCount) -> String {
    format!(
        "key {key:?} is pinned to partition {partition}, which {to} partitions do not have: \
         `keyorder unpin {key}` (or pin it below {to}) first"
    )
}

#[cfg(test)]
mod tests;
