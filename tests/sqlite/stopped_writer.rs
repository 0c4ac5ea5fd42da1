//! A real process stopped (SIGSTOP) inside a SQLite write transaction holds the file's write
//! lock until it resumes or ends, and no lease can bound that (docs/operations/sqlite.md, "A
//! frozen SQLite worker"). What keyorder can do is say so: a write that gives up after the busy
//! timeout names the stopped process and what to do about it, instead of SQLite's bare
//! "database is locked": `keyorder enqueue` fails with it, and a running `keyorder work` logs it.
//!
//! Every wait here waits for what it checks, with a deadline of [`DEADLINE`]: a loaded machine
//! makes the test slower, not wrong.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use rusqlite::Connection;

use super::cli::{events_file, keyorder, TempDir};

/// How long any one wait of this test may take: far above what it takes on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(90);

/// The environment variable that turns [`hold_the_write_lock`] from a no-op into the helper.
const HOLD: &str = "KEYORDER_TEST_HOLD_WRITE_LOCK";

/// Runs this test binary's [`hold_the_write_lock`] as a separate process holding the write lock
/// of `db`, and returns it once it holds it.
fn lock_holder(db: &std::path::Path) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "stopped_writer::hold_the_write_lock", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(HOLD, db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the helper starts");
    let stdout = lines(child.stdout.take().expect("piped"));
    let holding = wait_for(&stdout, |l| l.ends_with("holding"));
    assert!(holding.is_some(), "the helper never took the write lock");
    child
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill").args([sig, &child.id().to_string()]).status().expect("kill");
    assert!(ok.success(), "kill {sig} {}", child.id());
}

#[test]
#[allow(clippy::disallowed_methods)] // a real-time test of real processes
fn a_write_behind_a_stopped_writer_names_it_and_what_to_do() {
    let dir = TempDir::new("stopped-writer");
    events_file(&dir.0, 5);
    let first = keyorder(&dir.0, &["enqueue", "events.jsonl"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let db = dir.path("keyorder.db");

    // A running worker, then a writer that takes the lock and is stopped inside its write.
    let (mut work, log) = work(&dir.0);
    let leased = wait_for(&log, |l| l.contains("leased partition"));
    assert!(leased.is_some(), "keyorder work never leased a partition");
    let mut holder = lock_holder(&db);
    signal(&holder, "-STOP");
    let pid = holder.id();
    // The delivery path's own statements (not the worker's periodic reload of the endpoint
    // table, which opens the file anew) name the holder too.
    let worker_said = wait_for(&log, |l| {
        l.contains(&format!("pid {pid}"))
            && (l.contains("store unavailable") || l.contains("LOST partition"))
    });

    std::fs::write(dir.path("more.jsonl"), r#"{"event_id":"x1","subscription_id":"s"}"#).unwrap();
    let started = Instant::now();
    let blocked = keyorder(&dir.0, &["enqueue", "more.jsonl"]);
    let waited = started.elapsed();
    let stderr = String::from_utf8_lossy(&blocked.stderr).into_owned();
    signal(&holder, "-CONT");
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = work.kill();
    let _ = work.wait();

    let worker_said = worker_said.unwrap_or_else(|| panic!("keyorder work never named pid {pid}"));
    assert!(worker_said.contains(&format!("kill -CONT {pid}")), "{worker_said}");
    assert_eq!(blocked.status.code(), Some(1), "{stderr}");
    assert!(waited >= Duration::from_secs(4), "gave up after {waited:?}, before the busy timeout");
    for wanted in [
        format!("pid {pid}"),
        "stopped".to_owned(),
        format!("kill -CONT {pid}"),
        "keyorder.db stayed locked".to_owned(),
    ] {
        assert!(stderr.contains(&wanted), "no {wanted:?} in:\n{stderr}");
    }
    // With the holder gone the same enqueue goes through.
    let after = keyorder(&dir.0, &["enqueue", "more.jsonl"]);
    assert!(after.status.success(), "{}", String::from_utf8_lossy(&after.stderr));
    let conn = Connection::open(&db).unwrap();
    let queued: i64 =
        conn.query_row("SELECT count(*) FROM delivery_queue", [], |r| r.get(0)).unwrap();
    assert!(queued >= 1, "the event enqueued after the holder ended is queued");
}

/// `keyorder work` on the folder's database (delivering to a closed port), and its log lines.
/// Its events fail for as long as the test lasts, each retried within half a second, so the
/// worker always has a write coming: one is what meets the stopped writer's lock.
fn work(dir: &std::path::Path) -> (Child, Receiver<String>) {
    let mut work = Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(["work", "--deliver", "http://127.0.0.1:9/", "--name", "w"])
        .args(["--max-attempts", "100000", "--backoff-cap-ms", "500"])
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keyorder work starts");
    let stderr = work.stderr.take().expect("piped");
    (work, lines(stderr))
}

/// The lines `output` gives, read on a thread of their own so that they can be waited for with
/// a deadline.
fn lines(output: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// The first line of `log` that `wanted` accepts, within [`DEADLINE`].
#[allow(clippy::disallowed_methods)] // a real-time wait on a real process
fn wait_for(log: &Receiver<String>, wanted: impl Fn(&str) -> bool) -> Option<String> {
    let deadline = Instant::now() + DEADLINE;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match log.recv_timeout(left) {
            Ok(line) if wanted(&line) => return Some(line),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// Not a test: the helper process of the test above. With [`HOLD`] set it opens that database,
/// takes the write lock (`BEGIN IMMEDIATE`), says `holding` and waits to be stopped or killed.
#[test]
#[ignore = "a helper process for a_write_behind_a_stopped_writer_names_it_and_what_to_do"]
fn hold_the_write_lock() {
    let Some(db) = std::env::var_os(HOLD) else { return };
    let conn = Connection::open(db).expect("the database opens");
    conn.execute_batch("BEGIN IMMEDIATE").expect("the write lock");
    println!("holding");
    // Until the test kills it: past any deadline of the test.
    std::thread::sleep(DEADLINE * 10);
}
