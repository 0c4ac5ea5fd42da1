//! The store host: the queue, the dead-letter table and the leases, in memory, with the
//! PostgreSQL semantics that matter here:
//!
//! * a lease is a lock held by a session (connection) and is released only when the server
//!   notices the session is gone: at its end of stream, or after `detection` of silence (the
//!   keepalive timeout), never earlier;
//! * an insert is invisible until its transaction commits;
//! * a restart drops every session, lock and uncommitted insert, and keeps committed rows
//!   (they live in [`Durable`], outside the host factory).
//!
//! Or, with an expiry lease (`Durable::expiry`), SQLite's lease rows: a row per partition with
//! holder, epoch (incremented at each acquisition: the fencing token) and expiry by the store's
//! clock, kept across restarts. A lease is free once its expiry passed; every fenced statement
//! checks holder and epoch and renews the lease in the same step, and answers with the new
//! expiry. Membership is a row per worker, renewed by its calls and ended with its session.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use keyorder::check::{Acked, DeadLettered, Enqueued, LeaseChange, LeaseEvent};
use keyorder::drain::ParkedKeys;
use keyorder::repartition::{barrier, Barrier, DEFAULT_HOLD_POLL};
use keyorder::{Epoch, PartitionId, Seq, Time};

use crate::protocol::{
    Conn, Granted, LeaseAcks, LeaseId, StoreRequest, StoreResponse, WireHead, STORE_PORT,
};
use crate::trace::{now, SharedRecorder};

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
    /// The expiry lease's length; `None`: session locks.
    pub expiry: Option<Duration>,
    /// The expiry leases: a row per partition ever leased.
    pub leases: BTreeMap<PartitionId, LeaseRow>,
    /// Expiry-lease membership: worker → (its registering session, expiry).
    pub members: BTreeMap<String, (u64, Time)>,
}

/// An expiry lease's row.
#[derive(Clone, Debug)]
pub struct LeaseRow {
    /// The holder, `None` once handed back.
    pub holder: Option<String>,
    /// The epoch of the last acquisition.
    pub epoch: Epoch,
    /// When it expires, by the store's clock.
    pub expires_at: Time,
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

/// The store-side switches of the broken-design catalogue.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreBreaks {
    /// `two-readers`: a lock is granted whoever holds it, and every worker is told it is alone.
    pub shared_locks: bool,
    /// `requeue-at-tail`: a failed attempt moves the row to the tail with a new seq.
    pub requeue_at_tail: bool,
    /// `handover-always-clean`: every lease is granted as handed back cleanly, even after its
    /// last holder lost it.
    pub always_clean: bool,
    /// `unfenced-expiry`: queue statements on an expiry lease check only that the partition has
    /// an unexpired lease, not that it is theirs, and renew whichever it is.
    pub unfenced_expiry: bool,
    /// `skip-without-parking`: a head read passes over the rows that are backing off but
    /// serves the same key's later rows.
    pub skip_without_parking: bool,
    /// `priority-within-key` and `created-at-order`: a head read picks rows in another
    /// order than seq.
    pub head_order: Option<HeadOrder>,
    /// `rebalance-on-join`: a worker that registers is handed half of the other workers'
    /// partitions at once, as handed back clean, whether or not their deliveries are done.
    pub rebalance_on_join: bool,
    /// `stuck-key-blocks-partition`: a head read answers nothing while the partition's oldest
    /// row belongs to a parked key or to a key with a dead letter.
    pub stuck_key_blocks: bool,
}

/// An order a broken head read picks rows in, instead of seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadOrder {
    /// By a per-event priority, highest first, then seq (pg-boss's `ORDER BY priority DESC`).
    Priority,
    /// By the insert's timestamp in whole seconds, ties broken by the event id's hash (a
    /// random id standing in for the sequence: `ORDER BY created_at, id`).
    CreatedAt,
}

impl HeadOrder {
    /// The sort key of a row under this order.
    fn key(self, seq: Seq, row: &Row) -> (u64, u64) {
        let digest = keyorder::routing::key_digest(&row.event_id);
        match self {
            HeadOrder::Priority => (u64::MAX - digest % 3, seq.0 as u64),
            HeadOrder::CreatedAt => (row.created_ms / 1000, digest),
        }
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

/// What a restart forgets: sessions, locks, open transactions.
#[derive(Debug, Default)]
pub struct Volatile {
    next_session: u64,
    sessions: BTreeMap<u64, Session>,
    /// (partition, session) → epoch. Exclusive unless `shared_locks`.
    locks: BTreeMap<(PartitionId, u64), Epoch>,
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
        for ((partition, session), epoch) in old.locks {
            let worker =
                old.sessions.get(&session).and_then(|s| s.holder.clone()).unwrap_or_default();
            lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Lost);
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
        let held: Vec<_> = self
            .volatile
            .locks
            .iter()
            .filter(|((_, s), _)| *s == id)
            .map(|((p, _), e)| (*p, *e))
            .collect();
        let mut rec = rec.borrow_mut();
        for (partition, epoch) in held {
            self.volatile.locks.remove(&(partition, id));
            let worker = session.holder.clone().unwrap_or_default();
            rec.log(now(), "store", format_args!("session {id} ended ({why}): lease p{partition} epoch {epoch} of {worker} released"));
            lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Lost);
        }
        if let Some(w) = session.worker {
            rec.log(now(), "store", format_args!("session {id} of {w} ended ({why})"));
        }
        self.volatile.uncommitted.remove(&id);
        self.volatile.open_xids.remove(&id);
        self.durable.members.retain(|_, (s, _)| *s != id);
    }

    fn fenced(&self, session: u64, partition: PartitionId, epoch: Epoch) -> bool {
        self.volatile.sessions.get(&session).is_some_and(|s| s.pooled)
            || self.volatile.locks.get(&(partition, session)) == Some(&epoch)
    }

    /// Answers one request of `session` at time `at`. A fenced request (one that names a
    /// partition and epoch) is refused unless this session holds that lease.
    fn handle(
        &mut self,
        session: u64,
        req: StoreRequest,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        if let Some(length) = self.durable.expiry {
            let Some((partition, epoch)) = req.fence() else {
                return self.answer(session, req, at, rec);
            };
            let loose = self.durable.breaks.unfenced_expiry && req.is_queue_statement();
            let Some(until) = self.renew_lease(partition, epoch, at, length, loose) else {
                return StoreResponse::NotHeld;
            };
            let answer = Box::new(self.answer(session, req, at, rec));
            return StoreResponse::Lasts { until_us: until.0.as_micros() as u64, answer };
        }
        if let Some((partition, epoch)) = req.fence() {
            if !self.fenced(session, partition, epoch) {
                return StoreResponse::NotHeld;
            }
        }
        self.answer(session, req, at, rec)
    }

    /// Renews `partition`'s expiry lease if epoch `epoch` holds it unexpired (or, `loose`, if
    /// any epoch does): its new expiry, or `None` when the statement must be refused.
    fn renew_lease(
        &mut self,
        partition: PartitionId,
        epoch: Epoch,
        at: Time,
        length: Duration,
        loose: bool,
    ) -> Option<Time> {
        let row = self.durable.leases.get_mut(&partition)?;
        if row.holder.is_none() || row.expires_at <= at || (!loose && row.epoch != epoch) {
            return None;
        }
        row.expires_at = at.saturating_add(length);
        Some(row.expires_at)
    }

    /// The `rebalance-on-join` design: every other partition leased by another worker is taken
    /// from its holder and marked handed back clean, for the joining worker to lease at once.
    fn hand_to_joiner(&mut self, session: u64, worker: &str, at: Time, rec: &SharedRecorder) {
        let mut held: Vec<PartitionId> = if self.durable.expiry.is_some() {
            let others = |h: &Option<String>| h.as_deref().is_some_and(|h| h != worker);
            let leases = self.durable.leases.iter();
            leases
                .filter(|(_, r)| others(&r.holder) && r.expires_at > at)
                .map(|(p, _)| *p)
                .collect()
        } else {
            let sessions = &self.volatile.sessions;
            let other = |s: &u64| {
                *s != session
                    && sessions
                        .get(s)
                        .and_then(|x| x.holder.as_deref())
                        .is_some_and(|w| w != worker)
            };
            self.volatile.locks.keys().filter(|(_, s)| other(s)).map(|(p, _)| *p).collect()
        };
        held.sort();
        held.dedup();
        for partition in held.into_iter().step_by(2) {
            if self.break_lease(partition, rec) {
                self.durable.unclean.remove(&partition);
                rec.borrow_mut().log(
                    at,
                    "store",
                    format_args!("rebalance: p{partition} handed to the joining {worker}"),
                );
            }
        }
    }

    /// Carries out a request that passed its fence.
    fn answer(
        &mut self,
        session: u64,
        req: StoreRequest,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        use StoreRequest as R;
        match req {
            R::Register { worker } => self.register(session, worker, at, rec),
            R::LiveWorkers => {
                let n = self.live_workers(session, at);
                StoreResponse::Count(if self.durable.breaks.shared_locks { 1 } else { n as u64 })
            }
            R::Renew { .. } => StoreResponse::Ok,
            R::Pooled => {
                self.session(session).pooled = true;
                StoreResponse::Ok
            }
            R::Ping => StoreResponse::Ok,
            R::TryLock { partition, worker } => match self.durable.expiry {
                Some(length) => self.try_lease(partition, worker, at, length, rec),
                None => self.try_lock(session, partition, worker, rec),
            },
            R::Unlock { partition, epoch, clean } if self.durable.expiry.is_some() => {
                self.hand_back(partition, epoch, clean, at, rec)
            }
            R::Unlock { partition, epoch, clean } => {
                self.volatile.locks.remove(&(partition, session));
                if clean {
                    self.durable.unclean.remove(&partition);
                }
                let worker = self.session(session).holder.clone().unwrap_or_default();
                let mut rec = rec.borrow_mut();
                lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Released);
                let how = if clean { "clean" } else { "unclean" };
                rec.log(at, "store", format_args!("p{partition} handed back {how}"));
                StoreResponse::Ok
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
            R::FlushAcks { leases } => self.flush_acks(leases, at, rec),
            R::ReadAfter { partition, after, skip, limit, watched, .. } => {
                self.read_after(partition, after, &skip, limit, &watched, at)
            }
            R::Retry { partition, seq, attempts, retry_in_us, error, .. } => {
                self.retry(
                    partition,
                    seq,
                    attempts,
                    at.saturating_add(Duration::from_micros(retry_in_us)),
                    error,
                    rec,
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
        if let Some(length) = self.durable.expiry {
            self.durable.members.insert(worker.clone(), (session, at.saturating_add(length)));
        }
        if self.durable.breaks.rebalance_on_join {
            self.hand_to_joiner(session, &worker, at, rec);
        }
        self.session(session).worker = Some(worker);
        StoreResponse::Ok
    }

    /// A fenced head read after `after`, with the transactions its snapshot saw running and
    /// PostgreSQL's probe of `producer_xid`: whether a watched transaction's row at or below
    /// `after` committed behind the cursor.
    fn read_after(
        &self,
        partition: PartitionId,
        after: Seq,
        skip: &ParkedKeys,
        limit: u32,
        watched: &[u64],
        at: Time,
    ) -> StoreResponse {
        let from = Seq(after.0.saturating_add(1));
        let heads = self.heads(partition, from, at, skip, limit as usize);
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
    /// transaction): each lease's rows only after its own fenced renewal (loose under the
    /// `unfenced-expiry` design, as its other queue statements). Answers the leases refused.
    fn flush_acks(
        &mut self,
        leases: Vec<LeaseAcks>,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let Some(length) = self.durable.expiry else {
            return StoreResponse::Refused("buffered acknowledgements need expiry leases".into());
        };
        let loose = self.durable.breaks.unfenced_expiry;
        let mut lost = Vec::new();
        for LeaseAcks { partition, epoch, seqs } in leases {
            if self.renew_lease(partition, epoch, at, length, loose).is_none() {
                lost.push(LeaseId { partition, epoch });
                continue;
            }
            for seq in seqs {
                self.ack(partition, seq, at, rec);
            }
        }
        StoreResponse::Lost(lost)
    }

    /// Records a failed attempt; the `requeue-at-tail` design also moves the row to the tail.
    fn retry(
        &mut self,
        partition: PartitionId,
        seq: Seq,
        attempts: u32,
        not_before: Time,
        error: String,
        rec: &SharedRecorder,
    ) {
        let Some(row) = self.durable.rows.get_mut(&(partition, seq)) else { return };
        row.attempts = attempts;
        row.not_before = Some(not_before);
        row.last_error = Some(error);
        if self.durable.breaks.requeue_at_tail {
            let row = self.durable.dequeue(partition, seq).expect("found above");
            self.durable.next_seq += 1;
            let tail = Seq(self.durable.next_seq);
            rec.borrow_mut().log(
                now(),
                "store",
                format_args!("requeue p{partition} seq={seq} at the tail as seq={tail}"),
            );
            self.durable.queue(partition, tail, row);
        }
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

    fn try_lock(
        &mut self,
        session: u64,
        partition: PartitionId,
        worker: String,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let held =
            self.volatile.locks.range((partition, 0)..=(partition, u64::MAX)).next().is_some();
        if held && !self.durable.breaks.shared_locks {
            return StoreResponse::Lock(None);
        }
        let epoch = self.durable.epochs.entry(partition).or_default();
        *epoch += 1;
        let epoch = Epoch(*epoch);
        // Read the previous holder's hand-back, then mark this holding unclean until it ends
        // with a clean unlock.
        let clean = self.durable.unclean.insert(partition) || self.durable.breaks.always_clean;
        self.volatile.locks.insert((partition, session), epoch);
        self.session(session).holder = Some(worker.clone());
        let mut rec = rec.borrow_mut();
        lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Acquired);
        if clean {
            rec.log(now(), "store", format_args!("p{partition} was handed back clean"));
        }
        StoreResponse::Lock(Some(Granted { epoch, clean, until_us: None }))
    }

    /// Live workers: open control sessions, or with expiry leases unexpired member rows (the
    /// caller's renewed first: a worker's membership call is its renewal).
    fn live_workers(&mut self, session: u64, at: Time) -> usize {
        let Some(length) = self.durable.expiry else {
            return self.volatile.sessions.values().filter(|s| s.worker.is_some()).count();
        };
        if let Some(w) = self.volatile.sessions.get(&session).and_then(|s| s.worker.clone()) {
            self.durable.members.insert(w, (session, at.saturating_add(length)));
        }
        self.durable.members.values().filter(|(_, until)| *until > at).count()
    }

    /// Takes `partition`'s expiry lease if it has no holder or its expiry passed (recording the
    /// expired holder's loss).
    fn try_lease(
        &mut self,
        partition: PartitionId,
        worker: String,
        at: Time,
        length: Duration,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let mut rec = rec.borrow_mut();
        if let Some(row) = self.durable.leases.get(&partition) {
            match &row.holder {
                Some(_) if row.expires_at > at => return StoreResponse::Lock(None),
                Some(old) => {
                    rec.log(
                        at,
                        "store",
                        format_args!("lease p{partition} epoch {} of {old} expired", row.epoch),
                    );
                    lease_change(&mut rec, partition, old.clone(), row.epoch, LeaseEvent::Lost);
                    rec.fault("expired_takeover");
                }
                None => {}
            }
        }
        let epoch = self.durable.epochs.entry(partition).or_default();
        *epoch += 1;
        let epoch = Epoch(*epoch);
        let clean = self.durable.unclean.insert(partition) || self.durable.breaks.always_clean;
        let expires_at = at.saturating_add(length);
        let row = LeaseRow { holder: Some(worker.clone()), epoch, expires_at };
        self.durable.leases.insert(partition, row);
        lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Acquired);
        if clean {
            rec.log(at, "store", format_args!("p{partition} was handed back clean"));
        }
        let until_us = Some(expires_at.0.as_micros() as u64);
        StoreResponse::Lock(Some(Granted { epoch, clean, until_us }))
    }

    /// Hands an expiry lease back (its fence passed): no holder, expired, clean or not.
    fn hand_back(
        &mut self,
        partition: PartitionId,
        epoch: Epoch,
        clean: bool,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let Some(row) = self.durable.leases.get_mut(&partition) else {
            return StoreResponse::NotHeld;
        };
        let worker = row.holder.take().unwrap_or_default();
        row.expires_at = Time::ZERO;
        if clean {
            self.durable.unclean.remove(&partition);
        }
        let mut rec = rec.borrow_mut();
        lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Released);
        let how = if clean { "clean" } else { "unclean" };
        rec.log(at, "store", format_args!("p{partition} handed back {how}"));
        StoreResponse::Ok
    }

    /// Empties the store as a freshly created database would be, keeping its lease model; session
    /// ids stay unique (sessions of the old contents may still be open).
    pub fn wipe(&mut self) {
        let (next_session, expiry) = (self.volatile.next_session, self.durable.expiry);
        *self = StoreState::default();
        self.volatile.next_session = next_session;
        self.durable.expiry = expiry;
    }

    /// Loses `partition`'s lease the way this store loses one: a session lock's session is
    /// terminated (`pg_terminate_backend`; its connection closes at its next request), an
    /// expiry lease expires now. Whether there was a lease to lose.
    pub fn break_lease(&mut self, partition: PartitionId, rec: &SharedRecorder) -> bool {
        let at = now();
        if self.durable.expiry.is_some() {
            let Some(row) = self.durable.leases.get_mut(&partition) else { return false };
            row.expires_at = at;
            return row.holder.is_some();
        }
        let held: Vec<u64> =
            self.volatile.locks.keys().filter(|(p, _)| *p == partition).map(|(_, s)| *s).collect();
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
    /// first that waits: a head read's answer. A row the online repartition's barrier holds
    /// comes back with a short wait, like a recorded backoff: the worker looks again without an
    /// attempt. The rows of the keys in `skip` (parked by the drain) are passed over, so the
    /// first row of a key is its oldest; the `skip-without-parking` design passes over the rows
    /// that are backing off instead, whatever their key, so a failing key's later rows go first.
    fn heads(
        &self,
        partition: PartitionId,
        from: Seq,
        at: Time,
        skip: &ParkedKeys,
        limit: usize,
    ) -> Vec<WireHead> {
        let mut heads = Vec::new();
        if self.durable.breaks.stuck_key_blocks && self.oldest_key_is_stuck(partition, skip) {
            return heads;
        }
        if let Some(order) = self.durable.breaks.head_order {
            let mut rows: Vec<(Seq, &Row)> = self.visible(partition, from, at, skip).collect();
            rows.sort_by_key(|(seq, row)| order.key(*seq, row));
            for (seq, row) in rows.into_iter().take(limit) {
                let head = self.wire_head(seq, row, at);
                let waits = head.wait_us.is_some();
                heads.push(head);
                if waits {
                    break;
                }
            }
            return heads;
        }
        for (seq, row) in self.visible(partition, from, at, skip).take(limit) {
            let head = self.wire_head(seq, row, at);
            let waits = head.wait_us.is_some();
            heads.push(head);
            if waits {
                break;
            }
        }
        heads
    }

    /// `stuck-key-blocks-partition`: whether the partition's oldest row belongs to a key that
    /// is parked (in `skip`) or has a row in the dead-letter table.
    fn oldest_key_is_stuck(&self, partition: PartitionId, skip: &ParkedKeys) -> bool {
        let mut rows = self.durable.rows.range((partition, Seq(0))..=(partition, Seq(i64::MAX)));
        rows.next().is_some_and(|(_, row)| {
            skip.contains(&row.key)
                || self.durable.dead.iter().any(|(_, dead, _)| dead.key == row.key)
        })
    }

    /// The partition's rows from seq `from` on that a head read sees: those of keys not in
    /// `skip`; the `skip-without-parking` design passes over the rows that are backing off
    /// instead, whatever their key, so a failing key's later rows go first.
    fn visible<'a>(
        &'a self,
        partition: PartitionId,
        from: Seq,
        at: Time,
        skip: &'a ParkedKeys,
    ) -> impl Iterator<Item = (Seq, &'a Row)> + 'a {
        let skipping = self.durable.breaks.skip_without_parking;
        self.durable
            .rows
            .range((partition, from)..=(partition, Seq(i64::MAX)))
            .filter(move |(_, row)| {
                if skipping {
                    row.not_before.is_none_or(|t| t <= at)
                } else {
                    !skip.contains(&row.key)
                }
            })
            .map(|((_, seq), row)| (*seq, row))
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
        // PostgreSQL takes the seq at the insert, so rows can commit out of seq order; SQLite
        // serialises its writers, so seq order is commit order (the expiry lease's cursor
        // depends on it): there the seq is taken at the commit.
        let xid = self.durable.next_xid;
        self.volatile.open_xids.insert(session, xid);
        self.durable.next_xid += 1;
        let seq = if self.durable.expiry.is_some() {
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
        if self.durable.expiry.is_some() {
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
        let mut st = StoreState::default();
        st.durable.expiry = expiry;
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
        let mut st = StoreState::default();
        st.durable.expiry = Some(LENGTH);
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
        assert_eq!(st.durable.leases[&p0].expires_at, at(3_000).saturating_add(LENGTH));
        assert_eq!(st.durable.leases[&p1].epoch, new, "the new holder's lease is untouched");
        assert_eq!(st.durable.leases[&p1].expires_at, at(2_500).saturating_add(LENGTH));
    }
}
