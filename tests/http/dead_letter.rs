//! Every kind of delivery failure, end to end through the worker and the SQLite store: a
//! clear reason in `last_error`, retried with backoff, and dead-lettered after exactly
//! `max_attempts` with that reason.

use std::path::PathBuf;
use std::time::Duration;

use keyorder::clock::TokioClock;
use keyorder::http::HttpOptions;
use keyorder::key::Event;
use keyorder::retry::RetryPolicy;
use keyorder::store::sqlite::{self, schema::OpenMode, SqliteOptions, SqliteStore};
use keyorder::worker::{self, WorkerConfig};
use keyorder::PartitionCount;

use super::server::{deliverer, hyper_server, raw, Canned, Counts};
use super::tls::https_server;

const ATTEMPTS: u32 = 3;
const DELIVERY_TIMEOUT: Duration = Duration::from_millis(400);

struct TempDb(PathBuf);

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().expect("in a folder"));
    }
}

fn temp_db(name: &str) -> TempDb {
    let dir = std::env::temp_dir().join(format!("keyorder-dlq-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDb(dir.join("q.db"))
}

/// One event delivered to `url` until it is dead-lettered: returns the dead-letter row's
/// attempts and reason, and the last_error seen while it was still queued.
async fn dead_letter_of(name: &str, url: &str, options: HttpOptions) -> (i16, String, Vec<String>) {
    let db = temp_db(name);
    let count = PartitionCount::new(4).unwrap();
    let mut c = sqlite::schema::open(&db.0, OpenMode::Create).unwrap();
    let event = Event {
        event_id: format!("evt-{name}"),
        tenant_id: String::new(),
        subscription_id: "sub_1".into(),
        resource_id: String::new(),
        payload: serde_json::json!({"case": name}),
    };
    sqlite::layout::record(&c, count).unwrap();
    sqlite::queue::enqueue(&mut c, &[event]).unwrap();
    let store = SqliteStore::new(
        &db.0,
        count,
        SqliteOptions::for_delivery_timeout(DELIVERY_TIMEOUT),
        TokioClock::start(),
    )
    .unwrap();
    let mut config = WorkerConfig::new(format!("w-{name}"));
    config.retry =
        RetryPolicy::new(ATTEMPTS, Duration::from_millis(20), Duration::from_millis(80)).unwrap();
    config.delivery_timeout = DELIVERY_TIMEOUT;
    config.idle_poll = Duration::from_millis(10);
    config.rebalance_every = Duration::from_millis(50);
    let poll = rusqlite::Connection::open(&db.0).unwrap();
    let mut errors = Vec::new();
    let local = tokio::task::LocalSet::new();
    let dead = local
        .run_until(async {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let work = tokio::task::spawn_local(worker::run(
                store,
                deliverer(url, options),
                TokioClock::start(),
                config,
                async {
                    let _ = rx.await;
                },
            ));
            let mut dead = None;
            for _ in 0..1500 {
                if let Ok(Some(e)) =
                    poll.query_row("SELECT last_error FROM delivery_queue", [], |r| {
                        r.get::<_, Option<String>>(0)
                    })
                {
                    if errors.last() != Some(&e) {
                        errors.push(e);
                    }
                }
                let rows = sqlite::queue::dead_letters(&poll, None, 10).unwrap();
                if !rows.is_empty() {
                    dead = Some(rows);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let _ = tx.send(());
            work.await.unwrap();
            dead.expect("dead-lettered within 15 s")
        })
        .await;
    assert_eq!(dead.len(), 1, "one event, one dead letter");
    let depth: i64 =
        poll.query_row("SELECT count(*) FROM delivery_queue", [], |r| r.get(0)).unwrap();
    assert_eq!(depth, 0, "the row left the queue with its move to the dead-letter table");
    (dead[0].attempts, dead[0].reason.clone(), errors)
}

/// The dead letter names `reason`, after exactly ATTEMPTS attempts; the queued row showed it
/// too; a server saw every attempt.
async fn check(name: &str, url: String, reason: &str, counts: Option<Counts>) {
    check_with(name, url, reason, counts, HttpOptions::default()).await
}

async fn check_with(
    name: &str,
    url: String,
    reason: &str,
    counts: Option<Counts>,
    options: HttpOptions,
) {
    let (attempts, dead_reason, errors) = dead_letter_of(name, &url, options).await;
    assert_eq!(attempts, ATTEMPTS as i16, "{name}: dead-lettered after max_attempts");
    assert!(
        dead_reason.contains(reason),
        "{name}: dead-letter reason {dead_reason:?} lacks {reason:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains(reason)),
        "{name}: last_error never said {reason:?} while queued: {errors:?}"
    );
    if let Some(counts) = counts {
        assert_eq!(
            counts.requests(),
            ATTEMPTS as usize,
            "{name}: every attempt reached the server"
        );
    }
}

#[tokio::test]
async fn a_redirect_is_dead_lettered_with_its_location() {
    let reply = "HTTP/1.1 308 Permanent Redirect\r\nLocation: https://new.example/hook\r\nContent-Length: 0\r\n\r\n";
    let (addr, counts) = raw(vec![Canned::new(reply, false)]).await;
    check(
        "redirect",
        format!("http://{addr}/hook"),
        "redirect to https://new.example/hook",
        Some(counts),
    )
    .await;
}

#[tokio::test]
async fn a_client_error_is_dead_lettered_with_its_status() {
    let (addr, counts, _) = hyper_server(|_| (404, vec![])).await;
    check("client-error", format!("http://{addr}/hook"), "HTTP 404", Some(counts)).await;
}

#[tokio::test]
async fn a_server_error_is_dead_lettered_with_its_status() {
    let (addr, counts, _) = hyper_server(|_| (503, vec![])).await;
    check("server-error", format!("http://{addr}/hook"), "HTTP 503", Some(counts)).await;
}

#[tokio::test]
async fn a_reply_that_never_ends_is_dead_lettered_as_timed_out() {
    let reply = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nnot all of it";
    let (addr, counts) = raw(vec![Canned::new(reply, false)]).await;
    check("never-ends", format!("http://{addr}/hook"), "timed out", Some(counts)).await;
}

#[tokio::test]
async fn a_reply_over_the_limit_is_dead_lettered() {
    let body = "x".repeat(4096);
    let reply = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    let (addr, counts) = raw(vec![Canned::new(reply, false)]).await;
    let options = HttpOptions { max_reply: 1024, ..HttpOptions::default() };
    check_with("too-large", format!("http://{addr}/hook"), "larger than", Some(counts), options)
        .await;
}

#[tokio::test]
async fn an_unreachable_host_is_dead_lettered_naming_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    check("unreachable", format!("http://{addr}/hook"), &format!("cannot connect to {addr}"), None)
        .await;
}

#[tokio::test]
async fn a_certificate_from_an_unknown_ca_is_dead_lettered_as_a_tls_failure() {
    let (addr, counts) = https_server().await;
    check(
        "bad-certificate",
        format!("https://localhost:{}/hook", addr.port()),
        "invalid peer certificate",
        None,
    )
    .await;
    assert_eq!(counts.requests(), 0, "no request crosses a failed handshake");
}
