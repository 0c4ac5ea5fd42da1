//! Two `keyorder work` processes on one SQLite file. One is stopped (SIGSTOP) past its lease
//! expiry; the other takes its partitions over; then the stopped one continues (SIGCONT). It
//! may send at most the one event per partition it had in flight, acknowledges nothing, and
//! the checker finds no reorder, no concurrent delivery and no loss in what the endpoints saw.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keyorder::check::{check, Acked, DeadLettered, Delivery, Enqueued, History, Kind, Outcome};
use keyorder::{PartitionId, Seq, Time};
use rusqlite::Connection;

use super::cli::TempDir;
use super::endpoint::{Arrival, Endpoint};

pub(super) const DELIVERY_TIMEOUT_MS: &str = "300";
pub(super) const LEASE_EXPIRY_MS: &str = "900";

pub(super) fn work(db: &str, endpoint: &str, name: &str) -> Child {
    work_with(db, endpoint, name, &[])
}

/// [`work`] with extra environment variables.
pub(super) fn work_with(db: &str, endpoint: &str, name: &str, env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .envs(env.iter().copied())
        .args(["work", "--database", db, "--deliver", endpoint, "--name", name])
        .args(["--delivery-timeout-ms", DELIVERY_TIMEOUT_MS, "--lease-expiry-ms", LEASE_EXPIRY_MS])
        .args(["--idle-poll-ms", "20", "--backoff-base-ms", "20", "--backoff-cap-ms", "200"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keyorder work starts")
}

/// Stops `child` (SIGSTOP) at a moment it holds no SQLite write lock, and returns how many stops
/// landed inside one and were undone (SIGCONT) before trying again. A process frozen inside a
/// write transaction keeps the file's write lock, which only its commit or its end releases, so
/// every writer on the file (other workers, producers) waits until it resumes: SQLite's limit,
/// not the lease's (see docs/operations/sqlite.md, "A frozen SQLite worker").
pub(super) fn stop_outside_a_write(child: &Child, file: &Path) -> usize {
    let probe = Connection::open(file).unwrap();
    probe.busy_timeout(Duration::from_millis(300)).unwrap();
    for undone in 0..50 {
        signal(child, "-STOP");
        if probe.execute_batch("BEGIN IMMEDIATE; ROLLBACK").is_ok() {
            return undone;
        }
        signal(child, "-CONT");
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("every one of 50 stops landed inside a write transaction");
}

/// One endpoint per worker, on one clock (`epoch`), each answering after `latency`.
pub(super) fn two_endpoints(epoch: Instant, latency: Duration) -> (Endpoint, Endpoint) {
    let (a, b) = (Endpoint::start(epoch), Endpoint::start(epoch));
    for e in [&a, &b] {
        e.shared.lock().unwrap().latency = latency;
    }
    (a, b)
}

pub(super) fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill").args([sig, &child.id().to_string()]).status().expect("kill");
    assert!(ok.success(), "kill {sig}");
}

/// Lease rows held (unexpired) by the process with `pid`.
pub(super) fn held_by(c: &Connection, pid: u32) -> i64 {
    c.query_row(
        "SELECT count(*) FROM keyorder_lease WHERE holder LIKE ?1 AND boot IS keyorder_boot() AND expires_at > keyorder_clock()",
        [format!("lease:{pid}:%")],
        |r| r.get(0),
    )
    .unwrap()
}

#[allow(clippy::disallowed_methods)] // test deadlines in wall time
pub(super) fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(super) fn history(enqueued: &[Enqueued], arrivals: &[Arrival], c: &Connection) -> History {
    let mut h = History { enqueued: enqueued.to_vec(), ..Default::default() };
    for a in arrivals {
        h.deliveries.push(Delivery {
            event_id: a.event_id.clone(),
            key: a.key.clone(),
            seq: Seq(a.seq),
            partition: PartitionId(a.partition),
            attempt: a.attempt,
            worker: String::new(),
            sent_at: Time(a.at),
            arrived_at: Time(a.at),
            finished_at: Some(Time(a.done)),
            outcome: if a.accepted { Outcome::Accepted } else { Outcome::Rejected("500".into()) },
        });
    }
    let mut acked = std::collections::BTreeSet::new();
    for d in &h.deliveries {
        if d.outcome == Outcome::Accepted && acked.insert(d.seq) {
            h.acks.push(Acked { seq: d.seq, at: d.finished_at.unwrap_or(d.arrived_at) });
        }
    }
    let mut st = c.prepare("SELECT seq, reason FROM delivery_dlq").unwrap();
    for r in st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap() {
        let (seq, reason) = r.unwrap();
        h.dead_letters.push(DeadLettered { seq: Seq(seq), reason, at: Time::ZERO });
    }
    let mut st = c.prepare("SELECT seq FROM delivery_queue").unwrap();
    for r in st.query_map([], |r| r.get(0)).unwrap() {
        h.queued_at_end.push(Seq(r.unwrap()));
    }
    h
}

/// A new file at `file` with 16 partitions and `rounds` events for each of 16 keys, and what
/// was enqueued, as the checker takes it.
pub(super) fn filled_queue(
    file: &Path,
    rounds: usize,
) -> (Connection, Vec<keyorder::key::Event>, Vec<Enqueued>) {
    let mut c = keyorder::store::sqlite::schema::open(
        file,
        keyorder::store::sqlite::schema::OpenMode::Create,
    )
    .unwrap();
    let keys: Vec<String> = (0..16).map(|i| format!("sub_{i}")).collect();
    let mut events = Vec::new();
    for round in 0..rounds {
        for k in &keys {
            events.push(keyorder::key::Event {
                event_id: format!("{k}-{round}"),
                tenant_id: "t".into(),
                subscription_id: k.clone(),
                resource_id: "r".into(),
                payload: serde_json::json!({"round": round}),
            });
        }
    }
    let router = keyorder::Router::new(keyorder::PartitionCount::new(16).unwrap());
    keyorder::store::sqlite::layout::record(&c, router.count()).unwrap();
    keyorder::store::sqlite::queue::enqueue(&mut c, &events).unwrap();
    let enqueued: Vec<Enqueued> = {
        let mut st = c
            .prepare(
                "SELECT seq, partition, partition_key, event_id FROM delivery_queue ORDER BY seq",
            )
            .unwrap();
        st.query_map([], |r| {
            Ok(Enqueued {
                seq: Seq(r.get(0)?),
                partition: PartitionId(r.get(1)?),
                key: r.get(2)?,
                event_id: r.get(3)?,
                layout: 0,
                at: Time::ZERO,
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    };
    (c, events, enqueued)
}

#[test]
#[allow(clippy::disallowed_methods)] // the endpoints' clock is wall time
fn a_stopped_worker_past_its_lease_expiry_delivers_at_most_its_in_flight_event() {
    let dir = TempDir::new("sigstop");
    let file = dir.path("q.db");
    let db = format!("sqlite:{}", file.display());
    let (c, events, enqueued) = filled_queue(&file, 40);
    // One endpoint per worker, on one clock: who delivered what is then known.
    let epoch = Instant::now();
    let (ea, eb) = two_endpoints(epoch, Duration::from_millis(10));
    let mut a = work(&db, &ea.url, "a");
    wait_until("a delivers", Duration::from_secs(20), || ea.arrivals().len() >= 20);
    let mut b = work(&db, &eb.url, "b");
    wait_until("a and b share the partitions", Duration::from_secs(20), || {
        held_by(&c, a.id()) == 8 && held_by(&c, b.id()) == 8
    });
    let undone = stop_outside_a_write(&a, &file);
    let stopped_at = epoch.elapsed();
    // Past a's lease expiry: b takes over every partition and drains the queue.
    wait_until("b takes over all 16 partitions", Duration::from_secs(20), || {
        held_by(&c, b.id()) == 16
    });
    wait_until("b drains the queue", Duration::from_secs(60), || {
        keyorder::store::sqlite::queue::depth(&c).unwrap() == 0
    });
    let continued_at = epoch.elapsed();
    assert!(continued_at - stopped_at > Duration::from_millis(900), "stopped past the expiry");
    signal(&a, "-CONT");
    // Give a time to notice: its renewals and acknowledgements are refused.
    std::thread::sleep(Duration::from_millis(1500));
    for w in [&a, &b] {
        signal(w, "-TERM");
    }
    let a_err = output(&mut a);
    let b_err = output(&mut b);
    assert!(a_err.contains("LOST partition"), "a lost its leases:\n{a_err}");
    assert!(
        a_err.contains("is not held by this session"),
        "a's statements were refused by the fence:\n{a_err}"
    );
    // What a sent after it was stopped: at most one event per partition (its in-flight one).
    let late: Vec<Arrival> = ea.arrivals().into_iter().filter(|x| x.at >= stopped_at).collect();
    let mut per_partition = std::collections::BTreeMap::<u16, usize>::new();
    for x in &late {
        *per_partition.entry(x.partition).or_default() += 1;
    }
    assert!(
        per_partition.values().all(|n| *n <= 1),
        "a sent more than its in-flight events: {late:?}"
    );
    let mut arrivals = ea.arrivals();
    arrivals.extend(eb.arrivals());
    arrivals.sort_by_key(|x| x.at);
    let verdict = check(&history(&enqueued, &arrivals, &c));
    assert!(verdict.is_ok(), "{verdict}\nA:\n{a_err}\nB:\n{b_err}");
    assert_eq!(verdict.count(Kind::Lost), 0);
    assert!(verdict.events as usize == events.len());
    eprintln!(
        "sigstop: {} events, {} deliveries ({} by a after its stop), {} duplicates, {undone} \
         stop(s) inside a write transaction undone",
        verdict.events,
        verdict.deliveries,
        late.len(),
        verdict.count(Kind::Duplicate)
    );
}

pub(super) fn output(child: &mut Child) -> String {
    let _ = child.wait();
    let mut err = String::new();
    if let Some(s) = child.stderr.as_mut() {
        let _ = std::io::Read::read_to_string(s, &mut err);
    }
    err
}
