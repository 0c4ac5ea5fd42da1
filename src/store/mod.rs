//! The store boundary: what the worker is written against (membership, leases, and the fenced
//! queue operations of one leased partition: [`Store`], [`MembershipSession`],
//! [`LeaseSession`]), what the admin commands use ([`admin::Admin`] and its report types), and
//! the errors of both ([`StoreError`], [`admin::OpenError`]), none of which names a driver.
//! [`open`] opens a backend from a location (`--database`); [`any`] is the worker's store on
//! whichever backend that is. Each backend is one folder (`postgres/`, `sqlite/`) and converts
//! its driver's errors there.
//!
//! Implementations: PostgreSQL (session advisory locks), SQLite (lease rows fenced by holder
//! and epoch) and the simulation's store host. A [`LeaseSession`] holds one partition's lease;
//! every head read and acknowledgement goes through it and is fenced by it (on PostgreSQL and
//! in the simulation the session is the dedicated connection that holds the lock; on SQLite
//! every statement checks the lease row), so a worker that lost its lease cannot advance the
//! partition.

// The worker runs on a current-thread runtime (the simulation's, or `LocalSet` in production), so
// these futures need no `Send` bound.
#![allow(async_fn_in_trait)]

use std::time::Duration;

use crate::drain::{Head, ParkedKeys};
use crate::ids::{Epoch, PartitionId, Seq, Time};
use crate::routing::PartitionCount;

mod ack_buffer;
pub mod admin;
pub mod any;
pub mod expiry_drain;
mod head_cursor;
pub mod lock_wait;
pub mod open;
pub mod postgres;
mod read_ahead;
pub mod session_drain;
pub mod sqlite;
pub mod timed;

/// A driver's error, kept as the source of a [`StoreError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub use postgres::pooler::PoolingMode;

/// Errors at the store boundary. Any of them on a lease session means the lease is gone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The connection failed or was closed.
    #[error("store connection failed")]
    Io(#[from] std::io::Error),
    /// The store did not answer in time; the connection is presumed dead.
    #[error("store did not answer {operation} within {after:?}")]
    Timeout {
        /// The operation that timed out.
        operation: &'static str,
        /// How long it waited.
        after: Duration,
    },
    /// A fenced statement was refused: this session no longer holds the lease.
    #[error("partition {partition}: lease with epoch {epoch} is not held by this session")]
    LeaseNotHeld {
        /// The partition.
        partition: PartitionId,
        /// The epoch the statement was fenced with.
        epoch: Epoch,
    },
    /// The database could not be opened (the file cannot be created, opened or written, or is
    /// not a database): something the user can fix by naming another database or fixing the
    /// file's permissions. `backend` names the store, `source` is its driver's error.
    #[error("{backend} error")]
    CannotOpen {
        /// The store: `"postgres"`, `"sqlite"`.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The store's driver reported an error (a connection, a statement, the server, a busy
    /// database). `backend` names the store, `source` is the driver's error (each backend folder
    /// converts its driver's errors, so nothing else names a driver).
    #[error("{backend} error")]
    Backend {
        /// The store: `"postgres"`, `"sqlite"`.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// An expiry lease may end before a delivery started now could finish, by the holder's own
    /// clock: the holder must not deliver (see [`LeaseSession::ensure_lasts`]).
    #[error("partition {partition}: lease with epoch {epoch} may expire within {needed:?}")]
    LeaseEnding {
        /// The partition.
        partition: PartitionId,
        /// The lease's epoch.
        epoch: Epoch,
        /// How long the lease had to last.
        needed: Duration,
    },
    /// An admin operation gave up waiting for locks that other sessions held (see
    /// [`lock_wait`]); nothing of it was applied beyond what it reported before.
    #[error(
        "{operation} could not take its locks in {attempts} tries of {attempt:?} each, so as \
         not to hold up producers and workers behind it: {}. End that transaction (or the \
         session: SELECT pg_terminate_backend(pid)) and run it again, or wait longer \
         (--lock-wait)",
        lock_wait::holders_text(holders)
    )]
    LockBusy {
        /// The operation.
        operation: &'static str,
        /// Tries made.
        attempts: u32,
        /// How long each try waited.
        attempt: Duration,
        /// The sessions that held the locks after the last try.
        holders: Vec<lock_wait::LockHolder>,
    },
    /// A SQLite write gave up after waiting `waited` (the busy timeout) for the database's
    /// write lock, which the named processes held (see [`sqlite::lock_holders`]).
    #[error(
        "the SQLite database {} stayed locked for {waited:?}: {}",
        database.display(),
        sqlite::lock_holders::holders_text(holders)
    )]
    FileLocked {
        /// The database file.
        database: std::path::PathBuf,
        /// How long the write waited (the connection's busy timeout).
        waited: Duration,
        /// The processes holding locks on the database's files when it gave up.
        holders: Vec<sqlite::lock_holders::FileLockHolder>,
    },
    /// The database URL leads through a connection pooler that hands the server connection
    /// behind a client session to other clients between transactions (PgBouncer's transaction
    /// or statement pooling): session advisory locks (leases), session settings and prepared
    /// statements would not stay this client's, so the operation refuses before it starts.
    #[error(
        "{operation} needs PostgreSQL sessions of its own, but --database leads through a \
         connection pooler in {mode} pooling mode (it hands the server connection behind a \
         session to other clients between {between}), so a partition's lease would not stay \
         with the worker that took it. Point --database at a pool in session mode (PgBouncer: \
         pool_mode = session) or straight at the server"
    )]
    SessionsPooled {
        /// The operation refused.
        operation: &'static str,
        /// What the pooler was found to do.
        mode: PoolingMode,
        /// What the pooler switches between, for the message.
        between: &'static str,
    },
    /// A lease's session answered from another server session than the one that took the
    /// lock: a pooler moved it, and the lock is no longer this session's.
    #[error(
        "partition {partition}: the lease's session moved from server process {held_by} to \
         {now_on} (a connection pooler in transaction mode?); the lease is given up"
    )]
    SessionMoved {
        /// The partition.
        partition: PartitionId,
        /// The server process that took the lock.
        held_by: i32,
        /// The server process that answered now.
        now_on: i32,
    },
    /// The server accepts no writes (a standby in recovery, or `default_transaction_read_only`):
    /// the operation writes.
    #[error(
        "{operation} writes, but the server --database names is read-only ({why}). Name the \
         primary, or list every server and let the client find it: \
         postgres://user@primary,standby/db?target_session_attrs=read-write"
    )]
    ReadOnly {
        /// The operation refused.
        operation: &'static str,
        /// What the server said about itself.
        why: String,
    },
    /// The store refused the request, saying why.
    #[error("store refused {operation}: {reason}")]
    Refused {
        /// The operation.
        operation: &'static str,
        /// The store's reason.
        reason: String,
    },
}

/// A queue row as the store returns it: the head of a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredHead {
    /// The row's sequence number.
    pub seq: Seq,
    /// The event's unique id.
    pub event_id: String,
    /// The event's partition key.
    pub key: String,
    /// The payload as JSON text.
    pub payload: String,
    /// Failed attempts recorded so far.
    pub attempts: u32,
    /// How long until the row may be delivered again (a recorded backoff), if at all.
    pub wait: Option<Duration>,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
}

impl StoredHead {
    /// The drain's head for this row read at `now`: its remaining wait becomes a time on the
    /// reader's clock.
    pub fn into_head(self, now: Time) -> Head {
        Head {
            seq: self.seq,
            event_id: self.event_id,
            key: self.key,
            payload: self.payload,
            attempts: self.attempts,
            not_before: self.wait.map(|w| now.saturating_add(w)),
            last_error: self.last_error,
        }
    }
}

/// How the previous holder of a lease gave it up, as the store recorded it under the lease.
///
/// After a [`Handover::Clean`] no earlier holder can still have a delivery out, so a new lease
/// may read at once; after anything else it must wait out the delivery timeout first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// The previous holder gave the lease back after its last delivery, or there never was one.
    Clean,
    /// The previous holder lost the lease (crash, store restart, expiry) or the store cannot tell.
    Unclean,
}

/// A handle that opens sessions. Cheap to clone.
pub trait Store: Clone + 'static {
    /// The worker's membership session.
    type Membership: MembershipSession;
    /// A session holding one partition's lease.
    type Lease: LeaseSession + 'static;

    /// Opens the membership session of `worker`; the worker counts as live while it is open.
    async fn connect(&self, worker: &str) -> Result<Self::Membership, StoreError>;

    /// Opens a dedicated session and tries to take `partition`'s lease on it: `None` when
    /// another session holds it.
    async fn acquire(&self, partition: PartitionId) -> Result<Option<Self::Lease>, StoreError>;

    /// Returns once this process may act. At once in production, where a stopped process
    /// (SIGSTOP, a VM freeze) is stopped whole and acts on nothing, not even a timer, until it
    /// wakes. The simulation's pause fault holds a stopped worker here, so that the shared
    /// request timeout ([`timed`]) starts when it resumes: a frozen process cannot time a call
    /// out (and close its socket) while it is frozen.
    async fn ready(&self) {}
}

/// The worker's membership session.
pub trait MembershipSession {
    /// Live workers (open membership sessions), the caller included.
    async fn live_workers(&mut self) -> Result<usize, StoreError>;

    /// The partition count in force.
    async fn partition_count(&mut self) -> Result<PartitionCount, StoreError>;

    /// Returns once this process may act; see [`Store::ready`].
    async fn ready(&self) {}
}

/// One dedicated connection holding one partition's lease. Every method is fenced by it.
pub trait LeaseSession {
    /// The leased partition.
    fn partition(&self) -> PartitionId;

    /// The lease's epoch.
    fn epoch(&self) -> Epoch;

    /// How the previous holder gave the lease up. The default, [`Handover::Unclean`], is the
    /// safe answer for a store that does not record it.
    fn handover(&self) -> Handover {
        Handover::Unclean
    }

    /// Confirms, just before a delivery, that the lease lasts at least `needed` longer (the
    /// delivery timeout) by this holder's own clock, with whatever margin the store needs for
    /// clock skew; refused with [`StoreError::LeaseEnding`] (or another error) otherwise, and
    /// the worker then treats the lease as lost. A lease that lives as long as its session (an
    /// advisory lock) always lasts: the default. An expiry lease checks the expiry the store
    /// last told it, so a holder that was stopped (SIGSTOP, a VM freeze) past its expiry does
    /// not deliver on waking.
    async fn ensure_lasts(&mut self, needed: Duration) -> Result<(), StoreError> {
        let _ = needed;
        Ok(())
    }

    /// Whether the lease ends with its session (an advisory lock: the store frees it when it
    /// ends a silent session), so the holder must keep the session heard and must not deliver
    /// once it may have been silent too long (see [`crate::liveness`]). The default; an expiry
    /// lease, fenced by epoch and renewed on its own, answers `false`.
    fn ends_with_session(&self) -> bool {
        true
    }

    /// The longest one call of this session may take, given the request timeout: one request,
    /// the default. A session that resends a failed statement on a fresh connection (an expiry
    /// lease, fenced by epoch rather than by its connection) needs more; the shared wrapper
    /// ([`timed`]) bounds each call by this.
    fn request_budget(&self, request_timeout: Duration) -> Duration {
        request_timeout
    }

    /// Proves the session alive to the store with one cheap round trip (PostgreSQL: `SELECT 1`),
    /// so a healthy but quiet holder (idle, in a long backoff, during a long delivery) is not
    /// taken for a dead one. The default does nothing, for a store that ends no silent session.
    async fn keep_alive(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Returns once this process may act; see [`Store::ready`].
    async fn ready(&self) {}

    /// The partition's oldest row whose key is not in `skip` (the parked keys), if any, read
    /// under the lease's fence. With `skip` empty that is the partition's head. A key missing
    /// from `skip` that was in the previous call's `skip` was unparked: its oldest row may lie
    /// behind any read cursor, and the read must find it.
    async fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError>;

    /// Deletes the delivered row `seq`.
    async fn ack(&mut self, seq: Seq) -> Result<(), StoreError>;

    /// Records a failed attempt: the attempt count, the earliest retry, the error.
    async fn schedule_retry(
        &mut self,
        seq: Seq,
        attempts: u32,
        retry_in: Duration,
        error: &str,
    ) -> Result<(), StoreError>;

    /// Moves `seq` to the dead-letter table with `reason`, in one transaction.
    async fn dead_letter(
        &mut self,
        seq: Seq,
        attempts: u32,
        reason: &str,
    ) -> Result<(), StoreError>;

    /// Gives the lease back and closes the session. `handover` says whether a delivery of this
    /// holder may still be out ([`Handover::Unclean`]: the last one timed out or broke off);
    /// a store that records it lets the next holder skip the takeover wait after a clean one.
    async fn release(self, handover: Handover) -> Result<(), StoreError>;
}
