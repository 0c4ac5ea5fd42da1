//! The acknowledgements of every lease on one connection, deleted together.
//!
//! Rows of different partitions interleave in the table (seq order is arrival order), so a
//! page holds rows of many partitions. Deleting each partition's acknowledgements in its own
//! transaction writes each page to the WAL once per partition that had a row on it: the cost
//! per delivery grew with the partition count. One shared buffer per connection, flushed in
//! one transaction, writes each page about once per flush whatever the count.
//!
//! Fencing is unchanged: inside the flush transaction each lease's rows are deleted only after
//! its own fenced renewal succeeded. A lease whose renewal is refused is marked lost (its next
//! call fails with [`StoreError::LeaseNotHeld`]) and its rows stay queued for the next holder;
//! the other leases' deletes go on. A flush that fails as a whole puts every row back, so no
//! acknowledged row is left behind a cursor that already moved past it.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::Connection;

use super::Fence;
use crate::ids::Time;
use crate::store::StoreError;

/// The fewest rows per buffered lease a flush by count waits for.
pub(super) const ROWS_PER_LEASE: usize = 16;

/// A lease's identity in the buffer: `(partition, epoch)`.
pub(super) type LeaseKey = (u16, u64);

/// Rows to delete, per lease, with the fence each batch is deleted under.
pub(super) type Batch = BTreeMap<LeaseKey, (Fence, Vec<i64>)>;

/// The buffered acknowledgements of one connection's leases.
#[derive(Default)]
pub(super) struct AckBuffer {
    pending: Batch,
    total: usize,
    oldest: Option<Time>,
    /// Leases whose fenced renewal was refused in a flush another lease ran.
    lost: BTreeSet<LeaseKey>,
}

impl AckBuffer {
    /// Buffers `seq` of the lease `fence`, acknowledged at `now`.
    pub(super) fn push(&mut self, fence: &Fence, seq: i64, now: Time) {
        let entry = self.pending.entry(fence.key()).or_insert_with(|| (fence.clone(), Vec::new()));
        entry.1.push(seq);
        self.total += 1;
        self.oldest.get_or_insert(now);
    }

    /// Whether a flush is due: the oldest row is `delay` old, or `batch` rows are buffered —
    /// at least [`ROWS_PER_LEASE`] per lease in the buffer, since each lease's rows dirty index
    /// pages of their own and a flush should amortise them.
    pub(super) fn due(&self, now: Time, batch: usize, delay: std::time::Duration) -> bool {
        let batch = batch.max(ROWS_PER_LEASE * self.pending.len());
        self.total >= batch || self.oldest.is_some_and(|o| now.saturating_since(o) >= delay)
    }

    /// Whether anything is buffered.
    pub(super) fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Takes everything buffered, for one flush.
    pub(super) fn take(&mut self) -> Batch {
        self.total = 0;
        self.oldest = None;
        std::mem::take(&mut self.pending)
    }

    /// Puts back a batch whose flush failed as a whole (rows acknowledged meanwhile stay).
    pub(super) fn restore(&mut self, batch: Batch, now: Time) {
        for (key, (fence, seqs)) in batch {
            self.total += seqs.len();
            self.pending.entry(key).or_insert_with(|| (fence, Vec::new())).1.extend(seqs);
        }
        if self.total > 0 {
            self.oldest.get_or_insert(now);
        }
    }

    /// Records the leases a flush found lost.
    pub(super) fn mark_lost(&mut self, keys: impl IntoIterator<Item = LeaseKey>) {
        self.lost.extend(keys);
    }

    /// Whether a flush found the lease `key` lost.
    pub(super) fn is_lost(&self, key: LeaseKey) -> bool {
        self.lost.contains(&key)
    }

    /// Forgets the lease `key` (dropped): its unflushed rows stay queued, and no later flush
    /// renews a lease nobody holds any more.
    pub(super) fn forget(&mut self, key: LeaseKey) {
        if let Some((_, seqs)) = self.pending.remove(&key) {
            self.total -= seqs.len();
        }
        if self.pending.is_empty() {
            self.oldest = None;
        }
        self.lost.remove(&key);
    }
}

/// Deletes `batch` inside the open transaction `tx`: each lease's rows after its fenced
/// renewal. Returns the leases whose renewal was refused (their rows untouched); any other
/// error fails the whole flush.
pub(super) fn delete_batch(tx: &Connection, batch: &Batch) -> Result<Vec<LeaseKey>, StoreError> {
    let mut lost = Vec::new();
    let mut del = tx.prepare_cached(super::DELETE_SQL)?;
    for (key, (fence, seqs)) in batch {
        match fence.renew(tx) {
            Ok(()) => {
                for seq in seqs {
                    del.execute([fence.p(), *seq])?;
                }
            }
            Err(StoreError::LeaseNotHeld { .. }) => lost.push(*key),
            Err(other) => return Err(other),
        }
    }
    Ok(lost)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ids::{Epoch, PartitionId};

    fn fence(p: u16, epoch: u64) -> Fence {
        Fence {
            partition: PartitionId(p),
            epoch: Epoch(epoch),
            holder: format!("h{p}"),
            expiry: 30.0,
            margin: 10.0,
            sql: std::sync::Arc::new(super::super::HeadSql::new(1)),
        }
    }

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn due_by_age_of_the_oldest_row_or_by_count_of_at_least_rows_per_lease() {
        let delay = Duration::from_millis(50);
        let mut b = AckBuffer::default();
        assert!(!b.due(at(0), 2, delay));
        b.push(&fence(0, 1), 1, at(0));
        assert!(!b.due(at(49), 2, delay));
        assert!(b.due(at(50), 2, delay));
        b.push(&fence(0, 1), 2, at(10));
        assert!(!b.due(at(10), 2, delay), "one lease: at least ROWS_PER_LEASE rows");
        for seq in 3..=ROWS_PER_LEASE as i64 {
            b.push(&fence(0, 1), seq, at(10));
        }
        assert!(b.due(at(10), 2, delay));
        assert!(!b.due(at(10), ROWS_PER_LEASE + 1, delay), "a larger batch is the larger bound");
        b.push(&fence(1, 2), 100, at(10));
        assert!(!b.due(at(10), 2, delay), "two leases: twice as many");
    }

    #[test]
    fn take_empties_and_restore_merges_with_rows_acknowledged_meanwhile() {
        let mut b = AckBuffer::default();
        b.push(&fence(0, 1), 1, at(0));
        b.push(&fence(0, 1), 2, at(0));
        let batch = b.take();
        assert!(b.is_empty() && !b.due(at(1000), 1, Duration::from_millis(50)));
        b.push(&fence(0, 1), 3, at(5));
        b.restore(batch, at(6));
        let again = b.take();
        let mut seqs = again[&(0, 1)].1.clone();
        seqs.sort_unstable();
        assert_eq!(seqs, [1, 2, 3]);
    }

    #[test]
    fn a_forgotten_lease_leaves_nothing_to_renew() {
        let mut b = AckBuffer::default();
        b.push(&fence(0, 1), 1, at(0));
        b.push(&fence(1, 2), 2, at(0));
        b.mark_lost([(0, 1)]);
        assert!(b.is_lost((0, 1)) && !b.is_lost((1, 2)));
        b.forget((0, 1));
        assert!(!b.is_lost((0, 1)));
        let batch = b.take();
        assert_eq!(batch.keys().copied().collect::<Vec<_>>(), [(1, 2)]);
        b.forget((1, 2));
        assert!(!b.due(at(1000), 1, Duration::from_millis(1)));
    }
}
