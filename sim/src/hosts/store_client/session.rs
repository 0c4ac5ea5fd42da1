//! A session-lock lease (PostgreSQL's advisory lock) in the simulated client: every decision by
//! production's [`SessionDrain`]; this file only turns what it asks for into store requests.
//! The `unfenced-lease` design is a [`Route`]: its statements go over a pool of connections
//! instead of the lease's own.

use std::time::Duration;

use keyorder::clock::Clock;
use keyorder::drain::ParkedKeys;
use keyorder::store::session_drain::{HeadPlan, Read, Seen, SessionDrain};
use keyorder::store::{StoreError, StoredHead};
use keyorder::Seq;

use super::{stored, unexpected, LeaseWire};
use crate::protocol::{Conn, StoreRequest, StoreResponse, STORE_PORT};

/// Where a session lease's statements go.
pub(super) enum Route {
    /// Over the lease's own session: the fence.
    Own,
    /// `unfenced-lease`: over a pooled connection, reconnecting until a statement goes
    /// through, so a lost lease goes unnoticed.
    Pooled(Pool),
}

impl Route {
    /// The `unfenced-lease` design's route, with no pooled connection yet.
    pub(super) fn pooled() -> Self {
        Route::Pooled(Pool { conn: None })
    }
}

/// The `unfenced-lease` design's connection pool.
pub(super) struct Pool {
    conn: Option<Conn>,
}

/// Attempts a pooled statement gets before the pool gives up (a bound, not a design choice).
const POOL_ATTEMPTS: usize = 200;

/// A session lease's drain and the route of its statements.
pub(super) struct SessionLease {
    drain: SessionDrain,
    route: Route,
}

impl SessionLease {
    pub(super) fn new(drain: SessionDrain, route: Route) -> Self {
        Self { drain, route }
    }

    /// Whether its statements go over its own session (the lease is fenced by it).
    pub(super) fn is_own(&self) -> bool {
        matches!(self.route, Route::Own)
    }

    /// How long one of its calls may take: the pool retries past any request timeout, up to
    /// its own bound.
    pub(super) fn request_budget(&self, request_timeout: Duration) -> Duration {
        match self.route {
            Route::Own => request_timeout,
            Route::Pooled(_) => request_timeout.saturating_mul(3 * POOL_ATTEMPTS as u32 + 1),
        }
    }

    /// Sends a fenced statement by the lease's route: refused when the session does not hold
    /// the lease.
    async fn fenced(
        &mut self,
        wire: &mut LeaseWire,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<StoreResponse, StoreError> {
        wire.gate().await;
        let answer = match &mut self.route {
            Route::Pooled(pool) => pool.call(wire, req, operation).await?,
            // Bounded by the worker's shared wrapper, not here.
            Route::Own => wire.conn.exchange(&req).await?,
        };
        match answer {
            StoreResponse::NotHeld => Err(wire.not_held()),
            other => Ok(other),
        }
    }

    /// A fenced statement whose answer is `Ok`, sent now: the session was heard when it was
    /// sent (see `SessionDrain::heard`).
    async fn expect_ok(
        &mut self,
        wire: &mut LeaseWire,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<(), StoreError> {
        let sent = wire.clock.now();
        match self.fenced(wire, req, operation).await? {
            StoreResponse::Ok => {
                self.drain.heard(sent);
                Ok(())
            }
            other => Err(unexpected(operation, other)),
        }
    }

    /// Deletes the buffered acknowledgements, if any.
    async fn flush_acks(&mut self, wire: &mut LeaseWire) -> Result<(), StoreError> {
        if !self.drain.has_acks() {
            return Ok(());
        }
        let seqs = self.drain.take_acks();
        let req = StoreRequest::AckMany { partition: wire.partition, epoch: wire.epoch, seqs };
        self.expect_ok(wire, req, "ack").await
    }

    /// One round trip that proves the session: its buffered acknowledgements, else a ping.
    pub(super) async fn prove(&mut self, wire: &mut LeaseWire) -> Result<(), StoreError> {
        if self.drain.has_acks() {
            return self.flush_acks(wire).await;
        }
        self.expect_ok(wire, StoreRequest::Ping, "ping").await
    }

    /// Proves the session again when it was last heard `ack_delay` ago or more, as production
    /// PostgreSQL's lease does before a delivery (`SessionDrain::must_prove`).
    pub(super) async fn ensure_lasts(&mut self, wire: &mut LeaseWire) -> Result<(), StoreError> {
        wire.gate().await;
        if self.drain.must_prove(wire.clock.now()) {
            return self.prove(wire).await;
        }
        Ok(())
    }

    /// The head, by production PostgreSQL's rules.
    pub(super) async fn head(
        &mut self,
        wire: &mut LeaseWire,
        skip: &ParkedKeys,
    ) -> Result<Option<StoredHead>, StoreError> {
        wire.gate().await;
        match self.drain.plan_head(skip, wire.clock.now()) {
            HeadPlan::Serve(head) => return Ok(Some(head)),
            HeadPlan::Prove => self.prove(wire).await?,
            HeadPlan::Read(read) => {
                self.flush_acks(wire).await?;
                self.read_after(wire, read).await?;
            }
        }
        Ok(self.drain.head())
    }

    /// A head read: `read`, and the look behind the cursor it may call for.
    async fn read_after(&mut self, wire: &mut LeaseWire, read: Read) -> Result<(), StoreError> {
        let mut next = Some(read);
        while let Some(read) = next {
            let req = StoreRequest::ReadAfter {
                partition: wire.partition,
                epoch: wire.epoch,
                after: read.after,
                skip: self.drain.skipped().clone(),
                limit: self.drain.options().read_ahead,
                watched: self.drain.watched(),
            };
            let (rows, running, late) = match self.fenced(wire, req, "fetch_head").await? {
                StoreResponse::Heads { heads, running, late } => {
                    (heads.into_iter().map(stored).collect::<Vec<_>>(), running, late)
                }
                other => return Err(unexpected("fetch_head", other)),
            };
            next = self.drain.filled(read, rows, Seen { running: &running, late });
        }
        Ok(())
    }

    /// Row `seq` was delivered: its acknowledgement is buffered, and flushed when due.
    pub(super) async fn ack(&mut self, wire: &mut LeaseWire, seq: Seq) -> Result<(), StoreError> {
        if self.drain.acked(seq, wire.clock.now()) {
            self.flush_acks(wire).await?;
        }
        Ok(())
    }

    /// A statement that changes the head's row (a retry, a dead letter): the buffered
    /// acknowledgements go first, and what was read ahead is read again.
    pub(super) async fn change_row(
        &mut self,
        wire: &mut LeaseWire,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<(), StoreError> {
        self.flush_acks(wire).await?;
        self.drain.changed();
        self.expect_ok(wire, req, operation).await
    }

    /// Row `seq` was dead-lettered.
    pub(super) fn dead_lettered(&mut self, seq: Seq) {
        self.drain.dead_lettered(seq);
    }

    /// The hand-back: the last acknowledgements, then the unlock on the lock's own session,
    /// pooled design or not (PostgreSQL's `pg_advisory_unlock` on another session unlocks
    /// nothing).
    pub(super) async fn release(
        &mut self,
        wire: &mut LeaseWire,
        unlock: StoreRequest,
    ) -> Result<(), StoreError> {
        self.flush_acks(wire).await?;
        wire.gate().await;
        match wire.conn.exchange(&unlock).await? {
            StoreResponse::Ok => Ok(()),
            StoreResponse::NotHeld => Err(wire.not_held()),
            other => Err(unexpected("unlock", other)),
        }
    }
}

impl Pool {
    /// Keeps the lease session looking alive (errors ignored), and runs the statement on a
    /// pooled connection, reconnecting until it goes through.
    async fn call(
        &mut self,
        wire: &mut LeaseWire,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<StoreResponse, StoreError> {
        let timeout = wire.request_timeout;
        let _ = wire.conn.call(&StoreRequest::Ping, "ping", timeout).await;
        let mut last = None;
        for _ in 0..POOL_ATTEMPTS {
            if self.conn.is_none() {
                self.conn = pooled_connection(timeout).await;
                if self.conn.is_none() {
                    tokio::time::sleep(timeout).await;
                    continue;
                }
            }
            let conn = self.conn.as_mut().expect("connected above");
            match conn.call(&req, operation, timeout).await {
                Ok(resp) => return Ok(resp),
                Err(err) => {
                    self.conn = None;
                    last = Some(err);
                }
            }
        }
        Err(last.unwrap_or(StoreError::Timeout { operation, after: timeout }))
    }
}

/// A fresh connection marked pooled, or `None` when it cannot be had now.
async fn pooled_connection(timeout: Duration) -> Option<Conn> {
    let mut conn = Conn::connect(("store", STORE_PORT), timeout).await.ok()?;
    match conn.call(&StoreRequest::Pooled, "pool", timeout).await {
        Ok(StoreResponse::Ok) => Some(conn),
        _ => None,
    }
}
