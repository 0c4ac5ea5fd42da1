//! `keyorder work --metrics-addr` on a SQLite file: `/metrics` during a drain agrees with the
//! store (depth per partition, oldest wait, parked keys) and with the receiver, and `/healthz`
//! answers 200 once a partition is leased. (SQLite has no "store down" to test: the file is
//! opened in process; tests/pg covers the 503 when its server stops.)

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::cli::{events_file, keyorder, TempDir};
use super::endpoint::Endpoint;

/// GET `path` from 127.0.0.1:`port`: (status, body), or `None` while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// `name{partition="P"} V` samples of `body`, by partition.
fn by_partition(body: &str, name: &str) -> BTreeMap<i64, f64> {
    series(body, name).into_iter().collect()
}

/// The series of `name`, in the order /metrics lists them.
fn series(body: &str, name: &str) -> Vec<(i64, f64)> {
    let prefix = format!("{name}{{partition=\"");
    body.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (p, v) = rest.split_once("\"} ")?;
            Some((p.parse().ok()?, v.trim().parse().ok()?))
        })
        .collect()
}

/// `figure` (an aggregate over `delivery_queue`) per partition, straight from the file.
fn per_partition(c: &Connection, figure: &str) -> BTreeMap<i64, f64> {
    c.prepare(&format!("SELECT partition, {figure} FROM delivery_queue GROUP BY 1"))
        .unwrap()
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? as f64)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[allow(clippy::disallowed_methods)] // a real-time test of a real process
fn metrics_during_a_drain_agree_with_the_store_and_the_receiver() {
    let dir = TempDir::new("metrics");
    let n = 40;
    events_file(&dir.0, n);
    let enqueued = Instant::now();
    assert!(keyorder(&dir.0, &["enqueue", "events.jsonl"]).status.success());
    let endpoint = Endpoint::start(Instant::now());
    // Every event fails at first: the queue holds still while it is compared with the store.
    endpoint.shared.lock().unwrap().poison = (0..n).map(|i| format!("e{i}")).collect();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let worker = Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(["work", "--deliver", &endpoint.url, "--threads", "1", "--metrics-addr", &addr])
        .args(["--max-attempts", "1000", "--backoff-base-ms", "100", "--backoff-cap-ms", "200"])
        .args(["--stop-after", "60"])
        .current_dir(&dir.0)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("keyorder work starts");
    let _worker = Kill(worker);
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(port, "/healthz").map(|(s, _)| s) != Some(200) {
        assert!(Instant::now() < deadline, "/healthz never answered 200");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Past the 1 s refresh, then wait for the head attempts to show failures.
    std::thread::sleep(Duration::from_millis(1200));
    let (status, body) = get(port, "/metrics").expect("scrape");
    assert_eq!(status, 200);
    let c = Connection::open(dir.path("keyorder.db")).unwrap();
    let store = per_partition(&c, "count(*)");
    assert_eq!(store.values().sum::<f64>(), n as f64, "nothing delivered yet");
    // Every partition of the layout, in order, 0 when empty: 16 series of each figure.
    let every: Vec<i64> = (0..16).collect();
    for family in ["keyorder_partition_depth", "keyorder_partition_oldest_wait_seconds"] {
        let listed: Vec<i64> = series(&body, family).into_iter().map(|(p, _)| p).collect();
        assert_eq!(listed, every, "{family}: {body}");
    }
    let depth = by_partition(&body, "keyorder_partition_depth");
    let held: BTreeMap<i64, f64> =
        depth.iter().filter(|(_, d)| **d > 0.0).map(|(p, d)| (*p, *d)).collect();
    assert_eq!(held, store, "{body}");
    let age = enqueued.elapsed().as_secs_f64();
    for (p, wait) in by_partition(&body, "keyorder_partition_oldest_wait_seconds") {
        if !store.contains_key(&p) {
            assert_eq!(wait, 0.0, "partition {p} is empty: {body}");
            continue;
        }
        assert!(
            wait > 0.5 && wait <= age + 1.0,
            "partition {p}: oldest wait {wait} s, queued {age} s ago"
        );
    }
    assert!(body.contains("keyorder_worker_leases_acquired_total{worker=\"worker\"} 16"), "{body}");
    assert!(body.contains("keyorder_worker_leases_held{worker=\"worker\"} 16"), "{body}");
    // Every head fails, so failing keys are parked while their partition tries the next key:
    // the gauge shows them, never more than the keys a partition has queued.
    let keys = per_partition(&c, "count(DISTINCT partition_key)");
    let listed = by_partition(&body, "keyorder_partition_keys");
    assert_eq!(listed.into_iter().filter(|(_, k)| *k > 0.0).collect::<BTreeMap<_, _>>(), keys);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = get(port, "/metrics").expect("scrape");
        let parked = by_partition(&body, "keyorder_partition_parked_keys");
        let parked: BTreeMap<i64, f64> = parked.into_iter().filter(|(_, n)| *n > 0.0).collect();
        for (p, n) in &parked {
            assert!(*n <= keys[p], "partition {p}: {n} parked of {} keys", keys[p]);
        }
        if !parked.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "no parked key shown while every head fails: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Now let them through: the drain empties every partition's series.
    endpoint.shared.lock().unwrap().poison.clear();
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        std::thread::sleep(Duration::from_millis(1100));
        let (_, body) = get(port, "/metrics").expect("scrape");
        if by_partition(&body, "keyorder_partition_depth").values().all(|d| *d == 0.0) {
            break body;
        }
        assert!(Instant::now() < deadline, "not drained: {body}");
    };
    let arrivals = endpoint.shared.lock().unwrap().arrivals.clone();
    let accepted: std::collections::BTreeSet<String> =
        arrivals.iter().filter(|a| a.accepted).map(|a| a.event_id.clone()).collect();
    assert_eq!(accepted.len(), n, "the receiver accepted every event once the store shows none");
    let refused = arrivals.iter().filter(|a| !a.accepted).count();
    let count = |outcome: &str| -> usize {
        let prefix =
            format!("keyorder_worker_deliveries_total{{worker=\"worker\",outcome=\"{outcome}\"}} ");
        body.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |v| v.trim().parse().unwrap())
    };
    assert_eq!(count("accepted"), n, "{body}");
    assert_eq!(count("retried"), refused, "each 500 the receiver sent is one retry: {body}");
    assert_eq!(count("dead_lettered"), 0, "{body}");
    assert!(body.contains("keyorder_worker_delivery_seconds_count{worker=\"worker\"}"), "{body}");
    let parked = by_partition(&body, "keyorder_partition_parked_keys");
    assert!(parked.values().all(|n| *n == 0.0), "none parked once drained: {body}");
}

#[test]
fn a_metrics_address_that_cannot_be_bound_is_bad_input() {
    let dir = TempDir::new("metrics-bad-addr");
    let out = keyorder(
        &dir.0,
        &[
            "work",
            "--deliver",
            "http://127.0.0.1:9/",
            "--metrics-addr",
            "nonsense",
            "--stop-after",
            "1",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--metrics-addr nonsense: cannot listen there"), "{err}");
}
