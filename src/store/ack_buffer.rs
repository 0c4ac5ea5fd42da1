//! The buffered acknowledgements of every lease on one connection, deleted together. Sans-IO: a part of
//! [`ExpiryDrain`](crate::store::expiry_drain::ExpiryDrain), which the SQLite store and the
//! simulation's expiry-lease client both drive.
//!
//! Rows of different partitions interleave in a queue table (seq order is arrival order), so a
//! page holds rows of many partitions. Deleting each partition's acknowledgements in its own
//! transaction writes each page once per partition that had a row on it; one shared buffer per
//! connection, flushed in one transaction, writes each page about once per flush.
//!
//! Fencing is unchanged: a flush deletes each lease's rows only after that lease's own fenced
//! renewal succeeded. A lease whose renewal is refused is marked lost ([`AckBuffer::is_lost`]:
//! its next call must fail) and its rows stay queued for the next holder, who delivers them
//! again; the other leases' deletes go on. A flush that fails as a whole puts every row back
//! ([`AckBuffer::restore`]), so no acknowledged row is left behind a cursor that moved past it.
//! A lost acknowledgement is a duplicate delivery, never a loss.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::Time;

/// The fewest rows per buffered lease a flush by count waits for.
pub const ROWS_PER_LEASE: usize = 16;

/// A lease's identity in the buffer: `(partition, epoch)`.
pub type LeaseKey = (u16, u64);

/// Rows to delete, per lease, with the fence each batch is deleted under.
pub type Batch<F> = BTreeMap<LeaseKey, (F, Vec<i64>)>;

/// The buffered acknowledgements of one connection's leases; `F` is what a flush needs to
/// renew a lease under its fence.
#[derive(Debug)]
pub struct AckBuffer<F> {
    pending: Batch<F>,
    total: usize,
    oldest: Option<Time>,
    /// Leases whose fenced renewal was refused in a flush another lease ran.
    lost: BTreeSet<LeaseKey>,
}

impl<F> Default for AckBuffer<F> {
    fn default() -> Self {
        Self { pending: Batch::new(), total: 0, oldest: None, lost: BTreeSet::new() }
    }
}

impl<F: Clone> AckBuffer<F> {
    /// Buffers `seq` of the lease `key` (fenced by `fence`), acknowledged at `now`.
    pub fn push(&mut self, key: LeaseKey, fence: &F, seq: i64, now: Time) {
        let entry = self.pending.entry(key).or_insert_with(|| (fence.clone(), Vec::new()));
        entry.1.push(seq);
        self.total += 1;
        self.oldest.get_or_insert(now);
    }

    /// Whether a flush is due: the oldest row is `delay` old, or `batch` rows are buffered —
    /// at least [`ROWS_PER_LEASE`] per lease in the buffer, since each lease's rows dirty index
    /// pages of their own and a flush should amortise them.
    pub fn due(&self, now: Time, batch: usize, delay: std::time::Duration) -> bool {
        let batch = batch.max(ROWS_PER_LEASE * self.pending.len());
        self.total >= batch || self.oldest.is_some_and(|o| now.saturating_since(o) >= delay)
    }

    /// Whether anything is buffered.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Takes everything buffered, for one flush.
    pub fn take(&mut self) -> Batch<F> {
        self.total = 0;
        self.oldest = None;
        std::mem::take(&mut self.pending)
    }

    /// Puts back a batch whose flush failed as a whole (rows acknowledged meanwhile stay).
    pub fn restore(&mut self, batch: Batch<F>, now: Time) {
        for (key, (fence, seqs)) in batch {
            self.total += seqs.len();
            self.pending.entry(key).or_insert_with(|| (fence, Vec::new())).1.extend(seqs);
        }
        if self.total > 0 {
            self.oldest.get_or_insert(now);
        }
    }

    /// Records the leases a flush found lost.
    pub fn mark_lost(&mut self, keys: impl IntoIterator<Item = LeaseKey>) {
        self.lost.extend(keys);
    }

    /// Whether a flush found the lease `key` lost.
    pub fn is_lost(&self, key: LeaseKey) -> bool {
        self.lost.contains(&key)
    }

    /// Forgets the lease `key` (dropped): its unflushed rows stay queued, and no later flush
    /// renews a lease nobody holds any more.
    pub fn forget(&mut self, key: LeaseKey) {
        if let Some((_, seqs)) = self.pending.remove(&key) {
            self.total -= seqs.len();
        }
        if self.pending.is_empty() {
            self.oldest = None;
        }
        self.lost.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A buffer whose fence is the lease's key itself.
    fn push(b: &mut AckBuffer<()>, key: LeaseKey, seq: i64, now: Time) {
        b.push(key, &(), seq, now);
    }

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn due_by_age_of_the_oldest_row_or_by_count_of_at_least_rows_per_lease() {
        let delay = Duration::from_millis(50);
        let mut b = AckBuffer::default();
        assert!(!b.due(at(0), 2, delay));
        push(&mut b, (0, 1), 1, at(0));
        assert!(!b.due(at(49), 2, delay));
        assert!(b.due(at(50), 2, delay));
        push(&mut b, (0, 1), 2, at(10));
        assert!(!b.due(at(10), 2, delay), "one lease: at least ROWS_PER_LEASE rows");
        for seq in 3..=ROWS_PER_LEASE as i64 {
            push(&mut b, (0, 1), seq, at(10));
        }
        assert!(b.due(at(10), 2, delay));
        assert!(!b.due(at(10), ROWS_PER_LEASE + 1, delay), "a larger batch is the larger bound");
        push(&mut b, (1, 2), 100, at(10));
        assert!(!b.due(at(10), 2, delay), "two leases: twice as many");
    }

    #[test]
    fn take_empties_and_restore_merges_with_rows_acknowledged_meanwhile() {
        let mut b = AckBuffer::default();
        push(&mut b, (0, 1), 1, at(0));
        push(&mut b, (0, 1), 2, at(0));
        let batch = b.take();
        assert!(b.is_empty() && !b.due(at(1000), 1, Duration::from_millis(50)));
        push(&mut b, (0, 1), 3, at(5));
        b.restore(batch, at(6));
        let again = b.take();
        let mut seqs = again[&(0, 1)].1.clone();
        seqs.sort_unstable();
        assert_eq!(seqs, [1, 2, 3]);
    }

    #[test]
    fn a_forgotten_lease_leaves_nothing_to_renew() {
        let mut b = AckBuffer::default();
        push(&mut b, (0, 1), 1, at(0));
        push(&mut b, (1, 2), 2, at(0));
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
