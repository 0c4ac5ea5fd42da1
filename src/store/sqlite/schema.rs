//! The SQLite schema: the same tables, columns and migration versions as PostgreSQL's (see
//! [`crate::store::postgres::schema`]) as far as SQLite allows, plus the lease and membership
//! rows that stand in for advisory locks.
//!
//! Differences, all forced by SQLite: `seq` is `INTEGER PRIMARY KEY AUTOINCREMENT` (never
//! reused, like a sequence); the payload is JSON text checked by `json_valid` on insert;
//! timestamps are Unix seconds (`REAL`, `unixepoch('subsec')`), so expiry and lag are computed
//! inside SQL and Rust never reads the wall clock.
//!
//! Opening checks what a user can get wrong before anything is written: a missing folder, a
//! folder on a file system shared between hosts ([`super::local_fs`]), a read-only file, a
//! file that is not SQLite, a SQLite file of another application or of another schema
//! version. Each is a [`StoreError::Refused`] that names the file; the file is
//! left untouched.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior};

use super::conn::{configure, open_existing};
use crate::store::StoreError;

/// Each migration, in order. Version `i + 1` is `MIGRATIONS[i]`, the same numbering as
/// PostgreSQL's up to 8. Never edit a shipped one.
const MIGRATIONS: &[&str] = &[
    // 1: the reference queue table.
    r#"
    CREATE TABLE delivery_queue (
      seq            INTEGER PRIMARY KEY AUTOINCREMENT,
      partition      INTEGER NOT NULL,
      partition_key  TEXT    NOT NULL,
      event_id       TEXT    NOT NULL UNIQUE,
      payload        TEXT    NOT NULL CHECK (json_valid(payload)),
      attempts       INTEGER NOT NULL DEFAULT 0,
      enqueued_at    REAL    NOT NULL DEFAULT (unixepoch('subsec'))
    );
    CREATE INDEX delivery_queue_drain_idx ON delivery_queue (partition, seq);
    "#,
    // 2: a recorded backoff and the last error at the head; the dead-letter table; a key
    // index; and what stands in for advisory locks: a lease row per partition (holder, epoch
    // as the fencing token, expiry, how the last holder gave it up) and a membership row per
    // live worker (renewed by a heartbeat).
    r#"
    ALTER TABLE delivery_queue ADD COLUMN not_before REAL;
    ALTER TABLE delivery_queue ADD COLUMN last_error TEXT;
    CREATE TABLE delivery_dlq (
      id               INTEGER PRIMARY KEY AUTOINCREMENT,
      seq              INTEGER,
      partition        INTEGER NOT NULL,
      partition_key    TEXT    NOT NULL,
      event_id         TEXT    NOT NULL,
      payload          TEXT    NOT NULL CHECK (json_valid(payload)),
      attempts         INTEGER NOT NULL,
      enqueued_at      REAL,
      reason           TEXT    NOT NULL,
      dead_lettered_at REAL    NOT NULL DEFAULT (unixepoch('subsec'))
    );
    CREATE INDEX delivery_queue_key_idx ON delivery_queue (partition_key);
    CREATE TABLE keyorder_lease (
      partition  INTEGER PRIMARY KEY,
      holder     TEXT,
      epoch      INTEGER NOT NULL DEFAULT 0,
      expires_at REAL    NOT NULL DEFAULT 0,
      clean      INTEGER NOT NULL DEFAULT 1
    );
    CREATE TABLE keyorder_member (
      member     TEXT PRIMARY KEY,
      expires_at REAL NOT NULL
    );
    "#,
    // 3: the online repartition: each row's layout epoch, and the layouts in order.
    r#"
    ALTER TABLE delivery_queue ADD COLUMN layout INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX delivery_queue_layout_idx ON delivery_queue (layout);
    CREATE TABLE keyorder_layout (
      epoch      INTEGER PRIMARY KEY,
      partitions INTEGER NOT NULL CHECK (partitions BETWEEN 1 AND 32767),
      started_at REAL    NOT NULL DEFAULT (unixepoch('subsec'))
    );
    "#,
    // 4: PostgreSQL's hand-back record; on SQLite it is the lease row's `clean` (since 2), so
    // this version only keeps the numbering equal.
    "-- the lease row records it",
    // 5: a delivery target per key, as on PostgreSQL.
    r#"
    CREATE TABLE keyorder_endpoint (
      partition_key TEXT PRIMARY KEY,
      url           TEXT NOT NULL,
      secret_ref    TEXT
    );
    "#,
    // 6: the routing configuration in the database, as on PostgreSQL: the layout in force is
    // always recorded, pins beside it. A plain SQL insert of the layout-0 default (a
    // reference producer) while a later layout is in force is stamped with it and sent to its
    // key's pin; keyorder's own inserts carry the epoch they were routed under already.
    r#"
    CREATE TABLE keyorder_pin (
      partition_key TEXT    NOT NULL,
      partition     INTEGER NOT NULL CHECK (partition >= 0),
      from_epoch    INTEGER NOT NULL,
      until_epoch   INTEGER,
      pinned_at     REAL    NOT NULL DEFAULT (unixepoch('subsec')),
      PRIMARY KEY (partition_key, from_epoch)
    );
    CREATE UNIQUE INDEX keyorder_pin_current ON keyorder_pin (partition_key)
      WHERE until_epoch IS NULL;
    CREATE TRIGGER keyorder_route_insert AFTER INSERT ON delivery_queue
    WHEN NEW.layout = 0 AND EXISTS (SELECT 1 FROM keyorder_layout WHERE epoch > 0)
    BEGIN
      UPDATE delivery_queue SET
        layout = (SELECT max(epoch) FROM keyorder_layout),
        partition = coalesce((SELECT partition FROM keyorder_pin
                              WHERE partition_key = NEW.partition_key AND until_epoch IS NULL),
                             NEW.partition)
      WHERE seq = NEW.seq;
    END;
    "#,
    // 7: queued rows counted per key, layout and partition, kept by triggers, in place of the
    // key index. Every acknowledgement deleted an entry of `delivery_queue_key_idx`, and the
    // entries of one key lie together: with more rows queued per key, the keys of one delete
    // batch spread over more leaves, each a WAL frame written, checkpointed and synced. That
    // was the drain's cost growing with depth. A count row per key is as many rows as keys, not
    // as queued rows, so the pages a batch dirties no longer grow with the queue. The barrier,
    // pins and the per-key reports read the counts. The insert trigger counts the row as
    // inserted, then routes it: the routing update moves the count (the move trigger), so the
    // counts stay right whichever way a row was inserted or changed.
    r#"
    CREATE TABLE keyorder_key_rows (
      partition_key TEXT    NOT NULL,
      layout        INTEGER NOT NULL,
      partition     INTEGER NOT NULL,
      queued        INTEGER NOT NULL CHECK (queued > 0),
      PRIMARY KEY (partition_key, layout, partition)
    ) WITHOUT ROWID;
    INSERT INTO keyorder_key_rows (partition_key, layout, partition, queued)
      SELECT partition_key, layout, partition, count(*) FROM delivery_queue
      WHERE true GROUP BY 1, 2, 3;
    DROP INDEX delivery_queue_key_idx;
    DROP TRIGGER keyorder_route_insert;
    CREATE TRIGGER keyorder_queue_insert AFTER INSERT ON delivery_queue
    BEGIN
      INSERT INTO keyorder_key_rows (partition_key, layout, partition, queued)
        VALUES (NEW.partition_key, NEW.layout, NEW.partition, 1)
        ON CONFLICT DO UPDATE SET queued = queued + 1;
      UPDATE delivery_queue SET
        layout = (SELECT max(epoch) FROM keyorder_layout),
        partition = coalesce((SELECT partition FROM keyorder_pin
                              WHERE partition_key = NEW.partition_key AND until_epoch IS NULL),
                             NEW.partition)
      WHERE seq = NEW.seq AND NEW.layout = 0
        AND EXISTS (SELECT 1 FROM keyorder_layout WHERE epoch > 0);
    END;
    CREATE TRIGGER keyorder_queue_move
    AFTER UPDATE OF partition_key, layout, partition ON delivery_queue
    WHEN OLD.partition_key IS NOT NEW.partition_key OR OLD.layout IS NOT NEW.layout
      OR OLD.partition IS NOT NEW.partition
    BEGIN
      DELETE FROM keyorder_key_rows WHERE partition_key = OLD.partition_key
        AND layout = OLD.layout AND partition = OLD.partition AND queued = 1;
      UPDATE keyorder_key_rows SET queued = queued - 1 WHERE partition_key = OLD.partition_key
        AND layout = OLD.layout AND partition = OLD.partition;
      INSERT INTO keyorder_key_rows (partition_key, layout, partition, queued)
        VALUES (NEW.partition_key, NEW.layout, NEW.partition, 1)
        ON CONFLICT DO UPDATE SET queued = queued + 1;
    END;
    CREATE TRIGGER keyorder_queue_delete AFTER DELETE ON delivery_queue
    BEGIN
      DELETE FROM keyorder_key_rows WHERE partition_key = OLD.partition_key
        AND layout = OLD.layout AND partition = OLD.partition AND queued = 1;
      UPDATE keyorder_key_rows SET queued = queued - 1 WHERE partition_key = OLD.partition_key
        AND layout = OLD.layout AND partition = OLD.partition;
    END;
    "#,
    // 8: PostgreSQL's transaction ids (taken before the seq, and recorded on each row);
    // SQLite serialises its writers, so its seq order is commit order already, and this
    // version only keeps the numbering equal.
    "-- seq order is commit order",
    // 9 (SQLite's own; PostgreSQL's leases are session locks): leases and memberships expire by
    // the host's monotonic clock, in the boot that wrote them (`lease_clock`), not by the wall
    // clock, which a step moves. Rows written before are carried over with the time they had
    // left. Applied only while no worker runs (`migrate_to` checks): a keyorder of before would
    // compare these expiries with the wall clock.
    r#"
    ALTER TABLE keyorder_lease ADD COLUMN boot TEXT;
    ALTER TABLE keyorder_member ADD COLUMN boot TEXT;
    UPDATE keyorder_lease
      SET expires_at = expires_at - unixepoch('subsec') + keyorder_clock(), boot = keyorder_boot();
    UPDATE keyorder_member
      SET expires_at = expires_at - unixepoch('subsec') + keyorder_clock(), boot = keyorder_boot();
    "#,
];

/// The schema version this build writes and expects (PostgreSQL's numbering up to 8; 9 is
/// SQLite's own).
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// How long a connection waits for another's write lock before failing.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

pub use crate::store::admin::OpenMode;

/// What a file holds, judged without writing to it.
enum Found {
    Missing,
    Fresh,
    Version(Option<i32>),
}

fn refused(reason: String) -> StoreError {
    StoreError::Refused { operation: "open the database", reason }
}

/// Judges `path` read-only: nothing, an empty file, or a database with some schema version.
fn inspect(path: &Path) -> Result<Found, StoreError> {
    let shown = path.display();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(refused(format!(
                "the folder {} of {shown} does not exist (keyorder creates the file, not the folder)",
                dir.display()
            )));
        }
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if let Some(fs) = super::local_fs::shared_file_system_of(dir) {
        return Err(refused(format!(
            "{shown} is on a {fs} file system, shared between hosts: SQLite's locking does not \
             hold there, and keyorder's leases expire by this host's clock. Put the database on \
             a local disk, or use PostgreSQL for workers on several hosts"
        )));
    }
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(refused(format!("cannot read {shown}: {e}"))),
    };
    if !meta.is_file() {
        return Err(refused(format!("{shown} is not a file")));
    }
    // Checked explicitly: a superuser's writes would succeed on a read-only file.
    if meta.permissions().readonly() {
        return Err(refused(format!("{shown} is read-only: keyorder needs to write to it")));
    }
    if meta.len() == 0 {
        return Ok(Found::Fresh);
    }
    // Read-write without create: a read-only open of a WAL file could leave -wal and -shm files.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let not_sqlite = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            refused(format!("{shown} is not a SQLite database (is it the right file?)"))
        }
        _ => StoreError::from(e),
    };
    let conn = Connection::open_with_flags(path, flags).map_err(not_sqlite)?;
    conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(not_sqlite)?;
    if tables == 0 {
        return Ok(Found::Fresh);
    }
    let has_versions: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'keyorder_migrations')",
        [],
        |r| r.get(0),
    )?;
    if !has_versions {
        return Err(refused(format!(
            "{shown} is a SQLite database of something else (it has no keyorder_migrations table)"
        )));
    }
    let v: Option<i32> =
        conn.query_row("SELECT max(version) FROM keyorder_migrations", [], |r| r.get(0))?;
    Ok(Found::Version(v))
}

/// Opens the keyorder database at `path` as `mode` allows, checking it first (see the module
/// docs): on a refusal nothing has been written. The connection is configured (WAL,
/// `synchronous = NORMAL`, as the worker's connections keep it, busy timeout) and, unless `mode` is [`OpenMode::Migrate`], its
/// schema is current.
pub fn open(path: &Path, mode: OpenMode) -> Result<Connection, StoreError> {
    open_checked(path, mode).map_err(super::error::opening)
}

fn open_checked(path: &Path, mode: OpenMode) -> Result<Connection, StoreError> {
    let shown = path.display();
    let found = inspect(path)?;
    match (&found, mode) {
        (Found::Missing, OpenMode::Existing) => {
            return Err(refused(format!(
                "no database at {shown}: `keyorder enqueue` or `keyorder migrate` creates it"
            )))
        }
        (Found::Fresh, OpenMode::Existing) => {
            return Err(refused(format!(
                "{shown} is empty: run `keyorder migrate --database sqlite:{shown}`"
            )))
        }
        (Found::Version(v), _) => check_version(path, *v, mode)?,
        _ => {}
    }
    let mut conn = match found {
        Found::Missing => {
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let c = Connection::open_with_flags(path, flags)?;
            configure(&c, DEFAULT_BUSY_TIMEOUT)?;
            c
        }
        _ => open_existing(path, DEFAULT_BUSY_TIMEOUT)?,
    };
    if mode != OpenMode::Migrate {
        // A fresh file gets the schema; a current one is left as it is.
        migrate(&mut conn)?;
    }
    Ok(conn)
}

fn check_version(path: &Path, found: Option<i32>, mode: OpenMode) -> Result<(), StoreError> {
    let shown = path.display();
    let v = found.unwrap_or(0);
    if v > SCHEMA_VERSION {
        return Err(refused(format!(
            "{shown} has schema version {v}, newer than this keyorder's {SCHEMA_VERSION}: use a newer keyorder"
        )));
    }
    if v < SCHEMA_VERSION && mode != OpenMode::Migrate {
        return Err(refused(format!(
            "{shown} has schema version {v}, this keyorder needs {SCHEMA_VERSION}: run `keyorder migrate --database sqlite:{shown}`"
        )));
    }
    Ok(())
}

/// Applies every migration not applied yet, each in its own `BEGIN IMMEDIATE` transaction (so
/// two concurrent runs serialise). Returns the versions applied (empty when current).
pub fn migrate(conn: &mut Connection) -> Result<Vec<i32>, StoreError> {
    migrate_to(conn, SCHEMA_VERSION)
}

/// [`migrate`], stopping after version `last`: how the tests build a file of an older version.
fn migrate_to(conn: &mut Connection, last: i32) -> Result<Vec<i32>, StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS keyorder_migrations (
           version    INTEGER PRIMARY KEY,
           applied_at REAL NOT NULL DEFAULT (unixepoch('subsec')))",
    )?;
    super::lease_clock::register(conn)?;
    let mut applied = Vec::new();
    for (i, sql) in MIGRATIONS.iter().enumerate().take(last.max(0) as usize) {
        let version = i as i32 + 1;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done =
            tx.query_row("SELECT 1 FROM keyorder_migrations WHERE version = ?1", [version], |_| {
                Ok(())
            })
            .optional()?;
        if done.is_none() {
            if version == MONOTONIC_LEASES {
                refuse_while_workers_run(&tx)?;
            }
            tx.execute_batch(sql)?;
            tx.execute("INSERT INTO keyorder_migrations (version) VALUES (?1)", [version])?;
            applied.push(version);
        }
        tx.commit()?;
    }
    Ok(applied)
}

/// The version from which leases expire by the monotonic clock.
const MONOTONIC_LEASES: i32 = 9;

/// Refuses the move to monotonic expiry while a worker's membership is live by the wall clock:
/// that worker would go on comparing the new expiries with the wall clock, see every lease
/// expired and take partitions their holders still deliver from.
fn refuse_while_workers_run(tx: &rusqlite::Transaction<'_>) -> Result<(), StoreError> {
    let live: Vec<String> = tx
        .prepare(
            "SELECT member FROM keyorder_member WHERE expires_at > unixepoch('subsec') ORDER BY 1",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if live.is_empty() {
        return Ok(());
    }
    Err(StoreError::Refused {
        operation: "migrate",
        reason: format!(
            "schema version {MONOTONIC_LEASES} changes the clock leases expire by, and {} worker \
             session(s) are running ({}): stop every `keyorder work` on this file, then migrate \
             (a stopped worker's membership lapses within its lease expiry)",
            live.len(),
            live.join(", ")
        ),
    })
}

/// `Ok` when the schema is at [`SCHEMA_VERSION`]; otherwise an error naming what to run.
pub fn require_current(conn: &Connection) -> Result<(), StoreError> {
    let found: Option<i32> =
        match conn.query_row("SELECT max(version) FROM keyorder_migrations", [], |r| r.get(0)) {
            Ok(v) => v,
            Err(rusqlite::Error::SqliteFailure(_, Some(m))) if m.contains("no such table") => None,
            Err(e) => return Err(e.into()),
        };
    match found {
        Some(v) if v == SCHEMA_VERSION => Ok(()),
        other => Err(StoreError::Refused {
            operation: "schema check",
            reason: format!(
                "the database has schema version {}, this keyorder needs {SCHEMA_VERSION}: run `keyorder migrate`",
                other.map_or("none".to_owned(), |v| v.to_string())
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Counts = Vec<(String, i64, i64, i64)>;

    fn counts(c: &Connection) -> (Counts, Counts) {
        let read = |sql: &str| -> Counts {
            let mut st = c.prepare(sql).unwrap();
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)));
            rows.unwrap().map(Result::unwrap).collect()
        };
        (
            read("SELECT partition_key, layout, partition, queued FROM keyorder_key_rows ORDER BY 1, 2, 3"),
            read(
                "SELECT partition_key, layout, partition, count(*) FROM delivery_queue
                 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            ),
        )
    }

    /// Version 9 moves expiry to the monotonic clock: refused while a worker's membership is
    /// live by the wall clock (that worker would read the new expiries by the wall clock);
    /// once none is, a held lease keeps the time it had left, now in this boot.
    #[test]
    fn migration_9_waits_for_workers_to_stop_and_carries_leases_over() {
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(migrate_to(&mut c, 8).unwrap(), vec![1, 2, 3, 4, 5, 6, 7, 8]);
        c.execute_batch(
            "INSERT INTO keyorder_member (member, expires_at)
               VALUES ('member:4242:0', unixepoch('subsec') + 30);
             INSERT INTO keyorder_lease (partition, holder, epoch, expires_at, clean)
               VALUES (0, 'lease:4242:1', 1, unixepoch('subsec') + 20, 0);",
        )
        .unwrap();
        let refused = migrate_to(&mut c, 9).unwrap_err().to_string();
        assert!(refused.contains("member:4242:0") && refused.contains("stop every"), "{refused}");
        let version: i32 =
            c.query_row("SELECT max(version) FROM keyorder_migrations", [], |r| r.get(0)).unwrap();
        assert_eq!(version, 8);

        c.execute("UPDATE keyorder_member SET expires_at = unixepoch('subsec') - 1", []).unwrap();
        assert_eq!(migrate_to(&mut c, 9).unwrap(), vec![9]);
        let (left, this_boot): (f64, bool) = c
            .query_row(
                "SELECT expires_at - keyorder_clock(), boot IS keyorder_boot()
                 FROM keyorder_lease WHERE partition = 0",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert!((19.0..=20.5).contains(&left), "{left}");
        assert!(this_boot);
    }

    /// A file of version 6 with rows queued, some in a newer layout and pinned elsewhere, is
    /// migrated to 7: the counts start equal to the queue's and follow every later write.
    #[test]
    fn migration_7_counts_the_rows_a_populated_file_already_holds() {
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(migrate_to(&mut c, 6).unwrap(), vec![1, 2, 3, 4, 5, 6]);
        c.execute_batch(
            "INSERT INTO delivery_queue (partition, partition_key, event_id, payload) VALUES
               (1, 'a', 'e1', '{}'), (1, 'a', 'e2', '{}'), (2, 'b', 'e3', '{}');
             UPDATE delivery_queue SET layout = 1, partition = 5 WHERE event_id = 'e2';",
        )
        .unwrap();
        assert_eq!(migrate_to(&mut c, 7).unwrap(), vec![7]);
        let (kept, queued) = counts(&c);
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert_eq!(kept, queued);

        c.execute_batch(
            "INSERT INTO delivery_queue (partition, partition_key, event_id, payload)
               VALUES (2, 'b', 'e4', '{}');
             DELETE FROM delivery_queue WHERE event_id IN ('e1', 'e3');
             UPDATE delivery_queue SET partition = 3 WHERE event_id = 'e4';",
        )
        .unwrap();
        let (kept, queued) = counts(&c);
        assert_eq!(kept, queued);
        c.execute_batch("DELETE FROM delivery_queue").unwrap();
        assert_eq!(counts(&c).0, vec![]);
    }
}
