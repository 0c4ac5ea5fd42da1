//! Online repartitioning without a write pause: producers and consumers switch to a new
//! layout (count) at an epoch, and a per-key barrier keeps order.
//!
//! Every row carries the layout epoch it was routed under. A row of layout `e` is held back
//! while any row of the same key from an earlier layout is still queued: the key's old
//! partition must first deliver (or dead-letter) everything of that key enqueued before the
//! switch. Keys that do not move are unaffected in practice (their old and new rows share a
//! partition, which is FIFO). While old rows remain, consumers lease partitions under
//! `max(old, new)` counts, so shrinking still drains the partitions that disappear.
//!
//! This is the per-key form of Pulsar Key_Shared's "draining hashes": a key is held, not a
//! partition, so only keys that move and still have old rows wait.

use std::time::Duration;

use crate::routing::PartitionCount;

/// What the barrier says about a head row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barrier {
    /// Deliver it.
    Open,
    /// Hold it: an older-layout row of its key is still queued. Look again after a poll.
    Held,
}

/// The barrier for a row of layout `row_layout` whose key has queued rows of layouts down to
/// `oldest_layout_of_key` (the row's own layout when it is the key's only one).
pub fn barrier(row_layout: u64, oldest_layout_of_key: u64) -> Barrier {
    if oldest_layout_of_key < row_layout {
        Barrier::Held
    } else {
        Barrier::Open
    }
}

/// The count consumers lease under: both layouts' partitions while old rows remain.
pub fn consumer_count(
    old: PartitionCount,
    new: PartitionCount,
    old_rows_remain: bool,
) -> PartitionCount {
    if old_rows_remain {
        old.max(new)
    } else {
        new
    }
}

/// How long a held head waits before it looks again, by default.
pub const DEFAULT_HOLD_POLL: Duration = Duration::from_millis(50);

/// Predicted hold-back of a moving key: its old partition must first drain what was queued
/// before the switch, `depth` rows at `rate` deliveries per second.
pub fn predicted_hold_back(depth: u64, rate_per_partition: f64) -> Option<Duration> {
    (rate_per_partition > 0.0).then(|| Duration::from_secs_f64(depth as f64 / rate_per_partition))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_waits_for_older_rows_of_its_key() {
        assert_eq!(barrier(1, 0), Barrier::Held);
        assert_eq!(barrier(1, 1), Barrier::Open);
        assert_eq!(barrier(0, 0), Barrier::Open);
    }

    #[test]
    fn consumers_cover_both_layouts_while_old_rows_remain() {
        let (a, b) = (PartitionCount::new(16).unwrap(), PartitionCount::new(8).unwrap());
        assert_eq!(consumer_count(a, b, true), a);
        assert_eq!(consumer_count(a, b, false), b);
        assert_eq!(predicted_hold_back(100, 50.0), Some(Duration::from_secs(2)));
        assert_eq!(predicted_hold_back(100, 0.0), None);
    }
}
