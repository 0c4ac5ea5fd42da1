//! `kill -9` of a worker process mid-drain, and a PostgreSQL restart mid-drain: afterwards
//! every event is delivered or dead-lettered, per-key order of first deliveries holds, no key
//! is split; duplicates are counted and reported.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keyorder::check::{check, Kind};

use super::endpoint::Endpoint;
use super::harness::PgServer;
use super::util::*;

fn work(url: &str, endpoint: &str, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(["work", "--database", url, "--deliver", endpoint, "--name", name])
        .args([
            "--delivery-timeout-ms",
            "1000",
            "--idle-poll-ms",
            "20",
            "--backoff-base-ms",
            "20",
            "--backoff-cap-ms",
            "200",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("keyorder work starts")
}

async fn wait_arrivals(endpoint: &Endpoint, n: usize) {
    #[allow(clippy::disallowed_methods)]
    let start = Instant::now();
    while endpoint.arrivals().len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "only {} arrivals",
            endpoint.arrivals().len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn kill_9_of_a_worker_mid_drain_loses_nothing() {
    let Some(pg) = PgServer::start("kill_9") else { return };
    let url = pg.create_db("kill9");
    #[allow(clippy::disallowed_methods)]
    let endpoint = Endpoint::start(Instant::now());
    endpoint.shared.lock().unwrap().latency = Duration::from_millis(2);
    block_on(async {
        let mut c = migrated(&url).await;
        let keys: Vec<String> = (0..12).map(|i| format!("sub_{i}")).collect();
        enqueue(&mut c, &events(&keys, 40)).await;
        let enqueued = snapshot(&c).await;
        let mut first = work(&url, &endpoint.url, "first");
        wait_arrivals(&endpoint, 120).await;
        first.kill().expect("SIGKILL");
        let _ = first.wait();
        let mut second = work(&url, &endpoint.url, "second");
        wait_empty(&c, Duration::from_secs(60)).await;
        second.kill().expect("stop");
        let _ = second.wait();
        let verdict = check(&history(&c, &enqueued, &endpoint).await);
        assert!(verdict.is_ok(), "{verdict}");
        eprintln!(
            "kill -9 mid-drain: {} events, {} deliveries, {} duplicates",
            verdict.events,
            verdict.deliveries,
            verdict.count(Kind::Duplicate)
        );
    });
}

#[test]
fn a_postgres_restart_mid_drain_loses_nothing() {
    let Some(pg) = PgServer::start("pg_restart") else { return };
    let url = pg.create_db("restart");
    #[allow(clippy::disallowed_methods)]
    let endpoint = Endpoint::start(Instant::now());
    endpoint.shared.lock().unwrap().latency = Duration::from_millis(2);
    block_on(async {
        let mut c = migrated(&url).await;
        let keys: Vec<String> = (0..12).map(|i| format!("sub_{i}")).collect();
        enqueue(&mut c, &events(&keys, 40)).await;
        let enqueued = snapshot(&c).await;
        let mut a = work(&url, &endpoint.url, "a");
        let mut b = work(&url, &endpoint.url, "b");
        wait_arrivals(&endpoint, 120).await;
        pg.restart_immediate();
        let c = client(&url).await;
        wait_empty(&c, Duration::from_secs(60)).await;
        for w in [&mut a, &mut b] {
            w.kill().expect("stop");
            let _ = w.wait();
        }
        let verdict = check(&history(&c, &enqueued, &endpoint).await);
        assert!(verdict.is_ok(), "{verdict}");
        eprintln!(
            "restart mid-drain: {} events, {} deliveries, {} duplicates",
            verdict.events,
            verdict.deliveries,
            verdict.count(Kind::Duplicate)
        );
    });
}

#[test]
fn sigterm_finishes_in_flight_work_and_releases_every_lease() {
    let Some(pg) = PgServer::start("sigterm") else { return };
    let url = pg.create_db("sigterm");
    #[allow(clippy::disallowed_methods)]
    let endpoint = Endpoint::start(Instant::now());
    endpoint.shared.lock().unwrap().latency = Duration::from_millis(5);
    block_on(async {
        let mut c = migrated(&url).await;
        let keys: Vec<String> = (0..8).map(|i| format!("sub_{i}")).collect();
        enqueue(&mut c, &events(&keys, 40)).await;
        let mut w = Command::new(env!("CARGO_BIN_EXE_keyorder"))
            .args([
                "work",
                "--database",
                &url,
                "--deliver",
                &endpoint.url,
                "--delivery-timeout-ms",
                "1000",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts");
        wait_arrivals(&endpoint, 20).await;
        let term =
            Command::new("kill").args(["-TERM", &w.id().to_string()]).status().expect("kill runs");
        assert!(term.success());
        let out = tokio::task::spawn_blocking(move || {
            let status = w.wait().expect("exits");
            let mut err = String::new();
            std::io::Read::read_to_string(w.stderr.as_mut().expect("piped"), &mut err).unwrap();
            (status, err)
        })
        .await
        .unwrap();
        assert!(out.0.success(), "exit {:?}: {}", out.0, out.1);
        assert!(out.1.contains("stopped; leases taken 16, given back 16, lost 0"), "{}", out.1);
        let held: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 4711",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(held, 0, "every lease was released");
        // Whatever was delivered was acknowledged: no arrival is still queued undelivered twice.
        let queued: i64 =
            c.query_one("SELECT count(*) FROM delivery_queue", &[]).await.unwrap().get(0);
        assert_eq!(
            queued as usize + endpoint.arrivals().len(),
            320,
            "delivered + queued = enqueued, no redelivery"
        );
    });
}
