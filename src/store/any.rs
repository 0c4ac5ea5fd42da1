//! [`AnyStore`]: the worker's [`Store`] on whichever backend a location named, by delegation.
//!
//! Why an enum rather than a generic visitor: the command line opens the store at run time
//! from `--database`, and a value it can pass around (into threads, into the bench's drains)
//! keeps every caller simple. The cost is one `match` per store call, next to a statement
//! round trip (tens of microseconds at least): the worker loop stays generic over [`Store`]
//! and is monomorphised once more, for this type. The simulation does not use it.

use std::time::Duration;

use crate::drain::ParkedKeys;
use crate::ids::{Epoch, PartitionId, Seq};
use crate::routing::PartitionCount;
use crate::store::postgres::{PgControl, PgLease, PgStore};
use crate::store::sqlite::{SqliteControl, SqliteLease, SqliteStore};
use crate::store::{Handover, LeaseSession, MembershipSession, Store, StoreError, StoredHead};

/// A worker store on any backend (made by the store factory of `store::open`).
#[derive(Clone)]
pub struct AnyStore(Backend<PgStore, SqliteStore>);

/// A membership session on any backend.
pub struct AnyMembership(Backend<PgControl, SqliteControl>);

/// A lease session on any backend.
pub struct AnyLease(Backend<PgLease, SqliteLease>);

#[derive(Clone)]
enum Backend<P, S> {
    Postgres(P),
    Sqlite(S),
}

/// Runs `$call` on whichever backend's value `$value` holds, binding it to `$v`.
macro_rules! delegate {
    ($value:expr, $v:ident => $call:expr) => {
        match $value {
            Backend::Postgres($v) => $call,
            Backend::Sqlite($v) => $call,
        }
    };
}

impl From<PgStore> for AnyStore {
    fn from(s: PgStore) -> Self {
        Self(Backend::Postgres(s))
    }
}

impl From<SqliteStore> for AnyStore {
    fn from(s: SqliteStore) -> Self {
        Self(Backend::Sqlite(s))
    }
}

impl Store for AnyStore {
    type Membership = AnyMembership;
    type Lease = AnyLease;

    async fn connect(&self, worker: &str) -> Result<AnyMembership, StoreError> {
        Ok(AnyMembership(match &self.0 {
            Backend::Postgres(s) => Backend::Postgres(s.connect(worker).await?),
            Backend::Sqlite(s) => Backend::Sqlite(s.connect(worker).await?),
        }))
    }

    async fn acquire(&self, partition: PartitionId) -> Result<Option<AnyLease>, StoreError> {
        Ok(match &self.0 {
            Backend::Postgres(s) => s.acquire(partition).await?.map(Backend::Postgres),
            Backend::Sqlite(s) => s.acquire(partition).await?.map(Backend::Sqlite),
        }
        .map(AnyLease))
    }

    async fn ready(&self) {
        delegate!(&self.0, s => s.ready().await)
    }
}

impl MembershipSession for AnyMembership {
    async fn live_workers(&mut self) -> Result<usize, StoreError> {
        delegate!(&mut self.0, m => m.live_workers().await)
    }

    async fn partition_count(&mut self) -> Result<PartitionCount, StoreError> {
        delegate!(&mut self.0, m => m.partition_count().await)
    }

    async fn ready(&self) {
        delegate!(&self.0, m => m.ready().await)
    }
}

impl LeaseSession for AnyLease {
    fn partition(&self) -> PartitionId {
        delegate!(&self.0, l => l.partition())
    }

    fn epoch(&self) -> Epoch {
        delegate!(&self.0, l => l.epoch())
    }

    fn handover(&self) -> Handover {
        delegate!(&self.0, l => l.handover())
    }

    async fn ensure_lasts(&mut self, needed: Duration) -> Result<(), StoreError> {
        delegate!(&mut self.0, l => l.ensure_lasts(needed).await)
    }

    // Every provided method is delegated too: a default here would silently replace the
    // backend's own (PostgreSQL's keep-alive, SQLite's expiry lease not ending with a session).
    fn ends_with_session(&self) -> bool {
        delegate!(&self.0, l => l.ends_with_session())
    }

    fn request_budget(&self, request_timeout: Duration) -> Duration {
        delegate!(&self.0, l => l.request_budget(request_timeout))
    }

    async fn keep_alive(&mut self) -> Result<(), StoreError> {
        delegate!(&mut self.0, l => l.keep_alive().await)
    }

    async fn ready(&self) {
        delegate!(&self.0, l => l.ready().await)
    }

    async fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError> {
        delegate!(&mut self.0, l => l.fetch_head(skip).await)
    }

    async fn ack(&mut self, seq: Seq) -> Result<(), StoreError> {
        delegate!(&mut self.0, l => l.ack(seq).await)
    }

    async fn schedule_retry(
        &mut self,
        seq: Seq,
        attempts: u32,
        retry_in: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        delegate!(&mut self.0, l => l.schedule_retry(seq, attempts, retry_in, error).await)
    }

    async fn dead_letter(
        &mut self,
        seq: Seq,
        attempts: u32,
        reason: &str,
    ) -> Result<(), StoreError> {
        delegate!(&mut self.0, l => l.dead_letter(seq, attempts, reason).await)
    }

    async fn release(self, handover: Handover) -> Result<(), StoreError> {
        delegate!(self.0, l => l.release(handover).await)
    }
}
