//! Failover under load: a primary with a synchronous streaming standby; two `keyorder work`
//! processes and a producer on one multi-host URL (`target_session_attrs=read-write`); the
//! primary stopped (`-m immediate`) while events are enqueued and delivered, the standby
//! promoted. The workers and the producer move to the new primary by themselves, and the
//! checker finds no key reordered, no partition delivered twice at once, and every event whose
//! enqueue was acknowledged (synchronous replication: it reached the standby) delivered.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyorder::check::{check, Enqueued, Kind};
use keyorder::store::postgres::queue;
use keyorder::{PartitionId, Seq, Time};

use super::cli::{keyorder, text};
use super::endpoint::Endpoint;
use super::harness::PgServer;
use super::util::*;

const KEYS: usize = 20;
const ROUNDS: usize = 150;

struct Kill(Vec<Child>);
impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn worker(url: &str, endpoint: &str, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(["work", "--database", url, "--deliver", endpoint, "--name", name])
        .args(["--threads", "1", "--delivery-timeout-ms", "1000", "--request-timeout-ms", "1000"])
        .args(["--idle-poll-ms", "20", "--backoff-base-ms", "20", "--backoff-cap-ms", "200"])
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("keyorder work starts")
}

/// Enqueues `ROUNDS` rounds of one event per key, in order, through `url`; a round whose
/// outcome is unknown (the connection broke) is sent again after reconnecting (event ids make
/// that idempotent), so a key's events keep their order. Returns the acknowledged event ids.
#[allow(clippy::disallowed_methods)] // a deadline in wall time
fn produce(url: String, rounds_done: Arc<AtomicUsize>) -> Vec<String> {
    block_on(async move {
        let keys: Vec<String> = (0..KEYS).map(|i| format!("sub_{i}")).collect();
        let all = events(&keys, ROUNDS);
        let mut acked = Vec::new();
        let mut c = client(&url).await;
        for (round, batch) in all.chunks(KEYS).enumerate() {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match queue::enqueue(&mut c, batch, false).await {
                    Ok(_) => break,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "round {round} not enqueued: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let store = keyorder::store::postgres::PgStore::new(
                            &url,
                            count(),
                            Default::default(),
                        )
                        .unwrap();
                        if let Ok(fresh) = keyorder::store::postgres::connect(store.config()).await
                        {
                            c = fresh;
                        }
                    }
                }
            }
            acked.extend(batch.iter().map(|e| e.event_id.clone()));
            rounds_done.store(round + 1, Ordering::Relaxed);
            // Load spread over the failover, not all of it before.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        acked
    })
}

#[test]
#[allow(clippy::disallowed_methods)] // real processes and servers, waited for with deadlines
fn failover_to_a_promoted_standby_reorders_nothing_and_loses_nothing_acknowledged() {
    let Some(primary) = PgServer::start() else { return };
    let direct = primary.create_db("failover");
    let o = keyorder(&["migrate", "--database", &direct, "--partitions", "16"], "");
    assert!(o.status.success(), "{}", text(&o));
    let standby = primary.standby(true);
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/failover?target_session_attrs=read-write&connect_timeout=2",
        primary.port, standby.port
    );
    // The standby refuses writes by name, not with an SQL error.
    let o = keyorder(
        &["enqueue", "--database", &standby.url("failover")],
        "{\"event_id\":\"x\",\"subscription_id\":\"sub_0\"}\n",
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("read-only") && text(&o).contains("target_session_attrs"),
        "{}",
        text(&o)
    );
    let o = keyorder(
        &[
            "work",
            "--database",
            &standby.url("failover"),
            "--deliver",
            "http://127.0.0.1:9/",
            "--stop-after",
            "10",
        ],
        "",
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("standby in recovery"), "{}", text(&o));

    let endpoint = Endpoint::start(Instant::now());
    endpoint.shared.lock().unwrap().latency = Duration::from_millis(2);
    let _workers = Kill(vec![worker(&url, &endpoint.url, "a"), worker(&url, &endpoint.url, "b")]);
    let rounds = Arc::new(AtomicUsize::new(0));
    let producer = {
        let (url, rounds) = (url.clone(), rounds.clone());
        std::thread::spawn(move || produce(url, rounds))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while rounds.load(Ordering::Relaxed) < ROUNDS / 3 || endpoint.arrivals().len() < 200 {
        assert!(Instant::now() < deadline, "no load before the failover");
        std::thread::sleep(Duration::from_millis(20));
    }
    primary.stop_immediate();
    let stopped_at = (rounds.load(Ordering::Relaxed), endpoint.arrivals().len());
    standby.promote();
    let acked = producer.join().expect("the producer");
    assert_eq!(acked.len(), KEYS * ROUNDS);

    block_on(async {
        let c = client(&standby.url("failover")).await;
        wait_empty(&c, Duration::from_secs(90)).await;
        let arrivals = endpoint.arrivals();
        // What was enqueued, as the endpoint saw it (the rows are deleted once delivered).
        let mut first: BTreeMap<String, (i64, u16)> = BTreeMap::new();
        for a in &arrivals {
            first.entry(a.event_id.clone()).or_insert((a.seq, a.partition));
        }
        let undelivered: Vec<&String> =
            acked.iter().filter(|id| !first.contains_key(*id)).collect();
        assert!(undelivered.is_empty(), "acknowledged but never delivered: {undelivered:?}");
        let enqueued: Vec<Enqueued> = first
            .iter()
            .map(|(id, (seq, partition))| Enqueued {
                seq: Seq(*seq),
                partition: PartitionId(*partition),
                // Event ids are KEY-ROUND (see `events`).
                key: id.rsplit_once('-').map(|(k, _)| k.to_owned()).unwrap_or_default(),
                event_id: id.clone(),
                layout: 0,
                at: Time::ZERO,
            })
            .collect();
        let verdict = check(&history_of(&c, &enqueued, &arrivals).await);
        assert!(verdict.is_ok(), "{verdict}");
        eprintln!(
            "failover: primary stopped after {} of {ROUNDS} rounds and {} deliveries; {} events \
             delivered, {} deliveries, {} duplicates, none reordered",
            stopped_at.0,
            stopped_at.1,
            verdict.events,
            verdict.deliveries,
            verdict.count(Kind::Duplicate)
        );
    });
}
