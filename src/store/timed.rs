//! The wrapper every store goes through in the worker loop: a timeout on every call, and the
//! holder's record of when each lease session was last heard.
//!
//! Production and the simulation run this same code (the worker loop wraps whatever store it
//! is given), so the request timeout and the session liveness check the simulation proves
//! things under are the ones production enforces.
//!
//! * Every call is bounded by [`Limits::request_timeout`] (or the session's
//!   [`LeaseSession::request_budget`] of it, for a session that resends on a fresh connection);
//!   opening a session (a connection
//!   and its first statements) by twice it. A call that times out fails with
//!   [`StoreError::Timeout`]; the worker then drops that session (for PostgreSQL dropping the
//!   client closes the socket), so a fenced call that times out ends its lease.
//! * For a lease that ends with its session ([`LeaseSession::ends_with_session`]) and a store
//!   that ends silent sessions ([`Limits::session_timeout`]), the wrapper records when the
//!   session was last heard (the start of its last answered call, which the store received
//!   no earlier) and refuses a delivery ([`LeaseSession::ensure_lasts`]) that could still be
//!   running when the store ends the session: so a holder frozen past the bound does not
//!   deliver on waking. [`TimedLease::keep_alive_at`] says when the session must next be
//!   heard from to stay well inside the bound.

use std::future::Future;
use std::time::Duration;

use crate::clock::Clock;
use crate::drain::ParkedKeys;
use crate::ids::{Epoch, PartitionId, Seq, Time};
use crate::liveness::LivenessConfig;
use crate::routing::PartitionCount;
use crate::store::{Handover, LeaseSession, MembershipSession, Store, StoreError, StoredHead};

/// The bounds the wrapper enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest any store call may take.
    pub request_timeout: Duration,
    /// How long the store lets a session stay silent before ending it (and the locks it holds);
    /// `None`: the store ends no silent session (SQLite), and nothing is kept alive.
    pub session_timeout: Option<Duration>,
    /// How stale the record of "last heard" may be (see [`LivenessConfig::margin`]).
    pub margin: Duration,
}

impl Limits {
    /// Limits from a validated liveness configuration.
    pub fn from_liveness(c: &LivenessConfig) -> Self {
        Self {
            request_timeout: c.request_timeout,
            session_timeout: Some(c.session_timeout),
            margin: c.margin,
        }
    }

    /// The bound on opening a session: a connection and its first statements.
    pub fn open_timeout(&self) -> Duration {
        self.request_timeout.saturating_mul(2)
    }
}

/// Runs `call`, failing with [`StoreError::Timeout`] naming `operation` after `after`.
pub async fn bounded<T>(
    after: Duration,
    operation: &'static str,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(after, call).await.unwrap_or(Err(StoreError::Timeout { operation, after }))
}

/// A store whose every call is bounded; see the module doc.
#[derive(Clone, Debug)]
pub struct TimedStore<S, C> {
    inner: S,
    clock: C,
    limits: Limits,
}

impl<S, C> TimedStore<S, C> {
    /// Wraps `inner`, judging time by `clock`.
    pub fn new(inner: S, clock: C, limits: Limits) -> Self {
        Self { inner, clock, limits }
    }
}

/// A membership session whose every call is bounded.
pub struct TimedControl<T> {
    inner: T,
    limits: Limits,
}

/// A lease session whose every call is bounded, with the record of when it was last heard.
pub struct TimedLease<L, C> {
    inner: L,
    clock: C,
    limits: Limits,
    /// The start of the last call the store answered.
    heard_at: Time,
    /// The start of the last call sent.
    sent_at: Time,
}

impl<S, C> Store for TimedStore<S, C>
where
    S: Store,
    C: Clock + Clone + 'static,
{
    type Membership = TimedControl<S::Membership>;
    type Lease = TimedLease<S::Lease, C>;

    async fn connect(&self, worker: &str) -> Result<Self::Membership, StoreError> {
        self.inner.ready().await;
        let inner = bounded(self.limits.open_timeout(), "connect", self.inner.connect(worker));
        Ok(TimedControl { inner: inner.await?, limits: self.limits })
    }

    async fn acquire(&self, partition: PartitionId) -> Result<Option<Self::Lease>, StoreError> {
        self.inner.ready().await;
        let start = self.clock.now();
        let lease = bounded(self.limits.open_timeout(), "acquire", self.inner.acquire(partition));
        Ok(lease.await?.map(|inner| TimedLease {
            inner,
            clock: self.clock.clone(),
            limits: self.limits,
            heard_at: start,
            sent_at: start,
        }))
    }

    async fn ready(&self) {
        self.inner.ready().await;
    }
}

impl<T: MembershipSession> MembershipSession for TimedControl<T> {
    async fn live_workers(&mut self) -> Result<usize, StoreError> {
        self.inner.ready().await;
        bounded(self.limits.request_timeout, "live_workers", self.inner.live_workers()).await
    }

    async fn partition_count(&mut self) -> Result<PartitionCount, StoreError> {
        self.inner.ready().await;
        bounded(self.limits.request_timeout, "partition_count", self.inner.partition_count()).await
    }

    async fn ready(&self) {
        self.inner.ready().await;
    }
}

impl<L: LeaseSession, C: Clock> TimedLease<L, C> {
    /// When the session must next be heard from, if the store ends silent sessions and the
    /// lease ends with its session: a third of the bound after the last call was sent.
    pub fn keep_alive_at(&self) -> Option<Time> {
        let bound = self.limits.session_timeout.filter(|_| self.inner.ends_with_session())?;
        Some(self.sent_at.saturating_add(bound / 3))
    }

    /// How long until [`TimedLease::keep_alive_at`], by the lease's clock.
    pub fn keep_alive_in(&self) -> Option<Duration> {
        self.keep_alive_at().map(|t| t.saturating_since(self.clock.now()))
    }

    /// Marks a call as sent now, returning its start.
    fn begin(&mut self) -> Time {
        let start = self.clock.now();
        self.sent_at = start;
        start
    }

    /// Records that the call started at `start` was answered, if it was.
    fn end<T>(&mut self, start: Time, result: &Result<T, StoreError>) {
        if result.is_ok() {
            self.heard_at = self.heard_at.max(start);
        }
    }

    /// Refuses a delivery of `needed` that could outlast the session by the holder's clock.
    fn check_heard(&self, needed: Duration) -> Result<(), StoreError> {
        let Some(bound) = self.limits.session_timeout.filter(|_| self.inner.ends_with_session())
        else {
            return Ok(());
        };
        let silent = self.clock.now().saturating_since(self.heard_at);
        if silent + needed + self.limits.margin < bound {
            Ok(())
        } else {
            Err(StoreError::LeaseEnding {
                partition: self.inner.partition(),
                epoch: self.inner.epoch(),
                needed: needed + self.limits.margin + silent,
            })
        }
    }
}

/// One call of the inner session: after `ready`, bounded by the request timeout, recorded as
/// sent and, if answered, heard.
macro_rules! timed {
    ($self:ident, $operation:literal, $call:expr) => {{
        $self.inner.ready().await;
        let start = $self.begin();
        let after = $self.inner.request_budget($self.limits.request_timeout);
        let result = bounded(after, $operation, $call).await;
        $self.end(start, &result);
        result
    }};
}

impl<L: LeaseSession, C: Clock> LeaseSession for TimedLease<L, C> {
    fn partition(&self) -> PartitionId {
        self.inner.partition()
    }

    fn epoch(&self) -> Epoch {
        self.inner.epoch()
    }

    fn handover(&self) -> Handover {
        self.inner.handover()
    }

    fn ends_with_session(&self) -> bool {
        self.inner.ends_with_session()
    }

    fn request_budget(&self, request_timeout: Duration) -> Duration {
        self.inner.request_budget(request_timeout)
    }

    async fn ensure_lasts(&mut self, needed: Duration) -> Result<(), StoreError> {
        // After `ready`: a holder that was frozen judges its session by the time it woke.
        self.inner.ready().await;
        self.check_heard(needed)?;
        // No round trip is implied: the store is not heard by this.
        let after = self.inner.request_budget(self.limits.request_timeout);
        bounded(after, "ensure_lasts", self.inner.ensure_lasts(needed)).await
    }

    async fn keep_alive(&mut self) -> Result<(), StoreError> {
        timed!(self, "keep_alive", self.inner.keep_alive())
    }

    async fn ready(&self) {
        self.inner.ready().await;
    }

    async fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError> {
        timed!(self, "fetch_head", self.inner.fetch_head(skip))
    }

    async fn ack(&mut self, seq: Seq) -> Result<(), StoreError> {
        timed!(self, "ack", self.inner.ack(seq))
    }

    async fn schedule_retry(
        &mut self,
        seq: Seq,
        attempts: u32,
        retry_in: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        timed!(self, "schedule_retry", self.inner.schedule_retry(seq, attempts, retry_in, error))
    }

    async fn dead_letter(
        &mut self,
        seq: Seq,
        attempts: u32,
        reason: &str,
    ) -> Result<(), StoreError> {
        timed!(self, "dead_letter", self.inner.dead_letter(seq, attempts, reason))
    }

    async fn release(self, handover: Handover) -> Result<(), StoreError> {
        self.inner.ready().await;
        let after = self.inner.request_budget(self.limits.request_timeout);
        bounded(after, "release", self.inner.release(handover)).await
    }
}
