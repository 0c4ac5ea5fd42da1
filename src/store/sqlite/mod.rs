//! The SQLite store: the embedded default. Lease rows with an epoch stand in for advisory
//! locks; every statement of a leased partition is fenced by holder and epoch.
//!
//! * **Connections.** The sessions of one store handle (a worker's membership and its leases)
//!   share one connection on its own thread; the async side sends it jobs and awaits the
//!   answers, so no blocking call runs on the worker's executor. Sharing is sound because
//!   fencing is by holder and epoch in each statement, not by connection; one connection per
//!   worker also keeps its page cache valid (in WAL mode a commit by another connection
//!   invalidates it), which is most of the throughput. The connection runs in WAL mode with
//!   `synchronous = NORMAL` (a power cut may lose its last acknowledgements: duplicates, never
//!   losses) and a busy timeout; every write is one `BEGIN IMMEDIATE` transaction. The
//!   producer's connection ([`admin::SqliteAdmin`]) commits with `synchronous = FULL`. Every
//!   16th write of a worker's connection asks for a `RESTART` checkpoint after its commit, so
//!   that the WAL is written from its start again instead of growing by gigabytes (see `wal`).
//! * **Leases.** `keyorder_lease` has a row per partition: holder, epoch (incremented, across
//!   all partitions, at each acquisition: the fencing token), expiry (seconds of the host's
//!   monotonic clock, computed inside SQL by [`lease_clock`], with the boot they count from)
//!   and how the last holder gave it up. A lease is free when it has no holder, its expiry
//!   passed or it was written in another boot. The connection's thread renews the
//!   store's leases every `lease_expiry / 3` on its own timer (one fenced transaction), so
//!   renewal goes on during a long delivery.
//! * **Fencing.** Every head read checks, in the same read transaction as the head query, that
//!   this holder holds the lease at this epoch; every acknowledgement batch, retry update,
//!   dead-letter and release runs in a write transaction whose first statement renews the lease
//!   *only if* it is still held by this holder at this epoch and unexpired. When the check
//!   fails the transaction is rolled back and the call fails with [`StoreError::LeaseNotHeld`]:
//!   a worker whose lease expired can neither read the next head nor acknowledge anything.
//! * **The delivery rule.** A head read succeeds only while the lease lasts at least
//!   [`SqliteOptions::delivery_timeout`] plus twice [`SqliteOptions::clock_skew`] longer,
//!   checked in SQL (`expires_at > now + margin`); when the renewal is behind, the read renews
//!   the lease first (fenced). Since `lease_expiry > delivery_timeout`
//!   ([`SqliteOptions::validate`]), a delivery the worker starts ends, answered or timed out,
//!   before its lease can expire and another worker can take the partition. What no lease can
//!   prevent: a process paused (SIGSTOP, a VM freeze) between the head read and the send sends
//!   that one event late, a duplicate; its acknowledgement is then refused.
//! * **Read-ahead.** One head read reads up to [`SqliteOptions::read_ahead`] of the partition's
//!   oldest rows (ending at the first that waits: a backoff or the repartition barrier), with
//!   the time the lease has left. The lease then hands them out one at a time without a
//!   statement, but only while that expiry, carried over to tokio's clock from before the
//!   statement was sent, lies a delivery timeout plus the clock-skew bound ahead
//!   ([`crate::store::expiry_drain`], the composition the simulation's expiry leases run); then it
//!   reads again, which renews. Its own retries and dead letters drop what it read ahead; no
//!   other writer changes those rows.
//! * **Acknowledgements** of all the leases on a connection are buffered together and deleted
//!   in one transaction once `ack_batch` rows are buffered or the oldest is `ack_delay` old
//!   (and whenever a partition runs empty or writes anything else): each lease's rows only
//!   after its own fenced renewal in that transaction. A lost
//!   lease acknowledges nothing, and its unflushed rows are delivered again by the next holder.
//!   Heads are read after the last acknowledged seq: SQLite serialises writers, so seq order is
//!   commit order and no row can commit behind it. A head read passes over the parked keys'
//!   rows (the drain's `skip`); once a key is unparked its oldest row lies behind that cursor,
//!   so the read after an unpark deletes the buffered acknowledgements and reads from the
//!   partition's start. The cursor, the read-ahead and the buffer are one sans-IO type,
//!   [`ExpiryDrain`], which this store and the simulation's expiry-lease client both drive and
//!   only translate into statements, so the sweeps prove the composition this store runs.
//! * **Membership.** `keyorder_member` has a row per connected worker session, renewed every
//!   `lease_expiry / 3`; live workers are those whose row has not expired, so several
//!   `keyorder work` processes on one file share the partitions fairly.
//!
//! Expiry is the host's monotonic clock ([`lease_clock`]), the clock tokio's `Instant` reads,
//! by which the delivery timeout and the read-ahead rule are timed: no step of the wall clock
//! moves either, and every process on the host reads the same one. (Before schema version 9
//! expiry was the wall clock, and a step forward larger than the clock-skew bound could end a
//! lease while a delivery was out.)

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::clock::{Clock, TokioClock};
use crate::drain::ParkedKeys;
use crate::ids::{Epoch, PartitionId, Seq};
use crate::repartition::DEFAULT_HOLD_POLL;
use crate::routing::PartitionCount;
use crate::store::expiry_drain::{
    ExpiryAcks, ExpiryDrain, ExpiryDrainOptions, ExpiryHeadPlan, LeaseKey,
};
use crate::store::{Handover, LeaseSession, MembershipSession, Store, StoreError, StoredHead};

mod acks;
pub mod admin;
mod conn;
mod endpoints;
mod error;
pub mod layout;
pub mod lease_clock;
pub mod local_fs;
pub mod lock_holders;
pub mod queue;
pub mod schema;
mod wal;

use conn::{Conn, Tick};

/// Tuning of the SQLite store.
#[derive(Clone, Copy, Debug)]
pub struct SqliteOptions {
    /// How long a lease (and a membership row) lasts without renewal. Renewed every third of
    /// it. Must exceed `delivery_timeout`.
    pub lease_expiry: Duration,
    /// The worker's delivery timeout: a head is read only while the lease lasts at least this
    /// much longer (the delivery rule, see the module docs).
    pub delivery_timeout: Duration,
    /// How long a connection waits for the write lock before failing.
    pub busy_timeout: Duration,
    /// Acknowledgements buffered before a batch delete.
    pub ack_batch: usize,
    /// The oldest an unflushed acknowledgement may be.
    pub ack_delay: Duration,
    /// Rows one head read reads ahead: the lease then hands them out without a statement each
    /// while its expiry lies far enough ahead (see [`crate::store::read_ahead`]). 1 reads one
    /// row per head (no read-ahead).
    pub read_ahead: usize,
}

impl SqliteOptions {
    /// Defaults for a worker whose delivery timeout is `delivery_timeout`: leases last three
    /// times as long (30 s for the default 10 s), renewed every `delivery_timeout`.
    pub fn for_delivery_timeout(delivery_timeout: Duration) -> Self {
        Self {
            lease_expiry: delivery_timeout.saturating_mul(3),
            delivery_timeout,
            busy_timeout: schema::DEFAULT_BUSY_TIMEOUT,
            ack_batch: 512,
            ack_delay: Duration::from_millis(50),
            read_ahead: DEFAULT_READ_AHEAD,
        }
    }

    /// Refuses options that break the delivery rule: a lease must outlast a delivery.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.lease_expiry <= self.delivery_timeout {
            return Err(StoreError::Refused {
                operation: "configure the SQLite store",
                reason: format!(
                    "the lease expiry ({:?}) must exceed the delivery timeout ({:?}), or a delivery could outlast its lease",
                    self.lease_expiry, self.delivery_timeout
                ),
            });
        }
        if self.ack_batch == 0 {
            return Err(StoreError::Refused {
                operation: "configure the SQLite store",
                reason: "ack_batch must be at least 1".into(),
            });
        }
        if self.read_ahead == 0 || self.read_ahead > MAX_READ_AHEAD {
            return Err(StoreError::Refused {
                operation: "configure the SQLite store",
                reason: format!(
                    "the read-ahead must be between 1 and {MAX_READ_AHEAD} rows, not {}",
                    self.read_ahead
                ),
            });
        }
        Ok(())
    }

    fn renew_every(&self) -> Duration {
        self.lease_expiry / 3
    }

    /// The bound on how far the clock expiry is computed by may move against the holder's
    /// (tokio's monotonic clock, by which a read-ahead head is judged) between a head read and
    /// the deliveries it serves: a second, or a quarter of the slack between the lease and a
    /// delivery when that is shorter. On Linux both are the host's monotonic clock
    /// ([`lease_clock`]), so it is a margin kept, not a skew expected.
    pub fn clock_skew(&self) -> Duration {
        let slack = self.lease_expiry.saturating_sub(self.delivery_timeout) / 4;
        slack.min(Duration::from_secs(1))
    }

    /// The rules each lease's [`ExpiryDrain`] follows under these options.
    pub fn drain_options(&self) -> ExpiryDrainOptions {
        ExpiryDrainOptions {
            read_ahead: u32::try_from(self.read_ahead).unwrap_or(u32::MAX),
            ack_batch: self.ack_batch,
            ack_delay: self.ack_delay,
            delivery_timeout: self.delivery_timeout,
            clock_skew: self.clock_skew(),
        }
    }
}

/// The default [`SqliteOptions::read_ahead`]: 64 rows amortise a statement's round trip to the
/// connection's thread to almost nothing, and 64 small rows are a few kilobytes.
pub const DEFAULT_READ_AHEAD: usize = 64;

/// The largest [`SqliteOptions::read_ahead`]: every buffered row is held in memory.
pub const MAX_READ_AHEAD: usize = 4_096;

impl Default for SqliteOptions {
    fn default() -> Self {
        Self::for_delivery_timeout(Duration::from_secs(10))
    }
}

/// A handle that opens sessions on one database file. Cheap to clone; clones share one
/// connection thread.
#[derive(Clone)]
pub struct SqliteStore {
    path: PathBuf,
    head_sql: Arc<HeadSql>,
    count: PartitionCount,
    options: SqliteOptions,
    clock: TokioClock,
    shared: Rc<Shared>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("count", &self.count)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// The connection thread of a store handle, opened on first use, and what its timer renews.
struct Shared {
    conn: RefCell<Option<Rc<Conn>>>,
    registry: Arc<Mutex<Registry>>,
    /// The acknowledgements of every lease on the connection.
    acks: ExpiryAcks<Fence>,
    /// The connection's write count, for its WAL restarts.
    restarts: Rc<wal::Restarts>,
}

/// The leases and membership rows the connection's timer renews.
#[derive(Default)]
struct Registry {
    leases: BTreeMap<(u16, u64), Fence>,
    members: BTreeSet<String>,
}

fn registry(r: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    // A panic while holding this lock leaves plain data behind: still usable.
    r.lock().unwrap_or_else(|e| e.into_inner())
}

const MEMBER_UPSERT: &str = "INSERT INTO keyorder_member (member, expires_at, boot)
     VALUES (?1, keyorder_clock() + ?2, keyorder_boot())
     ON CONFLICT (member) DO UPDATE SET expires_at = excluded.expires_at, boot = excluded.boot";

/// Distinguishes the sessions of one process in holder and member names.
static SESSION: AtomicU64 = AtomicU64::new(0);

fn session_name(prefix: &str) -> String {
    let n = SESSION.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}:{}:{n}", std::process::id())
}

impl SqliteStore {
    /// A store for the database file at `path` (opened and migrated with [`schema::open`]
    /// first), leasing under `count` partitions and timing its delivery rule with `clock`.
    pub fn new(
        path: impl Into<PathBuf>,
        count: PartitionCount,
        options: SqliteOptions,
        clock: TokioClock,
    ) -> Result<Self, StoreError> {
        options.validate()?;
        let shared = Rc::new(Shared {
            conn: RefCell::new(None),
            registry: Arc::default(),
            acks: ExpiryAcks::new(),
            restarts: Rc::default(),
        });
        let head_sql = Arc::new(HeadSql::new(options.read_ahead));
        Ok(Self { path: path.into(), head_sql, count, options, clock, shared })
    }

    /// The shared connection, opened (with its renewal timer) on first use.
    async fn conn(&self) -> Result<Rc<Conn>, StoreError> {
        if let Some(c) = self.shared.conn.borrow().as_ref() {
            return Ok(c.clone());
        }
        let tick = renewal(self.shared.registry.clone(), &self.options);
        let conn = Rc::new(Conn::open(&self.path, self.options.busy_timeout, Some(tick)).await?);
        // Another session may have opened one meanwhile: keep the first, drop this one.
        Ok(self.shared.conn.borrow_mut().get_or_insert(conn).clone())
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A worker's membership session: its row in `keyorder_member`, renewed by the connection's
/// timer and deleted when the session is dropped.
pub struct SqliteControl {
    conn: Rc<Conn>,
    count: PartitionCount,
    member: String,
    registry: Arc<Mutex<Registry>>,
}

impl Drop for SqliteControl {
    fn drop(&mut self) {
        registry(&self.registry).members.remove(&self.member);
        let member = std::mem::take(&mut self.member);
        self.conn.detach(move |c| {
            // Best effort: an undeleted row expires by itself.
            let _ = c.execute("DELETE FROM keyorder_member WHERE member = ?1", [member]);
        });
    }
}

impl Store for SqliteStore {
    type Membership = SqliteControl;
    type Lease = SqliteLease;

    async fn connect(&self, worker: &str) -> Result<SqliteControl, StoreError> {
        let member = session_name(worker);
        let expiry = secs(self.options.lease_expiry);
        let conn = self.conn().await?;
        let m = member.clone();
        conn.call(move |c| {
            schema::require_current(c)?;
            c.execute(MEMBER_UPSERT, params![m, expiry])?;
            Ok(())
        })
        .await?;
        registry(&self.shared.registry).members.insert(member.clone());
        Ok(SqliteControl {
            conn,
            count: self.count,
            member,
            registry: self.shared.registry.clone(),
        })
    }

    async fn acquire(&self, partition: PartitionId) -> Result<Option<SqliteLease>, StoreError> {
        let holder = session_name("lease");
        let conn = self.conn().await?;
        let expiry = secs(self.options.lease_expiry);
        let h = holder.clone();
        let p = i64::from(partition.0);
        let Some((epoch, clean)) = conn.call(move |c| take_lease(c, p, &h, expiry)).await? else {
            return Ok(None);
        };
        let fence = Fence {
            partition,
            epoch: Epoch(epoch as u64),
            holder,
            expiry,
            margin: secs(self.options.delivery_timeout + 2 * self.options.clock_skew()),
            sql: self.head_sql.clone(),
        };
        registry(&self.shared.registry).leases.insert((partition.0, epoch as u64), fence.clone());
        let drain = ExpiryDrain::new(
            self.options.drain_options(),
            fence.key(),
            fence.clone(),
            &self.shared.acks,
        );
        Ok(Some(SqliteLease {
            conn,
            fence,
            drain,
            handover: if clean { Handover::Clean } else { Handover::Unclean },
            clock: self.clock,
            options: self.options,
            registry: self.shared.registry.clone(),
            restarts: self.shared.restarts.clone(),
        }))
    }
}

/// Takes `partition`'s lease for `holder` if it is free: `(epoch, clean hand-back)`.
fn take_lease(
    c: &mut Connection,
    p: i64,
    holder: &str,
    expiry: f64,
) -> Result<Option<(i64, bool)>, StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "INSERT INTO keyorder_lease (partition) VALUES (?1) ON CONFLICT (partition) DO NOTHING",
        [p],
    )?;
    let (busy, clean): (bool, bool) = tx.query_row(
        "SELECT holder IS NOT NULL AND boot IS keyorder_boot() AND expires_at > keyorder_clock(),
                holder IS NULL AND clean = 1
         FROM keyorder_lease WHERE partition = ?1",
        [p],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if busy {
        return Ok(None);
    }
    let epoch: i64 =
        tx.query_row("SELECT coalesce(max(epoch), 0) + 1 FROM keyorder_lease", [], |r| r.get(0))?;
    // Held from now on is unclean until the holder says otherwise at release: an expiry or a
    // crash leaves it so.
    tx.execute(
        "UPDATE keyorder_lease
         SET holder = ?2, epoch = ?3, expires_at = keyorder_clock() + ?4, boot = keyorder_boot(),
             clean = 0
         WHERE partition = ?1",
        params![p, holder, epoch, expiry],
    )?;
    tx.commit()?;
    Ok(Some((epoch, clean)))
}

impl MembershipSession for SqliteControl {
    async fn live_workers(&mut self) -> Result<usize, StoreError> {
        let n: i64 = self
            .conn
            .call(|c| {
                Ok(c.query_row(
                    "SELECT count(*) FROM keyorder_member
                     WHERE boot IS keyorder_boot() AND expires_at > keyorder_clock()",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await?;
        Ok(n.max(1) as usize)
    }

    async fn partition_count(&mut self) -> Result<PartitionCount, StoreError> {
        let count = self.count;
        self.conn.call(move |c| Ok(queue::consumer_count(c)?.unwrap_or(count))).await
    }
}

/// What a fenced statement checks: this holder holds this partition at this epoch, unexpired.
#[derive(Clone, Debug)]
struct Fence {
    partition: PartitionId,
    epoch: Epoch,
    holder: String,
    /// The lease's length, in seconds.
    expiry: f64,
    /// In seconds: a head is read only while the lease lasts this much longer (the delivery
    /// timeout and twice the clock-skew bound: a read renews the lease before what it reads
    /// ahead could no longer be handed out, see [`crate::store::expiry_drain`]).
    margin: f64,
    /// The head read's statements, reading [`SqliteOptions::read_ahead`] rows.
    sql: Arc<HeadSql>,
}

impl Fence {
    /// Renews the lease if and only if it is still held: the first statement of every fenced
    /// write transaction. Refused with [`StoreError::LeaseNotHeld`] otherwise.
    fn renew(&self, c: &Connection) -> Result<(), StoreError> {
        let n = c
            .prepare_cached(
                "UPDATE keyorder_lease SET expires_at = keyorder_clock() + ?4
                 WHERE partition = ?1 AND holder = ?2 AND epoch = ?3
                   AND boot IS keyorder_boot() AND expires_at > keyorder_clock()",
            )?
            .execute(params![self.p(), self.holder, self.epoch.0 as i64, self.expiry])?;
        if n == 1 {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    /// The heads after `cursor` (the oldest rows whose key is not in `skip`, a JSON array of
    /// parked keys, at most [`Fence::limit`], oldest first), in the same statement as the lease
    /// check: `None` when the lease is not held; `Some(lease)` when it is.
    fn held_heads(
        &self,
        c: &Connection,
        cursor: i64,
        skip: Option<&str>,
    ) -> Result<Option<HeldHeads>, StoreError> {
        // Without parked keys the statement of old, so the hot path pays nothing for parking.
        let mut stmt =
            c.prepare_cached(if skip.is_some() { &self.sql.skip } else { &self.sql.plain })?;
        let (p, holder, epoch) = (self.p(), &self.holder, self.epoch.0 as i64);
        let mut rows = match skip {
            Some(skip) => stmt.query(params![p, cursor, holder, epoch, self.margin, skip])?,
            None => stmt.query(params![p, cursor, holder, epoch, self.margin])?,
        };
        let mut held: Option<HeldHeads> = None;
        while let Some(r) = rows.next()? {
            let lease = held.get_or_insert(HeldHeads {
                lasts: r.get(0)?,
                expires_in: r.get::<_, f64>(1)?.max(0.0),
                heads: Vec::new(),
            });
            let Some(seq) = r.get::<_, Option<i64>>(2)? else { break };
            let wait: f64 = r.get(7)?;
            let mut wait = (wait > 0.0).then(|| Duration::from_secs_f64(wait));
            if r.get::<_, bool>(9)? {
                // The barrier holds this row: a short wait, no attempt spent.
                wait = Some(wait.unwrap_or_default().max(DEFAULT_HOLD_POLL));
            }
            lease.heads.push(StoredHead {
                seq: Seq(seq),
                event_id: r.get(3)?,
                key: r.get(4)?,
                payload: r.get(5)?,
                attempts: r.get::<_, i64>(6)?.clamp(0, i64::from(u32::MAX)) as u32,
                wait,
                last_error: r.get(8)?,
            });
            if wait.is_some() {
                // Nothing behind a waiting row is read ahead (see `ExpiryDrain::filled`).
                break;
            }
        }
        Ok(held)
    }

    fn p(&self) -> i64 {
        i64::from(self.partition.0)
    }

    fn key(&self) -> LeaseKey {
        (self.partition.0, self.epoch.0)
    }

    fn not_held(&self) -> StoreError {
        StoreError::LeaseNotHeld { partition: self.partition, epoch: self.epoch }
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction that starts with the fenced renewal.
    fn write<T>(
        &self,
        c: &mut Connection,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        self.renew(&tx)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    /// The heads after `cursor`, read in one statement with the lease check (the delivery rule:
    /// the lease must last [`Fence::margin`] longer). Renews first when it would not.
    fn read_heads(
        &self,
        c: &mut Connection,
        cursor: i64,
        skip: Option<&str>,
    ) -> Result<HeldHeads, StoreError> {
        match self.held_heads(c, cursor, skip)? {
            Some(held) if held.lasts => Ok(held),
            None => Err(self.not_held()),
            // Held, but the renewal is behind: renew and read again under the write lock.
            Some(_) => self
                .write(c, |tx| self.held_heads(tx, cursor, skip)?.ok_or_else(|| self.not_held())),
        }
    }
}

/// A fenced head read's answer: the lease is held.
struct HeldHeads {
    /// Whether it lasts [`Fence::margin`] longer.
    lasts: bool,
    /// Seconds until it expires, by SQLite's clock.
    expires_in: f64,
    /// The rows read, oldest first, ending at the first that waits.
    heads: Vec<StoredHead>,
}

/// The connection's timer: renews every registered lease (under its fence: a lost one stays
/// lost) and membership row in one transaction. A refusal needs no handling here: the next
/// fenced statement of that lease reports it.
fn renewal(reg: Arc<Mutex<Registry>>, options: &SqliteOptions) -> Tick {
    let expiry = secs(options.lease_expiry);
    Tick {
        every: options.renew_every(),
        run: Box::new(move |c: &mut Connection| {
            let (fences, members): (Vec<Fence>, Vec<String>) = {
                let r = registry(&reg);
                (r.leases.values().cloned().collect(), r.members.iter().cloned().collect())
            };
            if fences.is_empty() && members.is_empty() {
                return;
            }
            // Busy: the next tick tries again, and the sessions' own statements renew too.
            let Ok(tx) = c.transaction_with_behavior(TransactionBehavior::Immediate) else {
                return;
            };
            for f in &fences {
                let _ = f.renew(&tx);
            }
            for m in &members {
                let _ = tx.execute(MEMBER_UPSERT, params![m, expiry]);
            }
            let _ = tx.commit();
        }),
    }
}

/// One partition's lease: every statement of the partition, fenced by holder and epoch.
pub struct SqliteLease {
    conn: Rc<Conn>,
    registry: Arc<Mutex<Registry>>,
    fence: Fence,
    handover: Handover,
    clock: TokioClock,
    options: SqliteOptions,
    /// The cursor, the rows read ahead and this lease's share of the connection's buffered
    /// acknowledgements, by the expiry lease's rules ([`ExpiryDrain`]).
    drain: ExpiryDrain<Fence>,
    /// The connection's write count, for its WAL restarts.
    restarts: Rc<wal::Restarts>,
}

/// The lease check and the heads in one statement: on every row, whether the lease (this
/// partition, holder, epoch, unexpired: no row otherwise) lasts `?5` seconds longer and how
/// many seconds it has left; then a head's columns (NULL when the partition is empty), and
/// whether the online repartition's per-key barrier holds it. The heads are the partition's
/// oldest rows after the cursor `?2`, at most `{limit}` of them, oldest first: a number written
/// into the statement ([`HeadSql`]), since a `LIMIT` parameter makes SQLite prepare the
/// statement anew at every step.
///
/// The barrier is a `CASE`, not an `AND`: SQLite evaluates both sides of an `AND` in a result
/// column, and the `EXISTS` walks every queued row of the head's key through
/// `delivery_queue_key_idx` with a table lookup each (`layout` is not in the index), so a head
/// read cost grew with the queue's depth (1,000,000 events over 10,000 keys: 100 lookups a
/// read). `CASE` evaluates its `THEN` only when the `WHEN` holds, and the `WHEN` holds only
/// while rows of an older layout are queued at all (`min(layout)`, one seek of
/// `delivery_queue_layout_idx`, once per statement): a condition the `EXISTS` implies, so the
/// answer is unchanged.
const HEAD_SQL: &str = "SELECT l.expires_at > keyorder_clock() + ?5,
       l.expires_at - keyorder_clock(),
       q.seq, q.event_id, q.partition_key, q.payload, q.attempts,
       max(coalesce(q.not_before, 0) - unixepoch('subsec'), 0), q.last_error,
       CASE WHEN q.layout > 0 AND q.layout > (SELECT min(layout) FROM delivery_queue)
         THEN EXISTS (SELECT 1 FROM keyorder_key_rows o
           WHERE o.partition_key = q.partition_key AND o.layout < q.layout)
         ELSE 0 END
     FROM keyorder_lease l
     LEFT JOIN (SELECT * FROM delivery_queue WHERE partition = ?1 AND seq > ?2
                ORDER BY seq LIMIT {limit}) q ON 1
     WHERE l.partition = ?1 AND l.holder = ?3 AND l.epoch = ?4
       AND l.boot IS keyorder_boot() AND l.expires_at > keyorder_clock()
     ORDER BY q.seq";

/// [`HEAD_SQL`] passing over the rows of the parked keys (`?6`, a JSON array of keys).
const HEAD_SKIP_SQL: &str = "SELECT l.expires_at > keyorder_clock() + ?5,
       l.expires_at - keyorder_clock(),
       q.seq, q.event_id, q.partition_key, q.payload, q.attempts,
       max(coalesce(q.not_before, 0) - unixepoch('subsec'), 0), q.last_error,
       CASE WHEN q.layout > 0 AND q.layout > (SELECT min(layout) FROM delivery_queue)
         THEN EXISTS (SELECT 1 FROM keyorder_key_rows o
           WHERE o.partition_key = q.partition_key AND o.layout < q.layout)
         ELSE 0 END
     FROM keyorder_lease l
     LEFT JOIN (SELECT * FROM delivery_queue WHERE partition = ?1 AND seq > ?2
                  AND partition_key NOT IN (SELECT value FROM json_each(?6))
                ORDER BY seq LIMIT {limit}) q ON 1
     WHERE l.partition = ?1 AND l.holder = ?3 AND l.epoch = ?4
       AND l.boot IS keyorder_boot() AND l.expires_at > keyorder_clock()
     ORDER BY q.seq";

/// [`HEAD_SQL`] and [`HEAD_SKIP_SQL`] with their `LIMIT` written in.
#[derive(Debug)]
struct HeadSql {
    plain: String,
    skip: String,
}

impl HeadSql {
    fn new(limit: usize) -> Self {
        let limit = limit.to_string();
        Self {
            plain: HEAD_SQL.replace("{limit}", &limit),
            skip: HEAD_SKIP_SQL.replace("{limit}", &limit),
        }
    }
}

const DELETE_SQL: &str = "DELETE FROM delivery_queue WHERE partition = ?1 AND seq = ?2";

impl SqliteLease {
    fn p(&self) -> i64 {
        self.fence.p()
    }

    /// Fails when a flush run by another lease found this one lost.
    fn check_held(&self) -> Result<(), StoreError> {
        if self.drain.is_lost() {
            return Err(self.fence.not_held());
        }
        Ok(())
    }

    /// Runs `f` in a fenced write transaction on the connection's thread (`None`: no write of
    /// this lease's own), after deleting every buffered acknowledgement of the connection in
    /// the same transaction.
    async fn write<T: Send + 'static>(
        &mut self,
        f: Option<impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static>,
    ) -> Result<Option<T>, StoreError> {
        self.check_held()?;
        let flush = self.drain.acks().take();
        let sent = flush.clone();
        let fence = self.fence.clone();
        let busy_timeout = self.options.busy_timeout;
        let restart = self.restarts.next();
        let outcome = self
            .conn
            .call(move |c| {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let lost = match &sent {
                    Some(flush) => acks::delete_batch(&tx, flush)?,
                    None => Vec::new(),
                };
                let out = match f {
                    None => None,
                    Some(f) => match fence.renew(&tx) {
                        Ok(()) => Some(f(&tx)?),
                        // Lost: the other leases' deletes still commit.
                        Err(StoreError::LeaseNotHeld { .. }) => None,
                        Err(other) => return Err(other),
                    },
                };
                tx.commit()?;
                if restart {
                    wal::restart(c, busy_timeout);
                }
                Ok((lost, out))
            })
            .await;
        match outcome {
            Ok((lost, out)) => {
                self.drain.acks().flushed(lost);
                self.check_held()?;
                Ok(out)
            }
            Err(err) => {
                if let Some(flush) = flush {
                    self.drain.acks().failed(flush, self.clock.now());
                }
                Err(err)
            }
        }
    }

    async fn flush_acks(&mut self) -> Result<(), StoreError> {
        if self.drain.acks().is_empty() {
            return self.check_held();
        }
        self.write(None::<fn(&Connection) -> Result<(), StoreError>>).await.map(drop)
    }

    /// Runs `f` in a fenced write transaction (with the buffered acknowledgements): refused
    /// when the lease is not held. Its renewal is an answer the drain learns the expiry from.
    async fn write_own<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let sent = self.clock.now();
        match self.write(Some(f)).await? {
            Some(out) => {
                // Its first statement renewed the lease to a full expiry, counted from no
                // earlier than `sent`.
                self.drain.answered(sent.saturating_add(self.options.lease_expiry));
                Ok(out)
            }
            None => Err(self.fence.not_held()),
        }
    }
}

impl Drop for SqliteLease {
    fn drop(&mut self) {
        // No more renewals: unreleased, the lease expires by itself.
        // Its unflushed acknowledgements are forgotten with the drain.
        registry(&self.registry).leases.remove(&self.fence.key());
    }
}

impl LeaseSession for SqliteLease {
    fn partition(&self) -> PartitionId {
        self.fence.partition
    }

    fn ends_with_session(&self) -> bool {
        // An expiry lease, fenced by epoch and renewed on its own.
        false
    }

    /// The expiry the store last answered must lie `needed` plus the clock-skew bound ahead.
    /// Right after a head read it does (the read renews when it would not); when it no longer
    /// does (the process stood still, or the read waited long on the connection's thread), one
    /// fenced renewal answers again before the lease is given up.
    async fn ensure_lasts(&mut self, needed: Duration) -> Result<(), StoreError> {
        self.check_held()?;
        if self.drain.lasts(self.clock.now(), needed) {
            return Ok(());
        }
        self.write_own(|_| Ok(())).await?;
        if self.drain.lasts(self.clock.now(), needed) {
            Ok(())
        } else {
            Err(StoreError::LeaseEnding {
                partition: self.fence.partition,
                epoch: self.fence.epoch,
                needed,
            })
        }
    }

    fn epoch(&self) -> Epoch {
        self.fence.epoch
    }

    fn handover(&self) -> Handover {
        self.handover
    }

    async fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError> {
        self.check_held()?;
        let read = match self.drain.plan_head(skip, self.clock.now()) {
            ExpiryHeadPlan::Serve(head) => return Ok(Some(head)),
            ExpiryHeadPlan::Read(read) => read,
        };
        if read.flush_first {
            self.flush_acks().await?;
        }
        let now = self.clock.now();
        let skip = (!skip.is_empty())
            .then(|| serde_json::to_string(skip.as_slice()).expect("a list of strings serialises"));
        let (fence, after) = (self.fence.clone(), read.after.0);
        let held = self.conn.call(move |c| fence.read_heads(c, after, skip.as_deref())).await?;
        // Judged from before the statement was sent: no later than SQLite's expiry.
        self.drain.answered(now.saturating_add(Duration::from_secs_f64(held.expires_in)));
        let filled = self.drain.filled(held.heads);
        if filled.flush {
            self.flush_acks().await?;
        }
        Ok(filled.head)
    }

    async fn ack(&mut self, seq: Seq) -> Result<(), StoreError> {
        self.check_held()?;
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
        let (p, error, wait) = (self.p(), error.to_owned(), secs(retry_in));
        self.drain.changing_row();
        self.write_own(move |c| {
            c.prepare_cached(
                "UPDATE delivery_queue
                 SET attempts = ?3, not_before = unixepoch('subsec') + ?4, last_error = ?5
                 WHERE partition = ?1 AND seq = ?2",
            )?
            .execute(params![p, seq.0, i64::from(attempts), wait, error])?;
            Ok(())
        })
        .await
    }

    async fn dead_letter(
        &mut self,
        seq: Seq,
        attempts: u32,
        reason: &str,
    ) -> Result<(), StoreError> {
        let (p, reason) = (self.p(), reason.to_owned());
        self.drain.changing_row();
        // One transaction: the row leaves the queue and enters the DLQ together or not at all.
        self.write_own(move |c| {
            c.prepare_cached(
                "INSERT INTO delivery_dlq (seq, partition, partition_key, event_id, payload, attempts, enqueued_at, reason)
                 SELECT seq, partition, partition_key, event_id, payload, ?3, enqueued_at, ?4
                 FROM delivery_queue WHERE partition = ?1 AND seq = ?2",
            )?
            .execute(params![p, seq.0, i64::from(attempts), reason])?;
            c.prepare_cached(DELETE_SQL)?.execute([p, seq.0])?;
            Ok(())
        })
        .await?;
        self.drain.dead_lettered(seq);
        Ok(())
    }

    async fn release(mut self, handover: Handover) -> Result<(), StoreError> {
        let (p, clean) = (self.p(), handover == Handover::Clean);
        let fence = self.fence.clone();
        // The last acknowledgements and the hand-back in one fenced transaction: a lease that
        // ran out acknowledges nothing and records nothing.
        self.write_own(move |c| {
            c.execute(
                "UPDATE keyorder_lease SET holder = NULL, expires_at = 0, clean = ?4
                 WHERE partition = ?1 AND holder = ?2 AND epoch = ?3",
                params![p, fence.holder, fence.epoch.0 as i64, clean],
            )?;
            Ok(())
        })
        .await
    }
}

/// A partition's lease row as stored, for operators and tests.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseRow {
    /// The holder, if any (`None` after a release).
    pub holder: Option<String>,
    /// The epoch of the last acquisition.
    pub epoch: u64,
    /// Seconds until expiry (negative once expired).
    pub expires_in: f64,
    /// Whether the last holder gave it back cleanly (or there never was one).
    pub clean: bool,
}

/// The lease row of `partition`, if it was ever leased.
pub fn lease_row(c: &Connection, partition: PartitionId) -> Result<Option<LeaseRow>, StoreError> {
    Ok(c.query_row(
        "SELECT holder, epoch,
                CASE WHEN boot IS keyorder_boot() THEN expires_at - keyorder_clock() ELSE -1 END,
                clean
         FROM keyorder_lease WHERE partition = ?1",
        [i64::from(partition.0)],
        |r| {
            Ok(LeaseRow {
                holder: r.get(0)?,
                epoch: r.get::<_, i64>(1)? as u64,
                expires_in: r.get(2)?,
                clean: r.get(3)?,
            })
        },
    )
    .optional()?)
}
