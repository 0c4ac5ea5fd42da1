//! The schema: the reference design's `delivery_queue`, plus only what the design needs, and
//! the `delivery_dlq` table the reference never defines. Versioned, idempotent migrations.

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::store::lock_wait::{LockWait, LockWaitReport};
use crate::store::StoreError;

use super::lock_wait::{retrying, Contended};

/// Advisory-lock namespace of partition leases: the reference's `LOCK_NAMESPACE`.
pub const LEASE_NAMESPACE: i32 = 4711;
/// Advisory-lock namespace of worker membership (one lock per live worker session).
pub const MEMBER_NAMESPACE: i32 = 4712;
/// Advisory-lock namespace of per-key producer serialisation (transaction-scoped).
pub const KEY_NAMESPACE: i32 = 4713;
/// Advisory-lock namespace that serialises concurrent migrations.
const MIGRATE_NAMESPACE: i32 = 4714;

/// One migration: indexes built and dropped `CONCURRENTLY` first (outside a transaction, one
/// statement at a time, so the queue's writers never wait for them), then one transaction that
/// also records the version.
struct Migration {
    /// Indexes built first: each index's name and its `CREATE INDEX CONCURRENTLY IF NOT
    /// EXISTS` statement.
    build: &'static [(&'static str, &'static str)],
    /// Indexes dropped next (`DROP INDEX CONCURRENTLY IF EXISTS`).
    drop: &'static [&'static str],
    /// The transaction.
    sql: &'static str,
}

impl Migration {
    /// A migration that is one transaction.
    const fn tx(sql: &'static str) -> Self {
        Self { build: &[], drop: &[], sql }
    }
}

/// Each migration, in order. Version `i + 1` is `MIGRATIONS[i]`. Never change what a shipped
/// one leaves behind.
const MIGRATIONS: &[Migration] = &[
    // 1: the reference schema, unchanged, so reference producers keep working.
    Migration::tx(
        r#"
    CREATE TABLE IF NOT EXISTS delivery_queue (
      seq            BIGSERIAL PRIMARY KEY,
      partition      SMALLINT    NOT NULL,
      partition_key  TEXT        NOT NULL,
      event_id       TEXT        NOT NULL UNIQUE,
      payload        JSONB       NOT NULL,
      attempts       SMALLINT    NOT NULL DEFAULT 0,
      enqueued_at    TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE INDEX IF NOT EXISTS delivery_queue_drain_idx ON delivery_queue (partition, seq);
    "#,
    ),
    // 2: what the design adds: a recorded backoff and the last error at the head; the
    // dead-letter table (its own id, so the reference's DLQ insert works unchanged); the
    // lease epoch sequence; a key index for the split-key check.
    Migration::tx(
        r#"
    ALTER TABLE delivery_queue ADD COLUMN IF NOT EXISTS not_before TIMESTAMPTZ;
    ALTER TABLE delivery_queue ADD COLUMN IF NOT EXISTS last_error TEXT;
    CREATE TABLE IF NOT EXISTS delivery_dlq (
      id               BIGSERIAL PRIMARY KEY,
      seq              BIGINT,
      partition        SMALLINT    NOT NULL,
      partition_key    TEXT        NOT NULL,
      event_id         TEXT        NOT NULL,
      payload          JSONB       NOT NULL,
      attempts         SMALLINT    NOT NULL,
      enqueued_at      TIMESTAMPTZ,
      reason           TEXT        NOT NULL,
      dead_lettered_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE INDEX IF NOT EXISTS delivery_queue_key_idx ON delivery_queue (partition_key);
    CREATE SEQUENCE IF NOT EXISTS keyorder_lease_epoch;
    "#,
    ),
    // 3: the online repartition: each row's layout epoch, and the layouts (counts) in order.
    // A reference producer's rows get layout 0, the layout before any online switch.
    Migration::tx(
        r#"
    ALTER TABLE delivery_queue ADD COLUMN IF NOT EXISTS layout INT NOT NULL DEFAULT 0;
    CREATE INDEX IF NOT EXISTS delivery_queue_layout_idx ON delivery_queue (layout);
    CREATE TABLE IF NOT EXISTS keyorder_layout (
      epoch      INT PRIMARY KEY,
      partitions SMALLINT    NOT NULL CHECK (partitions BETWEEN 1 AND 32767),
      started_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    "#,
    ),
    // 4: how each partition's last holder gave its lease up, written only under the lease:
    // `clean` is set false when a lease is taken and true by a hand-back with no delivery out,
    // so the next holder may skip the takeover wait. No row: never leased. A database that
    // had leases before this migration (the epoch sequence was used) knows no hand-back to be
    // clean, so every partition starts unclean there.
    Migration::tx(
        r#"
    CREATE TABLE IF NOT EXISTS keyorder_handover (
      partition  SMALLINT    PRIMARY KEY,
      clean      BOOLEAN     NOT NULL,
      epoch      BIGINT      NOT NULL,
      changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    INSERT INTO keyorder_handover (partition, clean, epoch)
    SELECT g, false, 0 FROM generate_series(0, 32767) g
    WHERE (SELECT is_called FROM keyorder_lease_epoch)
    ON CONFLICT DO NOTHING;
    "#,
    ),
    // 5: a delivery target per key (a subscription's own URL), with a reference to its
    // signing secret (`env:NAME` or `file:PATH`, never the secret itself). Keys without a row
    // go to the worker's --deliver URL. The queue tables are untouched.
    Migration::tx(
        r#"
    CREATE TABLE IF NOT EXISTS keyorder_endpoint (
      partition_key TEXT PRIMARY KEY,
      url           TEXT NOT NULL,
      secret_ref    TEXT
    );
    "#,
    ),
    // 6: the routing configuration lives in the database: `keyorder_layout` holds the count in
    // force from now on (written by `keyorder migrate` or the first enqueue, not only by a
    // switch), and key pins beside it, each in force over a range of layout epochs (a pin
    // change starts an epoch of the same count, so the per-key barrier holds a moved key).
    // A plain SQL insert (a reference producer, routing by hash) is routed by a trigger:
    // stamped with the layout in force and sent to its key's pin. keyorder's own inserts route
    // themselves and mark their transaction (`keyorder.routed`), so the trigger skips them.
    Migration::tx(
        r#"
    CREATE TABLE IF NOT EXISTS keyorder_pin (
      partition_key TEXT     NOT NULL,
      partition     SMALLINT NOT NULL CHECK (partition >= 0),
      from_epoch    INT      NOT NULL,
      until_epoch   INT,
      pinned_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
      PRIMARY KEY (partition_key, from_epoch)
    );
    CREATE UNIQUE INDEX IF NOT EXISTS keyorder_pin_current ON keyorder_pin (partition_key)
      WHERE until_epoch IS NULL;
    CREATE OR REPLACE FUNCTION keyorder_route_insert() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
      e INT;
      p SMALLINT;
    BEGIN
      SELECT epoch INTO e FROM keyorder_layout ORDER BY epoch DESC LIMIT 1;
      IF e IS NOT NULL THEN
        NEW.layout := e;
      END IF;
      SELECT partition INTO p FROM keyorder_pin
        WHERE partition_key = NEW.partition_key AND until_epoch IS NULL;
      IF p IS NOT NULL THEN
        NEW.partition := p;
      END IF;
      RETURN NEW;
    END $$;
    CREATE OR REPLACE TRIGGER keyorder_route_insert BEFORE INSERT ON delivery_queue
      FOR EACH ROW
      WHEN (NEW.layout = 0 AND current_setting('keyorder.routed', true) IS DISTINCT FROM 'on')
      EXECUTE FUNCTION keyorder_route_insert();
    "#,
    ),
    // 7: SQLite counts queued rows per key in place of its key index; PostgreSQL keeps the
    // index (a delete leaves index entries to vacuum, so it costs nothing per row), and this
    // version only keeps the numbering equal.
    Migration::tx("-- the key index stays"),
    // 8: what the drain needs to find a row committed behind its cursor (`store::session_drain`,
    // "Late commits"). Every insert takes its transaction id before its seq, so a transaction
    // that started after a snapshot takes a seq above every seq that snapshot could see; and
    // every row records that id (`producer_xid`, indexed per partition), so a head read can
    // ask whether a transaction it saw running committed a row behind the cursor. Both are
    // column defaults, so a reference producer's plain insert keeps them too. The sequence's
    // name is resolved once, here. The new column is NULL for rows queued before: no
    // transaction a drain watches can have inserted them.
    Migration::tx(
        r#"
    DO $do$
    BEGIN
      EXECUTE format(
        $f$CREATE OR REPLACE FUNCTION keyorder_next_seq() RETURNS bigint
           LANGUAGE plpgsql VOLATILE AS $b$
           BEGIN
             PERFORM pg_current_xact_id();
             RETURN nextval(%L::regclass);
           END $b$$f$,
        pg_get_serial_sequence('delivery_queue', 'seq'));
    END $do$;
    ALTER TABLE delivery_queue ALTER COLUMN seq SET DEFAULT keyorder_next_seq();
    ALTER TABLE delivery_queue ADD COLUMN IF NOT EXISTS producer_xid BIGINT;
    ALTER TABLE delivery_queue ALTER COLUMN producer_xid
      SET DEFAULT (pg_current_xact_id()::text::bigint);
    CREATE INDEX IF NOT EXISTS delivery_queue_producer_idx
      ON delivery_queue (partition, producer_xid);
    "#,
    ),
    // 9: the head read's late-commit probe looks each watched transaction up by partition, id
    // and seq range in one index, and the planner is told that an id names few rows
    // (`n_distinct`, a fraction of the rows), which is true of a busy queue and keeps it on
    // that lookup: with version 8's index and a queue filled by few transactions it planned a
    // sequential scan of the queue on every read (`postgres::head_read_statement`). The index
    // is built, and version 8's dropped, `CONCURRENTLY`: the queue's writers never wait for
    // them (a plain `CREATE INDEX` held every insert and delete off for its whole build, 0.7 s
    // per 2,000,000 rows). (SQLite's 9 is its lease clock.)
    Migration {
        build: &[(
            "delivery_queue_producer_seq_idx",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS delivery_queue_producer_seq_idx
               ON delivery_queue (partition, producer_xid, seq)",
        )],
        drop: &["delivery_queue_producer_idx"],
        sql: r#"
    ALTER TABLE delivery_queue ALTER COLUMN producer_xid SET (n_distinct = -0.5);
    ANALYZE delivery_queue;
    "#,
    },
];

/// The schema version this build writes and expects.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Applies every migration not applied yet, each in its own transaction, under an advisory
/// lock so that two concurrent runs do not race. Returns the versions applied (empty when the
/// schema was current). Lock waits are bounded by [`LockWait::default`].
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, StoreError> {
    migrate_to(client, SCHEMA_VERSION, &LockWait::default(), &mut None).await
}

/// What a migration may lock: any keyorder table in any mode, and the migrations' advisory lock.
const MIGRATION_LOCKS: Contended = Contended {
    tables: &[
        "delivery_queue",
        "delivery_dlq",
        "keyorder_layout",
        "keyorder_pin",
        "keyorder_handover",
        "keyorder_endpoint",
        "keyorder_migrations",
    ],
    compatible: &[],
    advisory: Some(MIGRATE_NAMESPACE),
};

/// [`migrate`] up to version `target` (at most [`SCHEMA_VERSION`]), each migration's locks
/// waited for in bounded tries (`wait`, see [`crate::store::lock_wait`]), each try that gave up
/// reported to `report`. A migration that gives up leaves the versions before it applied.
pub async fn migrate_to(
    client: &mut Client,
    target: i32,
    wait: &LockWait,
    report: &mut Option<LockWaitReport>,
) -> Result<Vec<i32>, StoreError> {
    if !(0..=SCHEMA_VERSION).contains(&target) {
        return Err(StoreError::Refused {
            operation: "migrate",
            reason: format!("no schema version {target}: versions run from 1 to {SCHEMA_VERSION}"),
        });
    }
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS keyorder_migrations (
               version    INT PRIMARY KEY,
               applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await?;
    let mut applied = Vec::new();
    for (i, migration) in MIGRATIONS.iter().enumerate().take(target as usize) {
        let version = i as i32 + 1;
        let done = retrying(client, wait, report, "migrate", &MIGRATION_LOCKS, |c| {
            Box::pin(apply(c, version, migration))
        })
        .await?;
        if done {
            applied.push(version);
        }
    }
    Ok(applied)
}

/// Applies migration `version` unless it is recorded; whether it applied it. Its concurrent
/// index builds and drops run first, each on its own (a build that gave up on a lock leaves an
/// invalid index, which the next try drops and builds again); its transaction then checks that
/// every index it built is valid before it records the version, so a build still running in
/// another session, or one that failed, is never taken for done.
async fn apply(client: &mut Client, version: i32, m: &Migration) -> Result<bool, StoreError> {
    if !m.build.is_empty() || !m.drop.is_empty() {
        if recorded(client, version).await? {
            return Ok(false);
        }
        for (name, create) in m.build {
            if index_valid(client, name).await? == Some(false) {
                client.batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}")).await?;
            }
            client.batch_execute(create).await?;
        }
        for name in m.drop {
            client.batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}")).await?;
        }
    }
    let tx = client.transaction().await?;
    tx.query_typed("SELECT pg_advisory_xact_lock($1, 0)", &[(&MIGRATE_NAMESPACE, Type::INT4)])
        .await?;
    if recorded(&tx, version).await? {
        tx.commit().await?;
        return Ok(false);
    }
    for (name, _) in m.build {
        if index_valid(&tx, name).await? != Some(true) {
            return Err(StoreError::Refused {
                operation: "migrate",
                reason: format!(
                    "index {name} of schema version {version} is not ready (another session \
                     may still be building it): run `keyorder migrate` again"
                ),
            });
        }
    }
    tx.batch_execute(m.sql).await?;
    tx.query_typed(
        "INSERT INTO keyorder_migrations (version) VALUES ($1)",
        &[(&version, Type::INT4)],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Whether schema version `version` is recorded as applied.
async fn recorded(
    client: &impl tokio_postgres::GenericClient,
    version: i32,
) -> Result<bool, StoreError> {
    let row = client
        .query_typed_opt(
            "SELECT 1 FROM keyorder_migrations WHERE version = $1",
            &[(&version, Type::INT4)],
        )
        .await?;
    Ok(row.is_some())
}

/// Whether index `name` is valid (usable), `None` when there is none.
async fn index_valid(
    client: &impl tokio_postgres::GenericClient,
    name: &str,
) -> Result<Option<bool>, StoreError> {
    let row = client
        .query_typed_opt(
            "SELECT indisvalid AND indisready FROM pg_index WHERE indexrelid = to_regclass($1)",
            &[(&name, Type::TEXT)],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// The newest applied version, or an error naming what to run when the schema is missing or
/// older than this build.
pub async fn require_current(client: &Client) -> Result<(), StoreError> {
    let found: Option<i32> =
        match client.query_typed_one("SELECT max(version) FROM keyorder_migrations", &[]).await {
            Ok(row) => row.get(0),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => None,
            Err(e) => return Err(e.into()),
        };
    match found {
        Some(v) if v >= SCHEMA_VERSION => Ok(()),
        other => Err(StoreError::Refused {
            operation: "schema check",
            reason: format!(
                "the database has schema version {}, this keyorder needs {SCHEMA_VERSION}: run `keyorder migrate` with the same --database (not repeated here: a PostgreSQL URL may hold a password)",
                other.map_or("none".to_owned(), |v| v.to_string())
            ),
        }),
    }
}
