//! The store host: the queue, the dead-letter table and the leases, in memory, with the
//! semantics that matter here:
//!
//! * an insert is invisible until its transaction commits;
//! * a restart drops every session and uncommitted insert, and keeps committed rows (they live
//!   in [`Durable`], outside the host factory);
//! * the leases follow one of two models ([`Leases`]), one file each: PostgreSQL's session
//!   advisory locks (`session_locks.rs`) or SQLite's lease rows with an epoch and an expiry
//!   (`expiry_rows.rs`).
//!
//! The store-side designs of the broken-design catalogue (`designs.rs`) are a decorator around
//! the correct store: a request goes through [`StoreState::handle`], which hands it to the
//! decorator only when a design is switched on; the correct rules here take no switch.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use keyorder::check::{Acked, DeadLettered, Enqueued, LeaseChange, LeaseEvent};
use keyorder::drain::ParkedKeys;
use keyorder::repartition::{barrier, Barrier, DEFAULT_HOLD_POLL};
use keyorder::{Epoch, PartitionId, Seq, Time};

use crate::protocol::{
    Conn, LeaseAcks, LeaseId, StoreRequest, StoreResponse, WireHead, STORE_PORT,
};
use crate::trace::{now, SharedRecorder};

mod designs;
mod expiry_rows;
mod session_locks;

pub use designs::{HeadOrder, StoreBreaks};
use designs::{HeadRule, Rules};
pub use expiry_rows::{ExpiryFence, ExpiryRows, LeaseRow};
pub use session_locks::SessionLocks;

/// A queued row.
#[derive(Clone, Debug)]
pub struct Row {
    /// The seq the event was first enqueued with (differs from the row's only after a
    /// requeue at the tail).
    pub origin: Seq,
    /// The layout epoch the producer routed it under.
    pub layout: u64,
    /// The event's id.
    pub event_id: String,
    /// Its key.
    pub key: String,
    /// Failed attempts recorded.
    pub attempts: u32,
    /// Earliest next delivery.
    pub not_before: Option<Time>,
    /// The last error.
    pub last_error: Option<String>,
    /// The transaction that inserted it (PostgreSQL's `producer_xid`).
    pub xid: u64,
    /// When the producer inserted it, in whole ms of store time (a `created_at` column).
    pub created_ms: u64,
}

/// What survives a restart: committed rows, the dead-letter table, sequences.
#[derive(Debug, Default)]
pub struct Durable {
    /// The queue, ordered by partition then seq (the drain index).
    pub rows: BTreeMap<(PartitionId, Seq), Row>,
    /// Dead-lettered rows.
    pub dead: Vec<(Seq, Row, String)>,
    /// The last sequence number handed out.
    pub next_seq: i64,
    /// The next transaction id to hand out (PostgreSQL's, which a restart keeps).
    pub next_xid: u64,
    /// The last lease epoch per partition.
    pub epochs: BTreeMap<PartitionId, u64>,
    /// Partitions whose last holder did not hand them back cleanly: written under the lease
    /// (set when it is granted, cleared only by an unlock that says clean), so a lock lost with
    /// its connection or to a restart stays unclean. A partition never locked is clean.
    pub unclean: BTreeSet<PartitionId>,
    /// Every committed event id (the unique constraint, and the producers' idempotency).
    pub committed_ids: BTreeSet<String>,
    /// How many times the store has started.
    pub boots: u64,
    /// Known-bad lease and retry behaviour switched on.
    pub breaks: StoreBreaks,
    /// Queued rows per (key, layout): the online repartition's per-key barrier.
    pub layouts: BTreeMap<(String, u64), u64>,
    /// Whether heads are held by the per-key barrier (the online procedure's read).
    pub barrier: bool,
}

/// How the store leases partitions: the lease model, and its state.
#[derive(Debug)]
pub enum Leases {
    /// PostgreSQL's session advisory locks.
    SessionLocks(SessionLocks),
    /// SQLite's lease rows, fenced by epoch, with an expiry.
    ExpiryRows(ExpiryRows),
}

impl Default for Leases {
    fn default() -> Self {
        Leases::SessionLocks(SessionLocks::default())
    }
}

impl Leases {
    /// Expiry leases of `length` when given, session locks otherwise, none taken yet.
    pub fn new(expiry: Option<Duration>) -> Self {
        match expiry {
            Some(length) => Leases::ExpiryRows(ExpiryRows::new(length)),
            None => Leases::default(),
        }
    }

    /// The expiry leases' length; `None`: session locks.
    pub fn expiry(&self) -> Option<Duration> {
        match self {
            Leases::SessionLocks(_) => None,
            Leases::ExpiryRows(rows) => Some(rows.length()),
        }
    }

    /// `partition`'s expiry lease row, if this store has expiry leases and it was ever leased.
    pub fn expiry_row(&self, partition: PartitionId) -> Option<&LeaseRow> {
        match self {
            Leases::SessionLocks(_) => None,
            Leases::ExpiryRows(rows) => rows.row(partition),
        }
    }

    /// Whether a row takes its seq at commit (SQLite, which serialises its writers, so seq
    /// order is commit order: the expiry lease's cursor depends on it) rather than at the
    /// insert (PostgreSQL, whose rows can commit out of seq order).
    fn seq_at_commit(&self) -> bool {
        matches!(self, Leases::ExpiryRows(_))
    }
}

impl Durable {
    fn queue(&mut self, partition: PartitionId, seq: Seq, row: Row) {
        *self.layouts.entry((row.key.clone(), row.layout)).or_default() += 1;
        self.rows.insert((partition, seq), row);
    }

    fn dequeue(&mut self, partition: PartitionId, seq: Seq) -> Option<Row> {
        let row = self.rows.remove(&(partition, seq))?;
        let slot = (row.key.clone(), row.layout);
        if let Some(n) = self.layouts.get_mut(&slot) {
            *n -= 1;
            if *n == 0 {
                self.layouts.remove(&slot);
            }
        }
        Some(row)
    }

    /// The oldest layout with a queued row of `key`.
    fn oldest_layout(&self, key: &str) -> Option<u64> {
        let lo = (key.to_owned(), 0);
        self.layouts.range(lo..).next().filter(|((k, _), _)| k == key).map(|((_, l), _)| *l)
    }

    /// Whether any row of a layout older than `layout` is still queued.
    pub fn has_rows_older_than(&self, layout: u64) -> bool {
        self.layouts.keys().any(|(_, l)| *l < layout)
    }
}

#[derive(Debug, Default)]
struct Session {
    worker: Option<String>,
    holder: Option<String>,
    /// A pooled connection: holds no lock, and its statements run unchecked (as any plain
    /// PostgreSQL connection's would). Only the `unfenced-lease` design opens one.
    pooled: bool,
}

/// What a restart forgets: sessions and open transactions.
#[derive(Debug, Default)]
pub struct Volatile {
    next_session: u64,
    sessions: BTreeMap<u64, Session>,
    uncommitted: BTreeMap<u64, (Seq, PartitionId, Row)>,
    /// The transaction id of each session's open insert, taken before its seq (as
    /// PostgreSQL's `keyorder_next_seq()` takes it).
    open_xids: BTreeMap<u64, u64>,
    /// Sessions ended by [`StoreState::break_lease`] (`pg_terminate_backend`): their connection
    /// is closed at its next request.
    terminated: BTreeSet<u64>,
}

/// The whole store.
#[derive(Debug, Default)]
pub struct StoreState {
    /// Survives restarts.
    pub durable: Durable,
    /// Lost on restart.
    pub volatile: Volatile,
    /// The leases: which of them survive a restart is the model's.
    pub leases: Leases,
}

/// The store shared by the store host and the driver.
pub type SharedStore = Rc<RefCell<StoreState>>;

impl StoreState {
    /// Rows committed and not yet acknowledged or dead-lettered.
    pub fn depth(&self) -> usize {
        self.durable.rows.len()
    }

    /// Inserts not yet committed.
    pub fn uncommitted(&self) -> usize {
        self.volatile.uncommitted.len()
    }

    /// Whether an open insert was routed under a layout older than `layout`.
    pub fn has_uncommitted_older_than(&self, layout: u64) -> bool {
        self.volatile.uncommitted.values().any(|(_, _, row)| row.layout < layout)
    }

    /// The enqueue seqs of the rows still queued.
    pub fn queued(&self) -> Vec<Seq> {
        self.durable.rows.values().map(|r| r.origin).collect()
    }

    /// The partitions with rows of `key` queued, or open in a transaction.
    pub fn partitions_of(&self, key: &str) -> BTreeSet<PartitionId> {
        let queued = self.durable.rows.iter().map(|((p, _), row)| (*p, row));
        let open = self.volatile.uncommitted.values().map(|(_, p, row)| (*p, row));
        queued.chain(open).filter(|(_, row)| row.key == key).map(|(p, _)| p).collect()
    }

    /// Keys with queued rows on more than one partition.
    pub fn split_keys(&self) -> Vec<String> {
        let mut seen: BTreeMap<&str, BTreeSet<PartitionId>> = BTreeMap::new();
        for ((p, _), row) in &self.durable.rows {
            seen.entry(&row.key).or_default().insert(*p);
        }
        seen.into_iter().filter(|(_, ps)| ps.len() > 1).map(|(k, _)| k.to_owned()).collect()
    }

    /// A restart: every lock is lost, every session and open insert forgotten.
    fn restart(&mut self, rec: &SharedRecorder) {
        let old = std::mem::take(&mut self.volatile);
        // Session ids stay unique across restarts, so traces never reuse one.
        self.volatile.next_session = old.next_session;
        let mut rec = rec.borrow_mut();
        if let Leases::SessionLocks(locks) = &mut self.leases {
            locks.restart(&old, &mut rec);
        }
        rec.log(
            now(),
            "store",
            format_args!("restarted: sessions, locks and open inserts dropped"),
        );
    }

    fn open_session(&mut self) -> u64 {
        self.volatile.next_session += 1;
        let id = self.volatile.next_session;
        self.volatile.sessions.insert(id, Session::default());
        id
    }

    fn close_session(&mut self, id: u64, why: &str, rec: &SharedRecorder) {
        let Some(session) = self.volatile.sessions.remove(&id) else { return };
        let mut rec = rec.borrow_mut();
        if let Leases::SessionLocks(locks) = &mut self.leases {
            let holder = session.holder.clone().unwrap_or_default();
            locks.session_ended(id, &holder, why, &mut rec);
        }
        if let Some(w) = session.worker {
            rec.log(now(), "store", format_args!("session {id} of {w} ended ({why})"));
        }
        self.volatile.uncommitted.remove(&id);
        self.volatile.open_xids.remove(&id);
        if let Leases::ExpiryRows(rows) = &mut self.leases {
            rows.session_ended(id);
        }
    }

    /// Answers one request of `session` at time `at`. A fenced request (one that names a
    /// partition and epoch) is refused unless this session holds that lease. With a design of
    /// the catalogue switched on, the request goes through its decorator instead.
    fn handle(
        &mut self,
        session: u64,
        req: StoreRequest,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        if self.durable.breaks.any() {
            return designs::handle(self, session, req, at, rec);
        }
        self.handle_by(&Rules::CORRECT, session, req, at, rec)
    }

    /// [`StoreState::handle`] by the fence and head rules of `rules`.
    fn handle_by(
        &mut self,
        rules: &Rules,
        session: u64,
        req: StoreRequest,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let Some((partition, epoch)) = req.fence() else {
            return self.answer(rules, session, req, at, rec);
        };
        let until = match &mut self.leases {
            Leases::SessionLocks(locks) => {
                if !locks.fenced(&self.volatile, session, partition, epoch) {
                    return StoreResponse::NotHeld;
                }
                None
            }
            Leases::ExpiryRows(rows) => {
                let fence =
                    if req.is_queue_statement() { rules.queue_fence } else { ExpiryFence::Epoch };
                let Some(until) = rows.renew(partition, epoch, at, fence) else {
                    return StoreResponse::NotHeld;
                };
                Some(until)
            }
        };
        let answer = self.answer(rules, session, req, at, rec);
        match until {
            Some(until) => StoreResponse::Lasts {
                until_us: until.0.as_micros() as u64,
                answer: Box::new(answer),
            },
            None => answer,
        }
    }

    /// Carries out a request that passed its fence.
    fn answer(
        &mut self,
        rules: &Rules,
        session: u64,
        req: StoreRequest,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        use StoreRequest as R;
        match req {
            R::Register { worker } => self.register(session, worker, at, rec),
            R::LiveWorkers => StoreResponse::Count(self.live_workers(session, at) as u64),
            R::Renew { .. } => StoreResponse::Ok,
            R::Pooled => {
                self.session(session).pooled = true;
                StoreResponse::Ok
            }
            R::Ping => StoreResponse::Ok,
            R::TryLock { partition, worker } => {
                let state = (&mut self.durable, &mut self.volatile);
                match &mut self.leases {
                    Leases::SessionLocks(locks) => {
                        locks.try_lock(state, session, partition, worker, rec)
                    }
                    Leases::ExpiryRows(rows) => rows.try_lease(state.0, partition, worker, at, rec),
                }
            }
            R::Unlock { partition, epoch, clean } => {
                let state = (&mut self.durable, &mut self.volatile);
                let lease = (partition, epoch, clean);
                match &mut self.leases {
                    Leases::SessionLocks(locks) => locks.unlock(state, session, lease, at, rec),
                    Leases::ExpiryRows(rows) => rows.hand_back(state.0, lease, at, rec),
                }
            }
            R::Ack { partition, seq, .. } => {
                self.ack(partition, seq, at, rec);
                StoreResponse::Ok
            }
            R::AckMany { partition, seqs, .. } => {
                for seq in seqs {
                    self.ack(partition, seq, at, rec);
                }
                StoreResponse::Ok
            }
            R::FlushAcks { leases } => self.flush_acks(rules.queue_fence, leases, at, rec),
            R::ReadAfter { partition, after, skip, limit, watched, .. } => {
                self.read_after(&rules.heads, partition, after, &skip, limit, &watched, at)
            }
            R::Retry { partition, seq, attempts, retry_in_us, error, .. } => {
                self.retry(
                    partition,
                    seq,
                    attempts,
                    at.saturating_add(Duration::from_micros(retry_in_us)),
                    error,
                );
                StoreResponse::Ok
            }
            R::DeadLetter { partition, seq, attempts, reason, .. } => {
                self.dead_letter(partition, seq, attempts, reason, at, rec);
                StoreResponse::Ok
            }
            R::Insert { event_id, key, partition, layout } => {
                self.insert(session, event_id, key, partition, layout)
            }
            R::Commit => self.commit(session, at, rec),
        }
    }

    /// Membership: the session becomes the worker's control session.
    fn register(
        &mut self,
        session: u64,
        worker: String,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        rec.borrow_mut().log(at, "store", format_args!("session {session} registers {worker}"));
        if let Leases::ExpiryRows(rows) = &mut self.leases {
            rows.member(worker.clone(), session, at);
        }
        self.session(session).worker = Some(worker);
        StoreResponse::Ok
    }

    /// A fenced head read after `after`, with the transactions its snapshot saw running and
    /// PostgreSQL's probe of `producer_xid`: whether a watched transaction's row at or below
    /// `after` committed behind the cursor.
    #[allow(clippy::too_many_arguments)]
    fn read_after(
        &self,
        rule: &HeadRule,
        partition: PartitionId,
        after: Seq,
        skip: &ParkedKeys,
        limit: u32,
        watched: &[u64],
        at: Time,
    ) -> StoreResponse {
        let from = Seq(after.0.saturating_add(1));
        let heads = match rule {
            HeadRule::Seq => self.heads(partition, from, at, skip, limit as usize),
            HeadRule::Design(design) => {
                design.heads(self, partition, from, at, skip, limit as usize)
            }
        };
        let running = self.volatile.open_xids.values().copied().collect();
        let late = !watched.is_empty()
            && self
                .durable
                .rows
                .range((partition, Seq(i64::MIN))..=(partition, after))
                .any(|(_, row)| watched.contains(&row.xid));
        StoreResponse::Heads { heads, running, late }
    }

    /// Deletes a delivered row, if it is still queued.
    fn ack(&mut self, partition: PartitionId, seq: Seq, at: Time, rec: &SharedRecorder) {
        if let Some(row) = self.durable.dequeue(partition, seq) {
            let mut rec = rec.borrow_mut();
            rec.history.acks.push(Acked { seq: row.origin, at });
            rec.log(at, "store", format_args!("ack p{partition} seq={seq}"));
        }
    }

    /// Deletes the buffered acknowledgements of expiry leases (production SQLite's flush, one
    /// transaction): each lease's rows only after its own renewal under `fence`. Answers the
    /// leases refused.
    fn flush_acks(
        &mut self,
        fence: ExpiryFence,
        leases: Vec<LeaseAcks>,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let Leases::ExpiryRows(rows) = &mut self.leases else {
            return StoreResponse::Refused("buffered acknowledgements need expiry leases".into());
        };
        let mut lost = Vec::new();
        let mut held = Vec::new();
        for LeaseAcks { partition, epoch, seqs } in leases {
            if rows.renew(partition, epoch, at, fence).is_none() {
                lost.push(LeaseId { partition, epoch });
            } else {
                held.push((partition, seqs));
            }
        }
        for (partition, seqs) in held {
            for seq in seqs {
                self.ack(partition, seq, at, rec);
            }
        }
        StoreResponse::Lost(lost)
    }

    /// Records a failed attempt.
    fn retry(
        &mut self,
        partition: PartitionId,
        seq: Seq,
        attempts: u32,
        not_before: Time,
        error: String,
    ) {
        let Some(row) = self.durable.rows.get_mut(&(partition, seq)) else { return };
        row.attempts = attempts;
        row.not_before = Some(not_before);
        row.last_error = Some(error);
    }

    /// Moves a row to the dead-letter table, in one step.
    fn dead_letter(
        &mut self,
        partition: PartitionId,
        seq: Seq,
        attempts: u32,
        reason: String,
        at: Time,
        rec: &SharedRecorder,
    ) {
        let Some(mut row) = self.durable.dequeue(partition, seq) else { return };
        row.attempts = attempts;
        let mut rec = rec.borrow_mut();
        rec.log(
            at,
            "store",
            format_args!("dead-letter p{partition} seq={seq} {}: {reason}", row.event_id),
        );
        rec.history.dead_letters.push(DeadLettered { seq: row.origin, reason: reason.clone(), at });
        self.durable.dead.push((seq, row, reason));
    }

    fn session(&mut self, id: u64) -> &mut Session {
        self.volatile.sessions.entry(id).or_default()
    }

    /// Live workers, by the lease model's membership.
    fn live_workers(&mut self, session: u64, at: Time) -> usize {
        match &mut self.leases {
            Leases::SessionLocks(_) => SessionLocks::live_workers(&self.volatile),
            Leases::ExpiryRows(rows) => rows.live_workers(&self.volatile, session, at),
        }
    }

    /// Empties the store as a freshly created database would be, keeping its lease model; session
    /// ids stay unique (sessions of the old contents may still be open).
    pub fn wipe(&mut self) {
        let (next_session, expiry) = (self.volatile.next_session, self.leases.expiry());
        *self = StoreState::default();
        self.volatile.next_session = next_session;
        self.leases = Leases::new(expiry);
    }

    /// Loses `partition`'s lease the way this store loses one: a session lock's session is
    /// terminated (`pg_terminate_backend`; its connection closes at its next request), an
    /// expiry lease expires now. Whether there was a lease to lose.
    pub fn break_lease(&mut self, partition: PartitionId, rec: &SharedRecorder) -> bool {
        let held = match &mut self.leases {
            Leases::ExpiryRows(rows) => return rows.expire(partition, now()),
            Leases::SessionLocks(locks) => locks.holders(partition),
        };
        for session in &held {
            self.volatile.terminated.insert(*session);
            self.close_session(*session, "terminated", rec);
        }
        !held.is_empty()
    }

    /// Commits `event_id` of `key` on `partition` at once (an insert and its commit in one
    /// step, for drivers and tests): its seq, or `None` when the id was committed before.
    pub fn enqueue_committed(
        &mut self,
        event_id: &str,
        key: &str,
        partition: PartitionId,
        rec: &SharedRecorder,
    ) -> Option<Seq> {
        if !self.durable.committed_ids.insert(event_id.to_owned()) {
            return None;
        }
        let xid = self.durable.next_xid;
        self.durable.next_xid += 1;
        self.durable.next_seq += 1;
        let seq = Seq(self.durable.next_seq);
        let row = Row {
            origin: seq,
            layout: 0,
            event_id: event_id.to_owned(),
            key: key.to_owned(),
            attempts: 0,
            not_before: None,
            last_error: None,
            xid,
            created_ms: now().0.as_millis() as u64,
        };
        let enqueued = Enqueued {
            event_id: event_id.to_owned(),
            key: key.to_owned(),
            seq,
            partition,
            layout: 0,
            at: now(),
        };
        rec.borrow_mut().enqueued(enqueued);
        self.durable.queue(partition, seq, row);
        Some(seq)
    }

    /// The partition's oldest rows from seq `from` on, at most `limit` of them and ending at the
    /// first that waits: a head read's answer. The rows of the keys in `skip` (parked by the
    /// drain) are passed over, so the first row of a key is its oldest.
    fn heads(
        &self,
        partition: PartitionId,
        from: Seq,
        at: Time,
        skip: &ParkedKeys,
        limit: usize,
    ) -> Vec<WireHead> {
        let rows = self.rows_from(partition, from).filter(|(_, row)| !skip.contains(&row.key));
        self.until_one_waits(rows.take(limit), at)
    }

    /// The partition's rows from seq `from` on, in seq order.
    fn rows_from(&self, partition: PartitionId, from: Seq) -> impl Iterator<Item = (Seq, &Row)> {
        let rows = self.durable.rows.range((partition, from)..=(partition, Seq(i64::MAX)));
        rows.map(|((_, seq), row)| (*seq, row))
    }

    /// `rows` as a head read answers them at `at`, ending at the first that waits.
    fn until_one_waits<'a>(
        &self,
        rows: impl Iterator<Item = (Seq, &'a Row)>,
        at: Time,
    ) -> Vec<WireHead> {
        let mut heads = Vec::new();
        for (seq, row) in rows {
            let head = self.wire_head(seq, row, at);
            let waits = head.wait_us.is_some();
            heads.push(head);
            if waits {
                break;
            }
        }
        heads
    }

    /// A row as a head read answers it at `at`. A row the online repartition's barrier holds
    /// comes back with a short wait, like a recorded backoff: the worker looks again without an
    /// attempt.
    fn wire_head(&self, seq: Seq, row: &Row, at: Time) -> WireHead {
        let oldest = self.durable.oldest_layout(&row.key).unwrap_or(row.layout);
        let backoff = row.not_before.filter(|t| *t > at).map(|t| t.saturating_since(at));
        let held = self.durable.barrier && barrier(row.layout, oldest) == Barrier::Held;
        let wait =
            if held { Some(backoff.unwrap_or_default().max(DEFAULT_HOLD_POLL)) } else { backoff };
        WireHead {
            seq,
            event_id: row.event_id.clone(),
            key: row.key.clone(),
            attempts: row.attempts,
            wait_us: wait.map(|w| w.as_micros() as u64),
            last_error: row.last_error.clone(),
        }
    }

    fn insert(
        &mut self,
        session: u64,
        event_id: String,
        key: String,
        partition: PartitionId,
        layout: u64,
    ) -> StoreResponse {
        if self.durable.committed_ids.contains(&event_id) {
            return StoreResponse::Duplicate;
        }
        if self.volatile.uncommitted.contains_key(&session) {
            return StoreResponse::Refused("one open insert per session".into());
        }
        // PostgreSQL takes the seq at the insert, SQLite at the commit (`Leases::seq_at_commit`).
        let xid = self.durable.next_xid;
        self.volatile.open_xids.insert(session, xid);
        self.durable.next_xid += 1;
        let seq = if self.leases.seq_at_commit() {
            Seq(0)
        } else {
            self.durable.next_seq += 1;
            Seq(self.durable.next_seq)
        };
        let row = Row {
            origin: seq,
            layout,
            event_id,
            key,
            attempts: 0,
            not_before: None,
            last_error: None,
            xid,
            created_ms: now().0.as_millis() as u64,
        };
        self.volatile.uncommitted.insert(session, (seq, partition, row));
        StoreResponse::Inserted
    }

    fn commit(&mut self, session: u64, at: Time, rec: &SharedRecorder) -> StoreResponse {
        let Some((mut seq, partition, mut row)) = self.volatile.uncommitted.remove(&session) else {
            return StoreResponse::Refused("no open insert to commit".into());
        };
        self.volatile.open_xids.remove(&session);
        if !self.durable.committed_ids.insert(row.event_id.clone()) {
            return StoreResponse::Duplicate;
        }
        if self.leases.seq_at_commit() {
            self.durable.next_seq += 1;
            seq = Seq(self.durable.next_seq);
            row.origin = seq;
        }
        let mut rec = rec.borrow_mut();
        rec.log(
            at,
            "store",
            format_args!("commit p{partition} seq={seq} {} key={}", row.event_id, row.key),
        );
        rec.enqueued(Enqueued {
            event_id: row.event_id.clone(),
            key: row.key.clone(),
            seq,
            partition,
            layout: row.layout,
            at,
        });
        self.durable.queue(partition, seq, row);
        StoreResponse::Ok
    }
}

fn lease_change(
    rec: &mut crate::trace::Recorder,
    partition: PartitionId,
    worker: String,
    epoch: Epoch,
    change: LeaseEvent,
) {
    let at = now();
    rec.log(at, "store", format_args!("lease p{partition} epoch {epoch} {change:?} by {worker}"));
    rec.history.leases.push(LeaseChange { partition, worker, epoch, change, at });
}

/// The store host's factory. Each start (first boot or restart) forgets volatile state.
pub fn host(
    state: SharedStore,
    rec: SharedRecorder,
    detection: Duration,
) -> impl Fn() -> crate::simulator::HostFuture {
    let held = super::HeldListener::default();
    move || {
        let (state, rec, held) = (state.clone(), rec.clone(), held.clone());
        Box::pin(async move {
            {
                let mut s = state.borrow_mut();
                if s.durable.boots > 0 {
                    s.restart(&rec);
                }
                s.durable.boots += 1;
            }
            let listener = held.get(STORE_PORT).await?;
            loop {
                let (stream, _) = listener.accept().await?;
                let (state, rec) = (state.clone(), rec.clone());
                tokio::task::spawn_local(serve(Conn::new(stream), state, rec, detection));
            }
        })
    }
}

/// Serves one session until its end of stream, an error, or `detection` of silence.
async fn serve(mut conn: Conn, state: SharedStore, rec: SharedRecorder, detection: Duration) {
    let id = state.borrow_mut().open_session();
    let why = loop {
        let req = match conn.recv_within::<StoreRequest>(detection).await {
            Ok(Some(req)) => req,
            Ok(None) => break "end of stream",
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break "keepalive timeout",
            Err(_) => break "connection error",
        };
        if state.borrow().volatile.terminated.contains(&id) {
            break "terminated";
        }
        let resp = state.borrow_mut().handle(id, req, now(), &rec);
        if conn.send(&resp).await.is_err() {
            break "connection error";
        }
    };
    state.borrow_mut().close_session(id, why, &rec);
}

#[cfg(test)]
mod tests {
    use super::*;

    const LENGTH: Duration = Duration::from_secs(2);

    fn at(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    fn insert(st: &mut StoreState, session: u64, id: &str, rec: &SharedRecorder) {
        let req = StoreRequest::Insert {
            event_id: id.into(),
            key: "k".into(),
            partition: PartitionId(0),
            layout: 0,
        };
        assert!(matches!(st.handle(session, req, at(0), rec), StoreResponse::Inserted));
    }

    /// Two producers insert `e1` then `e2` and commit them the other way round: the queue's
    /// event ids in seq order.
    fn commit_in_reverse(expiry: Option<Duration>) -> Vec<String> {
        let rec: SharedRecorder = Rc::default();
        let mut st = StoreState { leases: Leases::new(expiry), ..StoreState::default() };
        let (a, b) = (st.open_session(), st.open_session());
        insert(&mut st, a, "e1", &rec);
        insert(&mut st, b, "e2", &rec);
        assert!(matches!(st.handle(b, StoreRequest::Commit, at(1), &rec), StoreResponse::Ok));
        assert!(matches!(st.handle(a, StoreRequest::Commit, at(2), &rec), StoreResponse::Ok));
        let enqueued: Vec<_> = rec.borrow().history.enqueued.iter().map(|e| e.seq).collect();
        let rows: Vec<_> = st.durable.rows.values().map(|r| r.origin).collect();
        assert_eq!(enqueued.iter().copied().collect::<BTreeSet<_>>(), rows.into_iter().collect());
        st.durable.rows.values().map(|r| r.event_id.clone()).collect()
    }

    #[test]
    fn with_expiry_leases_seq_order_is_commit_order_as_in_sqlite() {
        assert_eq!(commit_in_reverse(Some(LENGTH)), ["e2", "e1"]);
    }

    #[test]
    fn with_session_locks_the_insert_takes_the_seq_as_in_postgresql() {
        assert_eq!(commit_in_reverse(None), ["e1", "e2"]);
    }

    /// A flush deletes each lease's rows only after that lease's fenced renewal: a lease that
    /// expired and was taken over is answered lost and its rows stay queued; a held lease's
    /// rows go and its expiry moves on.
    #[test]
    fn a_flush_deletes_only_the_rows_of_leases_still_held() {
        let rec: SharedRecorder = Rc::default();
        let mut st = StoreState { leases: Leases::new(Some(LENGTH)), ..StoreState::default() };
        let s = st.open_session();
        let (p0, p1) = (PartitionId(0), PartitionId(1));
        let mut seqs = Vec::new();
        for (i, p) in [p0, p1, p0, p1].into_iter().enumerate() {
            let req = StoreRequest::Insert {
                event_id: format!("e{i}"),
                key: format!("k{p}"),
                partition: p,
                layout: 0,
            };
            st.handle(s, req, at(0), &rec);
            st.handle(s, StoreRequest::Commit, at(0), &rec);
            seqs.push(Seq(st.durable.next_seq));
        }
        let lock = |st: &mut StoreState, p, w: &str, ms| {
            let req = StoreRequest::TryLock { partition: p, worker: w.into() };
            match st.handle(s, req, at(ms), &rec) {
                StoreResponse::Lock(Some(g)) => g.epoch,
                other => panic!("{other:?}"),
            }
        };
        let e0 = lock(&mut st, p0, "w0", 0);
        let old = lock(&mut st, p1, "w1", 0);
        // w1's lease runs out and w2 takes p1; w0's was renewed in between.
        st.handle(s, StoreRequest::Renew { partition: p0, epoch: e0 }, at(1_500), &rec);
        let new = lock(&mut st, p1, "w2", 2_500);
        assert!(new > old);
        let leases = vec![
            LeaseAcks { partition: p0, epoch: e0, seqs: vec![seqs[0], seqs[2]] },
            LeaseAcks { partition: p1, epoch: old, seqs: vec![seqs[1]] },
        ];
        match st.handle(s, StoreRequest::FlushAcks { leases }, at(3_000), &rec) {
            StoreResponse::Lost(lost) => {
                assert_eq!(lost, [LeaseId { partition: p1, epoch: old }]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(st.queued(), [seqs[1], seqs[3]], "the lost lease acknowledged nothing");
        assert_eq!(st.leases.expiry_row(p0).unwrap().expires_at, at(3_000).saturating_add(LENGTH));
        assert_eq!(
            st.leases.expiry_row(p1).unwrap().epoch,
            new,
            "the new holder's lease is untouched"
        );
        assert_eq!(st.leases.expiry_row(p1).unwrap().expires_at, at(2_500).saturating_add(LENGTH));
    }
}
