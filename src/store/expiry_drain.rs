//! The head reads and acknowledgements of a lease fenced by an epoch and an expiry (SQLite's
//! lease rows). Sans-IO: the SQLite store and the simulation's expiry-lease client each keep
//! one per lease and only translate what it asks for into statements, so the simulation proves
//! the composition production runs. [`crate::store::session_drain`] is its sibling for leases
//! that live as long as their session.
//!
//! * **Cursor.** Heads are read after the last acknowledged (or dead-lettered) seq, a batch of
//!   up to `read_ahead` rows at a time ([`crate::store::head_cursor`]). That is sound only where
//!   seq order is commit order, so no row can commit behind the cursor: SQLite serialises its
//!   writers, and the simulated store gives an expiry lease's queue its seqs at commit.
//! * **Served while the lease lasts.** A row read ahead is handed out without a statement only
//!   while the lease's expiry, as the store last answered it, lies the delivery timeout plus the
//!   clock-skew bound ahead of the holder's clock ([`crate::store::read_ahead`]); the holder
//!   tells the drain every answer its statements bring ([`ExpiryDrain::answered`]).
//! * **Acknowledgements buffered** per connection: every lease of one connection (one worker
//!   process in the simulation) shares one [`ExpiryAcks`], flushed in one transaction once
//!   `ack_batch` rows are buffered or the oldest is `ack_delay` old, whenever a partition runs
//!   empty, and before every other write of a lease (a retry, a dead letter, a renewal, the
//!   hand-back) ([`crate::store::ack_buffer`]). Each lease's rows are deleted only after its own
//!   fenced renewal in that flush; a lease refused there is lost ([`ExpiryDrain::is_lost`]).
//! * **Parked keys** are passed over by the read and never served from what was read ahead. An
//!   unparked key's oldest row lies behind the cursor, beside acknowledged rows whose deletes
//!   may still be buffered: the next read flushes them and starts from the partition's start.
//!   (Keeping the cursor would pass the unparked key's rows: the simulation's
//!   `cursor-past-parked` design checks this.)
//! * **Rows that change** (the holder's own retry or dead letter) drop what was read ahead, so
//!   it is read again; a row that waits ends a batch and is always read afresh.
//!
//! Call order per head: [`ExpiryDrain::plan_head`]; on [`ExpiryHeadPlan::Read`] flush first
//! when it says so, run the fenced read, report its expiry with [`ExpiryDrain::answered`] and
//! its rows with [`ExpiryDrain::filled`], and flush when that says so. After a delivery:
//! [`ExpiryDrain::acked`] (flush when it returns `true`), or [`ExpiryDrain::changing_row`] then
//! the fenced write (with the flush) and, for a dead letter, [`ExpiryDrain::dead_lettered`].

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use crate::drain::ParkedKeys;
use crate::ids::{Seq, Time};
use crate::store::ack_buffer::{AckBuffer, Batch};
use crate::store::head_cursor::HeadCursor;
use crate::store::read_ahead::ReadAhead;
use crate::store::StoredHead;

pub use crate::store::ack_buffer::LeaseKey;

/// How an expiry lease reads ahead and buffers acknowledgements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpiryDrainOptions {
    /// Rows read ahead per head read (1: none ahead).
    pub read_ahead: u32,
    /// Acknowledgements buffered before a batch delete.
    pub ack_batch: usize,
    /// The oldest an unflushed acknowledgement may be.
    pub ack_delay: Duration,
    /// The worker's delivery timeout: a row read ahead is handed out only while the lease
    /// lasts this plus `clock_skew` longer.
    pub delivery_timeout: Duration,
    /// The bound on the skew between the store's clock and the holder's.
    pub clock_skew: Duration,
}

/// The acknowledgements buffered by every expiry lease of one connection, deleted together.
/// `F` is what a flush needs to renew a lease under its fence. Clones share the buffer.
#[derive(Debug)]
pub struct ExpiryAcks<F>(Rc<RefCell<AckBuffer<F>>>);

impl<F> Clone for ExpiryAcks<F> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<F> Default for ExpiryAcks<F> {
    fn default() -> Self {
        Self(Rc::new(RefCell::new(AckBuffer::default())))
    }
}

impl<F: Clone> ExpiryAcks<F> {
    /// An empty buffer for one connection.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }

    /// Takes everything buffered, of every lease, for one flush; `None` when nothing is.
    pub fn take(&self) -> Option<Flush<F>> {
        let mut acks = self.0.borrow_mut();
        (!acks.is_empty()).then(|| Flush { batch: acks.take() })
    }

    /// A flush committed: each lease in `lost` was refused its fenced renewal (its rows stay
    /// queued and its next call must fail), the others' rows are gone.
    pub fn flushed(&self, lost: impl IntoIterator<Item = LeaseKey>) {
        self.0.borrow_mut().mark_lost(lost);
    }

    /// A flush failed as a whole at `now`: every row goes back, beside rows acknowledged
    /// meanwhile, so no acknowledged row is left behind a cursor that moved past it.
    pub fn failed(&self, flush: Flush<F>, now: Time) {
        self.0.borrow_mut().restore(flush.batch, now);
    }
}

/// One flush of a connection's buffered acknowledgements: per lease, its fence and its seqs.
/// Handed back with [`ExpiryAcks::failed`] when the flush fails as a whole.
#[derive(Clone, Debug)]
pub struct Flush<F> {
    batch: Batch<F>,
}

impl<F> Flush<F> {
    /// Each lease's rows to delete after its fenced renewal, in a fixed (key) order.
    pub fn leases(&self) -> impl Iterator<Item = (LeaseKey, &F, &[i64])> + '_ {
        self.batch.iter().map(|(key, (fence, seqs))| (*key, fence, seqs.as_slice()))
    }
}

/// What a head read must do, from [`ExpiryDrain::plan_head`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpiryHeadPlan {
    /// Hand out this row read ahead: the lease lasts a delivery.
    Serve(StoredHead),
    /// Read a batch from the store, and hand it to [`ExpiryDrain::filled`].
    Read(ExpiryRead),
}

/// One fenced batch read: the oldest rows after `after`, the parked keys passed over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiryRead {
    /// Read the rows with a seq above this one (zero: from the partition's start).
    pub after: Seq,
    /// At most this many rows.
    pub limit: u32,
    /// Flush the buffered acknowledgements before the read: a key was unparked, and its rows
    /// lie beside acknowledged rows whose deletes may still be buffered.
    pub flush_first: bool,
}

/// A batch read's outcome, from [`ExpiryDrain::filled`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiryFilled {
    /// The partition's head, if any.
    pub head: Option<StoredHead>,
    /// Flush the buffered acknowledgements now: the partition ran empty, so nothing is gained
    /// by holding the deletes back (and the flush proves the lease is still held).
    pub flush: bool,
}

/// One expiry lease's cursor, rows read ahead and share of its connection's acknowledgements.
#[derive(Debug)]
pub struct ExpiryDrain<F: Clone> {
    options: ExpiryDrainOptions,
    /// This lease in `acks`.
    key: LeaseKey,
    /// What a flush renews this lease under.
    fence: F,
    cursor: HeadCursor,
    ahead: ReadAhead,
    acks: ExpiryAcks<F>,
    /// An unpark sends the cursor back to the start (always, except in the simulation's
    /// `cursor-past-parked` design).
    rewind_on_unpark: bool,
}

impl<F: Clone> ExpiryDrain<F> {
    /// The drain of the lease `key`, fenced by `fence`, whose acknowledgements join `acks`.
    pub fn new(options: ExpiryDrainOptions, key: LeaseKey, fence: F, acks: &ExpiryAcks<F>) -> Self {
        Self {
            options,
            key,
            fence,
            cursor: HeadCursor::new(),
            ahead: ReadAhead::new(options.clock_skew),
            acks: acks.clone(),
            rewind_on_unpark: true,
        }
    }

    /// A broken rule for the simulation's catalogue (`cursor-past-parked`): an unpark leaves
    /// the cursor where acknowledgements of other keys moved it, past the unparked key's rows.
    /// Only in builds with the `broken-designs` feature, which no production build enables.
    #[cfg(feature = "broken-designs")]
    pub fn keeping_the_cursor_on_unpark(mut self) -> Self {
        self.rewind_on_unpark = false;
        self
    }

    /// The options it runs with.
    pub fn options(&self) -> ExpiryDrainOptions {
        self.options
    }

    /// This lease's key in its connection's buffer.
    pub fn key(&self) -> LeaseKey {
        self.key
    }

    /// The connection's shared buffer, for a flush.
    pub fn acks(&self) -> &ExpiryAcks<F> {
        &self.acks
    }

    /// Whether a flush (this lease's or another's) found the lease lost: every further call
    /// of the lease must fail.
    pub fn is_lost(&self) -> bool {
        self.acks.0.borrow().is_lost(self.key)
    }

    /// The store answered that the lease lasts until `until`, by the holder's clock and no
    /// later than the store's (the holder's time before it sent the statement plus the time
    /// left the store answered). The later of two answers stands.
    pub fn answered(&mut self, until: Time) {
        self.ahead.expires(until);
    }

    /// Whether the lease, as last answered, lasts `needed` plus the clock-skew bound beyond
    /// `now`: the rule every delivery is checked against before it starts.
    pub fn lasts(&self, now: Time, needed: Duration) -> bool {
        self.ahead.lasts(now, needed)
    }

    /// What a head read passing over `skip` must do at `now`.
    pub fn plan_head(&mut self, skip: &ParkedKeys, now: Time) -> ExpiryHeadPlan {
        let before = self.cursor.after();
        let unparked = self.cursor.look(skip);
        if unparked {
            if !self.rewind_on_unpark {
                self.cursor.passed(Seq(before));
            }
            self.ahead.clear();
        } else if let Some(head) = self.ahead.next(skip, now, self.options.delivery_timeout) {
            return ExpiryHeadPlan::Serve(head);
        }
        ExpiryHeadPlan::Read(ExpiryRead {
            after: Seq(self.cursor.after()),
            limit: self.options.read_ahead.max(1),
            flush_first: unparked,
        })
    }

    /// Takes the rows a fenced read returned (oldest first, parked keys passed over): the head
    /// is the first, and the rows up to the first that waits are kept for the calls that follow.
    pub fn filled(&mut self, rows: Vec<StoredHead>) -> ExpiryFilled {
        // Cheap (a batch is at most `read_ahead` rows) and kept in every build: a store whose
        // read broke either would have the drain hand out a row out of order.
        assert!(
            rows.windows(2).all(|w| w[0].seq < w[1].seq),
            "a head read returned rows out of seq order: {:?}",
            rows.iter().map(|h| h.seq.0).collect::<Vec<_>>()
        );
        assert!(
            rows.first().is_none_or(|h| h.seq.0 > self.cursor.after()),
            "a head read returned seq {} at or behind its cursor {}",
            rows.first().map_or(0, |h| h.seq.0),
            self.cursor.after()
        );
        let head = self.ahead.fill(rows);
        let flush = head.is_none();
        ExpiryFilled { head, flush }
    }

    /// Row `seq` was delivered and acknowledged at `now`: its delete is buffered, reads start
    /// after it. Returns whether a flush is due.
    pub fn acked(&mut self, seq: Seq, now: Time) -> bool {
        let mut acks = self.acks.0.borrow_mut();
        acks.push(self.key, &self.fence, seq.0, now);
        let due = acks.due(now, self.options.ack_batch, self.options.ack_delay);
        drop(acks);
        self.cursor.passed(seq);
        self.ahead.acked(seq);
        due
    }

    /// The holder is about to change one of its rows (a retry's recorded wait, a dead letter):
    /// what was read ahead is read again. The buffered acknowledgements go first, in or before
    /// the same fenced write.
    pub fn changing_row(&mut self) {
        self.ahead.clear();
    }

    /// Row `seq` was dead-lettered: reads start after it.
    pub fn dead_lettered(&mut self, seq: Seq) {
        self.cursor.passed(seq);
    }

    /// Rows read ahead and not yet acknowledged.
    pub fn read_ahead_len(&self) -> usize {
        self.ahead.buffered()
    }
}

impl<F: Clone> Drop for ExpiryDrain<F> {
    fn drop(&mut self) {
        // The lease is gone: its unflushed rows stay queued for the next holder, and no later
        // flush renews a lease nobody holds.
        self.acks.0.borrow_mut().forget(self.key);
    }
}

#[cfg(test)]
mod tests;
