//! Opening a store from a location (the `--database` text): `sqlite:PATH` for a SQLite file,
//! anything else a PostgreSQL URL. The one place that knows which backends exist; callers get
//! values they use through the [`Admin`] and [`Store`](crate::store::Store) traits.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::clock::TokioClock;
use crate::endpoints::EndpointRow;
use crate::ids::PartitionId;
use crate::key::Event;
use crate::layout::{LayoutRecord, Placement, RoutingState};
use crate::routing::PartitionCount;
pub use crate::store::admin::{OpenError, OpenMode};

use crate::store::admin::{
    Admin, DeadRow, Durability, EnqueueReport, KeyDepth, Layout, PartitionLag, PinChange, SplitKey,
};
use crate::store::any::AnyStore;
use crate::store::lock_wait::{LockWait, LockWaitReport};
use crate::store::postgres::admin::PgAdmin;
use crate::store::postgres::{self, PgOptions, PgStore};
use crate::store::sqlite::admin::SqliteAdmin;
use crate::store::sqlite::{SqliteOptions, SqliteStore};
use crate::store::StoreError;

/// Where a store lives, parsed from its location text. Says nothing about whether it exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location(Backend);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Location {
    /// `sqlite:PATH` (or `sqlite://PATH`) names a SQLite file; anything else is taken for a
    /// PostgreSQL URL or key=value string (checked when opened).
    pub fn parse(text: &str) -> Result<Self, OpenError> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(OpenError::NoPath);
            }
            return Ok(Self(Backend::Sqlite(PathBuf::from(path))));
        }
        Ok(Self(Backend::Postgres(text.to_owned())))
    }

    /// The file, for a store that lives in one (SQLite); `None` for a server.
    pub fn file(&self) -> Option<&Path> {
        match &self.0 {
            Backend::Sqlite(path) => Some(path),
            Backend::Postgres(_) => None,
        }
    }

    /// Opens one connection for the admin operations, as `mode` allows.
    pub async fn open_admin(&self, mode: OpenMode) -> Result<AdminConn, OpenError> {
        Ok(AdminConn(match &self.0 {
            Backend::Sqlite(path) => AdminBackend::Sqlite(SqliteAdmin::open(path, mode)?),
            Backend::Postgres(url) => AdminBackend::Postgres(PgAdmin::open(url, mode).await?),
        }))
    }

    /// Checks, before `operation` takes a lock or writes anything, that sessions opened here
    /// are the caller's own and the store accepts writes. PostgreSQL: no connection pooler in
    /// transaction or statement mode between (session advisory locks, session settings and
    /// prepared statements belong to the server connection), and not a standby
    /// ([`crate::store::postgres::pooler`]); [`StoreError::SessionsPooled`] or
    /// [`StoreError::ReadOnly`] otherwise. A SQLite file's connections are always its own.
    pub async fn require_own_sessions(&self, operation: &'static str) -> Result<(), StoreError> {
        match &self.0 {
            Backend::Sqlite(_) => Ok(()),
            Backend::Postgres(url) => {
                let config = PgStore::config_of(url)?;
                postgres::pooler::require_own_sessions(&config, operation).await
            }
        }
    }

    /// A factory of worker stores leasing under `count` partitions: checks the URL and the
    /// options now (nothing is connected yet).
    pub fn stores(
        &self,
        count: PartitionCount,
        options: StoreOptions,
    ) -> Result<StoreFactory, OpenError> {
        Ok(StoreFactory(match &self.0 {
            Backend::Sqlite(path) => {
                if options.session_timeout.is_some() {
                    return Err(OpenError::Options(StoreError::Refused {
                        operation: "configure the session timeout",
                        reason: "it is for PostgreSQL; a SQLite lease is bounded by its expiry \
                                 (--lease-expiry-ms)"
                            .into(),
                    }));
                }
                let mut sqlite = SqliteOptions::for_delivery_timeout(options.delivery_timeout);
                if let Some(expiry) = options.lease_expiry {
                    sqlite.lease_expiry = expiry;
                }
                if let Some(rows) = options.read_ahead {
                    sqlite.read_ahead = rows;
                }
                sqlite.validate().map_err(OpenError::Options)?;
                Factory::Sqlite { path: path.clone(), count, options: sqlite }
            }
            Backend::Postgres(url) => Factory::Postgres {
                store: Box::new(
                    PgStore::new(url, count, PgOptions::default()).map_err(OpenError::BadUrl)?,
                ),
                delivery_timeout: options.delivery_timeout,
                session_timeout: options.session_timeout.unwrap_or_else(|| {
                    crate::liveness::default_session_timeout(
                        options.delivery_timeout,
                        options.request_timeout,
                    )
                }),
            },
        }))
    }
}

/// What a worker store is configured with, for every backend.
#[derive(Clone, Copy, Debug)]
pub struct StoreOptions {
    /// How long one delivery may take.
    pub delivery_timeout: Duration,
    /// How long a lease lasts unrenewed, for a store whose leases expire (SQLite); `None`: the
    /// store's default for `delivery_timeout`. Ignored by a store whose leases live as long
    /// as their session (PostgreSQL).
    pub lease_expiry: Option<Duration>,
    /// How long the store lets a silent session live before it ends it (and the leases and
    /// membership it holds), for a store whose leases live as long as their session
    /// (PostgreSQL); `None`: [`crate::liveness::default_session_timeout`]. A store whose leases
    /// expire (SQLite) refuses it: its bound is `lease_expiry`.
    pub session_timeout: Option<Duration>,
    /// How long any one store call may take (the worker's request timeout).
    pub request_timeout: Duration,
    /// Rows a head read reads ahead, for a store that reads ahead (SQLite, see
    /// [`crate::store::read_ahead`]); `None`: the store's default. Ignored by PostgreSQL.
    pub read_ahead: Option<usize>,
}

/// How a store bounds the leases of a worker that stops answering (frozen, cut off), as found
/// when the worker starts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionBounding {
    /// Leases expire unless renewed (SQLite): a silent holder's leases end by their expiry.
    Expiry(Duration),
    /// The server ends a session silent for this long, and with it its leases (PostgreSQL 14
    /// and later: `idle_session_timeout`, set per session).
    ServerEnds(Duration),
    /// The server cannot end a silent session by itself: what is and is not bounded.
    Partial(String),
}

/// Makes worker stores, one per worker loop (each on its own thread), for one location.
/// `Send` and `Sync`, so that every worker thread can make its own.
#[derive(Clone, Debug)]
pub struct StoreFactory(Factory);

#[derive(Clone, Debug)]
enum Factory {
    Sqlite { path: PathBuf, count: PartitionCount, options: SqliteOptions },
    Postgres { store: Box<PgStore>, delivery_timeout: Duration, session_timeout: Duration },
}

impl StoreFactory {
    /// The same factory, its stores leasing under `count` partitions: for a caller that checks
    /// the options before it can read the count from the database.
    pub fn with_count(mut self, count: PartitionCount) -> Self {
        match &mut self.0 {
            Factory::Sqlite { count: c, .. } => *c = count,
            Factory::Postgres { store, .. } => store.set_count(count),
        }
        self
    }

    /// A store for one worker loop (a SQLite store gets its own connection thread).
    pub fn make(&self) -> Result<AnyStore, StoreError> {
        Ok(match &self.0 {
            Factory::Sqlite { path, count, options } => AnyStore::from(SqliteStore::new(
                path.clone(),
                *count,
                *options,
                TokioClock::start(),
            )?),
            Factory::Postgres { store, .. } => AnyStore::from(PgStore::clone(store)),
        })
    }

    /// The bound on a silent session and how stale the holder's record of "last heard" may
    /// be ([`crate::liveness::LivenessConfig::margin`]), for a store whose leases live as long
    /// as their session; `None` for one whose leases expire.
    pub fn session_bound(&self) -> Option<(Duration, Duration)> {
        match &self.0 {
            Factory::Sqlite { .. } => None,
            // Rows read ahead are served up to `ack_delay` after the server last answered.
            Factory::Postgres { session_timeout, .. } => {
                Some((*session_timeout, PgOptions::default().ack_delay))
            }
        }
    }

    /// Has every session this factory's stores open bounded (PostgreSQL: the server's silent
    /// session timeout, TCP keepalives and user timeout, set per session), asking the server
    /// once what it supports. Call before [`Self::make`].
    pub async fn bound_sessions(&mut self) -> Result<SessionBounding, StoreError> {
        match &mut self.0 {
            Factory::Sqlite { options, .. } => Ok(SessionBounding::Expiry(options.lease_expiry)),
            Factory::Postgres { store, session_timeout, .. } => {
                let bound = store.bound_sessions(*session_timeout).await?;
                Ok(match bound.shortfall() {
                    None => SessionBounding::ServerEnds(*session_timeout),
                    Some(what) => SessionBounding::Partial(what),
                })
            }
        }
    }

    /// The wait of a lease taken after an unclean hand-back, when it must be longer than the
    /// delivery timeout (a store that serves rows read ahead after losing its session);
    /// `None`: the delivery timeout.
    pub fn takeover_delay(&self) -> Option<Duration> {
        match &self.0 {
            Factory::Sqlite { .. } => None,
            Factory::Postgres { delivery_timeout, .. } => {
                Some(postgres::admin::takeover_delay(*delivery_timeout))
            }
        }
    }
}

/// One admin connection to whichever store the location named; use it through [`Admin`].
pub struct AdminConn(AdminBackend);

enum AdminBackend {
    Sqlite(SqliteAdmin),
    Postgres(PgAdmin),
}

/// Calls `$method` on whichever admin connection this is.
macro_rules! delegate {
    ($self:expr, $a:ident => $call:expr) => {
        match $self {
            AdminBackend::Sqlite($a) => $call,
            AdminBackend::Postgres($a) => $call,
        }
    };
}

impl Admin for AdminConn {
    fn schema_version(&self) -> i32 {
        delegate!(&self.0, a => a.schema_version())
    }

    fn bound_lock_waits(&mut self, wait: LockWait, report: LockWaitReport) {
        delegate!(&mut self.0, a => a.bound_lock_waits(wait, report))
    }

    async fn migrate(&mut self) -> Result<Vec<i32>, StoreError> {
        delegate!(&mut self.0, a => a.migrate().await)
    }

    async fn enqueue(
        &mut self,
        events: &[Event],
        serialise_keys: bool,
    ) -> Result<EnqueueReport, StoreError> {
        delegate!(&mut self.0, a => a.enqueue(events, serialise_keys).await)
    }

    async fn record_layout(&mut self, count: PartitionCount) -> Result<LayoutRecord, StoreError> {
        delegate!(&mut self.0, a => a.record_layout(count).await)
    }

    async fn routing_state(&self) -> Result<RoutingState, StoreError> {
        delegate!(&self.0, a => a.routing_state().await)
    }

    async fn placements(&self) -> Result<Vec<Placement>, StoreError> {
        delegate!(&self.0, a => a.placements().await)
    }

    async fn change_pin(
        &mut self,
        key: &str,
        partition: Option<PartitionId>,
    ) -> Result<PinChange, StoreError> {
        delegate!(&mut self.0, a => a.change_pin(key, partition).await)
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, StoreError> {
        delegate!(&self.0, a => a.lag().await)
    }

    async fn heaviest_keys(&self, limit: i64) -> Result<Vec<KeyDepth>, StoreError> {
        delegate!(&self.0, a => a.heaviest_keys(limit).await)
    }

    async fn split_keys(&self, limit: i64) -> Result<Vec<SplitKey>, StoreError> {
        delegate!(&self.0, a => a.split_keys(limit).await)
    }

    async fn queued_keys(&self) -> Result<Vec<(String, f64)>, StoreError> {
        delegate!(&self.0, a => a.queued_keys().await)
    }

    async fn dead_letters(&self, id: Option<i64>, limit: i64) -> Result<Vec<DeadRow>, StoreError> {
        delegate!(&self.0, a => a.dead_letters(id, limit).await)
    }

    async fn redrive(&mut self, id: i64) -> Result<Option<i64>, StoreError> {
        delegate!(&mut self.0, a => a.redrive(id).await)
    }

    async fn switch_online(
        &mut self,
        from: PartitionCount,
        to: PartitionCount,
    ) -> Result<Layout, StoreError> {
        delegate!(&mut self.0, a => a.switch_online(from, to).await)
    }

    async fn endpoints(&self) -> Result<Vec<EndpointRow>, StoreError> {
        delegate!(&self.0, a => a.endpoints().await)
    }

    async fn set_endpoint(&mut self, row: &EndpointRow) -> Result<bool, StoreError> {
        delegate!(&mut self.0, a => a.set_endpoint(row).await)
    }

    async fn remove_endpoint(&mut self, key: &str) -> Result<bool, StoreError> {
        delegate!(&mut self.0, a => a.remove_endpoint(key).await)
    }

    async fn depth(&self) -> Result<i64, StoreError> {
        delegate!(&self.0, a => a.depth().await)
    }

    async fn dead_letters_below(
        &self,
        below: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeadRow>, StoreError> {
        delegate!(&self.0, a => a.dead_letters_below(below, limit).await)
    }

    async fn dead_letters_after(&self, after_id: i64) -> Result<i64, StoreError> {
        delegate!(&self.0, a => a.dead_letters_after(after_id).await)
    }

    async fn empty_queue(&mut self, dead_letters: bool) -> Result<(), StoreError> {
        delegate!(&mut self.0, a => a.empty_queue(dead_letters).await)
    }

    fn deletes_leave_bloat(&self) -> bool {
        delegate!(&self.0, a => a.deletes_leave_bloat())
    }

    fn set_durability(&mut self, durability: Durability) -> Result<(), StoreError> {
        delegate!(&mut self.0, a => a.set_durability(durability))
    }

    fn durability(&self) -> Result<Option<Durability>, StoreError> {
        delegate!(&self.0, a => a.durability())
    }
}
