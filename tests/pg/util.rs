//! Helpers: enqueue interleaved events, run in-process workers until the queue drains, and
//! turn what the endpoint saw plus what the database holds into a history for the checker.

use std::time::{Duration, Instant};

use keyorder::check::{Acked, DeadLettered, Delivery, Enqueued, History, Outcome};
use keyorder::clock::TokioClock;
use keyorder::http::{HttpDeliverer, Target};
use keyorder::key::Event;
use keyorder::retry::RetryPolicy;
use keyorder::store::postgres::{self, queue, schema, PgOptions, PgStore};
use keyorder::worker::{self, WorkerConfig, WorkerReport};
use keyorder::{PartitionCount, PartitionId, Seq, Time};
use tokio_postgres::Client;

use super::endpoint::{Arrival, Endpoint};

pub const PARTITIONS: i64 = 16;

pub fn count() -> PartitionCount {
    PartitionCount::new(PARTITIONS).unwrap()
}

/// Runs `fut` on a current-thread runtime in a `LocalSet`.
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    tokio::task::LocalSet::new().block_on(&rt, fut)
}

pub async fn client(url: &str) -> Client {
    let store = PgStore::new(url, count(), PgOptions::default()).unwrap();
    postgres::connect(store.config()).await.expect("connects")
}

pub async fn migrated(url: &str) -> Client {
    let mut c = client(url).await;
    schema::migrate(&mut c).await.expect("migrates");
    c
}

/// `per_key` events for each key, interleaved round-robin (the reference test's shape).
pub fn events(keys: &[String], per_key: usize) -> Vec<Event> {
    let mut out = Vec::new();
    for round in 0..per_key {
        for key in keys {
            out.push(Event {
                event_id: format!("{key}-{round}"),
                tenant_id: "t".into(),
                subscription_id: key.clone(),
                resource_id: "r".into(),
                payload: serde_json::json!({"event_id": format!("{key}-{round}"), "round": round}),
            });
        }
    }
    out
}

pub async fn enqueue(client: &mut Client, events: &[Event]) {
    keyorder::store::postgres::layout::record(client, count()).await.expect("records the count");
    let report = queue::enqueue(client, events, false).await.expect("enqueues");
    assert_eq!(report.inserted as usize, events.len());
}

pub fn config(name: &str) -> WorkerConfig {
    let mut c = WorkerConfig::new(name);
    c.retry = RetryPolicy::new(4, Duration::from_millis(20), Duration::from_millis(200)).unwrap();
    c.idle_poll = Duration::from_millis(20);
    c.rebalance_every = Duration::from_millis(100);
    c.delivery_timeout = Duration::from_millis(1000);
    c.reconnect_after = Duration::from_millis(100);
    c.rng_seed = name.len() as u64;
    c
}

/// Runs `workers` in-process workers until the queue is empty (or `limit` passes).
pub async fn drain(
    url: &str,
    endpoint: &Endpoint,
    workers: usize,
    limit: Duration,
) -> Vec<WorkerReport> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    for i in 0..workers {
        let store = PgStore::new(url, count(), PgOptions::default()).unwrap();
        let deliver = HttpDeliverer::new(Target::parse(&endpoint.url).unwrap());
        let mut rx = rx.clone();
        let stop = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let mut cfg = config(&format!("w{i}"));
        cfg.start_offset = (i * PARTITIONS as usize / workers) as u16;
        handles.push(tokio::task::spawn_local(worker::run(
            store,
            deliver,
            TokioClock::start(),
            cfg,
            stop,
        )));
    }
    let c = client(url).await;
    wait_empty(&c, limit).await;
    let _ = tx.send(true);
    let mut reports = Vec::new();
    for h in handles {
        reports.push(h.await.expect("worker task"));
    }
    reports
}

#[allow(clippy::disallowed_methods)] // a test deadline in wall time
pub async fn wait_empty(c: &Client, limit: Duration) {
    let start = Instant::now();
    loop {
        let depth: i64 =
            c.query_one("SELECT count(*) FROM delivery_queue", &[]).await.unwrap().get(0);
        if depth == 0 {
            return;
        }
        assert!(start.elapsed() < limit, "queue not drained after {limit:?}: {depth} rows left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The history: enqueued rows as recorded before draining, the endpoint's arrivals, the DLQ.
pub async fn history(c: &Client, enqueued: &[Enqueued], endpoint: &Endpoint) -> History {
    history_of(c, enqueued, &endpoint.arrivals()).await
}

/// The history of `enqueued` rows from what one or more endpoints saw (`arrivals`), with the
/// dead letters and what is still queued read from the database.
pub async fn history_of(c: &Client, enqueued: &[Enqueued], arrivals: &[Arrival]) -> History {
    let mut h = History { enqueued: enqueued.to_vec(), ..Default::default() };
    let key_of: std::collections::BTreeMap<i64, String> =
        enqueued.iter().map(|e| (e.seq.0, e.key.clone())).collect();
    for a in arrivals {
        h.deliveries.push(Delivery {
            event_id: a.event_id.clone(),
            key: key_of.get(&a.seq).cloned().unwrap_or_default(),
            seq: Seq(a.seq),
            partition: PartitionId(a.partition),
            attempt: a.attempt,
            worker: String::new(),
            sent_at: Time(a.at),
            arrived_at: Time(a.at),
            finished_at: Some(Time(a.done)),
            outcome: if a.accepted {
                Outcome::Accepted
            } else {
                Outcome::Rejected("HTTP 500".into())
            },
        });
    }
    // The endpoint cannot see deletes; a row is deleted after its accepted delivery answered,
    // so that answer is a lower bound of its ack, which is what the split-key check needs.
    let mut acked = std::collections::BTreeSet::new();
    for d in &h.deliveries {
        if d.outcome == Outcome::Accepted && acked.insert(d.seq) {
            h.acks.push(Acked { seq: d.seq, at: d.finished_at.unwrap_or(d.arrived_at) });
        }
    }
    for r in c.query("SELECT seq, reason FROM delivery_dlq", &[]).await.unwrap() {
        h.dead_letters.push(DeadLettered { seq: Seq(r.get(0)), reason: r.get(1), at: Time::ZERO });
    }
    for r in c.query("SELECT seq FROM delivery_queue", &[]).await.unwrap() {
        h.queued_at_end.push(Seq(r.get(0)));
    }
    h
}

/// The rows in the queue now, as the history's enqueued records (with their layouts).
pub async fn snapshot(c: &Client) -> Vec<Enqueued> {
    c.query(
        "SELECT seq, partition, partition_key, event_id, layout FROM delivery_queue ORDER BY seq",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| Enqueued {
        seq: Seq(r.get(0)),
        partition: PartitionId(r.get::<_, i16>(1) as u16),
        key: r.get(2),
        event_id: r.get(3),
        layout: r.get::<_, i32>(4) as u64,
        at: Time::ZERO,
    })
    .collect()
}
