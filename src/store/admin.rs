//! The admin boundary: what the command line does to a store besides working it (schema
//! migration, batch enqueue, lag, dead letters, the online switch, the endpoint table, the
//! bench's probes), as one trait every store implements, and what those operations report: the
//! same types for every store.

// The command line runs these on a current-thread runtime: no `Send` bound is needed.
#![allow(async_fn_in_trait)]

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::clock::Clock;
use crate::endpoints::EndpointRow;
use crate::ids::PartitionId;
use crate::key::Event;
use crate::layout::{LayoutRecord, Placement, RoutingState};
use crate::routing::PartitionCount;
use crate::store::lock_wait::{LockWait, LockWaitReport};
use crate::store::StoreError;

/// What opening a database may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Create the file if it does not exist and lay down the schema in a fresh file; an
    /// existing keyorder database must be at the current schema version.
    Create,
    /// Upgrade (`keyorder migrate`): like `Create`, but an older keyorder schema is accepted,
    /// and nothing is applied: the caller runs [`Admin::migrate`] and reports what it applied.
    Migrate,
    /// The database must exist and be at the current schema version (reading commands never
    /// create files).
    Existing,
}

/// Why a store could not be opened. Each variant says whose the fix is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// `sqlite:` with nothing after it.
    #[error("sqlite: needs a path, e.g. sqlite:keyorder.db")]
    NoPath,
    /// The URL does not parse (the user's to fix).
    #[error("bad database URL: {0}")]
    BadUrl(#[source] StoreError),
    /// The server could not be reached or refused the connection.
    #[error("cannot connect to the database")]
    Connect(#[source] StoreError),
    /// The database is reachable but its schema is not the one this keyorder needs.
    #[error(transparent)]
    Schema(StoreError),
    /// The file cannot be used as it is (missing, not a database, read-only, another schema
    /// version): the user's to fix, by naming another file or fixing this one.
    #[error("{}: {error}", file.display())]
    Unusable {
        /// The file.
        file: PathBuf,
        /// What was wrong ([`StoreError::Refused`] or [`StoreError::CannotOpen`]).
        #[source]
        error: StoreError,
    },
    /// Opening the file failed otherwise (an I/O error, a busy database).
    #[error("opening {}", file.display())]
    Other {
        /// The file.
        file: PathBuf,
        /// What failed.
        #[source]
        error: StoreError,
    },
    /// The store options are refused (they break the delivery rule).
    #[error("store options refused")]
    Options(#[source] StoreError),
}

/// The operations outside a lease, on one open connection to a store. A store's implementation
/// may block (SQLite's do): these are one-shot commands with nothing else on their runtime.
pub trait Admin {
    /// The schema version this keyorder's store needs (what [`Admin::migrate`] brings it to).
    fn schema_version(&self) -> i32;

    /// Bounds the waits of the operations that lock what producers and workers need too
    /// (migrate, switch, pin): `wait` per operation, each try that gave up reported to
    /// `report` (see [`crate::store::lock_wait`]). Until called, [`LockWait::default`] and no
    /// report. A store whose waits are bounded otherwise ignores it (SQLite: its busy timeout).
    fn bound_lock_waits(&mut self, wait: LockWait, report: LockWaitReport) {
        let _ = (wait, report);
    }

    /// Applies the migrations the database lacks, in order; returns the versions applied
    /// (empty when the schema was current). Idempotent.
    async fn migrate(&mut self) -> Result<Vec<i32>, StoreError>;

    /// Inserts `events` routed by the layout in force and the pins, read in the insert's
    /// transaction; refused when no layout is recorded ([`Admin::record_layout`]). Reports
    /// duplicate event ids instead of failing. With `serialise_keys` producers of one key
    /// commit in seq order even when several run at once (a store with one writer at a time
    /// always does).
    async fn enqueue(
        &mut self,
        events: &[Event],
        serialise_keys: bool,
    ) -> Result<EnqueueReport, StoreError>;

    /// Records `count` as the first layout when none is recorded; returns the layout in force
    /// (which differs from `count` when another was recorded first).
    async fn record_layout(&mut self, count: PartitionCount) -> Result<LayoutRecord, StoreError>;

    /// Every recorded layout and pin (empty layouts: nothing recorded yet).
    async fn routing_state(&self) -> Result<RoutingState, StoreError>;

    /// Queued rows grouped by key, partition and layout, sorted so.
    async fn placements(&self) -> Result<Vec<Placement>, StoreError>;

    /// Pins `key` to `partition` (`None`: unpins it) under a new layout epoch of the same
    /// count, so the per-key barrier holds its new rows until its old ones are delivered.
    /// Refused, changing nothing, when no layout is recorded, the key is empty or the
    /// partition is outside the count.
    async fn change_pin(
        &mut self,
        key: &str,
        partition: Option<PartitionId>,
    ) -> Result<PinChange, StoreError>;

    /// Depth, oldest wait, keys and head attempts of every non-empty partition, by partition.
    async fn lag(&self) -> Result<Vec<PartitionLag>, StoreError>;

    /// The `limit` keys with the most queued rows, heaviest first.
    async fn heaviest_keys(&self, limit: i64) -> Result<Vec<KeyDepth>, StoreError>;

    /// Up to `limit` keys queued on more than one partition (a split: a violation).
    async fn split_keys(&self, limit: i64) -> Result<Vec<SplitKey>, StoreError>;

    /// Every queued key with its queued rows, in key order.
    async fn queued_keys(&self) -> Result<Vec<(String, f64)>, StoreError>;

    /// Dead letters, newest first: the one with `id`, or up to `limit` of them.
    async fn dead_letters(&self, id: Option<i64>, limit: i64) -> Result<Vec<DeadRow>, StoreError>;

    /// Up to `limit` dead letters with ids below `below` (all of them with `None`), newest
    /// first: pages of `keyorder dlq list`, each after the last id of the one before.
    async fn dead_letters_below(
        &self,
        below: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeadRow>, StoreError>;

    /// How many dead letters have an id above `after_id` (with `after_id` the newest id when a
    /// run started: how many the run wrote, for `keyorder work --until-empty`).
    async fn dead_letters_after(&self, after_id: i64) -> Result<i64, StoreError>;

    /// Re-enqueues dead letter `id` at the tail, routed by the layout in force and the pins,
    /// and removes it from the dead letters in the same transaction: its new seq, or `None`
    /// when there is no such id.
    async fn redrive(&mut self, id: i64) -> Result<Option<i64>, StoreError>;

    /// Starts an online change of count from `from` to `to` (see [`crate::repartition`]);
    /// refused with [`StoreError::Refused`] when `from` is not the count in force or a pin
    /// names a partition `to` lacks.
    async fn switch_online(
        &mut self,
        from: PartitionCount,
        to: PartitionCount,
    ) -> Result<Layout, StoreError>;

    /// Every per-key delivery target (`keyorder_endpoint`), in key order.
    async fn endpoints(&self) -> Result<Vec<EndpointRow>, StoreError>;

    /// Writes `row` (already validated by the caller), replacing its key's row if it has one,
    /// atomically. Returns whether a row was replaced.
    async fn set_endpoint(&mut self, row: &EndpointRow) -> Result<bool, StoreError>;

    /// Deletes the endpoint row of `key`. Returns whether there was one.
    async fn remove_endpoint(&mut self, key: &str) -> Result<bool, StoreError>;

    /// Rows in the queue.
    async fn depth(&self) -> Result<i64, StoreError>;

    /// Empties the queue (for the bench, on a throwaway database), with the dead letters too
    /// when `dead_letters`, and forgets the layouts and pins (the next enqueue's caller
    /// records a count afresh); a store with lease rows empties those as well.
    async fn empty_queue(&mut self, dead_letters: bool) -> Result<(), StoreError>;

    /// Whether deleted rows leave dead space that slows later drains until vacuumed
    /// (PostgreSQL's MVCC), which the bench's churn measurement shows; `false` for a store that
    /// reuses deleted pages at once.
    fn deletes_leave_bloat(&self) -> bool;

    /// Sets how durable this connection's commits are before they return (see
    /// [`Durability`]). A store whose commits follow its server's setting (PostgreSQL:
    /// `synchronous_commit`) accepts either value and changes nothing.
    fn set_durability(&mut self, durability: Durability) -> Result<(), StoreError>;

    /// How durable this connection's commits are, as the store reports it now (SQLite: read
    /// back from `PRAGMA synchronous`); `None` for a store whose commits follow its server's
    /// setting (PostgreSQL).
    fn durability(&self) -> Result<Option<Durability>, StoreError>;
}

/// How durable a producer's commits are when the call that made them returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Durability {
    /// On disk before the commit returns (SQLite `synchronous = FULL`): a power cut loses no
    /// event a producer was told was enqueued. The default for every admin connection.
    #[default]
    Full,
    /// Durable at the next WAL checkpoint (SQLite `synchronous = NORMAL`): a process crash
    /// loses nothing, a power cut may lose the last commits. For producers that accept that.
    Normal,
}

/// Waits until the queue is empty (the drain step of drain-and-switch), polling every `poll`
/// and reporting the depth to `progress`; `false` when `timeout` passed first (do NOT switch
/// then). Time is the caller's clock.
pub async fn wait_until_drained(
    admin: &impl Admin,
    clock: &impl Clock,
    timeout: Duration,
    poll: Duration,
    mut progress: impl FnMut(i64),
) -> Result<bool, StoreError> {
    let deadline = clock.now().saturating_add(timeout);
    loop {
        let d = admin.depth().await?;
        if d == 0 {
            return Ok(true);
        }
        progress(d);
        if clock.now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(poll).await;
    }
}

/// What a batch enqueue did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EnqueueReport {
    /// Rows inserted.
    pub inserted: u64,
    /// Event ids already in the queue (the batch went on without them).
    pub duplicates: Vec<String>,
}

/// A layout: a partition count in force from an epoch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// The epoch rows routed under it carry.
    pub epoch: i32,
    /// Its partition count.
    pub partitions: u16,
}

/// A recorded partition count as the stores read it, or why it is unusable.
pub(crate) fn recorded_count(n: i64) -> Result<PartitionCount, StoreError> {
    PartitionCount::new(n)
        .map_err(|e| StoreError::Refused { operation: "read the layout", reason: e.to_string() })
}

/// Why `operation` cannot run: no layout is recorded.
pub(crate) fn no_layout(operation: &'static str) -> StoreError {
    StoreError::Refused {
        operation,
        reason:
            "no partition count is recorded in this database: run `keyorder migrate --partitions N`"
                .into(),
    }
}

/// What [`Admin::change_pin`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PinChange {
    /// The layout epoch in force afterwards (new when `changed`).
    pub epoch: i32,
    /// The key's pin before.
    pub previous: Option<PartitionId>,
    /// Rows of the key queued when it changed (those hold its new rows back until delivered).
    pub queued_rows: i64,
    /// Whether anything changed (pinning a key where it is pinned does not).
    pub changed: bool,
}

/// One partition's lag.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PartitionLag {
    /// The partition.
    pub partition: i16,
    /// Rows queued.
    pub depth: i64,
    /// Age of the oldest queued row, in seconds.
    pub oldest_wait_seconds: f64,
    /// Distinct keys queued.
    pub keys_affected: i64,
    /// Failed attempts recorded at the head.
    pub head_attempts: i32,
    /// Why the head's last attempt failed, when it has failed (what a stuck partition is stuck
    /// on).
    pub last_error: Option<String>,
    /// When the head may be tried next (UTC, `YYYY-MM-DD HH:MM:SS.fff+00`), when a backoff was
    /// recorded for it.
    pub next_attempt_at: Option<String>,
    /// Seconds until then (0 when it is due); `None` with no recorded backoff.
    pub next_attempt_in_seconds: Option<f64>,
}

/// A key's queued rows, for skew reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyDepth {
    /// The key.
    pub key: String,
    /// Its queued rows.
    pub depth: i64,
}

/// A key queued on more than one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SplitKey {
    /// The key.
    pub key: String,
    /// The partitions it is queued on.
    pub partitions: Vec<i16>,
}

/// A dead-lettered row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadRow {
    /// The dead-letter id.
    pub id: i64,
    /// Its queue seq, if it came from keyorder.
    pub seq: Option<i64>,
    /// Its partition.
    pub partition: i16,
    /// Its key.
    pub key: String,
    /// Its event id.
    pub event_id: String,
    /// Attempts made.
    pub attempts: i16,
    /// Why.
    pub reason: String,
    /// When, as text.
    pub dead_lettered_at: String,
    /// The payload, as JSON text.
    pub payload: String,
}
