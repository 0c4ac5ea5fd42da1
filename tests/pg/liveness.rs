//! Production enforces the session liveness bound the simulation assumes (issue #19), shown on
//! real processes with scaled-down timings: delivery timeout 300 ms, request timeout 500 ms,
//! session timeout 2 s (request timeouts this short, on a busy 2-core machine, are what the
//! slack is for).
//!
//! * A worker holding half the partitions is frozen (SIGSTOP) while events keep coming: the
//!   server ends its silent sessions after the bound, the other worker takes its partitions and
//!   delivers on every one of them within bound + delivery timeout + slack; after SIGCONT the
//!   frozen one sent at most the event it had in flight per partition, acknowledged none of
//!   them, and the checker finds no reorder, no concurrent delivery, nothing lost.
//! * The same with the network cut by a blackholing TCP proxy (it stops forwarding and keeps
//!   both sockets open): the cut-off worker logs its loss. Still running, it may also send rows
//!   it read ahead, for up to the store's `ack_delay` (50 ms) after the server last answered
//!   (the takeover wait covers them): every send after the cut starts within that (plus
//!   scheduling slack), and none is acknowledged.
//! * A healthy worker whose endpoint answers just inside the delivery timeout, with heads in a
//!   backoff far longer than the bound and idle polls longer than it, keeps every lease for
//!   two minutes (forty bounds).
//!
//! `KEYORDER_LIVENESS_DEFAULTS=1` runs the frozen-worker and the blackholed-worker tests with
//! the production defaults (delivery timeout 10 s, session timeout 30 s) and prints the resume
//! times: the figures of docs/measurements/session-liveness.md.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use keyorder::check::{check, Enqueued, History, Kind};
use keyorder::store::postgres::schema::LEASE_NAMESPACE;
use keyorder::{PartitionId, Seq, Time};

use super::endpoint::{Arrival, Endpoint};
use super::harness::PgServer;
use super::util::*;

/// The test's runtime: one that outlives each call, so a client's connection task made in one
/// `block_on` still runs in the next.
/// A current-thread runtime driven on a thread of its own; calls block on its handle.
fn rt() -> &'static tokio::runtime::Handle {
    static RT: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            tx.send(rt.handle().clone()).unwrap();
            rt.block_on(std::future::pending::<()>());
        });
        rx.recv().unwrap()
    })
}

/// The scaled-down timings, in ms, and the flags that set them.
struct Timings {
    delivery_ms: u64,
    session_ms: u64,
    flags: Vec<String>,
}

impl Timings {
    fn scaled() -> Self {
        let flags = [
            "--delivery-timeout-ms",
            "300",
            "--request-timeout-ms",
            "500",
            "--session-timeout-ms",
            "2000",
            "--idle-poll-ms",
            "20",
            "--backoff-base-ms",
            "20",
            "--backoff-cap-ms",
            "200",
        ];
        Timings { delivery_ms: 300, session_ms: 2000, flags: flags.map(String::from).to_vec() }
    }

    /// The production defaults (nothing but a short idle poll, which makes no session quieter).
    fn defaults() -> Self {
        let flags = ["--idle-poll-ms", "20"];
        Timings { delivery_ms: 10_000, session_ms: 30_000, flags: flags.map(String::from).to_vec() }
    }
}

/// A `keyorder work` process whose stderr is collected as it comes (so it never blocks).
struct Worker {
    child: Child,
    err: Arc<Mutex<String>>,
}

impl Worker {
    fn start(url: &str, endpoint: &str, name: &str, extra: &[String]) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keyorder"))
            .args(["work", "--database", url, "--deliver", endpoint, "--name", name])
            .args(["--threads", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("keyorder work starts");
        let err = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("piped");
        let sink = err.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Worker { child, err }
    }

    fn signal(&self, sig: &str) {
        let ok =
            Command::new("kill").args([sig, &self.child.id().to_string()]).status().expect("kill");
        assert!(ok.success(), "kill {sig}");
    }

    /// Stops the process (SIGTERM) and returns everything it wrote on stderr.
    fn stop(mut self) -> String {
        self.signal("-TERM");
        let _ = self.child.wait();
        std::thread::sleep(Duration::from_millis(100));
        let text = self.err.lock().unwrap().clone();
        text
    }
}

/// `url` with the sessions named `name` in `pg_stat_activity`, so the test can tell whose
/// leases are whose.
fn named(url: &str, name: &str) -> String {
    format!("{url}?application_name={name}")
}

#[allow(clippy::disallowed_methods)] // test deadlines in wall time
fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The partitions whose lease locks sessions named `name` hold.
async fn held_by(c: &tokio_postgres::Client, name: &str) -> BTreeSet<u16> {
    c.query(
        "SELECT l.objid::int4 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.classid = $1::int::oid AND l.objsubid = 2
           AND l.granted AND a.application_name = $2",
        &[&LEASE_NAMESPACE, &name],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<_, i32>(0) as u16)
    .collect()
}

/// Migrates the database and logs every row ever enqueued (a trigger), so the checker can
/// tell a lost event from one that was never there.
async fn prepared(url: &str) -> tokio_postgres::Client {
    let c = migrated(url).await;
    c.batch_execute(
        "CREATE TABLE test_enqueued (seq bigint, partition int2, partition_key text, event_id text);
         CREATE FUNCTION test_log() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO test_enqueued VALUES (NEW.seq, NEW.partition, NEW.partition_key, NEW.event_id);
           RETURN NEW;
         END $$;
         CREATE TRIGGER test_log AFTER INSERT ON delivery_queue
           FOR EACH ROW EXECUTE FUNCTION test_log();",
    )
    .await
    .unwrap();
    c
}

/// Enqueues one event per key every 50 ms until `stop` is set, on its own thread.
fn producer(url: String, keys: Vec<String>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        block_on(async {
            let mut c = client(&url).await;
            for round in 1000.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                enqueue(&mut c, &events_of(&keys, round)).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    })
}

/// One event per key, of `round`.
fn events_of(keys: &[String], round: usize) -> Vec<keyorder::key::Event> {
    keys.iter()
        .map(|k| keyorder::key::Event {
            event_id: format!("{k}-{round}"),
            tenant_id: "t".into(),
            subscription_id: k.clone(),
            resource_id: "r".into(),
            payload: serde_json::json!({ "round": round }),
        })
        .collect()
}

/// The checker's history: every row ever enqueued, what both endpoints saw, the DLQ and what
/// is still queued.
async fn history(c: &tokio_postgres::Client, arrivals: &[Arrival]) -> History {
    let mut enqueued = Vec::new();
    for r in c
        .query(
            "SELECT seq, partition, partition_key, event_id FROM test_enqueued ORDER BY seq",
            &[],
        )
        .await
        .unwrap()
    {
        enqueued.push(Enqueued {
            seq: Seq(r.get(0)),
            partition: PartitionId(r.get::<_, i16>(1) as u16),
            key: r.get(2),
            event_id: r.get(3),
            layout: 0,
            at: Time::ZERO,
        });
    }
    history_of(c, &enqueued, arrivals).await
}

/// A loopback TCP proxy to PostgreSQL that, once cut, forwards nothing more in either direction
/// and keeps every socket open (a blackhole, not a reset); connections opened after the cut are
/// accepted and then ignored.
struct Blackhole {
    port: u16,
    /// Set once cut. A forwarder holds the read lock from its check to the end of its write,
    /// so once `cut` has taken the write lock, no byte goes through: a worker cannot
    /// acknowledge anything after `cut` returns, however the threads are scheduled.
    cut: Arc<RwLock<bool>>,
}

impl Blackhole {
    fn start(upstream: u16) -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(RwLock::new(false));
        let flag = cut.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if *flag.read().unwrap_or_else(|e| e.into_inner()) {
                    held.push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
                    let flag = flag.clone();
                    std::thread::spawn(move || forward(from, to, &flag));
                }
            }
        });
        Blackhole { port, cut }
    }

    fn cut(&self) {
        *self.cut.write().unwrap_or_else(|e| e.into_inner()) = true;
    }
}

/// Copies `from` to `to` until either closes or the proxy is cut; then holds both open forever.
fn forward(mut from: TcpStream, mut to: TcpStream, cut: &RwLock<bool>) {
    from.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut buf = [0u8; 16 * 1024];
    let is_cut = || *cut.read().unwrap_or_else(|e| e.into_inner());
    loop {
        if is_cut() {
            // Stop reading and writing, keep the sockets: nothing answers, nothing resets.
            let _keep = (from, to);
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            Ok(n) => {
                let gate = cut.read().unwrap_or_else(|e| e.into_inner());
                if *gate {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
                drop(gate);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// How worker `a` is taken away while it holds half the partitions.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// SIGSTOP, later SIGCONT.
    Freeze,
    /// Its connections to the server go through a proxy that is then cut.
    Blackhole,
}

/// Two workers share 16 partitions; `a` is taken away by `fault` while events keep coming.
/// Returns how long after the fault `b` had delivered on every partition `a` held.
#[allow(clippy::disallowed_methods)] // the endpoints' clock is wall time
fn worker_taken_away(test: &str, fault: Fault, timings: Timings) -> Option<Duration> {
    let pg = PgServer::start()?;
    let url = pg.create_db(test);
    let keys = covering_keys();
    let c = rt().block_on(async {
        let mut c = prepared(&url).await;
        enqueue(&mut c, &events(&keys, 10)).await;
        c
    });
    let epoch = Instant::now();
    // One endpoint per worker, on one clock: who delivered what is then known.
    let (ea, eb) = (Endpoint::start(epoch), Endpoint::start(epoch));
    for e in [&ea, &eb] {
        e.shared.lock().unwrap().latency = Duration::from_millis(10);
    }
    let proxy = Blackhole::start(pg.port);
    let a_url = match fault {
        Fault::Freeze => named(&url, "a"),
        Fault::Blackhole => named(&pg_url_via(&url, pg.port, proxy.port), "a"),
    };
    let a = Worker::start(&a_url, &ea.url, "a", &timings.flags);
    wait_until("a delivers", Duration::from_secs(30), || ea.arrivals().len() >= 20);
    let b = Worker::start(&named(&url, "b"), &eb.url, "b", &timings.flags);
    let mut a_parts = BTreeSet::new();
    wait_until("a and b hold 8 partitions each", Duration::from_secs(30), || {
        a_parts = rt().block_on(held_by(&c, "a"));
        a_parts.len() == 8 && rt().block_on(held_by(&c, "b")).len() == 8
    });
    let stop = Arc::new(AtomicBool::new(false));
    let producing = producer(url.clone(), keys.clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    // Resume times count from before the fault (an upper bound); what a may still do is judged
    // from after it (once `kill` returned, a is stopped): in between it may have finished a
    // delivery and acknowledged it, as any healthy worker.
    let faulted_at = epoch.elapsed();
    match fault {
        Fault::Freeze => a.signal("-STOP"),
        Fault::Blackhole => proxy.cut(),
    }
    let taken_away_at = epoch.elapsed();
    // The bound, the takeover wait after an unclean loss (a delivery timeout and the read-ahead
    // margin), and the slack: b's rebalance period (1 s), the server's timer granularity and a
    // busy machine.
    let slack = Duration::from_millis(2_500);
    let limit = Duration::from_millis(timings.session_ms + timings.delivery_ms) + slack;
    let mut resumed = BTreeMap::new();
    wait_until("b delivers on every partition a held", limit + Duration::from_secs(30), || {
        for x in eb.arrivals().iter().filter(|x| x.at >= faulted_at) {
            if a_parts.contains(&x.partition) {
                resumed.entry(x.partition).or_insert(x.at - faulted_at);
            }
        }
        resumed.len() == a_parts.len()
    });
    let resume = resumed.values().copied().max().unwrap_or_default();
    eprintln!("{test}: a held {a_parts:?}; b delivered on all of them {resume:?} after the fault (limit {limit:?})");
    assert!(resume <= limit, "{resume:?} > {limit:?}: {resumed:?}");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    producing.join().unwrap();
    rt().block_on(wait_empty(&c, Duration::from_secs(120)));
    if fault == Fault::Freeze {
        a.signal("-CONT");
    }
    // Time for a to notice: its sessions are gone.
    std::thread::sleep(Duration::from_millis(1_500));
    let (a_err, b_err) = (a.stop(), b.stop());
    let said = |err: &str, who: &str, what: &str| {
        err.lines().any(|l| l.contains(what) && l.contains(&format!("worker=\"{who}\"")))
    };
    assert!(said(&a_err, "a", "LOST partition"), "a lost its leases:\n{a_err}");
    if fault == Fault::Blackhole {
        assert!(a_err.contains("did not answer"), "a's calls timed out:\n{a_err}");
    }
    assert!(said(&b_err, "b", "leased partition"), "{b_err}");
    judge(fault, &c, &ea, &eb, taken_away_at, &a_err, &b_err);
    Some(resume)
}

/// Two keys on each of the 16 partitions, so every partition has events to deliver.
fn covering_keys() -> Vec<String> {
    let router = keyorder::Router::new(count());
    let mut per = BTreeMap::<u16, usize>::new();
    let mut keys = Vec::new();
    for i in 0.. {
        let key = format!("sub_{i}");
        let n = per.entry(router.route(&key).0).or_default();
        if *n < 2 {
            *n += 1;
            keys.push(key);
        }
        if keys.len() == 2 * PARTITIONS as usize {
            break;
        }
    }
    keys
}

/// The URL `url` with the server's port replaced by the proxy's.
fn pg_url_via(url: &str, server: u16, proxy: u16) -> String {
    url.replace(&format!(":{server}/"), &format!(":{proxy}/"))
}

/// What a sent after the fault: frozen, at most one event per partition (the one in flight);
/// cut off, only what it started within the read-ahead window; each redelivered by b afterwards
/// (a acknowledged none of them); and the checker's verdict.
fn judge(
    fault: Fault,
    c: &tokio_postgres::Client,
    ea: &Endpoint,
    eb: &Endpoint,
    faulted_at: Duration,
    a_err: &str,
    b_err: &str,
) {
    let late: Vec<Arrival> = ea.arrivals().into_iter().filter(|x| x.at >= faulted_at).collect();
    match fault {
        Fault::Freeze => {
            let mut per_partition = BTreeMap::<u16, usize>::new();
            for x in &late {
                *per_partition.entry(x.partition).or_default() += 1;
            }
            assert!(
                per_partition.values().all(|n| *n <= 1),
                "a sent more than its in-flight events: {late:?}"
            );
        }
        Fault::Blackhole => {
            // Read-ahead rows are served up to 50 ms after the last answer; 250 ms of slack.
            let horizon = faulted_at + Duration::from_millis(300);
            assert!(
                late.iter().all(|x| x.at <= horizon),
                "a kept delivering after the cut: {late:?}"
            );
        }
    }
    let b_after: BTreeSet<i64> =
        eb.arrivals().iter().filter(|x| x.at >= faulted_at).map(|x| x.seq).collect();
    for x in ea.arrivals().iter().filter(|x| x.done >= faulted_at) {
        assert!(
            b_after.contains(&x.seq),
            "a's in-flight seq {} was not redelivered by b: acknowledged?",
            x.seq
        );
    }
    let mut arrivals = ea.arrivals();
    arrivals.extend(eb.arrivals());
    arrivals.sort_by_key(|x| x.at);
    let verdict = check(&rt().block_on(history(c, &arrivals)));
    assert!(verdict.is_ok(), "{verdict}\nA:\n{a_err}\nB:\n{b_err}");
    assert_eq!(verdict.count(Kind::Lost), 0);
    eprintln!(
        "{} events, {} deliveries ({} by a after the fault), {} duplicates",
        verdict.events,
        verdict.deliveries,
        late.len(),
        verdict.count(Kind::Duplicate)
    );
}

#[test]
fn a_frozen_workers_partitions_move_within_the_bound() {
    let defaults = std::env::var("KEYORDER_LIVENESS_DEFAULTS").is_ok_and(|v| v == "1");
    let timings = if defaults { Timings::defaults() } else { Timings::scaled() };
    worker_taken_away("liveness_sigstop", Fault::Freeze, timings);
}

#[test]
fn a_blackholed_workers_partitions_move_within_the_bound_and_it_logs_its_loss() {
    let defaults = std::env::var("KEYORDER_LIVENESS_DEFAULTS").is_ok_and(|v| v == "1");
    let timings = if defaults { Timings::defaults() } else { Timings::scaled() };
    worker_taken_away("liveness_blackhole", Fault::Blackhole, timings);
}

#[test]
#[allow(clippy::disallowed_methods)] // wall-time deadlines
fn a_healthy_worker_keeps_its_leases_for_many_bounds() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("liveness_healthy");
    let keys: Vec<String> = (0..32).map(|i| format!("sub_{i}")).collect();
    let c = rt().block_on(async {
        let mut c = migrated(&url).await;
        enqueue(&mut c, &events(&keys, 3)).await;
        c
    });
    let e = Endpoint::start(Instant::now());
    {
        let mut s = e.shared.lock().unwrap();
        // Just inside the 1 s delivery timeout.
        s.latency = Duration::from_millis(850);
        // Every third key's events fail: their heads wait in a backoff of 5 to 20 s.
        for k in keys.iter().step_by(3) {
            for round in 0..3 {
                s.poison.insert(format!("{k}-{round}"));
            }
        }
    }
    let flags = [
        "--delivery-timeout-ms",
        "1000",
        "--request-timeout-ms",
        "1000",
        "--session-timeout-ms",
        "3000",
        "--idle-poll-ms",
        "5000",
        "--backoff-base-ms",
        "5000",
        "--backoff-cap-ms",
        "20000",
        "--max-attempts",
        "100",
    ]
    .map(String::from);
    let w = Worker::start(&named(&url, "c"), &e.url, "c", &flags);
    wait_until("c holds every partition", Duration::from_secs(30), || {
        rt().block_on(held_by(&c, "c")).len() == 16
    });
    let epochs = || -> Vec<i64> {
        rt().block_on(async {
            c.query("SELECT epoch FROM keyorder_handover ORDER BY partition", &[]).await.unwrap()
        })
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    // Each lease's epoch row is written just after its lock is granted.
    wait_until("every lease has its epoch", Duration::from_secs(10), || epochs().len() == 16);
    let first = epochs();
    // Two minutes, forty bounds (KEYORDER_LIVENESS_HEALTHY_SECS to change it): idle
    // partitions poll every 5 s, failing heads back off up to 20 s, every delivery takes
    // 850 ms; only the keep-alive keeps the quiet sessions heard.
    let hold = std::env::var("KEYORDER_LIVENESS_HEALTHY_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(120), Duration::from_secs);
    let start = Instant::now();
    while start.elapsed() < hold {
        let held = rt().block_on(held_by(&c, "c"));
        assert_eq!(held.len(), 16, "a lease was lost after {:?}", start.elapsed());
        std::thread::sleep(Duration::from_millis(250));
    }
    let (last, err) = (epochs(), w.stop());
    assert!(!err.contains("LOST"), "{err}");
    assert_eq!(last, first, "no lease was taken anew:\n{err}");
    assert!(e.arrivals().iter().any(|a| !a.accepted), "some heads failed and backed off");
}

#[test]
fn a_session_bound_that_does_not_cover_a_delivery_is_refused_at_start() {
    // Refused before anything connects: the address is never used.
    let out = Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(["work", "--database", "postgres://postgres@127.0.0.1:1/none"])
        .args(["--deliver", "http://127.0.0.1:1/hook", "--delivery-timeout-ms", "1000"])
        .args(["--session-timeout-ms", "1200"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--session-timeout-ms") && err.contains("must exceed the delivery timeout"),
        "{err}"
    );
}
