//! The worker's store client in the simulation: production's `Store`, `MembershipSession` and
//! `LeaseSession` traits over the store protocol to the simulated store host, with
//! production's sans-IO lease drains doing the deciding: [`SessionDrain`] for session locks
//! (`session.rs`), [`ExpiryDrain`](keyorder::store::expiry_drain::ExpiryDrain) for expiry
//! leases (`expiry.rs`). This file opens sessions and routes each lease call to its model.
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

use std::rc::Rc;
use std::time::Duration;

use keyorder::clock::Clock;
use keyorder::drain::ParkedKeys;
use keyorder::store::expiry_drain::ExpiryAcks;
use keyorder::store::session_drain::{SessionDrain, SessionDrainOptions};
use keyorder::store::{Handover, LeaseSession, MembershipSession, Store, StoreError, StoredHead};
use keyorder::{Epoch, PartitionCount, PartitionId, Seq};

use super::worker::SimClock;
use crate::control::SharedControl;
use crate::protocol::{Conn, StoreRequest, StoreResponse, WireHead, STORE_PORT};

mod expiry;
mod session;

use expiry::ExpiryLease;
use session::{Route, SessionLease};
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
    acks: ExpiryAcks<()>,
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
            acks: ExpiryAcks::new(),
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

/// A session holding one partition's lease: the connection and identity every lease model
/// shares, and the model's own state.
pub struct SimLease {
    wire: LeaseWire,
    /// How the previous holder handed the lease back, as the store recorded it.
    handover: Handover,
    model: LeaseModel,
}

/// What every lease model of the client shares: the lease's connection, identity, and the
/// worker process it belongs to.
struct LeaseWire {
    conn: Conn,
    partition: PartitionId,
    epoch: Epoch,
    request_timeout: Duration,
    worker: Rc<str>,
    control: SharedControl,
    /// The worker's clock.
    clock: SimClock,
}

impl LeaseWire {
    /// Waits while the worker's process is stopped.
    async fn gate(&self) {
        gate(&self.control, &self.worker).await;
    }

    fn not_held(&self) -> StoreError {
        StoreError::LeaseNotHeld { partition: self.partition, epoch: self.epoch }
    }
}

/// How a lease is held: each model's state, driven by production's sans-IO drain.
enum LeaseModel {
    /// A session lock (PostgreSQL's advisory lock), by [`SessionDrain`]'s rules.
    Session(SessionLease),
    /// An expiry lease (SQLite's lease row), by `ExpiryDrain`'s rules.
    Expiry(ExpiryLease),
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
        let granted = match conn.call(&req, "try_lock", self.request_timeout).await? {
            StoreResponse::Lock(Some(granted)) => granted,
            StoreResponse::Lock(None) => return Ok(None),
            other => return Err(unexpected("try_lock", other)),
        };
        let epoch = granted.epoch;
        let model = match self.expiry {
            Some(client) => {
                // The store and its clients agree on the lease model: a store of session locks
                // grants no expiry, a store of expiry leases always one.
                assert!(
                    granted.until_us.is_some(),
                    "invariant: an expiry store grants p{partition} epoch {epoch} with an expiry"
                );
                LeaseModel::Expiry(ExpiryLease::new(self, client, partition, epoch))
            }
            None => {
                assert!(
                    granted.until_us.is_none(),
                    "invariant: a session-lock store grants p{partition} epoch {epoch} without an expiry"
                );
                let route = if self.unfenced { Route::pooled() } else { Route::Own };
                LeaseModel::Session(SessionLease::new(self.session_drain(), route))
            }
        };
        let wire = LeaseWire {
            conn,
            partition,
            epoch,
            request_timeout: self.request_timeout,
            worker: self.worker.clone(),
            control: self.control.clone(),
            clock: self.clock,
        };
        let handover = if granted.clean { Handover::Clean } else { Handover::Unclean };
        Ok(Some(SimLease { wire, handover, model }))
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
}

fn unexpected(operation: &'static str, resp: StoreResponse) -> StoreError {
    let reason = match resp {
        StoreResponse::Refused(reason) => reason,
        other => format!("unexpected answer {other:?}"),
    };
    StoreError::Refused { operation, reason }
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

impl LeaseSession for SimLease {
    fn partition(&self) -> PartitionId {
        self.wire.partition
    }

    fn epoch(&self) -> Epoch {
        self.wire.epoch
    }

    fn handover(&self) -> Handover {
        self.handover
    }

    fn ends_with_session(&self) -> bool {
        // An expiry lease is fenced by epoch; the `unfenced-lease` design believes its lease
        // does not depend on its session (that is its flaw), so it neither keeps it alive nor
        // checks it.
        matches!(&self.model, LeaseModel::Session(s) if s.is_own())
    }

    fn request_budget(&self, request_timeout: Duration) -> Duration {
        match &self.model {
            LeaseModel::Session(s) => s.request_budget(request_timeout),
            LeaseModel::Expiry(_) => ExpiryLease::request_budget(request_timeout),
        }
    }

    async fn ready(&self) {
        self.wire.gate().await;
    }

    async fn keep_alive(&mut self) -> Result<(), StoreError> {
        match &mut self.model {
            LeaseModel::Session(s) => s.prove(&mut self.wire).await,
            LeaseModel::Expiry(e) => e.ping(&mut self.wire).await,
        }
    }

    async fn ensure_lasts(&mut self, needed: Duration) -> Result<(), StoreError> {
        match &mut self.model {
            LeaseModel::Session(s) => s.ensure_lasts(&mut self.wire).await,
            LeaseModel::Expiry(e) => e.ensure_lasts(&mut self.wire, needed).await,
        }
    }

    async fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError> {
        match &mut self.model {
            LeaseModel::Session(s) => s.head(&mut self.wire, skip).await,
            LeaseModel::Expiry(e) => e.head(&mut self.wire, skip).await,
        }
    }

    async fn ack(&mut self, seq: Seq) -> Result<(), StoreError> {
        match &mut self.model {
            LeaseModel::Session(s) => s.ack(&mut self.wire, seq).await,
            LeaseModel::Expiry(e) => e.ack(&mut self.wire, seq).await,
        }
    }

    async fn schedule_retry(
        &mut self,
        seq: Seq,
        attempts: u32,
        retry_in: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let req = StoreRequest::Retry {
            partition: self.wire.partition,
            epoch: self.wire.epoch,
            seq,
            attempts,
            retry_in_us: retry_in.as_micros() as u64,
            error: error.to_owned(),
        };
        match &mut self.model {
            LeaseModel::Session(s) => s.change_row(&mut self.wire, req, "schedule_retry").await,
            LeaseModel::Expiry(e) => e.change_row(&mut self.wire, req, "schedule_retry").await,
        }
    }

    async fn dead_letter(
        &mut self,
        seq: Seq,
        attempts: u32,
        reason: &str,
    ) -> Result<(), StoreError> {
        let req = StoreRequest::DeadLetter {
            partition: self.wire.partition,
            epoch: self.wire.epoch,
            seq,
            attempts,
            reason: reason.to_owned(),
        };
        match &mut self.model {
            LeaseModel::Session(s) => {
                s.change_row(&mut self.wire, req, "dead_letter").await?;
                s.dead_lettered(seq);
            }
            LeaseModel::Expiry(e) => {
                e.change_row(&mut self.wire, req, "dead_letter").await?;
                e.dead_lettered(seq);
            }
        }
        Ok(())
    }

    async fn release(mut self, handover: Handover) -> Result<(), StoreError> {
        let clean = handover == Handover::Clean;
        let req =
            StoreRequest::Unlock { partition: self.wire.partition, epoch: self.wire.epoch, clean };
        match &mut self.model {
            LeaseModel::Session(s) => s.release(&mut self.wire, req).await,
            LeaseModel::Expiry(e) => e.release(&mut self.wire, req).await,
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
