//! PostgreSQL behind a real connection pooler (PgBouncer). In transaction and statement mode a
//! session's server connection (and its advisory locks) goes to other clients between
//! transactions: `work` refuses before it takes a lease, as do `migrate` and `switch`, and
//! nothing changes in the database; the admin commands that need no session work. In session
//! mode three workers deliver every event with no key reordered and no partition delivered
//! twice at once.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use keyorder::check::check;

use super::bouncer::Bouncer;
use super::cli::{keyorder, psql, text};
use super::endpoint::Endpoint;
use super::harness::PgServer;
use super::util::*;

/// What a refused command must leave as it was: the queue, the layouts, the lease records, the
/// advisory locks held.
fn state(pg: &PgServer, db: &str) -> String {
    psql(
        pg,
        db,
        "SELECT (SELECT count(*) FROM delivery_queue) || ' queued, ' ||
                (SELECT count(*) FROM keyorder_layout) || ' layouts, ' ||
                (SELECT count(*) FROM keyorder_handover) || ' leases recorded, ' ||
                (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory') || ' advisory locks'",
    )
}

fn refused(o: &Output, mode: &str) {
    let t = text(o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains(&format!("{mode} pooling mode")), "names the mode: {t}");
    assert!(t.contains("pool_mode = session") && t.contains("straight at the server"), "{t}");
    assert!(!t.contains("prepared statement"), "no driver error: {t}");
}

#[test]
fn transaction_pooling_refuses_work_before_a_lease_and_serves_enqueue_and_lag() {
    let Some(pg) = PgServer::start() else { return };
    let direct = pg.create_db("pooled_tx");
    let Some(bouncer) = Bouncer::start(&pg, "transaction", 4, "pooler_transaction") else {
        return;
    };
    let pooled = bouncer.url("pooled_tx");
    let o = keyorder(&["migrate", "--database", &pooled], "");
    refused(&o, "transaction");
    assert!(keyorder(&["migrate", "--database", &direct], "").status.success());
    // The commands that need no session of their own work through the pooler.
    let input: String = (0..30)
        .map(|i| format!("{{\"event_id\":\"e{i}\",\"subscription_id\":\"sub_{}\"}}\n", i % 7))
        .collect();
    let o = keyorder(&["enqueue", "--database", &pooled], &input);
    assert!(o.status.success() && text(&o).contains("enqueued 30 events"), "{}", text(&o));
    for cmd in [
        &["lag", "--database", &pooled][..],
        &["dlq", "--database", &pooled, "list"],
        &["pins", "--database", &pooled],
        &["endpoints", "list", "--database", &pooled],
    ] {
        let o = keyorder(cmd, "");
        assert!(o.status.success(), "{cmd:?}: {}", text(&o));
    }
    let o = keyorder(&["lag", "--database", &pooled], "");
    assert!(text(&o).contains("heavy key \"sub_0\": 5 queued"), "lag: {}", text(&o));
    let before = state(&pg, "pooled_tx");
    #[allow(clippy::disallowed_methods)] // the endpoint's clock
    let endpoint = Endpoint::start(Instant::now());
    let work = ["work", "--database", &pooled, "--deliver", &endpoint.url, "--threads", "2"];
    let o = keyorder(&[&work[..], &["--until-empty", "--stop-after", "30"]].concat(), "");
    refused(&o, "transaction");
    let o = keyorder(&["switch", "--database", &pooled, "--to", "8", "--producers-follow"], "");
    refused(&o, "transaction");
    assert_eq!(state(&pg, "pooled_tx"), before, "a refused command changed the database");
    assert!(endpoint.arrivals().is_empty(), "nothing is delivered");
    // Statement pooling refuses transactions: work names it.
    let Some(statement) = Bouncer::start(&pg, "statement", 4, "pooler_statement") else { return };
    let pooled = statement.url("pooled_tx");
    let work = ["work", "--database", &pooled, "--deliver", &endpoint.url, "--stop-after", "30"];
    refused(&keyorder(&work, ""), "statement");
    assert_eq!(state(&pg, "pooled_tx"), before, "a refused command changed the database");
}

#[test]
#[allow(clippy::disallowed_methods)] // real processes, waited for with a deadline
fn session_pooling_delivers_every_event_in_order_with_three_workers() {
    let Some(pg) = PgServer::start() else { return };
    pg.create_db("pooled_session");
    let Some(bouncer) = Bouncer::start(&pg, "session", 60, "pooler_session") else { return };
    let url = bouncer.url("pooled_session");
    let o = keyorder(&["migrate", "--database", &url], "");
    assert!(o.status.success(), "{}", text(&o));
    let endpoint = Endpoint::start(Instant::now());
    endpoint.shared.lock().unwrap().latency = Duration::from_millis(1);
    block_on(async {
        let mut c = client(&url).await;
        let keys: Vec<String> = (0..40).map(|i| format!("sub_{i}")).collect();
        enqueue(&mut c, &events(&keys, 25)).await;
        let enqueued = snapshot(&c).await;
        let workers: Vec<_> = (0..3)
            .map(|i| {
                Command::new(env!("CARGO_BIN_EXE_keyorder"))
                    .args(["work", "--database", &url, "--deliver", &endpoint.url])
                    .args(["--name", &format!("w{i}"), "--threads", "1", "--until-empty"])
                    .args(["--stop-after", "120", "--delivery-timeout-ms", "2000"])
                    .args(["--idle-poll-ms", "20"])
                    .env_remove("DATABASE_URL")
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("keyorder work starts")
            })
            .collect();
        for w in workers {
            let o = w.wait_with_output().expect("worker exits");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "a worker failed: {err}\npgbouncer: {}", bouncer.log());
        }
        let verdict = check(&history(&c, &enqueued, &endpoint).await);
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!(verdict.events, 1000);
        let delivered: std::collections::BTreeSet<String> =
            endpoint.arrivals().into_iter().map(|a| a.event_id).collect();
        assert_eq!(delivered.len(), 1000, "every event delivered");
        eprintln!(
            "session pooling: {} events, {} deliveries, {} duplicates",
            verdict.events,
            verdict.deliveries,
            verdict.count(keyorder::check::Kind::Duplicate)
        );
    });
}

/// A lease whose statements a pooler sends to another server connection (as PgBouncer 1.21
/// and later do when they forward prepared statements in transaction mode) finds out from
/// the server process that answers, and gives the lease up instead of delivering. The test
/// stages the move by hand: another client holds the lease's server connection in a
/// transaction, and the other server connection holds a statement of the lease's name.
#[test]
fn a_lease_moved_to_another_server_connection_is_given_up() {
    use keyorder::store::postgres::{self, PgOptions, PgStore};
    use keyorder::store::{LeaseSession, Store, StoreError};

    let Some(pg) = PgServer::start() else { return };
    let direct = pg.create_db("pooled_moved");
    let Some(bouncer) = Bouncer::start(&pg, "transaction", 2, "pooler_moved") else { return };
    let url = bouncer.url("pooled_moved");
    block_on(async {
        migrated(&direct).await;
        let store = PgStore::new(&url, count(), PgOptions::default()).unwrap();
        let mut lease =
            store.acquire(keyorder::PartitionId(0)).await.unwrap().expect("the lease is free");
        lease.keep_alive().await.expect("its own session so far");
        // The pooler gives the most recently used server connection (the lease's) to the next
        // client: hold it there in a transaction and read the lease's ping statement's name.
        let holder = postgres::connect(store.config()).await.unwrap();
        holder.batch_execute("BEGIN").await.unwrap();
        let name = holder
            .simple_query(
                "SELECT name FROM pg_prepared_statements WHERE statement = 'SELECT pg_backend_pid()'",
            )
            .await
            .unwrap()
            .into_iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .expect("the holder is on the lease's server connection, which has its statements");
        // The other server connection gets a statement of that name doing the same.
        let other = postgres::connect(store.config()).await.unwrap();
        other.batch_execute(&format!("PREPARE {name} AS SELECT pg_backend_pid()")).await.unwrap();
        let moved = lease.keep_alive().await;
        assert!(
            matches!(moved, Err(StoreError::SessionMoved { .. })),
            "the lease answered from another server process must be given up: {moved:?}"
        );
        holder.batch_execute("COMMIT").await.unwrap();
    });
}
