//! Admin operations that lock what producers and workers need (migrate, switch, pin) wait for
//! their locks in bounded tries: a transaction an operator left open makes them fail, naming
//! that session, instead of queueing every producer behind them for as long as it stays open.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keyorder::store::lock_wait::{LockWait, LockWaitReport};
use keyorder::store::postgres::{layout, queue, schema};
use keyorder::store::StoreError;
use keyorder::PartitionCount;

use super::harness::PgServer;
use super::util::*;

/// A plain SQL producer's insert of one row into partition 0 (the reference producer's
/// statement: the column defaults do the rest).
async fn plain_insert(
    producer: &tokio_postgres::Client,
    event_id: &str,
) -> Result<u64, tokio_postgres::Error> {
    producer
        .execute(
            "INSERT INTO delivery_queue (partition, partition_key, event_id, payload)
             VALUES (0, 'k', $1, '{}')",
            &[&event_id],
        )
        .await
}

/// The newest applied schema version.
async fn version(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT max(version) FROM keyorder_migrations", &[]).await.unwrap().get(0)
}

/// `keyorder migrate` with a migration pending, while a session sits idle in a transaction
/// that read `delivery_queue`: a plain SQL producer keeps inserting (none waits past its 5 s
/// statement timeout), and the migration fails within its --lock-wait, naming that session and
/// applying nothing (its concurrent index build, given up, leaves an invalid index). Once the
/// transaction ends, the same command drops that index, builds it again and applies the
/// migration.
/// Without `lock_timeout` the migration's `ALTER TABLE` waits for the idle transaction and
/// every insert queues behind it: the producer's statement timeout fails this test.
#[test]
#[allow(clippy::disallowed_methods)] // a test deadline in wall time
fn a_migration_behind_an_open_transaction_gives_up_and_never_holds_up_producers() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("migrate_locks");
    block_on(async {
        let mut c = client(&url).await;
        schema::migrate_to(&mut c, schema::SCHEMA_VERSION - 1, &LockWait::default(), &mut None)
            .await
            .unwrap();
        layout::record(&c, count()).await.unwrap();
        // An operator's forgotten transaction that read the queue.
        let mut operator = client(&url).await;
        operator.batch_execute("SET application_name = 'forgotten-psql'").await.unwrap();
        let held = operator.transaction().await.unwrap();
        held.query_one("SELECT count(*) FROM delivery_queue", &[]).await.unwrap();
        let pid: i32 = held.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);

        let mut migrate = Command::new(env!("CARGO_BIN_EXE_keyorder"))
            .args(["migrate", "--database", &url, "--lock-wait", "4"])
            .env_remove("DATABASE_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("keyorder runs");
        // A producer of plain SQL inserts meanwhile, each bounded by a statement timeout.
        let producer = client(&url).await;
        producer.batch_execute("SET statement_timeout = '5s'").await.unwrap();
        let start = Instant::now();
        let mut inserted = 0;
        while migrate.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "migrate did not give up");
            plain_insert(&producer, &format!("e{inserted}"))
                .await
                .expect("an insert waited behind the migration");
            inserted += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let out = migrate.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "migrate succeeded behind an open transaction: {stderr}");
        assert!(inserted >= 20, "the producer inserted only {inserted} rows meanwhile");
        for needle in [
            "migrate: waiting for locks other sessions hold (try 1 of 2)",
            &format!("pid {pid} (forgotten-psql), idle in transaction"),
            "holds AccessShareLock on delivery_queue",
            "last statement: SELECT pg_backend_pid()",
            "pg_terminate_backend",
        ] {
            assert!(stderr.contains(needle), "{needle:?} not in:\n{stderr}");
        }
        assert_eq!(version(&c).await, schema::SCHEMA_VERSION - 1, "a migration was applied");
        // The concurrent build that gave up on its lock left its index invalid; the next run
        // must drop and build it again rather than take it for done.
        let valid: Option<bool> = c
            .query_opt(
                "SELECT indisvalid FROM pg_index
                 WHERE indexrelid = to_regclass('delivery_queue_producer_seq_idx')",
                &[],
            )
            .await
            .unwrap()
            .map(|r| r.get(0));
        assert_eq!(valid, Some(false), "the index build that gave up left no invalid index");

        held.commit().await.unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_keyorder"))
            .args(["migrate", "--database", &url, "--lock-wait", "4"])
            .env_remove("DATABASE_URL")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(version(&c).await, schema::SCHEMA_VERSION);
        let valid: bool = c
            .query_one(
                "SELECT indisvalid FROM pg_index
                 WHERE indexrelid = 'delivery_queue_producer_seq_idx'::regclass",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(valid, "version 9 recorded with its index invalid");
    });
}

/// A switch behind a producer's open transaction (it read the layout `FOR SHARE`) gives up
/// after its tries, reporting each, and changes nothing; started again while that transaction
/// ends during its wait, it goes through.
#[test]
fn a_switch_behind_an_open_producer_transaction_reports_gives_up_then_goes_through() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("switch_locks");
    block_on(async {
        let c = migrated(&url).await;
        layout::record(&c, count()).await.unwrap();
        let mut producer = client(&url).await;
        let held = producer.transaction().await.unwrap();
        held.query_one("SELECT epoch FROM keyorder_layout FOR SHARE", &[]).await.unwrap();
        let pid: i32 = held.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);

        let wait = LockWait {
            attempt: Duration::from_millis(200),
            pause: Duration::from_millis(100),
            attempts: 3,
        };
        let notices = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = notices.clone();
        let report: LockWaitReport = Box::new(move |n| seen.lock().unwrap().push(n.to_string()));
        let mut report = Some(report);
        let to = PartitionCount::new(32).unwrap();
        let mut admin = client(&url).await;
        let bounded = Duration::from_secs(10);
        let switch = queue::switch_online(&mut admin, count(), to, &wait, &mut report);
        let err = tokio::time::timeout(bounded, switch)
            .await
            .expect("the switch waited for its lock without bound")
            .expect_err("switched behind an open transaction");
        let StoreError::LockBusy { operation, attempts, holders, .. } = &err else {
            panic!("not a lock wait: {err}")
        };
        assert_eq!((*operation, *attempts), ("switch", 3));
        assert!(holders.iter().any(|h| h.pid == pid && h.holds.contains("RowShareLock")), "{err}");
        let notices = notices.lock().unwrap().clone();
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(notices[0].contains("try 1 of 3") && notices[0].contains(&format!("pid {pid}")));
        let layouts = layout::state(&c).await.unwrap();
        assert_eq!(layouts.current().unwrap().partitions, count(), "the switch changed the layout");
        // The session's lock timeout is back to the server's default.
        let timeout: String = admin.query_one("SHOW lock_timeout", &[]).await.unwrap().get(0);
        assert_eq!(timeout, "0");

        // The producer's transaction ends while the switch waits: it goes through.
        let ends = async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            held.commit().await.unwrap();
        };
        let wait = LockWait { attempts: 20, ..wait };
        let mut silent = None;
        let (switched, ()) =
            tokio::join!(queue::switch_online(&mut admin, count(), to, &wait, &mut silent), ends);
        let layout = switched.expect("the switch goes through once the transaction ends");
        assert_eq!(layout.partitions, 32);
    });
}

/// Version 9 builds its index on a full queue while a producer inserts with a 50 ms lock
/// timeout: no insert waits that long, the version is recorded, the new index is valid and
/// version 8's is gone. Built with a plain `CREATE INDEX` (as version 9 was first written), the
/// index holds every insert off for its whole build (hundreds of ms on 600,000 rows) and an
/// insert fails on its lock timeout.
#[test]
fn migration_9_builds_its_index_without_holding_off_writes() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("migrate_concurrently");
    block_on(async {
        let mut c = client(&url).await;
        schema::migrate_to(&mut c, 8, &LockWait::default(), &mut None).await.unwrap();
        layout::record(&c, count()).await.unwrap();
        c.batch_execute(
            "SET keyorder.routed = 'on';
             INSERT INTO delivery_queue (partition, partition_key, event_id, payload)
               SELECT g % 16, 'k' || (g % 5000), 'bulk' || g, '{}'
               FROM generate_series(1, 600000) g;
             RESET keyorder.routed;",
        )
        .await
        .unwrap();
        let producer = client(&url).await;
        producer.batch_execute("SET lock_timeout = '50ms'").await.unwrap();
        let migrating = std::cell::Cell::new(true);
        let migrate = async {
            let mut admin = client(&url).await;
            let applied = schema::migrate(&mut admin).await;
            migrating.set(false);
            applied
        };
        let produce = async {
            let mut during = 0;
            while migrating.get() {
                plain_insert(&producer, &format!("live{during}"))
                    .await
                    .expect("an insert waited behind the migration's index build");
                during += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            during
        };
        let (applied, during) = tokio::join!(migrate, produce);
        assert_eq!(applied.unwrap(), [9]);
        assert!(during >= 3, "only {during} inserts ran during the migration");
        let indexes: Vec<(String, bool)> = c
            .query(
                "SELECT c.relname::text, i.indisvalid FROM pg_index i
                 JOIN pg_class c ON c.oid = i.indexrelid
                 WHERE i.indrelid = 'delivery_queue'::regclass AND c.relname LIKE '%producer%'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(indexes, [("delivery_queue_producer_seq_idx".to_owned(), true)]);
        assert_eq!(version(&c).await, 9);
    });
}
