//! Issue #21, end to end through the worker, the SQLite store and HTTP: a receiver answers 503
//! with `Retry-After: 1` to the first three attempts of every event of one key. With parking
//! (the default) that key's partition-mates finish within 2 s of the other partitions; with
//! `strict_partition_order` they wait behind it. The failing key's events arrive in order and
//! nothing is dead-lettered.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keyorder::clock::TokioClock;
use keyorder::http::HttpOptions;
use keyorder::key::Event;
use keyorder::retry::RetryPolicy;
use keyorder::store::sqlite::{self, schema::OpenMode, SqliteOptions, SqliteStore};
use keyorder::worker::{self, WorkerConfig};
use keyorder::{PartitionCount, Router};

use super::server::{deliverer, hyper_server, Captured};

const FAILING: &str = "k0";
const KEYS: usize = 30;
const PARTITIONS: i64 = 8;

/// 503 with `Retry-After: 1` to the first three attempts of every event of `FAILING`.
fn answer(req: &Captured) -> (u16, Vec<(&'static str, &'static str)>) {
    let header = |name| req.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let attempt: u32 = header("x-keyorder-attempt").parse().unwrap_or(0);
    if header("x-keyorder-key") == FAILING && attempt <= 3 {
        (503, vec![("retry-after", "1")])
    } else {
        (204, vec![])
    }
}

/// Drains the scenario; returns each key's finish time (its last row gone) from the start,
/// the failing key's arrivals `(seq, attempt)` in order, and the dead letters.
async fn run(strict: bool) -> (BTreeMap<String, Duration>, Vec<(i64, u32)>, usize) {
    let dir =
        std::env::temp_dir().join(format!("keyorder-parking-{strict}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("q.db");
    let count = PartitionCount::new(PARTITIONS).unwrap();
    let mut c = sqlite::schema::open(&db, OpenMode::Create).unwrap();
    let mut events = Vec::new();
    for n in 0..20 {
        for k in 0..KEYS {
            // The failing key has 2 events among the 582 (the 10 among 3,000, shrunk).
            if k == 0 && n >= 2 {
                continue;
            }
            events.push(Event {
                event_id: format!("k{k}-{n}"),
                tenant_id: String::new(),
                subscription_id: format!("k{k}"),
                resource_id: String::new(),
                payload: serde_json::json!({"n": n}),
            });
        }
    }
    sqlite::layout::record(&c, count).unwrap();
    sqlite::queue::enqueue(&mut c, &events).unwrap();
    let (addr, _, seen) = hyper_server(answer).await;
    let store = SqliteStore::new(
        &db,
        count,
        SqliteOptions::for_delivery_timeout(Duration::from_secs(2)),
        TokioClock::start(),
    )
    .unwrap();
    let mut config = WorkerConfig::new(format!("w-{strict}"));
    config.retry = RetryPolicy::new(5, Duration::from_millis(50), Duration::from_secs(5)).unwrap();
    config.delivery_timeout = Duration::from_secs(2);
    config.idle_poll = Duration::from_millis(10);
    config.rebalance_every = Duration::from_millis(50);
    config.strict_partition_order = strict;
    let url = format!("http://{addr}/");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let work = tokio::task::spawn_local(worker::run(
        store,
        deliverer(&url, HttpOptions::default()),
        TokioClock::start(),
        config,
        async {
            let _ = rx.await;
        },
    ));
    #[allow(clippy::disallowed_methods)] // a real-time test: wall time is what is measured
    let start = Instant::now();
    let mut finished = BTreeMap::new();
    for _ in 0..3000 {
        let mut stmt =
            c.prepare_cached("SELECT DISTINCT partition_key FROM delivery_queue").unwrap();
        let queued: Vec<String> =
            stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
        for k in 0..KEYS {
            let key = format!("k{k}");
            if !queued.contains(&key) {
                finished.entry(key).or_insert_with(|| start.elapsed());
            }
        }
        if queued.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = tx.send(());
    work.await.unwrap();
    let dead = sqlite::queue::dead_letters(&c, None, 100).unwrap().len();
    let arrivals = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.headers.get("x-keyorder-key").is_some_and(|v| v == FAILING))
        .map(|r| {
            let h = |n| r.headers.get(n).and_then(|v| v.to_str().ok()).unwrap().to_owned();
            (h("x-keyorder-seq").parse().unwrap(), h("x-keyorder-attempt").parse().unwrap())
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    (finished, arrivals, dead)
}

/// When the failing key's partition-mates and the other partitions' keys finished.
fn finish_times(finished: &BTreeMap<String, Duration>) -> (Duration, Duration) {
    let router = Router::new(PartitionCount::new(PARTITIONS).unwrap());
    let home = router.route(FAILING);
    let (mut mates, mut others) = (Duration::ZERO, Duration::ZERO);
    for (key, at) in finished.iter().filter(|(k, _)| *k != FAILING) {
        let slot = if router.route(key) == home { &mut mates } else { &mut others };
        *slot = (*slot).max(*at);
    }
    (mates, others)
}

fn measure(strict: bool) -> (Duration, Duration) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (finished, arrivals, dead) = tokio::task::LocalSet::new().block_on(&rt, run(strict));
    assert_eq!(finished.len(), KEYS, "every key drained: {finished:?}");
    assert_eq!(dead, 0, "nothing dead-lettered");
    // The failing key: each event's four attempts, in seq order, the first event's first.
    let seqs: Vec<i64> = arrivals.iter().map(|a| a.0).collect();
    assert!(seqs.windows(2).all(|w| w[0] <= w[1]), "the failing key out of order: {arrivals:?}");
    let attempts: Vec<u32> = arrivals.iter().map(|a| a.1).collect();
    assert_eq!(attempts, [1, 2, 3, 4, 1, 2, 3, 4], "three refusals, then accepted, per event");
    let (mates, others) = finish_times(&finished);
    eprintln!(
        "strict_partition_order={strict}: partition-mates of {FAILING} finished at {:.2} s, \
         the other partitions at {:.2} s, {FAILING} at {:.2} s",
        mates.as_secs_f64(),
        others.as_secs_f64(),
        finished[FAILING].as_secs_f64()
    );
    (mates, others)
}

#[test]
fn a_failing_key_holds_up_only_itself() {
    let (mates, others) = measure(false);
    assert!(
        mates <= others + Duration::from_secs(2),
        "parking: partition-mates finished {mates:?}, the others {others:?}"
    );
    // The same scenario in partition FIFO: the mates wait out the failing key's backoffs
    // (six Retry-After seconds), which is what the assertion above rules out.
    let (mates, others) = measure(true);
    assert!(
        mates > others + Duration::from_secs(3),
        "strict: partition-mates finished {mates:?}, the others {others:?}"
    );
}
