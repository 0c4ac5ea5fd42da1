//! The worker's store client in the simulation: production's `Store`, `MembershipSession` and
//! `LeaseSession` traits over the store protocol to the simulated store host, with
//! production's shared lease logic (session drain, read-ahead, acknowledgement buffer) doing
//! the deciding.
//!
//! Every store call is bounded by the worker loop's shared wrapper ([`keyorder::store::timed`]),
//! the code production runs; this client applies its own timeouts only where they mean more
//! than a request timeout: opening a connection (and its first statement), an expiry lease's
//! resend on a fresh connection, the `unfenced-lease` pool's retries.
//!
//! A pause fault stops the worker's process: every store statement, renewal and delivery check
//! waits at a gate until it resumes, so nothing reaches the store or an endpoint meanwhile,
//! while the worker keeps its state and connections. The gate stands where the worker next
//! touches its lease: a delivery passes the lease check after the gate, never before it (a
//! stop between that check and the send, microseconds in production, is the one window no lease
//! can cover, and the simulation does not sample it).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use keyorder::clock::Clock;
use keyorder::drain::ParkedKeys;
use keyorder::store::ack_buffer::{AckBuffer, LeaseKey};
use keyorder::store::head_cursor::HeadCursor;
use keyorder::store::read_ahead::ReadAhead;
use keyorder::store::session_drain::{HeadPlan, Read, Seen, SessionDrain, SessionDrainOptions};
use keyorder::store::{Handover, LeaseSession, MembershipSession, Store, StoreError, StoredHead};
use keyorder::{Epoch, PartitionCount, PartitionId, Seq, Time};

use super::worker::SimClock;
use crate::control::SharedControl;
use crate::protocol::{
    Conn, LeaseAcks, LeaseId, StoreRequest, StoreResponse, WireHead, STORE_PORT,
};

/// The broken designs that live in the worker's store client.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClientBreaks {
    /// `unfenced-lease`: statements go over a pooled connection, not the lease's.
    pub unfenced: bool,
    /// `cursor-past-parked`: an unpark leaves a session lease's cursor where it was.
    pub cursor_past_parked: bool,
    /// `cursor-past-late-commit`: a session lease reads after its cursor whatever may still
    /// commit below it.
    pub cursor_past_late_commit: bool,
}

/// How the worker's store client treats an expiry lease.
#[derive(Clone, Copy, Debug)]
pub struct ExpiryClient {
    /// The margin of the delivery check: the stated bound on clock skew.
    pub margin: Duration,
    /// How often the holder renews each lease.
    pub renew_every: Duration,
    /// The worker's delivery timeout: a head read ahead is handed out only while the lease
    /// lasts this plus the margin longer.
    pub delivery_timeout: Duration,
    /// Rows one head read reads ahead (production SQLite's default).
    pub read_ahead: u32,
    /// Buffered acknowledgements that make a flush due (production SQLite's `ack_batch`).
    pub ack_batch: usize,
    /// The oldest a buffered acknowledgement may be before a flush is due (`ack_delay`).
    pub ack_delay: Duration,
}

impl ExpiryClient {
    /// A client with the given margin, renewal period and delivery timeout, and production
    /// SQLite's defaults for everything else (read-ahead, acknowledgement buffer).
    pub fn new(margin: Duration, renew_every: Duration, delivery_timeout: Duration) -> Self {
        let sqlite = keyorder::store::sqlite::SqliteOptions::for_delivery_timeout(delivery_timeout);
        Self {
            margin,
            renew_every,
            delivery_timeout,
            read_ahead: sqlite.read_ahead as u32,
            ack_batch: sqlite.ack_batch,
            ack_delay: sqlite.ack_delay,
        }
    }
}

/// Waits while worker `name`'s process is stopped (a pause fault).
async fn gate(control: &SharedControl, name: &str) {
    while control.borrow().is_stopped(name) {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The store client: opens sessions to the store host.
#[derive(Clone)]
pub struct SimStore {
    worker: Rc<str>,
    control: SharedControl,
    request_timeout: Duration,
    /// `unfenced-lease`: statements go over a pooled connection, not the lease's.
    unfenced: bool,
    /// `cursor-past-parked`: an unpark leaves a session lease's cursor where it was.
    cursor_past_parked: bool,
    /// `cursor-past-late-commit`: a session lease reads after its cursor whatever may still
    /// commit below it.
    cursor_past_late_commit: bool,
    /// The worker's clock.
    clock: SimClock,
    /// Expiry leases: the delivery check's margin and the renewal period; `None`: session locks.
    expiry: Option<ExpiryClient>,
    /// Expiry leases: the acknowledgements of every lease of this worker process, buffered
    /// together as production SQLite buffers a connection's (lost with the process).
    acks: Rc<RefCell<AckBuffer<()>>>,
}

impl SimStore {
    /// A store client for worker `worker`: session locks unless `expiry` is given.
    pub fn new(
        worker: &str,
        control: SharedControl,
        request_timeout: Duration,
        clock: SimClock,
        expiry: Option<ExpiryClient>,
    ) -> Self {
        Self {
            worker: worker.into(),
            control,
            request_timeout,
            unfenced: false,
            cursor_past_parked: false,
            cursor_past_late_commit: false,
            clock,
            expiry,
            acks: Rc::default(),
        }
    }

    /// This client with the broken designs of `breaks` switched on.
    pub fn with_breaks(mut self, breaks: ClientBreaks) -> Self {
        self.unfenced = breaks.unfenced;
        self.cursor_past_parked = breaks.cursor_past_parked;
        self.cursor_past_late_commit = breaks.cursor_past_late_commit;
        self
    }
}

/// The worker's membership session.
pub struct SimControl {
    conn: Conn,
    control: SharedControl,
    worker: Rc<str>,
}

/// A session holding one partition's lease.
pub struct SimLease {
    conn: Conn,
    partition: PartitionId,
    epoch: Epoch,
    /// How the previous holder handed the lease back, as the store recorded it.
    handover: Handover,
    request_timeout: Duration,
    /// `unfenced-lease` only: the pooled connection statements go over instead of `conn`.
    pool: Option<Pool>,
    worker: Rc<str>,
    control: SharedControl,
    /// Expiry leases only: what the holder knows of its expiry.
    expiry: Option<Expiry>,
    /// Session leases only: the cursor, rows read ahead and buffered acknowledgements, by
    /// production PostgreSQL's rules ([`SessionDrain`]).
    drain: Option<SessionDrain>,
    /// The worker's clock.
    clock: SimClock,
}

/// An expiry lease as its holder sees it: the expiry the store last answered (store time), the
/// holder's clock to judge it by, and the renewal task (stopped with the lease).
struct Expiry {
    until: Rc<Cell<Time>>,
    clock: SimClock,
    renewer: tokio::task::JoinHandle<()>,
    /// The rows read ahead, judged by production's code ([`ReadAhead`]).
    ahead: ReadAhead,
    /// Where the next head read starts, by production's code ([`HeadCursor`]).
    cursor: HeadCursor,
    /// The worker process's buffered acknowledgements, shared by its leases.
    acks: Rc<RefCell<AckBuffer<()>>>,
    /// This lease in `acks`.
    key: LeaseKey,
    client: ExpiryClient,
    /// `cursor-past-parked`: an unpark leaves the cursor where it was.
    cursor_past_parked: bool,
}

impl Expiry {
    /// Whether the lease, as the store last answered (by a statement or the renewal timer),
    /// lasts `needed` plus the margin beyond this holder's now.
    fn lasts(&mut self, needed: Duration) -> bool {
        self.ahead.expires(self.until.get());
        self.ahead.lasts(self.clock.now(), needed)
    }
}

impl Drop for Expiry {
    fn drop(&mut self) {
        self.renewer.abort();
        // Unflushed acknowledgements stay queued; no later flush renews a dropped lease.
        self.acks.borrow_mut().forget(self.key);
    }
}

/// The holder's renewal timer: renews the lease every `every` on a connection of its own, so
/// renewal goes on during a long delivery. A refusal ends it (the next statement of the lease
/// reports the loss); a failed connection is replaced at the next tick.
async fn renew(
    lease: (PartitionId, Epoch),
    until: Rc<Cell<Time>>,
    (worker, control): (Rc<str>, SharedControl),
    every: Duration,
    timeout: Duration,
) {
    let (partition, epoch) = lease;
    let mut conn: Option<Conn> = None;
    loop {
        tokio::time::sleep(every).await;
        gate(&control, &worker).await;
        let late = control.borrow().late_renewals.get(&*worker).copied();
        if let Some(late) = late {
            tokio::time::sleep(late).await;
            gate(&control, &worker).await;
        }
        if conn.is_none() {
            conn = Conn::connect(("store", STORE_PORT), timeout).await.ok();
        }
        let Some(c) = &mut conn else { continue };
        match c.call(&StoreRequest::Renew { partition, epoch }, "renew", timeout).await {
            Ok(StoreResponse::Lasts { until_us, .. }) => {
                until.set(until.get().max(Time(Duration::from_micros(until_us))));
            }
            Ok(StoreResponse::NotHeld) => return,
            Ok(_) => {}
            Err(_) => conn = None,
        }
    }
}

/// The `unfenced-lease` design's connection pool: a statement that fails is retried on a
/// fresh connection, so a lost lease goes unnoticed.
struct Pool {
    conn: Option<Conn>,
}

/// Attempts a pooled statement gets before the pool gives up (a bound, not a design choice).
const POOL_ATTEMPTS: usize = 200;

fn unexpected(operation: &'static str, resp: StoreResponse) -> StoreError {
    let reason = match resp {
        StoreResponse::Refused(reason) => reason,
        other => format!("unexpected answer {other:?}"),
    };
    StoreError::Refused { operation, reason }
}

impl Store for SimStore {
    type Membership = SimControl;
    type Lease = SimLease;

    async fn ready(&self) {
        gate(&self.control, &self.worker).await;
    }

    async fn connect(&self, worker: &str) -> Result<SimControl, StoreError> {
        gate(&self.control, &self.worker).await;
        let mut conn = Conn::connect(("store", STORE_PORT), self.request_timeout).await?;
        let req = StoreRequest::Register { worker: worker.to_owned() };
        match conn.call(&req, "register", self.request_timeout).await? {
            StoreResponse::Ok => {
                Ok(SimControl { conn, control: self.control.clone(), worker: self.worker.clone() })
            }
            other => Err(unexpected("register", other)),
        }
    }

    async fn acquire(&self, partition: PartitionId) -> Result<Option<SimLease>, StoreError> {
        gate(&self.control, &self.worker).await;
        let mut conn = Conn::connect(("store", STORE_PORT), self.request_timeout).await?;
        let req = StoreRequest::TryLock { partition, worker: self.worker.to_string() };
        match conn.call(&req, "try_lock", self.request_timeout).await? {
            StoreResponse::Lock(Some(granted)) => Ok(Some(SimLease {
                conn,
                partition,
                epoch: granted.epoch,
                handover: if granted.clean { Handover::Clean } else { Handover::Unclean },
                request_timeout: self.request_timeout,
                pool: self.unfenced.then_some(Pool { conn: None }),
                worker: self.worker.clone(),
                control: self.control.clone(),
                expiry: self.expiry_of(partition, granted.epoch, granted.until_us),
                drain: self.expiry.is_none().then(|| self.session_drain()),
                clock: self.clock,
            })),
            StoreResponse::Lock(None) => Ok(None),
            other => Err(unexpected("try_lock", other)),
        }
    }
}

impl SimStore {
    /// A new session lease's drain, by production PostgreSQL's rules.
    fn session_drain(&self) -> SessionDrain {
        let mut drain = SessionDrain::new(SessionDrainOptions::default(), self.clock.now());
        if self.cursor_past_parked {
            drain = drain.keeping_the_cursor_on_unpark();
        }
        if self.cursor_past_late_commit {
            drain = drain.trusting_the_cursor();
        }
        drain
    }

    /// The holder's view of a granted expiry lease, with its renewal task started.
    fn expiry_of(
        &self,
        partition: PartitionId,
        epoch: Epoch,
        until_us: Option<u64>,
    ) -> Option<Expiry> {
        let (client, until_us) = (self.expiry?, until_us?);
        let until = Rc::new(Cell::new(Time(Duration::from_micros(until_us))));
        let renewer = tokio::task::spawn_local(renew(
            (partition, epoch),
            until.clone(),
            (self.worker.clone(), self.control.clone()),
            client.renew_every,
            self.request_timeout,
        ));
        Some(Expiry {
            until,
            clock: self.clock,
            renewer,
            ahead: ReadAhead::new(client.margin),
            cursor: HeadCursor::new(),
            acks: self.acks.clone(),
            key: (partition.0, epoch.0),
            client,
            cursor_past_parked: self.cursor_past_parked,
        })
    }
}

impl MembershipSession for SimControl {
    async fn live_workers(&mut self) -> Result<usize, StoreError> {
        gate(&self.control, &self.worker).await;
        // Bounded by the worker's shared wrapper, not here.
        match self.conn.exchange(&StoreRequest::LiveWorkers).await? {
            StoreResponse::Count(n) => Ok(n as usize),
            other => Err(unexpected("live_workers", other)),
        }
    }

    async fn partition_count(&mut self) -> Result<PartitionCount, StoreError> {
        Ok(self.control.borrow().worker_count)
    }

    async fn ready(&self) {
        gate(&self.control, &self.worker).await;
    }
}

impl SimLease {
    async fn fenced(
        &mut self,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<StoreResponse, StoreError> {
        gate(&self.control, &self.worker).await;
        if self.pool.is_some() {
            return self.pooled(req, operation).await;
        }
        let answer = match &self.expiry {
            Some(_) => self.call_anywhere(&req, operation).await?,
            // A session lock's statement: bounded by the worker's shared wrapper, not here.
            None => self.conn.exchange(&req).await?,
        };
        match answer {
            StoreResponse::NotHeld => {
                Err(StoreError::LeaseNotHeld { partition: self.partition, epoch: self.epoch })
            }
            StoreResponse::Lasts { until_us, answer } => {
                if let Some(e) = &self.expiry {
                    e.until.set(e.until.get().max(Time(Duration::from_micros(until_us))));
                }
                Ok(*answer)
            }
            other => Ok(other),
        }
    }

    /// An expiry lease's statement: fenced by its epoch in the store, not by the connection, so
    /// a failed connection is replaced and the statement sent once more (every fenced statement
    /// is idempotent).
    async fn call_anywhere(
        &mut self,
        req: &StoreRequest,
        operation: &'static str,
    ) -> Result<StoreResponse, StoreError> {
        let timeout = self.request_timeout;
        match self.conn.call(req, operation, timeout).await {
            Ok(answer) => Ok(answer),
            Err(_) => {
                self.conn = Conn::connect(("store", STORE_PORT), timeout).await?;
                self.conn.call(req, operation, timeout).await
            }
        }
    }

    /// The `unfenced-lease` path: keep the lease session looking alive (errors ignored), and run
    /// the statement on a pooled connection, reconnecting until it goes through.
    async fn pooled(
        &mut self,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<StoreResponse, StoreError> {
        let timeout = self.request_timeout;
        let _ = self.conn.call(&StoreRequest::Ping, "ping", timeout).await;
        let pool = self.pool.as_mut().expect("called only with a pool");
        let mut last = None;
        for _ in 0..POOL_ATTEMPTS {
            if pool.conn.is_none() {
                let mut fresh = Conn::connect(("store", STORE_PORT), timeout).await.ok();
                if let Some(c) = &mut fresh {
                    if !matches!(
                        c.call(&StoreRequest::Pooled, "pool", timeout).await,
                        Ok(StoreResponse::Ok)
                    ) {
                        fresh = None;
                    }
                }
                if fresh.is_none() {
                    tokio::time::sleep(timeout).await;
                    continue;
                }
                pool.conn = fresh;
            }
            let conn = pool.conn.as_mut().expect("connected above");
            match conn.call(&req, operation, timeout).await {
                Ok(resp) => return Ok(resp),
                Err(err) => {
                    pool.conn = None;
                    last = Some(err);
                }
            }
        }
        Err(last.unwrap_or(StoreError::Timeout { operation, after: timeout }))
    }

    async fn expect_ok(
        &mut self,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<(), StoreError> {
        match self.fenced(req, operation).await? {
            StoreResponse::Ok => Ok(()),
            other => Err(unexpected(operation, other)),
        }
    }

    /// A session lease's statement, sent at `sent`, answered: what its drain knows of the
    /// session (heard when the statement was sent, see `SessionDrain::heard`).
    fn heard(&mut self, sent: Time) {
        if let Some(d) = &mut self.drain {
            d.heard(sent);
        }
    }

    /// Fails when a flush, this lease's or another's, found this expiry lease lost (production
    /// SQLite's check before every call).
    fn check_held(&self) -> Result<(), StoreError> {
        match &self.expiry {
            Some(e) if e.acks.borrow().is_lost(e.key) => {
                Err(StoreError::LeaseNotHeld { partition: self.partition, epoch: self.epoch })
            }
            _ => Ok(()),
        }
    }

    /// Deletes an expiry lease's worker's buffered acknowledgements, of all its leases, in one
    /// statement: each lease's rows after its own fenced renewal (production SQLite's flush).
    /// A lease refused is marked lost; a flush that fails as a whole puts every row back.
    async fn flush_expiry_acks(&mut self) -> Result<(), StoreError> {
        let Some(e) = &self.expiry else { return Ok(()) };
        if e.acks.borrow().is_empty() {
            return self.check_held();
        }
        let batch = e.acks.borrow_mut().take();
        let leases = batch
            .iter()
            .map(|(&(p, epoch), (_, seqs))| LeaseAcks {
                partition: PartitionId(p),
                epoch: Epoch(epoch),
                seqs: seqs.iter().map(|&s| Seq(s)).collect(),
            })
            .collect();
        gate(&self.control, &self.worker).await;
        let answer = self.call_anywhere(&StoreRequest::FlushAcks { leases }, "ack").await;
        let Some(e) = &self.expiry else { return Ok(()) };
        match answer {
            Ok(StoreResponse::Lost(lost)) => {
                e.acks.borrow_mut().mark_lost(
                    lost.into_iter().map(|LeaseId { partition, epoch }| (partition.0, epoch.0)),
                );
                self.check_held()
            }
            Ok(other) => {
                e.acks.borrow_mut().restore(batch, self.clock.now());
                Err(unexpected("ack", other))
            }
            Err(err) => {
                e.acks.borrow_mut().restore(batch, self.clock.now());
                Err(err)
            }
        }
    }

    /// Before a statement changes a row (a retry, a dead letter): what was read ahead is read
    /// again, and the buffered acknowledgements go first.
    async fn row_changes(&mut self) -> Result<(), StoreError> {
        if let Some(e) = &mut self.expiry {
            e.ahead.clear();
        }
        self.flush_acks().await?;
        if let Some(d) = &mut self.drain {
            d.changed();
        }
        Ok(())
    }

    /// Deletes the lease's buffered acknowledgements, if any.
    async fn flush_acks(&mut self) -> Result<(), StoreError> {
        if self.expiry.is_some() {
            return self.flush_expiry_acks().await;
        }
        let Some(d) = self.drain.as_mut().filter(|d| d.has_acks()) else { return Ok(()) };
        let seqs = d.take_acks();
        let req = StoreRequest::AckMany { partition: self.partition, epoch: self.epoch, seqs };
        let sent = self.clock.now();
        self.expect_ok(req, "ack").await?;
        self.heard(sent);
        Ok(())
    }

    /// One round trip that proves a session: its buffered acknowledgements, else a ping.
    async fn prove(&mut self) -> Result<(), StoreError> {
        if self.drain.as_ref().is_some_and(SessionDrain::has_acks) {
            return self.flush_acks().await;
        }
        let sent = self.clock.now();
        self.expect_ok(StoreRequest::Ping, "ping").await?;
        self.heard(sent);
        Ok(())
    }

    /// A session lease's head read: `read`, and the look behind the cursor it may call for.
    async fn read_after(&mut self, read: Read) -> Result<(), StoreError> {
        let mut next = Some(read);
        while let Some(read) = next {
            let Some(d) = &self.drain else { return Ok(()) };
            let (skip, limit) = (d.skipped().clone(), d.options().read_ahead);
            let (partition, epoch) = (self.partition, self.epoch);
            let watched = d.watched();
            let req = StoreRequest::ReadAfter {
                partition,
                epoch,
                after: read.after,
                skip,
                limit,
                watched,
            };
            let (rows, running, late) = match self.fenced(req, "fetch_head").await? {
                StoreResponse::Heads { heads, running, late } => {
                    (heads.into_iter().map(stored).collect::<Vec<_>>(), running, late)
                }
                other => return Err(unexpected("fetch_head", other)),
            };
            let seen = Seen { running: &running, late };
            next = self.drain.as_mut().and_then(|d| d.filled(read, rows, seen));
        }
        Ok(())
    }

    /// A session lease's head, by production PostgreSQL's rules.
    async fn session_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError> {
        gate(&self.control, &self.worker).await;
        let now = self.clock.now();
        let Some(d) = &mut self.drain else { return Ok(None) };
        match d.plan_head(skip, now) {
            HeadPlan::Serve(head) => Ok(Some(head)),
            HeadPlan::Prove => {
                self.prove().await?;
                Ok(self.drain.as_ref().and_then(SessionDrain::head))
            }
            HeadPlan::Read(read) => {
                self.flush_acks().await?;
                self.read_after(read).await?;
                Ok(self.drain.as_ref().and_then(SessionDrain::head))
            }
        }
    }
}

impl LeaseSession for SimLease {
    fn partition(&self) -> PartitionId {
        self.partition
    }

    fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn handover(&self) -> Handover {
        self.handover
    }

    fn ends_with_session(&self) -> bool {
        // An expiry lease is fenced by epoch; the `unfenced-lease` design believes its lease
        // does not depend on its session (that is its flaw), so it neither keeps it alive nor
        // checks it.
        self.expiry.is_none() && self.pool.is_none()
    }

    fn request_budget(&self, request_timeout: Duration) -> Duration {
        if self.pool.is_some() {
            // The pool retries past any request timeout, up to its own bound.
            request_timeout.saturating_mul(3 * POOL_ATTEMPTS as u32 + 1)
        } else if self.expiry.is_some() {
            // The buffered acknowledgements' flush, then the statement: each a call, and on
            // failure a reconnect and the call once more.
            request_timeout.saturating_mul(6)
        } else {
            request_timeout
        }
    }

    async fn ready(&self) {
        gate(&self.control, &self.worker).await;
    }

    async fn keep_alive(&mut self) -> Result<(), StoreError> {
        // A session lease's buffered acknowledgements prove it as well as a ping (PostgreSQL).
        self.prove().await
    }

    async fn ensure_lasts(&mut self, needed: Duration) -> Result<(), StoreError> {
        gate(&self.control, &self.worker).await;
        // A session lease proves its session again when it was last heard `ack_delay` ago or
        // more, as production PostgreSQL's does (`SessionDrain::must_prove`).
        if self.drain.as_ref().is_some_and(|d| d.must_prove(self.clock.now())) {
            return self.prove().await;
        }
        let Some(e) = &mut self.expiry else { return Ok(()) };
        // The store's expiry against this holder's clock, which may run up to the margin
        // behind the store's; when it is too close, one fenced renewal answers again, as
        // production SQLite does.
        if e.lasts(needed) {
            return self.check_held();
        }
        // Production's renewal is a fenced write, which deletes the buffered acknowledgements
        // first.
        self.flush_acks().await?;
        let (partition, epoch) = (self.partition, self.epoch);
        self.expect_ok(StoreRequest::Renew { partition, epoch }, "renew").await?;
        if self.expiry.as_mut().is_some_and(|e| e.lasts(needed)) {
            Ok(())
        } else {
            Err(StoreError::LeaseEnding { partition, epoch, needed })
        }
    }

    async fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError> {
        if self.drain.is_some() {
            return self.session_head(skip).await;
        }
        // An expiry lease: production SQLite's read-ahead, cursor and buffered
        // acknowledgements.
        gate(&self.control, &self.worker).await;
        self.check_held()?;
        let Some(e) = &mut self.expiry else { return Ok(None) };
        let before = e.cursor.after();
        if e.cursor.look(skip) {
            // An unparked key's oldest row lies behind the cursor and what was read ahead,
            // beside acknowledged rows whose deletes may still be buffered.
            if e.cursor_past_parked {
                // The broken design: the cursor stays past the unparked key's rows.
                e.cursor.passed(Seq(before));
            }
            e.ahead.clear();
            self.flush_acks().await?;
        }
        let Some(e) = &mut self.expiry else { return Ok(None) };
        e.ahead.expires(e.until.get());
        if let Some(head) = e.ahead.next(skip, e.clock.now(), e.client.delivery_timeout) {
            return Ok(Some(head));
        }
        let req = StoreRequest::ReadAfter {
            partition: self.partition,
            epoch: self.epoch,
            after: Seq(e.cursor.after()),
            skip: skip.clone(),
            limit: e.client.read_ahead,
            watched: Vec::new(),
        };
        let heads = match self.fenced(req, "fetch_head").await? {
            StoreResponse::Heads { heads, .. } => heads,
            other => return Err(unexpected("fetch_head", other)),
        };
        let Some(e) = &mut self.expiry else { return Ok(None) };
        e.ahead.expires(e.until.get());
        let head = e.ahead.fill(heads.into_iter().map(stored).collect());
        if head.is_none() {
            // The partition ran empty: nothing is gained by holding the deletes back.
            self.flush_acks().await?;
        }
        Ok(head)
    }

    async fn ack(&mut self, seq: Seq) -> Result<(), StoreError> {
        let now = self.clock.now();
        if let Some(d) = &mut self.drain {
            if d.acked(seq, now) {
                self.flush_acks().await?;
            }
            return Ok(());
        }
        self.check_held()?;
        let Some(e) = &mut self.expiry else {
            return self
                .expect_ok(
                    StoreRequest::Ack { partition: self.partition, epoch: self.epoch, seq },
                    "ack",
                )
                .await;
        };
        let due = {
            let mut acks = e.acks.borrow_mut();
            acks.push(e.key, &(), seq.0, now);
            acks.due(now, e.client.ack_batch, e.client.ack_delay)
        };
        e.cursor.passed(seq);
        e.ahead.acked(seq);
        if due {
            self.flush_acks().await?;
        }
        Ok(())
    }

    async fn schedule_retry(
        &mut self,
        seq: Seq,
        attempts: u32,
        retry_in: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        self.row_changes().await?;
        let req = StoreRequest::Retry {
            partition: self.partition,
            epoch: self.epoch,
            seq,
            attempts,
            retry_in_us: retry_in.as_micros() as u64,
            error: error.to_owned(),
        };
        let sent = self.clock.now();
        self.expect_ok(req, "schedule_retry").await?;
        self.heard(sent);
        Ok(())
    }

    async fn dead_letter(
        &mut self,
        seq: Seq,
        attempts: u32,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.row_changes().await?;
        let req = StoreRequest::DeadLetter {
            partition: self.partition,
            epoch: self.epoch,
            seq,
            attempts,
            reason: reason.to_owned(),
        };
        let sent = self.clock.now();
        self.expect_ok(req, "dead_letter").await?;
        if let Some(d) = &mut self.drain {
            d.dead_lettered(seq);
        }
        if let Some(e) = &mut self.expiry {
            e.cursor.passed(seq);
        }
        self.heard(sent);
        Ok(())
    }

    async fn release(mut self, handover: Handover) -> Result<(), StoreError> {
        // Unlocking happens on the lock's own session, pooled design or not (PostgreSQL's
        // pg_advisory_unlock on another session unlocks nothing).
        let clean = handover == Handover::Clean;
        let req = StoreRequest::Unlock { partition: self.partition, epoch: self.epoch, clean };
        // The last acknowledgements go before the lease (PostgreSQL's hand-back; SQLite's, in
        // one transaction).
        self.flush_acks().await?;
        if self.expiry.is_some() {
            return self.expect_ok(req, "unlock").await;
        }
        gate(&self.control, &self.worker).await;
        match self.conn.exchange(&req).await? {
            StoreResponse::Ok => Ok(()),
            StoreResponse::NotHeld => {
                Err(StoreError::LeaseNotHeld { partition: self.partition, epoch: self.epoch })
            }
            other => Err(unexpected("unlock", other)),
        }
    }
}

/// A head row off the wire (the simulation carries no payloads).
fn stored(h: WireHead) -> StoredHead {
    StoredHead {
        seq: h.seq,
        event_id: h.event_id,
        key: h.key,
        payload: String::new(),
        attempts: h.attempts,
        wait: h.wait_us.map(Duration::from_micros),
        last_error: h.last_error,
    }
}
