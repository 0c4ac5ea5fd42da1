//! Heads read ahead under an expiry lease, judged by the holder's clock. Sans-IO: a part of
//! [`ExpiryDrain`](crate::store::expiry_drain::ExpiryDrain), which the SQLite store and the
//! simulation's expiry-lease client both drive.
//!
//! One fenced statement reads a batch of a partition's oldest rows; the holder then takes them
//! one at a time without going back to the store, but only while the lease's expiry, as the
//! store last answered it, lies more than `needed` (the delivery timeout plus the bound on the
//! skew between the store's clock and the holder's) ahead of the holder's clock: the rule of
//! [`LeaseSession::ensure_lasts`](crate::store::LeaseSession::ensure_lasts), which both holders
//! also check with [`ReadAhead::lasts`] just before each delivery. A head handed out
//! then is delivered, answered or timed out, before the lease can expire and another holder can
//! take the partition, exactly as if it had been read by its own fenced statement at that
//! moment. Once the rule no longer holds, [`ReadAhead::next`] answers `None` and the holder reads
//! from the store again, whose answer renews what it knows.
//!
//! What is buffered stays true because the lease holder is the only writer of its partition's
//! rows besides producers, whose rows come after every buffered one (a queue's seq is its commit
//! order): its own retries and dead letters drop the buffer ([`ReadAhead::clear`]); a row that
//! waits (a recorded backoff, the repartition barrier) ends a batch, so it is always read afresh;
//! a parked key's rows are passed over, and an unparked key's oldest row, which lies behind the
//! buffer, is read afresh once the holder clears the buffer.

use std::collections::VecDeque;
use std::time::Duration;

use crate::drain::ParkedKeys;
use crate::ids::{Seq, Time};
use crate::store::StoredHead;

/// The rows a lease read ahead and has not acknowledged, and the lease's expiry as the store
/// last answered it.
#[derive(Debug)]
pub struct ReadAhead {
    /// Buffered rows, oldest first; none of them waits.
    heads: VecDeque<StoredHead>,
    /// The lease's expiry by the holder's clock, no later than the store's: `None` until known.
    until: Option<Time>,
    /// The bound on the skew between the store's clock and the holder's.
    skew: Duration,
}

impl ReadAhead {
    /// An empty buffer of a holder whose clock is at most `skew` off the store's.
    pub fn new(skew: Duration) -> Self {
        Self { heads: VecDeque::new(), until: None, skew }
    }

    /// Records the store's answer that the lease lasts until `until`, converted to the holder's
    /// clock so that it is no later than the store's (the holder's time *before* it sent the
    /// statement, plus the time left the store answered). Keeps the later of two answers.
    pub fn expires(&mut self, until: Time) {
        self.until = Some(self.until.map_or(until, |t| t.max(until)));
    }

    /// Takes a batch read under the fence (the oldest rows after the last acknowledged one,
    /// parked keys passed over, oldest first): returns its first row, the partition's head, and
    /// keeps the rows up to the first that waits for the calls that follow. A head that waits is
    /// returned and nothing is kept, so that it is read again when its wait is over.
    pub fn fill(&mut self, batch: Vec<StoredHead>) -> Option<StoredHead> {
        self.heads.clear();
        let mut rows = batch.into_iter();
        let head = rows.next()?;
        if head.wait.is_none() {
            self.heads.push_back(head.clone());
            self.heads.extend(rows.take_while(|h| h.wait.is_none()));
        }
        Some(head)
    }

    /// The next buffered head whose key is not in `skip`, if the lease lasts a delivery
    /// (`delivery_timeout`) beyond `now`; `None` when the holder must read from the store. Rows
    /// of parked keys are dropped: an unparked key is read afresh after [`ReadAhead::clear`].
    pub fn next(
        &mut self,
        skip: &ParkedKeys,
        now: Time,
        delivery_timeout: Duration,
    ) -> Option<StoredHead> {
        if !self.lasts(now, delivery_timeout) {
            return None;
        }
        if !skip.is_empty() {
            self.heads.retain(|h| !skip.contains(&h.key));
        }
        self.heads.front().cloned()
    }

    /// Whether the lease, as last answered, lasts longer than `needed` plus the clock-skew
    /// bound beyond `now`.
    pub fn lasts(&self, now: Time, needed: Duration) -> bool {
        self.until.is_some_and(|until| lasts(now, until, needed + self.skew))
    }

    /// Row `seq` was acknowledged: it and every row before it leave the buffer.
    pub fn acked(&mut self, seq: Seq) {
        while self.heads.front().is_some_and(|h| h.seq <= seq) {
            self.heads.pop_front();
        }
    }

    /// Forgets every buffered row (the holder changed one, or an unparked key's rows lie
    /// behind them); the expiry stays known.
    pub fn clear(&mut self) {
        self.heads.clear();
    }

    /// Buffered rows.
    pub fn buffered(&self) -> usize {
        self.heads.len()
    }
}

/// The delivery rule of an expiry lease: a lease that expires at `until` (by the holder's clock,
/// no later than the store's) lasts more than `needed` beyond `now`.
pub fn lasts(now: Time, until: Time, needed: Duration) -> bool {
    now.saturating_add(needed) < until
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, key: &str, wait: Option<u64>) -> StoredHead {
        StoredHead {
            seq: Seq(seq),
            event_id: format!("e{seq}"),
            key: key.into(),
            payload: "{}".into(),
            attempts: 0,
            wait: wait.map(Duration::from_millis),
            last_error: None,
        }
    }

    /// The delivery timeout: with the 400 ms skew bound, a lease must last 1,000 ms more.
    const T: Duration = Duration::from_millis(600);

    fn ahead(until_ms: u64) -> ReadAhead {
        let mut r = ReadAhead::new(Duration::from_millis(400));
        r.expires(Time::from_millis(until_ms));
        r
    }

    #[test]
    fn len_counts_the_buffered_rows() {
        let mut r = ahead(10_000);
        assert_eq!(r.buffered(), 0);
        r.fill(vec![row(1, "a", None), row(2, "b", None), row(3, "c", Some(5))]);
        assert_eq!(r.buffered(), 2, "the row that waits is not kept");
        r.acked(Seq(1));
        assert_eq!(r.buffered(), 1);
        r.clear();
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn hands_out_buffered_rows_in_order_until_acknowledged() {
        let mut r = ahead(10_000);
        let head = r.fill(vec![row(1, "a", None), row(2, "b", None), row(3, "a", None)]);
        assert_eq!(head.map(|h| h.seq), Some(Seq(1)));
        let now = Time::from_millis(100);
        // Not acknowledged yet: the same head again, never the one behind it.
        assert_eq!(r.next(&ParkedKeys::NONE, now, T).map(|h| h.seq), Some(Seq(1)));
        r.acked(Seq(1));
        assert_eq!(r.next(&ParkedKeys::NONE, now, T).map(|h| h.seq), Some(Seq(2)));
        r.acked(Seq(2));
        r.acked(Seq(3));
        assert_eq!(r.next(&ParkedKeys::NONE, now, T), None, "empty: read from the store");
    }

    #[test]
    fn nothing_is_handed_out_once_the_lease_may_end_within_the_bound() {
        let mut r = ahead(10_000);
        r.fill(vec![row(1, "a", None), row(2, "b", None)]);
        // 8,999 + 1,000 < 10,000: lasts. 9,000 + 1,000 is not < 10,000: read from the store.
        assert!(r.next(&ParkedKeys::NONE, Time::from_millis(8_999), T).is_some());
        assert_eq!(r.next(&ParkedKeys::NONE, Time::from_millis(9_000), T), None);
        // A later answer from the store extends it; an earlier one does not shorten it.
        r.expires(Time::from_millis(20_000));
        r.expires(Time::from_millis(5_000));
        assert!(r.next(&ParkedKeys::NONE, Time::from_millis(9_000), T).is_some());
        // An unknown expiry never lasts.
        let mut unknown = ReadAhead::new(Duration::ZERO);
        let d = Duration::ZERO;
        unknown.fill(vec![row(1, "a", None)]);
        assert_eq!(unknown.next(&ParkedKeys::NONE, Time::ZERO, d), None);
    }

    #[test]
    fn a_row_that_waits_ends_the_batch_and_is_never_buffered() {
        let mut r = ahead(10_000);
        let head = r.fill(vec![row(1, "a", None), row(2, "b", Some(50)), row(3, "c", None)]);
        assert_eq!(head.map(|h| h.seq), Some(Seq(1)));
        assert_eq!(r.buffered(), 1, "only the rows before the waiting one");
        // A waiting head is returned, and nothing kept behind it.
        let head = r.fill(vec![row(2, "b", Some(50)), row(3, "c", None)]);
        assert_eq!(head.map(|h| h.wait.is_some()), Some(true));
        assert_eq!(r.buffered(), 0);
        assert_eq!(r.fill(Vec::new()), None);
    }

    #[test]
    fn parked_keys_are_passed_over_and_clear_forgets_everything() {
        let mut r = ahead(10_000);
        r.fill(vec![row(1, "a", None), row(2, "b", None), row(3, "a", None), row(4, "c", None)]);
        let now = Time::from_millis(1);
        let skip = ParkedKeys::new(["a".to_owned()]);
        assert_eq!(r.next(&skip, now, T).map(|h| h.seq), Some(Seq(2)));
        r.acked(Seq(2));
        assert_eq!(r.next(&skip, now, T).map(|h| h.seq), Some(Seq(4)));
        r.clear();
        assert_eq!(r.next(&ParkedKeys::NONE, now, T), None);
    }
}
