//! The head reads and acknowledgements of a lease that lives as long as its session
//! (PostgreSQL's advisory lock). Sans-IO: the PostgreSQL store and the simulation's
//! session-lock client each keep one per lease, so the simulation proves the code production
//! runs.
//!
//! * **Cursor.** Heads are read after the last acknowledged seq, a batch of up to
//!   `read_ahead` rows at a time; delivery stays one at a time. A read that ignores the cursor
//!   (a *full* read) runs when the cursor read finds nothing and at least every
//!   `full_scan_every`, so a row that committed late, behind the cursor, is still found.
//! * **Served while heard.** A row read ahead is handed out without a round trip only while the
//!   session answered less than `ack_delay` ago; after that one round trip proves it again (the
//!   buffered acknowledgements if any, else a ping). An answer counts from when its statement
//!   was sent, not when it is read, and the lease asks again right before the send
//!   ([`SessionDrain::must_prove`]), so a holder stopped in between (SIGSTOP, a frozen VM)
//!   whose session ended meanwhile sends nothing. A holder whose session was lost may thus
//!   start a delivery up to `ack_delay` after the loss: the liveness margin and the takeover
//!   wait of a lease taken after a lost session both include it
//!   ([`crate::store::postgres::admin::takeover_delay`]).
//! * **Acknowledgements buffered.** They are deleted together once `ack_batch` are buffered or
//!   the oldest is `ack_delay` old, and before every other statement of the lease (a head read
//!   from the store, a retry, a dead letter, the hand-back). A session lost with some buffered
//!   only redelivers them.
//! * **Parked keys** are passed over by the read and never served from what was read ahead:
//!   parking a key drops the read-ahead. While a key is parked, acknowledgements of other keys
//!   move the cursor past its rows, so unparking it sends the cursor back to the start: reads
//!   go from the beginning until acknowledgements, now in seq order again, move it on. (Keeping
//!   the cursor and making only the next read a full one would let a read after the cursor
//!   pass the unparked key's rows once another key was parked: the simulation's
//!   `cursor-past-parked` design checks this.)
//! * **Late commits.** A row takes its seq at the insert and may commit after rows with higher
//!   seqs were delivered and acknowledged (a long producer transaction): a read after the last
//!   acknowledged seq would pass it, and its key's next row could go first. So each read
//!   reports the transactions its snapshot saw running (PostgreSQL's `pg_snapshot_xip`), and
//!   the drain watches each, with the highest seq read before it was first seen running: every
//!   transaction takes its id before its seq (`keyorder_next_seq()`, schema version 8), so its
//!   rows lie above that seq. Each read also asks, in the same statement, whether a watched
//!   transaction committed a row at or below where it started (each row records the id of the
//!   transaction that inserted it, `producer_xid`, indexed per partition). Only then are the
//!   read's rows dropped, the cursor moved back to where that transaction's rows can lie and
//!   the rows read again from there. A transaction that inserts nothing (an acknowledgement's
//!   delete, an idle session holding an id) costs no read. (Trusting the cursor alone
//!   would let a row committed behind it wait for the next full read while its key's later
//!   rows went first: the simulation's `cursor-past-late-commit` design checks this.)
//! * **Rows that wait** (a recorded retry time, or the online repartition's barrier) end a
//!   batch, and as the head are read again at the next look: a wait is only as fresh as the read
//!   that returned it. (Serving a waiting head again from the read-ahead would hand out the same
//!   wait every time: with `--strict-partition-order` a partition would wait for its head over
//!   and over until a full read.)

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::drain::ParkedKeys;
use crate::ids::{Seq, Time};
use crate::store::StoredHead;

/// How a session lease reads ahead and buffers acknowledgements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionDrainOptions {
    /// Rows read ahead per head read.
    pub read_ahead: u32,
    /// Acknowledgements buffered before a batch delete.
    pub ack_batch: usize,
    /// The oldest an unflushed acknowledgement, and the last contact behind a row served from
    /// the read-ahead, may be.
    pub ack_delay: Duration,
    /// How often a head read ignores the cursor, to find rows that committed late.
    pub full_scan_every: Duration,
}

impl Default for SessionDrainOptions {
    /// PostgreSQL's defaults: 64 rows ahead, 128 acknowledgements or 50 ms, a full read every
    /// second.
    fn default() -> Self {
        Self {
            read_ahead: 64,
            ack_batch: 128,
            ack_delay: Duration::from_millis(50),
            full_scan_every: Duration::from_secs(1),
        }
    }
}

/// What a head read must do, from [`SessionDrain::plan_head`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadPlan {
    /// Hand out this row read ahead: the session was heard recently enough.
    Serve(StoredHead),
    /// Prove the session with one round trip (flush the buffered acknowledgements if any, else
    /// a ping), report it with [`SessionDrain::heard`], then hand out [`SessionDrain::head`].
    Prove,
    /// Flush the buffered acknowledgements, read a batch, and hand it to
    /// [`SessionDrain::filled`].
    Read(Read),
}

/// What a head read's own snapshot showed beside its rows.
#[derive(Clone, Copy, Debug)]
pub struct Seen<'a> {
    /// The ids of the transactions running (PostgreSQL's `pg_snapshot_xip`).
    pub running: &'a [u64],
    /// Whether a row of the partition at or below the read's `after` was inserted by one of
    /// the transactions [`SessionDrain::watched`] named: a commit behind the cursor.
    pub late: bool,
}

/// One batch read: the rows after `after` (every row when it is zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Read {
    /// Read the rows with a seq above this one.
    pub after: Seq,
    full: bool,
    /// The clock when the head read was asked for.
    at: Time,
}

/// One lease's cursor, rows read ahead and buffered acknowledgements. `Clone` copies all of it
/// (the model checker keeps one copy per explored state).
#[derive(Clone, Debug)]
pub struct SessionDrain {
    options: SessionDrainOptions,
    /// The last acknowledged (or dead-lettered) seq: head reads start after it.
    cursor: Seq,
    /// The highest seq any read returned.
    seen: Seq,
    /// Transactions a read saw running, each with the seq its rows lie above: `seen` before
    /// the read that first saw it (a transaction that started after a snapshot takes a seq
    /// above every seq that snapshot could see).
    watched: BTreeMap<u64, Seq>,
    /// Rows read ahead, head first, none of a key in `skipped`. Only the head may wait (its
    /// retry time, or the barrier), and then it is the only row.
    ahead: VecDeque<StoredHead>,
    /// The parked keys the last head read passed over.
    skipped: ParkedKeys,
    /// Acknowledged seqs not yet deleted.
    acks: Vec<Seq>,
    oldest_ack: Option<Time>,
    /// When the session last answered.
    heard_at: Time,
    full_scan_at: Time,
    /// The last read, from the beginning, found nothing: the next starts there too, since a
    /// read after the cursor would find nothing either and be followed by one that does.
    drained: bool,
    /// An unpark sends the cursor back to the start (always, except in the simulation's
    /// `cursor-past-parked` design).
    rewind_on_unpark: bool,
    /// Reads start after the cursor whatever may still commit below it (only in the
    /// simulation's `cursor-past-late-commit` design).
    trust_cursor: bool,
}

impl SessionDrain {
    /// The drain of a lease taken at `now` (its session just answered).
    pub fn new(options: SessionDrainOptions, now: Time) -> Self {
        Self {
            options,
            cursor: Seq(0),
            seen: Seq(0),
            watched: BTreeMap::new(),
            ahead: VecDeque::new(),
            skipped: ParkedKeys::NONE,
            acks: Vec::new(),
            oldest_ack: None,
            heard_at: now,
            full_scan_at: now,
            drained: false,
            rewind_on_unpark: true,
            trust_cursor: false,
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

    /// A broken rule for the simulation's catalogue (`cursor-past-late-commit`): reads start
    /// after the last acknowledged seq even while a transaction that took a lower seq may still
    /// commit. Only in builds with the `broken-designs` feature, which no production build
    /// enables.
    #[cfg(feature = "broken-designs")]
    pub fn trusting_the_cursor(mut self) -> Self {
        self.trust_cursor = true;
        self
    }

    /// The parked keys the read-ahead passes over (what a read from the store must skip).
    pub fn skipped(&self) -> &ParkedKeys {
        &self.skipped
    }

    /// The options it runs with.
    pub fn options(&self) -> SessionDrainOptions {
        self.options
    }

    /// What a head read passing over `skip` must do at `now`.
    pub fn plan_head(&mut self, skip: &ParkedKeys, now: Time) -> HeadPlan {
        let mut full = now.saturating_since(self.full_scan_at) >= self.options.full_scan_every;
        if self.skipped != *skip {
            // A key was parked (its rows may be read ahead) or unparked: drop the read-ahead.
            // An unparked key's rows may lie behind the cursor, which acknowledgements of other
            // keys moved past them: reads start from the beginning again until acknowledgements
            // move the cursor, so no read after it can pass over them.
            if !self.skipped.is_subset(skip) {
                full = true;
                if self.rewind_on_unpark {
                    self.cursor = Seq(0);
                }
            }
            self.ahead.clear();
            self.skipped = skip.clone();
        }
        if !full {
            // A head that waits is read again: its wait is only as fresh as the read.
            if let Some(head) = self.ahead.front().filter(|h| h.wait.is_none()) {
                // A partition slower than one delivery per `ack_delay` keeps its read-ahead:
                // one round trip proves the session instead of a re-read.
                if self.must_prove(now) {
                    return HeadPlan::Prove;
                }
                return HeadPlan::Serve(head.clone());
            }
        }
        let full = full || self.drained;
        let after = if full { Seq(0) } else { self.cursor };
        HeadPlan::Read(Read { after, full, at: now })
    }

    /// Whether the session must be proved (one round trip) before a delivery starts at `now`:
    /// its last answer is `ack_delay` old or older. A head is served only while the session was
    /// heard within `ack_delay`, but a holder stopped between that and the send (SIGSTOP, a
    /// frozen VM) may wake after its session ended some other way than by silence (a server
    /// restart, a terminated backend) and its partition was taken: asked again right before the
    /// send, this stops it.
    pub fn must_prove(&self, now: Time) -> bool {
        now.saturating_since(self.heard_at) >= self.options.ack_delay
    }

    /// The session answered a statement sent at `sent_at`. The answer proves the session alive
    /// when the store ran the statement, which was after `sent_at` but may be long before the
    /// answer is read: a process stopped (SIGSTOP, a frozen VM) while its answer waited in the
    /// socket reads it on waking, after its session may have been ended and its lease taken.
    /// So the send, not the read, is when it was heard.
    pub fn heard(&mut self, sent_at: Time) {
        self.heard_at = self.heard_at.max(sent_at);
    }

    /// The row to hand out: the oldest read ahead.
    pub fn head(&self) -> Option<StoredHead> {
        self.ahead.front().cloned()
    }

    /// The transactions a head read must ask about ([`Seen::late`]): those its earlier reads
    /// saw running.
    pub fn watched(&self) -> Vec<u64> {
        if self.trust_cursor {
            return Vec::new();
        }
        self.watched.keys().copied().collect()
    }

    /// Takes in the rows `read` returned, oldest first, and what its snapshot showed; the
    /// session counts as heard when the read was planned (see [`Self::heard`]). Returns the read to run next, if any: when a watched transaction
    /// committed rows below where `read` started, a read from below them (these rows are
    /// dropped); when nothing was found after the cursor, one read from the beginning.
    pub fn filled(
        &mut self,
        read: Read,
        mut rows: Vec<StoredHead>,
        seen: Seen<'_>,
    ) -> Option<Read> {
        self.heard(read.at);
        let behind = self.watch(&rows, seen.running);
        if seen.late {
            // A watched transaction committed a row at or below where the read started: it
            // has finished, so `behind` names where its rows can lie.
            let from = behind.unwrap_or(Seq(0)).min(read.after);
            self.ahead.clear();
            self.cursor = self.cursor.min(from);
            return Some(Read { after: from, full: false, at: read.at });
        }
        // A row that waits (its retry time, or the barrier) is handed out as the head at most
        // once and never kept behind another: served again later, its wait would be as stale
        // as the read. It ends the batch, and as the head it is read afresh next time.
        if let Some(first) = rows.iter().position(|h| h.wait.is_some()) {
            rows.truncate(first.max(1));
        }
        self.ahead = rows.into();
        if self.ahead.is_empty() && !read.full && read.after > Seq(0) {
            return Some(Read { after: Seq(0), full: false, at: read.at });
        }
        if read.full || self.ahead.is_empty() {
            self.full_scan_at = read.at;
        }
        self.drained = self.ahead.is_empty();
        None
    }

    /// Takes in what a read saw: stops watching the transactions no longer running and returns
    /// the lowest seq their rows lie above, starts watching the new ones, and notes the
    /// highest seq read.
    fn watch(&mut self, rows: &[StoredHead], running: &[u64]) -> Option<Seq> {
        let mut running = running.to_vec();
        running.sort_unstable();
        let mut behind: Option<Seq> = None;
        self.watched.retain(|xid, from| {
            let still = running.binary_search(xid).is_ok();
            if !still {
                behind = Some(behind.map_or(*from, |b| b.min(*from)));
            }
            still
        });
        for xid in running {
            self.watched.entry(xid).or_insert(self.seen);
        }
        if let Some(highest) = rows.iter().map(|h| h.seq).max() {
            self.seen = self.seen.max(highest);
        }
        behind
    }

    /// Records the acknowledgement of `seq` at `now`; `true` when the buffered ones are due to
    /// be deleted ([`Self::take_acks`]).
    pub fn acked(&mut self, seq: Seq, now: Time) -> bool {
        if self.ahead.front().is_some_and(|h| h.seq == seq) {
            self.ahead.pop_front();
        }
        self.acks.push(seq);
        self.cursor = self.cursor.max(seq);
        let oldest = *self.oldest_ack.get_or_insert(now);
        self.acks.len() >= self.options.ack_batch
            || now.saturating_since(oldest) >= self.options.ack_delay
    }

    /// Whether acknowledgements are buffered.
    pub fn has_acks(&self) -> bool {
        !self.acks.is_empty()
    }

    /// The buffered acknowledgements, for one delete; the caller reports its answer with
    /// [`Self::heard`]. A failed delete means a lost session: the rows stay queued for the next
    /// holder, which redelivers them.
    pub fn take_acks(&mut self) -> Vec<Seq> {
        self.oldest_ack = None;
        std::mem::take(&mut self.acks)
    }

    /// A row of the lease changed (a retry was recorded): what was read ahead is read again.
    pub fn changed(&mut self) {
        self.ahead.clear();
    }

    /// Row `seq` was moved to the dead-letter table.
    pub fn dead_lettered(&mut self, seq: Seq) {
        self.ahead.clear();
        self.cursor = self.cursor.max(seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read's snapshot with no transaction running and no late commit.
    const QUIET: Seen<'static> = Seen { running: &[], late: false };

    /// A snapshot with `ids` running and no late commit.
    fn running(ids: &[u64]) -> Seen<'_> {
        Seen { running: ids, late: false }
    }

    /// A snapshot with nothing running, where a watched transaction committed a row behind
    /// the cursor.
    const LATE: Seen<'static> = Seen { running: &[], late: true };

    fn ms(n: u64) -> Time {
        Time(Duration::from_millis(n))
    }

    fn row(seq: i64, key: &str) -> StoredHead {
        StoredHead {
            seq: Seq(seq),
            event_id: format!("e{seq}"),
            key: key.into(),
            payload: String::new(),
            attempts: 0,
            wait: None,
            last_error: None,
        }
    }

    /// A row that waits 100 ms: its retry time, or the barrier's hold.
    fn waits(seq: i64, key: &str) -> StoredHead {
        StoredHead { wait: Some(Duration::from_millis(100)), ..row(seq, key) }
    }

    fn read(plan: HeadPlan) -> Read {
        match plan {
            HeadPlan::Read(r) => r,
            other => panic!("expected a read, got {other:?}"),
        }
    }

    #[test]
    fn a_full_read_that_found_rows_restarts_the_full_scan_period() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        // A second after the start, the read is a full one.
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1_000)));
        assert!(r.full);
        assert_eq!(d.filled(r, vec![row(1, "a"), row(2, "b")], QUIET), None);
        // It found rows, and it counts as the period's full read: the batch is served.
        assert_eq!(d.plan_head(&ParkedKeys::NONE, ms(1_002)), HeadPlan::Serve(row(1, "a")));
    }

    #[test]
    fn acknowledgements_are_buffered_until_taken() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        assert!(!d.has_acks());
        assert!(!d.acked(Seq(1), ms(1)), "one ack, 0 ms old: not due");
        assert!(d.has_acks());
        assert_eq!(d.take_acks(), vec![Seq(1)]);
        assert!(!d.has_acks());
    }

    #[test]
    fn rows_are_served_from_the_batch_while_the_session_was_heard_within_ack_delay() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        assert_eq!(r.after, Seq(0));
        assert_eq!(d.filled(r, vec![row(1, "a"), row(2, "b")], QUIET), None);
        assert_eq!(d.plan_head(&ParkedKeys::NONE, ms(3)), HeadPlan::Serve(row(1, "a")));
        assert!(!d.acked(Seq(1), ms(4)));
        assert_eq!(d.plan_head(&ParkedKeys::NONE, ms(40)), HeadPlan::Serve(row(2, "b")));
        // 50 ms after the last answer: prove the session before serving.
        assert_eq!(d.plan_head(&ParkedKeys::NONE, ms(52)), HeadPlan::Prove);
        d.heard(ms(53));
        assert_eq!(d.plan_head(&ParkedKeys::NONE, ms(54)), HeadPlan::Serve(row(2, "b")));
    }

    /// An answer proves the session when its statement was sent, however late it is read (a
    /// stopped process reads on waking an answer that waited in its socket), and a send after
    /// `ack_delay` of silence needs the session proved again.
    #[test]
    fn the_session_counts_as_heard_when_the_statement_was_sent() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        // Answered (read) whenever: heard at 1 ms, when the read was planned and sent.
        d.filled(r, vec![row(1, "a"), row(2, "b")], QUIET);
        assert!(!d.must_prove(ms(50)));
        assert!(d.must_prove(ms(51)), "heard at the send, 50 ms before");
        assert_eq!(d.plan_head(&ParkedKeys::NONE, ms(51)), HeadPlan::Prove);
        // An older statement answered later does not move the record back.
        d.heard(ms(60));
        d.heard(ms(55));
        assert!(!d.must_prove(ms(109)));
        assert!(d.must_prove(ms(110)));
    }

    #[test]
    fn an_empty_cursor_read_looks_behind_the_cursor_once() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(5, "a")], QUIET);
        assert!(!d.acked(Seq(5), ms(2)));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(3)));
        assert_eq!(r.after, Seq(5));
        let again = d.filled(r, vec![], QUIET).expect("a look behind the cursor");
        assert_eq!(again.after, Seq(0));
        assert_eq!(d.filled(again, vec![row(4, "late")], QUIET), None);
        assert_eq!(d.head(), Some(row(4, "late")));
    }

    #[test]
    fn an_empty_partition_is_looked_at_with_one_read_from_the_beginning() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(5, "a")], QUIET);
        d.acked(Seq(5), ms(2));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(3)));
        let again = d.filled(r, vec![], QUIET).expect("a look behind the cursor");
        assert_eq!(d.filled(again, vec![], QUIET), None);
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(100)));
        assert_eq!(r.after, Seq(0), "no read after the cursor first");
        assert_eq!(d.filled(r, vec![], QUIET), None, "and no second read");
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(200)));
        d.filled(r, vec![row(9, "b")], QUIET);
        d.acked(Seq(9), ms(202));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(203)));
        assert_eq!(r.after, Seq(9), "rows found: the cursor again");
    }

    #[test]
    fn acknowledgements_are_due_by_count_or_by_age() {
        let options = SessionDrainOptions { ack_batch: 2, ..SessionDrainOptions::default() };
        let mut d = SessionDrain::new(options, ms(0));
        assert!(!d.acked(Seq(1), ms(0)));
        assert!(d.acked(Seq(2), ms(1)));
        assert_eq!(d.take_acks(), vec![Seq(1), Seq(2)]);
        assert!(!d.has_acks());
        assert!(!d.acked(Seq(3), ms(10)));
        assert!(d.acked(Seq(4), ms(60)), "the oldest is 50 ms old");
    }

    #[test]
    fn unparking_a_key_forces_a_full_read_and_parking_drops_the_batch() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(1, "a"), row(2, "b"), row(3, "a")], QUIET);
        d.acked(Seq(1), ms(2));
        let parked = ParkedKeys::new(["a".to_owned()]);
        let r = read(d.plan_head(&parked, ms(3)));
        assert_eq!(r.after, Seq(1), "parking reads on from the cursor");
        d.filled(r, vec![row(2, "b")], QUIET);
        d.acked(Seq(2), ms(4));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(5)));
        assert_eq!(r.after, Seq(0), "unparking reads from the start");
    }

    #[test]
    fn it_reports_its_options_and_the_keys_its_reads_pass_over() {
        let options =
            SessionDrainOptions { ack_delay: Duration::from_millis(7), ..Default::default() };
        let mut d = SessionDrain::new(options, ms(0));
        assert_eq!(d.options(), options);
        assert_eq!(d.skipped(), &ParkedKeys::NONE);
        let parked = ParkedKeys::new(["a".to_owned()]);
        d.plan_head(&parked, ms(1));
        assert_eq!(d.skipped(), &parked);
    }

    /// Parks `a` past an acknowledgement of `b`, unparks it, takes one full read, then parks
    /// `b`: where the next read starts (the unpark's rewind, or the cursor kept past `a`'s rows).
    fn read_after_an_unpark(mut d: SessionDrain) -> Seq {
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(1, "a"), row(2, "b"), row(3, "a")], QUIET);
        d.acked(Seq(1), ms(2));
        let r = read(d.plan_head(&ParkedKeys::new(["a".to_owned()]), ms(3)));
        d.filled(r, vec![row(2, "b")], QUIET);
        d.acked(Seq(2), ms(4));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(5)));
        assert!(r.full, "an unpark forces a full read");
        d.filled(r, vec![row(3, "a")], QUIET);
        read(d.plan_head(&ParkedKeys::new(["b".to_owned()]), ms(6))).after
    }

    #[test]
    fn an_unpark_rewinds_the_cursor_for_the_reads_after_it() {
        let d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        assert_eq!(read_after_an_unpark(d), Seq(0));
    }

    #[cfg(feature = "broken-designs")]
    #[test]
    fn keeping_the_cursor_on_unpark_reads_on_past_the_unparked_keys_rows() {
        let d =
            SessionDrain::new(SessionDrainOptions::default(), ms(0)).keeping_the_cursor_on_unpark();
        assert_eq!(read_after_an_unpark(d), Seq(2), "the broken rule reads past a's row 3");
    }

    #[test]
    fn a_row_the_barrier_holds_is_read_again_and_a_full_read_comes_every_second() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![waits(1, "a")], QUIET);
        assert!(matches!(d.plan_head(&ParkedKeys::NONE, ms(2)), HeadPlan::Read(_)));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(3)));
        d.filled(r, vec![row(1, "a"), row(2, "b")], QUIET);
        d.acked(Seq(1), ms(4));
        assert!(matches!(d.plan_head(&ParkedKeys::NONE, ms(5)), HeadPlan::Serve(_)));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1_004)));
        assert_eq!(r.after, Seq(0), "a second after the last full read");
    }

    #[test]
    fn a_row_that_waits_ends_the_batch_and_as_the_head_is_read_again() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(1, "a"), waits(2, "b"), row(3, "c")], QUIET);
        assert_eq!(d.plan_head(&ParkedKeys::NONE, ms(2)), HeadPlan::Serve(row(1, "a")));
        d.acked(Seq(1), ms(3));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(4)));
        assert_eq!(r.after, Seq(1), "the waiting row was not kept");
        d.filled(r, vec![waits(2, "b"), row(3, "c")], QUIET);
        assert_eq!(d.head(), Some(waits(2, "b")));
        // Its wait is over 100 ms later: the head is read again, not served with the old wait.
        assert!(matches!(d.plan_head(&ParkedKeys::NONE, ms(105)), HeadPlan::Read(_)));
    }

    #[test]
    fn retries_and_dead_letters_drop_the_batch() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(1, "a"), row(2, "b")], QUIET);
        d.changed();
        assert!(matches!(d.plan_head(&ParkedKeys::NONE, ms(2)), HeadPlan::Read(_)));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(2)));
        d.filled(r, vec![row(1, "a"), row(2, "b")], QUIET);
        d.dead_lettered(Seq(1));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(3)));
        assert_eq!(r.after, Seq(1));
    }

    #[test]
    fn a_row_committed_behind_the_cursor_is_read_before_its_keys_next_row() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        // Transaction 7 took seq 2 for key "k" and has not committed: rows 1 and 3 are seen.
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(1, "a"), row(3, "b")], running(&[7]));
        assert_eq!(d.watched(), vec![7]);
        d.acked(Seq(1), ms(2));
        d.acked(Seq(3), ms(3));
        d.take_acks();
        // Transaction 7 commits seq 2, and key "k"'s next row (seq 4) commits after it.
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(4)));
        assert_eq!(r.after, Seq(3));
        let behind = d.filled(r, vec![row(4, "k")], LATE).expect("a read from behind");
        assert_eq!(behind.after, Seq(0), "transaction 7 was running at the first read");
        assert_eq!(d.head(), None, "the rows read after the cursor are dropped");
        assert_eq!(d.filled(behind, vec![row(2, "k"), row(4, "k")], QUIET), None);
        assert_eq!(d.head(), Some(row(2, "k")));
        assert!(d.watched().is_empty());
        d.acked(Seq(2), ms(7));
        d.acked(Seq(4), ms(8));
        assert_eq!(read(d.plan_head(&ParkedKeys::NONE, ms(9))).after, Seq(4));
    }

    #[test]
    fn a_transaction_that_started_after_a_read_is_looked_for_only_above_what_it_saw() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(1, "a"), row(3, "b")], QUIET);
        d.acked(Seq(1), ms(2));
        d.acked(Seq(3), ms(3));
        // Transaction 9 starts after that read, takes seq 5 and stays open while 6 goes.
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(4)));
        d.filled(r, vec![row(6, "c")], running(&[9]));
        d.acked(Seq(6), ms(6));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(7)));
        assert_eq!(r.after, Seq(6));
        let behind = d.filled(r, vec![row(7, "c")], LATE).expect("a read from behind");
        assert_eq!(behind.after, Seq(3), "its rows lie above seq 3, the highest read before it");
    }

    #[test]
    fn a_transaction_that_commits_nothing_behind_the_cursor_costs_no_read_from_behind() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0));
        for (i, seq) in (1..=5).enumerate() {
            let r = read(d.plan_head(&ParkedKeys::NONE, ms(10 * i as u64)));
            assert_eq!(r.after, Seq(seq - 1));
            // Transaction 4 (an idle session holding an id) runs through every read, and
            // each read sees another (an acknowledgement's delete) that finished since.
            let ids = [4, 100 + seq as u64];
            assert_eq!(d.filled(r, vec![row(seq, "a")], running(&ids)), None);
            d.acked(Seq(seq), ms(10 * i as u64 + 2));
        }
        assert_eq!(d.watched(), vec![4, 105]);
    }

    #[cfg(feature = "broken-designs")]
    #[test]
    fn trusting_the_cursor_passes_a_row_that_commits_late() {
        let mut d = SessionDrain::new(SessionDrainOptions::default(), ms(0)).trusting_the_cursor();
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(1)));
        d.filled(r, vec![row(1, "a"), row(3, "b")], running(&[7]));
        assert!(d.watched().is_empty(), "nothing is asked about");
        d.acked(Seq(1), ms(2));
        d.acked(Seq(3), ms(3));
        let r = read(d.plan_head(&ParkedKeys::NONE, ms(4)));
        assert_eq!(d.filled(r, vec![row(4, "k")], QUIET), None, "no read from behind");
        assert_eq!(d.head(), Some(row(4, "k")));
    }
}
