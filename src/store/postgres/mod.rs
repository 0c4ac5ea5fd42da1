//! The PostgreSQL store: session advisory locks as leases, the reference queue table, and a
//! drain that never walks dead rows.
//!
//! * **Leases** are `pg_try_advisory_lock(4711, partition)` on a dedicated connection that is
//!   never pooled; every head read, acknowledgement, retry and dead-letter of that partition
//!   goes through the same connection, so a worker whose session died cannot advance it.
//! * **Membership**: each worker holds `pg_advisory_lock(4712, pg_backend_pid())` on its
//!   control connection; live workers are counted from `pg_locks`, in this database only.
//! * **Hand-backs** are recorded under the lease in `keyorder_handover`: a lease taken after a
//!   clean hand-back (or on a partition never leased) reads at once; after a lost session it
//!   waits out the delivery timeout, since the lost holder may still have a delivery out.
//! * **Draining**: heads are read `seq > cursor` (the last acknowledged seq), a bounded batch
//!   ahead; delivery stays one at a time. A full read without the cursor runs when the cursor
//!   read finds nothing and at least every `full_scan_every`, so a row that committed late
//!   (behind the cursor) is still found. Acknowledgements are deleted in batches, at most
//!   `ack_batch` rows or `ack_delay` old; rows read ahead are served only while the session was
//!   heard from within `ack_delay`, so a silently lost lease stops delivery promptly.
//! * **Parked keys** (the drain's `skip`) are passed over in the head query
//!   (`partition_key <> ALL($4)`) and never served from the read-ahead. When a key is unparked
//!   its oldest row lies behind the cursor, so the cursor goes back to the start.
//! * The cursor, the read-ahead and the acknowledgement buffer are
//!   [`crate::store::session_drain::SessionDrain`], which the simulation runs too.

use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls, Statement};

use crate::clock::{Clock, TokioClock};
use crate::drain::ParkedKeys;
use crate::ids::{Epoch, PartitionId, Seq};
use crate::repartition::DEFAULT_HOLD_POLL;
use crate::routing::PartitionCount;
use crate::store::session_drain::{HeadPlan, Read, Seen, SessionDrain, SessionDrainOptions};
use crate::store::{Handover, LeaseSession, MembershipSession, Store, StoreError, StoredHead};

pub mod admin;
mod endpoints;
mod error;
pub mod layout;
mod lock_wait;
pub mod pooler;
pub mod queue;
pub mod schema;

use schema::{LEASE_NAMESPACE, MEMBER_NAMESPACE};

/// Tuning of the PostgreSQL store: how a lease reads ahead and buffers acknowledgements
/// ([`SessionDrain`], the rules the simulation runs too).
pub type PgOptions = SessionDrainOptions;

/// A handle that opens sessions to one database. Cheap to clone; a clone keeps its own spare
/// connections (a worker loop's, on its own runtime).
#[derive(Debug)]
pub struct PgStore {
    config: Config,
    count: PartitionCount,
    options: PgOptions,
    clock: TokioClock,
    /// Connections whose lease try failed, kept for the next try: a worker that loses a race
    /// for a partition costs the server a round trip, not a new backend.
    spare: std::sync::Mutex<Vec<Client>>,
    /// The `SET` statements every session of the store runs first (see [`PgStore::new`]).
    session: String,
}

impl Clone for PgStore {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            count: self.count,
            options: self.options,
            clock: self.clock,
            // A connection is driven by the runtime that opened it: never hand one to a clone
            // that may run on another.
            spare: Default::default(),
            session: self.session.clone(),
        }
    }
}

impl PgStore {
    fn spares(&self) -> std::sync::MutexGuard<'_, Vec<Client>> {
        // Plain data: still usable after a panic elsewhere.
        self.spare.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The most spare connections a store handle keeps.
const MAX_SPARE: usize = 2;

/// Opens one connection and drives it on the current runtime.
pub async fn connect(config: &Config) -> Result<Client, StoreError> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped or the server goes away; either way
        // the next statement on the client reports it.
        let _ = connection.await;
    });
    Ok(client)
}

impl PgStore {
    /// A store for the database at `url` (a `postgres://` URL or key=value string), leasing
    /// under `count` partitions.
    ///
    /// Every session of the store plans each prepared statement once (`plan_cache_mode =
    /// force_generic_plan`, set when the session opens): the hot statements are written so that
    /// the generic plan is the right one ([`head_read_statement`]), and left to choose, the
    /// server planned each head read anew (its generic estimate looks worse than a custom
    /// plan's), which halved a no-op drain.
    ///
    /// Session settings are `SET` by the session's first statement, not sent as the `options`
    /// startup parameter, which connection poolers refuse (PgBouncer: "unsupported startup
    /// parameter") or drop.
    pub fn new(url: &str, count: PartitionCount, options: PgOptions) -> Result<Self, StoreError> {
        let config = Self::config_of(url)?;
        Ok(Self {
            config,
            count,
            options,
            clock: TokioClock::start(),
            spare: Default::default(),
            session: "SET plan_cache_mode = force_generic_plan".to_owned(),
        })
    }

    /// Sessions opened from now on lease under `count` partitions.
    pub(crate) fn set_count(&mut self, count: PartitionCount) {
        self.count = count;
    }

    /// Opens one session of the store: connected, with the store's session settings set.
    async fn open_session(&self) -> Result<Client, StoreError> {
        let client = connect(&self.config).await?;
        client.batch_execute(&self.session).await?;
        Ok(client)
    }

    /// Checks that sessions of this store are its own (no pooler in transaction or statement
    /// mode between it and the server) and that the server accepts writes, before `operation`
    /// takes a lease (see [`pooler::require_own_sessions`]).
    pub async fn require_own_sessions(&self, operation: &'static str) -> Result<(), StoreError> {
        pooler::require_own_sessions(&self.config, operation).await
    }

    /// The connection configuration of `url`, with a connect timeout of 5 s unless it sets one;
    /// [`StoreError::Refused`] when it does not parse.
    pub(crate) fn config_of(url: &str) -> Result<Config, StoreError> {
        let mut config: Config = url.parse().map_err(|e: tokio_postgres::Error| {
            StoreError::Refused { operation: "parse the database URL", reason: e.to_string() }
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(5));
        }
        Ok(config)
    }

    /// The connection configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Has the server end every session of this store (membership, leases, spares) that stays
    /// silent longer than `timeout`, and the client give up on a dead peer as fast; reports what
    /// the server could bound. Call once before the store is used: every session opened
    /// afterwards sets them in its first statement (with the store's other settings).
    ///
    /// Per session: `idle_session_timeout` (PostgreSQL 14 and later: the server's own timer, so
    /// it ends the session of a frozen or cut-off client whose kernel or proxy still answers TCP),
    /// `idle_in_transaction_session_timeout`, `tcp_keepalives_idle/interval/count` and
    /// `tcp_user_timeout` (12 and later). The client sets its own keepalive and user timeout.
    pub async fn bound_sessions(&mut self, timeout: Duration) -> Result<SessionBound, StoreError> {
        let client = connect(&self.config).await?;
        let row =
            client.query_one("SELECT current_setting('server_version_num')::int4", &[]).await?;
        let bound = SessionBound::new(row.get(0), timeout);
        for (name, value) in bound.settings() {
            self.session.push_str(&format!("; SET {name} = {value}"));
        }
        let (idle, interval, count) = bound.keepalives();
        self.config
            .keepalives(true)
            .keepalives_idle(idle)
            .keepalives_interval(interval)
            .keepalives_retries(count)
            .tcp_user_timeout(timeout);
        Ok(bound)
    }
}

/// What [`PgStore::bound_sessions`] set up on the server it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionBound {
    /// The server's `server_version_num`.
    pub server_version_num: i32,
    /// The bound.
    pub timeout: Duration,
}

impl SessionBound {
    /// The settings for a server of `server_version_num`.
    pub fn new(server_version_num: i32, timeout: Duration) -> Self {
        Self { server_version_num, timeout }
    }

    /// Whether the server ends a silent session by its own timer (`idle_session_timeout`,
    /// PostgreSQL 14 and later): the one setting that bounds a frozen or blackholed client.
    pub fn server_ends_silent_sessions(&self) -> bool {
        self.server_version_num >= 140_000
    }

    /// Keepalive idle time, interval and count: dead-peer detection within about two thirds
    /// of the bound, in whole seconds as the server takes them.
    pub fn keepalives(&self) -> (Duration, Duration, u32) {
        let secs = |d: Duration| Duration::from_secs(d.as_secs().max(1));
        (secs(self.timeout / 3), secs(self.timeout / 9), 3)
    }

    /// The settings (name, value) that set the bound per session, in the order they are set.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let ms = self.timeout.as_millis().max(1).to_string();
        let (idle, interval, count) = self.keepalives();
        let mut s = vec![
            ("idle_in_transaction_session_timeout", ms.clone()),
            ("tcp_keepalives_idle", idle.as_secs().to_string()),
            ("tcp_keepalives_interval", interval.as_secs().to_string()),
            ("tcp_keepalives_count", count.to_string()),
        ];
        if self.server_version_num >= 120_000 {
            s.push(("tcp_user_timeout", ms.clone()));
        }
        if self.server_ends_silent_sessions() {
            s.push(("idle_session_timeout", ms));
        }
        s
    }

    /// The settings as startup options (`-c name=value ...`), for a connection string.
    pub fn options(&self) -> String {
        let all: Vec<String> =
            self.settings().iter().map(|(name, value)| format!("-c {name}={value}")).collect();
        all.join(" ")
    }

    /// What is and is not bounded on this server, for the operator, when not everything is.
    pub fn shortfall(&self) -> Option<String> {
        if self.server_ends_silent_sessions() {
            return None;
        }
        Some(format!(
            "PostgreSQL {} has no idle_session_timeout (14 and later): a worker that dies or whose network drops is detected by TCP keepalive{} within about {:?}, but the sessions of a frozen worker (SIGSTOP, a VM pause) or one behind a proxy that keeps its sockets open keep their leases until it wakes",
            self.server_version_num,
            if self.server_version_num >= 120_000 { " and tcp_user_timeout" } else { "" },
            self.timeout
        ))
    }
}

/// A worker's membership session.
pub struct PgControl {
    client: Client,
    count: PartitionCount,
}

impl Store for PgStore {
    type Membership = PgControl;
    type Lease = PgLease;

    async fn connect(&self, _worker: &str) -> Result<PgControl, StoreError> {
        let client = self.open_session().await?;
        schema::require_current(&client).await?;
        client
            .execute("SELECT pg_advisory_lock($1, pg_backend_pid())", &[&MEMBER_NAMESPACE])
            .await?;
        Ok(PgControl { client, count: self.count })
    }

    async fn acquire(&self, partition: PartitionId) -> Result<Option<PgLease>, StoreError> {
        // A spare connection holds no lock (its try failed), so it is as good as a new one;
        // one the server closed meanwhile fails its first statement below, like a new one
        // that broke.
        let p = i32::from(partition.0);
        let spare = self.spares().pop().filter(|c| !c.is_closed());
        let (client, row) = match spare {
            // A spare the server ended meanwhile (it was silent past the session bound) is
            // replaced, not reported as a store failure.
            Some(c) => match c.query_one(TRY_LOCK, &[&LEASE_NAMESPACE, &p]).await {
                Ok(row) => (c, row),
                Err(_) => self.try_lock_fresh(p).await?,
            },
            None => self.try_lock_fresh(p).await?,
        };
        let backend: i32 = row.get(1);
        if !row.get::<_, bool>(0) {
            let mut spare = self.spares();
            if spare.len() < MAX_SPARE {
                spare.push(client);
            }
            return Ok(None);
        }
        // Under the lock: take the next epoch, read how the last holder left, and mark the
        // partition unclean until this holder hands it back with nothing out. One statement:
        // the CTE reads the row as it was before the upsert.
        let p16 = partition.0 as i16;
        let row = client
            .query_one(
                "WITH prev AS (SELECT clean FROM keyorder_handover WHERE partition = $1)
                 INSERT INTO keyorder_handover (partition, clean, epoch)
                 VALUES ($1, false, nextval('keyorder_lease_epoch'))
                 ON CONFLICT (partition)
                   DO UPDATE SET clean = false, epoch = EXCLUDED.epoch, changed_at = now()
                 RETURNING epoch, COALESCE((SELECT clean FROM prev), true)",
                &[&p16],
            )
            .await?;
        let epoch: i64 = row.get(0);
        let handover = if row.get::<_, bool>(1) { Handover::Clean } else { Handover::Unclean };
        Ok(Some(PgLease {
            client,
            backend,
            partition,
            epoch: Epoch(epoch as u64),
            handover,
            clock: self.clock,
            drain: SessionDrain::new(self.options, self.clock.now()),
            prepared: None,
        }))
    }
}

/// Tries a partition's lease lock, and names the server process that holds it if taken.
const TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1, $2), pg_backend_pid()";

impl PgStore {
    async fn try_lock_fresh(&self, p: i32) -> Result<(Client, tokio_postgres::Row), StoreError> {
        let client = self.open_session().await?;
        let row = client.query_one(TRY_LOCK, &[&LEASE_NAMESPACE, &p]).await?;
        Ok((client, row))
    }
}

impl MembershipSession for PgControl {
    async fn live_workers(&mut self) -> Result<usize, StoreError> {
        let row = self
            .client
            .query_one(
                "SELECT count(*) FROM pg_locks
                 WHERE locktype = 'advisory' AND classid = $1::int::oid AND objsubid = 2 AND granted
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[&MEMBER_NAMESPACE],
            )
            .await?;
        Ok(row.get::<_, i64>(0).max(1) as usize)
    }

    async fn partition_count(&mut self) -> Result<PartitionCount, StoreError> {
        // After an online switch the layout table is the source of the count.
        Ok(queue::consumer_count(&self.client).await?.unwrap_or(self.count))
    }
}

/// One partition's lease: the connection that holds the advisory lock, and every statement
/// of the partition on it.
pub struct PgLease {
    client: Client,
    /// The server process that took the lock: every statement that proves the session (the
    /// head read, the acknowledgements, the ping) names the process that ran it, and any other
    /// means a pooler moved the session, so the lock is not this session's any more.
    backend: i32,
    partition: PartitionId,
    epoch: Epoch,
    /// How the previous holder left, read when the lease was taken.
    handover: Handover,
    clock: TokioClock,
    /// The cursor, the rows read ahead and the buffered acknowledgements.
    drain: SessionDrain,
    /// The statements every delivery path runs, prepared once per lease (parsed and planned
    /// once by the server, not at every call).
    prepared: Option<Prepared>,
}

/// The hot statements of a lease's session.
struct Prepared {
    /// `HEAD_COLUMNS` of up to `$3` rows after seq `$2` of partition `$1`.
    read_ahead: Statement,
    /// The same, passing over the rows of the keys `$4` (the parked keys).
    read_ahead_skip: Statement,
    /// Deletes the acknowledged seqs `$2` of partition `$1`; answers the server process.
    delete_acks: Statement,
    /// Proves the session alive; answers the server process.
    ping: Statement,
}

/// The head columns, and whether the online repartition's per-key barrier holds the row (an
/// older-layout row of its key is still queued).
const HEAD_COLUMNS: &str = "seq, event_id, partition_key, payload::text, attempts::int4,
    GREATEST(EXTRACT(EPOCH FROM (not_before - now())), 0)::float8, last_error,
    (q.layout > 0 AND EXISTS (SELECT 1 FROM delivery_queue o
       WHERE o.partition_key = q.partition_key AND o.layout < q.layout))";

/// A head read of up to `$3` rows after seq `$2` of partition `$1` (and `filter`): the ids of
/// the transactions the statement's own snapshot saw running; whether one of the transactions
/// `$4` inserted a row of the partition at or below `$2` (a commit behind the cursor); then
/// [`HEAD_COLUMNS`]; then the server process that ran it. One row with NULL head columns when
/// no row matches.
///
/// Written so that the planner has one good plan whatever the statistics and the visibility
/// map say, since a prepared statement soon runs a generic plan, which knows neither the
/// partition nor the cursor (`tests/pg/leases.rs`,
/// `the_head_read_never_plans_a_walk_of_the_queue`):
/// * the rows are asked for as a range of the `(partition, seq)` index, `(partition, seq)`
///   between `($1, $2)` and `($1, max)`, ordered by both: no other index or scan can serve that
///   range in that order. Asked as `partition = $1 AND seq > $2 ORDER BY seq`, the generic plan
///   walked the primary key from the cursor, filtering by partition: every row above the cursor
///   of every partition for a read of an empty one (53 ms against 0.06 ms on 400,000 rows);
/// * the probe runs only when `$4` holds ids (the `CASE`), as one lookup per id in the
///   `(partition, producer_xid, seq)` index, which schema version 9 builds and whose
///   `producer_xid` statistics it pins (`n_distinct`), so the estimate never favours a scan:
///   written as a join on version 8's index it planned, once the table was analysed, a
///   sequential scan of the whole queue on every read.
fn read_ahead_statement(filter: &str) -> String {
    format!(
        "SELECT (SELECT coalesce(array_agg(x::text::int8), '{{}}')
                 FROM pg_snapshot_xip(pg_current_snapshot()) x),
                CASE WHEN cardinality($4::int8[]) = 0 THEN false
                     ELSE EXISTS (SELECT 1 FROM unnest($4::int8[]) w(x)
                                  JOIN delivery_queue l ON l.partition = $1
                                    AND l.producer_xid = w.x AND l.seq <= $2)
                END,
                h.*, pg_backend_pid()
         FROM (SELECT 1) one
         LEFT JOIN LATERAL (
           SELECT {HEAD_COLUMNS} FROM delivery_queue q
           WHERE (partition, seq) > ($1, $2)
             AND (partition, seq) <= ($1, 9223372036854775807::int8) {filter}
           ORDER BY partition, seq LIMIT $3
         ) h ON true
         ORDER BY h.seq"
    )
}

/// The head read every lease prepares (`skip_parked`: the one that passes over parked keys,
/// `$5`), for `EXPLAIN` by operators and tests. Parameters: partition (`int2`), cursor
/// (`int8`), rows (`int8`), watched transaction ids (`int8[]`), parked keys (`text[]`).
pub fn head_read_statement(skip_parked: bool) -> String {
    read_ahead_statement(if skip_parked { SKIP_PARKED } else { "" })
}

/// The filter of the head read that passes over the parked keys.
const SKIP_PARKED: &str = "AND partition_key <> ALL($5::text[])";

impl PgLease {
    fn p(&self) -> i16 {
        // A partition is below a validated count of at most 32767.
        self.partition.0 as i16
    }

    /// The prepared hot statements, prepared on first use.
    async fn prepared(&mut self) -> Result<&Prepared, StoreError> {
        if self.prepared.is_none() {
            let read_ahead = read_ahead_statement("");
            let read_ahead_skip = read_ahead_statement(SKIP_PARKED);
            let prepared = Prepared {
                read_ahead: self.client.prepare(&read_ahead).await?,
                read_ahead_skip: self.client.prepare(&read_ahead_skip).await?,
                delete_acks: self
                    .client
                    .prepare(
                        "WITH d AS (DELETE FROM delivery_queue WHERE partition = $1 AND seq = ANY($2))
                         SELECT pg_backend_pid()",
                    )
                    .await?,
                ping: self.client.prepare("SELECT pg_backend_pid()").await?,
            };
            self.prepared = Some(prepared);
        }
        Ok(self.prepared.as_ref().expect("prepared just above"))
    }

    async fn flush_acks(&mut self) -> Result<(), StoreError> {
        if !self.drain.has_acks() {
            return Ok(());
        }
        let seqs: Vec<i64> = self.drain.take_acks().into_iter().map(|s| s.0).collect();
        let delete = self.prepared().await?.delete_acks.clone();
        let sent = self.clock.now();
        let row = self.client.query_one(&delete, &[&self.p(), &seqs]).await?;
        self.same_session(row.get(0))?;
        self.drain.heard(sent);
        Ok(())
    }

    /// Whether server process `answered` is the one that took the lock; [`StoreError::SessionMoved`]
    /// otherwise (the lease is then given up: a pooler handed the session to another server
    /// connection, and the lock stayed with the old one).
    fn same_session(&self, answered: i32) -> Result<(), StoreError> {
        if answered == self.backend {
            return Ok(());
        }
        Err(StoreError::SessionMoved {
            partition: self.partition,
            held_by: self.backend,
            now_on: answered,
        })
    }

    /// One round trip that proves the session: the buffered acknowledgements, else a ping.
    async fn prove(&mut self) -> Result<(), StoreError> {
        if self.drain.has_acks() {
            return self.flush_acks().await;
        }
        let ping = self.prepared().await?.ping.clone();
        let sent = self.clock.now();
        let row = self.client.query_one(&ping, &[]).await?;
        self.same_session(row.get(0))?;
        self.drain.heard(sent);
        Ok(())
    }

    /// Runs `read`, and the look behind the cursor it may call for.
    async fn read_ahead(&mut self, read: Read) -> Result<(), StoreError> {
        let mut next = Some(read);
        while let Some(read) = next {
            let (rows, running, late) = self.read_batch(read.after.0).await?;
            let seen = Seen { running: &running, late };
            next = self.drain.filled(read, rows, seen);
        }
        Ok(())
    }

    /// The rows after seq `from`, head first, ending at the first that waits (its retry time,
    /// or the barrier): [`SessionDrain::filled`] keeps nothing behind one. With the ids of the
    /// transactions the statement's snapshot saw running, and whether a watched one committed
    /// a row at or below `from`.
    async fn read_batch(
        &mut self,
        from: i64,
    ) -> Result<(Vec<StoredHead>, Vec<u64>, bool), StoreError> {
        let limit = i64::from(self.drain.options().read_ahead);
        let skipped = self.drain.skipped().clone();
        let watched: Vec<i64> = self.drain.watched().into_iter().map(|x| x as i64).collect();
        let rows = if skipped.is_empty() {
            // Without parked keys the statement of old: the hot path pays nothing for parking.
            let read = self.prepared().await?.read_ahead.clone();
            self.client.query(&read, &[&self.p(), &from, &limit, &watched]).await?
        } else {
            let read = self.prepared().await?.read_ahead_skip.clone();
            let skip = skipped.as_slice();
            self.client.query(&read, &[&self.p(), &from, &limit, &watched, &skip]).await?
        };
        // The running transactions come with every row, and alone (head columns NULL) when
        // nothing is queued after `from`.
        let Some(first) = rows.first() else {
            let reason = "the head read returned no row, not even its snapshot".to_owned();
            return Err(StoreError::Refused { operation: "fetch_head", reason });
        };
        self.same_session(first.get(10))?;
        let running: Vec<i64> = first.get(0);
        let running = running.into_iter().map(|x| x.max(0) as u64).collect();
        let late: bool = first.get(1);
        let mut heads = Vec::with_capacity(rows.len());
        for r in &rows {
            let Some(seq) = r.get::<_, Option<i64>>(2) else { break };
            let wait: f64 = r.get(7);
            let mut wait = (wait > 0.0).then(|| Duration::from_secs_f64(wait));
            let held: bool = r.get(9);
            if held {
                // The barrier holds this row: it comes back as a short wait (no attempt is
                // spent), so the next look re-reads it.
                wait = Some(wait.unwrap_or_default().max(DEFAULT_HOLD_POLL));
            }
            let waits = wait.is_some();
            heads.push(StoredHead {
                seq: Seq(seq),
                event_id: r.get(3),
                key: r.get(4),
                payload: r.get(5),
                attempts: r.get::<_, i32>(6).max(0) as u32,
                wait,
                last_error: r.get(8),
            });
            if waits {
                break;
            }
        }
        Ok((heads, running, late))
    }
}

impl LeaseSession for PgLease {
    fn partition(&self) -> PartitionId {
        self.partition
    }

    fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn handover(&self) -> Handover {
        self.handover
    }

    async fn keep_alive(&mut self) -> Result<(), StoreError> {
        // Pending acknowledgements prove the session as well as a ping, and are due anyway.
        self.prove().await
    }

    async fn ensure_lasts(&mut self, needed: Duration) -> Result<(), StoreError> {
        let _ = needed;
        // The head was served while the session was heard within `ack_delay`; a holder stopped
        // since (SIGSTOP, a VM freeze) proves its session again before it sends, or finds it
        // gone (`SessionDrain::must_prove`).
        if self.drain.must_prove(self.clock.now()) {
            self.prove().await?;
        }
        Ok(())
    }

    async fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError> {
        match self.drain.plan_head(skip, self.clock.now()) {
            HeadPlan::Serve(head) => Ok(Some(head)),
            HeadPlan::Prove => {
                self.prove().await?;
                Ok(self.drain.head())
            }
            HeadPlan::Read(read) => {
                self.flush_acks().await?;
                self.read_ahead(read).await?;
                Ok(self.drain.head())
            }
        }
    }

    async fn ack(&mut self, seq: Seq) -> Result<(), StoreError> {
        if self.drain.acked(seq, self.clock.now()) {
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
        self.flush_acks().await?;
        self.drain.changed();
        let attempts = i16::try_from(attempts).unwrap_or(i16::MAX);
        let micros = i64::try_from(retry_in.as_micros()).unwrap_or(i64::MAX);
        let sent = self.clock.now();
        self.client
            .execute(
                "UPDATE delivery_queue
                 SET attempts = $3, not_before = now() + $4 * interval '1 microsecond', last_error = $5
                 WHERE partition = $1 AND seq = $2",
                &[&self.p(), &seq.0, &attempts, &(micros as f64), &error],
            )
            .await?;
        self.drain.heard(sent);
        Ok(())
    }

    async fn dead_letter(
        &mut self,
        seq: Seq,
        attempts: u32,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.flush_acks().await?;
        self.drain.changed();
        let attempts = i16::try_from(attempts).unwrap_or(i16::MAX);
        // One statement, so one transaction: the row leaves the queue and enters the DLQ
        // together or not at all.
        let sent = self.clock.now();
        self.client
            .execute(
                "WITH moved AS (
                   DELETE FROM delivery_queue WHERE partition = $1 AND seq = $2
                   RETURNING seq, partition, partition_key, event_id, payload, enqueued_at)
                 INSERT INTO delivery_dlq (seq, partition, partition_key, event_id, payload, attempts, enqueued_at, reason)
                 SELECT seq, partition, partition_key, event_id, payload, $3::int2, enqueued_at, $4::text FROM moved",
                &[&self.p(), &seq.0, &attempts, &reason],
            )
            .await?;
        self.drain.dead_lettered(seq);
        self.drain.heard(sent);
        Ok(())
    }

    async fn release(mut self, handover: Handover) -> Result<(), StoreError> {
        self.flush_acks().await?;
        if handover == Handover::Clean {
            // Still under the lock, and only for this epoch: a clean mark is never written by a
            // session that lost the lease.
            self.client
                .execute(
                    "UPDATE keyorder_handover SET clean = true, changed_at = now()
                     WHERE partition = $1 AND epoch = $2",
                    &[&self.p(), &(self.epoch.0 as i64)],
                )
                .await?;
        }
        let p = i32::from(self.partition.0);
        self.client.execute("SELECT pg_advisory_unlock($1, $2)", &[&LEASE_NAMESPACE, &p]).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_bound_sets_what_the_server_version_has() {
        let bound = |v| SessionBound::new(v, Duration::from_millis(30_000));
        let v15 = bound(150_004);
        assert_eq!(
            v15.options(),
            "-c idle_in_transaction_session_timeout=30000 -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=3 -c tcp_keepalives_count=3 -c tcp_user_timeout=30000 -c idle_session_timeout=30000"
        );
        assert_eq!(v15.shortfall(), None);
        let v13 = bound(130_010);
        assert!(!v13.options().contains("idle_session_timeout"), "unknown before 14");
        assert!(v13.options().contains("tcp_user_timeout"));
        let why = v13.shortfall().expect("a frozen worker is not bounded");
        assert!(why.contains("no idle_session_timeout") && why.contains("frozen"), "{why}");
        let v11 = bound(110_000);
        assert!(!v11.options().contains("tcp_user_timeout"), "unknown before 12");
        assert!(!v11.shortfall().unwrap().contains("tcp_user_timeout"));
        // A bound under three seconds still gets whole-second keepalives of at least 1 s.
        let short = SessionBound::new(150_000, Duration::from_millis(2_000));
        assert_eq!(short.keepalives(), (Duration::from_secs(1), Duration::from_secs(1), 3));
    }
}
