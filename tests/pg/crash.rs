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

/// Drains 12 keys × 40 events with `workers` worker processes, calls `disrupt` once 120 have
/// arrived, lets `after` more workers finish the queue, and judges the history.
fn mid_drain(
    test: &str,
    workers: &[&str],
    after: &[&str],
    disrupt: impl FnOnce(&PgServer, &mut [Child]),
) {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db(test);
    #[allow(clippy::disallowed_methods)]
    let endpoint = Endpoint::start(Instant::now());
    endpoint.shared.lock().unwrap().latency = Duration::from_millis(2);
    block_on(async {
        let mut c = migrated(&url).await;
        let keys: Vec<String> = (0..12).map(|i| format!("sub_{i}")).collect();
        enqueue(&mut c, &events(&keys, 40)).await;
        let enqueued = snapshot(&c).await;
        let mut running: Vec<Child> =
            workers.iter().map(|n| work(&url, &endpoint.url, n)).collect();
        wait_arrivals(&endpoint, 120).await;
        disrupt(&pg, &mut running);
        running.extend(after.iter().map(|n| work(&url, &endpoint.url, n)));
        let c = client(&url).await;
        wait_empty(&c, Duration::from_secs(60)).await;
        for w in &mut running {
            let _ = w.kill();
            let _ = w.wait();
        }
        let verdict = check(&history(&c, &enqueued, &endpoint).await);
        assert!(verdict.is_ok(), "{verdict}");
        eprintln!(
            "{test}: {} events, {} deliveries, {} duplicates",
            verdict.events,
            verdict.deliveries,
            verdict.count(Kind::Duplicate)
        );
    });
}

#[test]
fn kill_9_of_a_worker_mid_drain_loses_nothing() {
    mid_drain("kill_9", &["first"], &["second"], |_, running| {
        running[0].kill().expect("SIGKILL");
        let _ = running[0].wait();
    });
}

#[test]
fn a_postgres_restart_mid_drain_loses_nothing() {
    mid_drain("pg_restart", &["a", "b"], &[], |pg, _| pg.restart_immediate());
}

#[test]
fn sigterm_finishes_in_flight_work_and_releases_every_lease() {
    let Some(pg) = PgServer::start() else { return };
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
        // Every lease it took, it gave back (how many it took by then depends on timing).
        let summary = out
            .1
            .lines()
            .find(|l| l.contains("stopped; leases taken"))
            .unwrap_or_default()
            .to_owned();
        let field = |name: &str| -> Option<u64> {
            let at = summary.find(&format!(" {name}="))? + name.len() + 2;
            summary[at..].split(' ').next()?.parse().ok()
        };
        let numbers: Vec<u64> =
            ["taken", "given_back", "lost"].iter().filter_map(|n| field(n)).collect();
        assert!(
            numbers.len() == 3 && numbers[0] >= 1 && numbers[0] == numbers[1] && numbers[2] == 0,
            "{}",
            out.1
        );
        let logged =
            |what: &str| out.1.lines().any(|l| l.contains(what) && l.contains(" partition=0 "));
        assert!(logged("leased partition") && logged("gave back partition"), "{}", out.1);
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
