//! `keyorder` on SQLite files: the quick start with no --database, and each kind of bad file
//! refused with exit 2 and a message naming it, the file untouched.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rusqlite::Connection;

/// A fresh folder under the system temp folder, removed at the end.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("keyorder-sqlite-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn keyorder(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(args)
        .current_dir(dir)
        .env_remove("DATABASE_URL")
        .output()
        .expect("keyorder runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

pub fn events_file(dir: &Path, n: usize) -> PathBuf {
    let lines: Vec<String> = (0..n)
        .map(|i| {
            serde_json::json!({"event_id": format!("e{i}"), "subscription_id": format!("sub_{}", i % 5),
                "tenant_id": "t", "resource_id": "r", "payload": {"n": i}})
            .to_string()
        })
        .collect();
    let path = dir.join("events.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

#[test]
fn with_no_database_the_queue_is_keyorder_db_in_the_working_folder() {
    let dir = TempDir::new("default");
    events_file(&dir.0, 20);
    let out = keyorder(&dir.0, &["enqueue", "events.jsonl"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("enqueued 20 events"), "{}", text(&out));
    assert!(dir.path("keyorder.db").is_file(), "enqueue created keyorder.db");
    let lag = keyorder(&dir.0, &["lag", "--json"]);
    assert!(lag.status.success(), "{}", text(&lag));
    let v: serde_json::Value = serde_json::from_slice(&lag.stdout).expect("json");
    let depth: i64 =
        v["partitions"].as_array().unwrap().iter().map(|p| p["depth"].as_i64().unwrap()).sum();
    assert_eq!(depth, 20);
    // Enqueueing the same file again skips every event as a duplicate.
    let again = keyorder(&dir.0, &["enqueue", "events.jsonl"]);
    assert!(text(&again).contains("enqueued 0 events (20 duplicates skipped)"), "{}", text(&again));
    let help = keyorder(&dir.0, &["enqueue", "--help"]);
    assert!(text(&help).contains("sqlite:keyorder.db"), "--help states the default");
}

#[test]
fn migrate_creates_then_reports_current() {
    let dir = TempDir::new("migrate");
    let first = keyorder(&dir.0, &["migrate", "--database", "sqlite:q.db"]);
    assert!(
        text(&first).contains("applied migrations [1, 2, 3, 4, 5, 6, 7, 8, 9]"),
        "{}",
        text(&first)
    );
    let second = keyorder(&dir.0, &["migrate", "--database", "sqlite:q.db"]);
    assert!(text(&second).contains("schema is current (version 9)"), "{}", text(&second));
    let c = Connection::open(dir.path("q.db")).unwrap();
    let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
}

/// The file's bytes and the folder's listing, to show a refusal wrote nothing.
fn snapshot(dir: &Path, file: &Path) -> (Option<Vec<u8>>, Vec<String>) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    (std::fs::read(file).ok(), names)
}

/// Runs `enqueue`, `work` and `lag` against `db` and expects each to be refused as bad input
/// (exit 2) with `message`, leaving the folder as it was.
fn refused(dir: &TempDir, db: &str, file: &Path, message: &str) {
    events_file(&dir.0, 3);
    let before = snapshot(&dir.0, file);
    let database = format!("sqlite:{db}");
    for args in [
        vec!["enqueue", "--database", &database, "events.jsonl"],
        vec![
            "work",
            "--database",
            &database,
            "--deliver",
            "http://127.0.0.1:9/x",
            "--stop-after",
            "1",
        ],
        vec!["lag", "--database", &database],
        vec!["migrate", "--database", &database],
    ] {
        let out = keyorder(&dir.0, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(message), "{args:?}: expected {message:?} in {}", text(&out));
        assert_eq!(snapshot(&dir.0, file), before, "{args:?} touched the folder");
    }
}

#[test]
fn a_path_in_a_missing_folder_is_refused() {
    let dir = TempDir::new("missing");
    refused(&dir, "nope/q.db", &dir.path("nope/q.db"), "does not exist");
    assert!(!dir.path("nope").exists(), "the folder was not created");
}

#[test]
fn a_file_that_is_not_sqlite_is_refused() {
    let dir = TempDir::new("notdb");
    std::fs::write(dir.path("q.db"), "these are my notes, not a database\n".repeat(200)).unwrap();
    refused(&dir, "q.db", &dir.path("q.db"), "is not a SQLite database");
}

#[test]
fn a_sqlite_database_of_another_application_is_refused() {
    let dir = TempDir::new("foreign");
    let c = Connection::open(dir.path("q.db")).unwrap();
    c.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');").unwrap();
    drop(c);
    refused(&dir, "q.db", &dir.path("q.db"), "a SQLite database of something else");
}

#[test]
fn a_database_of_another_schema_version_is_refused() {
    let dir = TempDir::new("version");
    let out = keyorder(&dir.0, &["migrate", "--database", "sqlite:q.db"]);
    assert!(out.status.success(), "{}", text(&out));
    let c = Connection::open(dir.path("q.db")).unwrap();
    c.execute("INSERT INTO keyorder_migrations (version) VALUES (99)", []).unwrap();
    // Checkpoint and leave rollback mode untouched: the snapshot then covers every byte.
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    drop(c);
    let newer = format!(
        "schema version 99, newer than this keyorder's {}",
        keyorder::store::sqlite::schema::SCHEMA_VERSION
    );
    refused(&dir, "q.db", &dir.path("q.db"), &newer);
}

#[test]
fn a_read_only_file_is_refused() {
    let dir = TempDir::new("readonly");
    let out = keyorder(&dir.0, &["migrate", "--database", "sqlite:q.db"]);
    assert!(out.status.success(), "{}", text(&out));
    let file = dir.path("q.db");
    let mut perms = std::fs::metadata(&file).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&file, perms).unwrap();
    refused(&dir, "q.db", &file, "is read-only");
}

#[test]
fn reading_commands_do_not_create_a_file() {
    let dir = TempDir::new("nocreate");
    let out = keyorder(&dir.0, &["lag"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no database at keyorder.db"), "{}", text(&out));
    assert!(!dir.path("keyorder.db").exists());
    let out = keyorder(&dir.0, &["dlq", "list"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[test]
fn a_lease_expiry_shorter_than_the_delivery_timeout_is_refused() {
    let dir = TempDir::new("expiry");
    let out = keyorder(
        &dir.0,
        &[
            "work",
            "--deliver",
            "http://127.0.0.1:9/x",
            "--delivery-timeout-ms",
            "1000",
            "--lease-expiry-ms",
            "900",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("must exceed the delivery timeout"), "{}", text(&out));
    assert!(!dir.path("keyorder.db").exists());
}

#[test]
fn switch_on_sqlite_routes_new_events_with_the_new_count() {
    let dir = TempDir::new("switch");
    events_file(&dir.0, 10);
    assert!(keyorder(&dir.0, &["enqueue", "events.jsonl"]).status.success());
    let out = keyorder(&dir.0, &["switch", "--from", "16", "--to", "32", "--producers-follow"]);
    assert!(out.status.success(), "{}", text(&out));
    let wrong = keyorder(&dir.0, &["switch", "--from", "16", "--to", "64", "--producers-follow"]);
    assert_eq!(wrong.status.code(), Some(2), "{}", text(&wrong));
    assert!(
        text(&wrong).contains("--from 16 disagrees")
            && text(&wrong).contains("records 32 partitions"),
        "{}",
        text(&wrong)
    );
    let later: Vec<String> = (0..10)
        .map(|i| {
            serde_json::json!({"event_id": format!("late{i}"), "subscription_id": format!("sub_{}", i % 5),
                "payload": {"n": i}})
            .to_string()
        })
        .collect();
    std::fs::write(dir.path("later.jsonl"), later.join("\n")).unwrap();
    let out = keyorder(&dir.0, &["enqueue", "later.jsonl"]);
    assert!(out.status.success(), "{}", text(&out));
    let c = Connection::open(dir.path("keyorder.db")).unwrap();
    let router = keyorder::Router::new(keyorder::PartitionCount::new(32).unwrap());
    let mut st = c
        .prepare("SELECT partition_key, partition, layout FROM delivery_queue WHERE event_id LIKE 'late%'")
        .unwrap();
    let rows: Vec<(String, u16, i64)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), 10);
    for (key, partition, layout) in rows {
        assert_eq!(layout, 1, "routed under the new layout");
        assert_eq!(partition, router.route(&key).0, "routed with 32 partitions");
    }
}

#[test]
fn work_until_empty_drains_and_exits_0() {
    let dir = TempDir::new("until-empty");
    #[allow(clippy::disallowed_methods)] // the endpoint's clock
    let receiver = super::endpoint::Endpoint::start(std::time::Instant::now());
    events_file(&dir.0, 30);
    let out = keyorder(&dir.0, &["enqueue", "events.jsonl"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = keyorder(
        &dir.0,
        &[
            "work",
            "--deliver",
            &receiver.url,
            "--until-empty",
            "--threads",
            "2",
            "--partitions",
            "16",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("the queue is empty; no dead letters written"), "{}", text(&out));
    let mut ids: Vec<String> = receiver.arrivals().into_iter().map(|a| a.event_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 30, "every event delivered before the exit");
    let lag = keyorder(&dir.0, &["lag", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&lag.stdout).expect("json");
    assert_eq!(v["partitions"].as_array().map(Vec::len), Some(0), "{v}");
    let help = keyorder(&dir.0, &["work", "--help"]);
    assert!(text(&help).contains("--until-empty"), "{}", text(&help));
    assert!(text(&help).contains("1 when dead letters were written"), "{}", text(&help));
}

#[test]
fn help_describes_the_thread_default_instead_of_printing_this_machines_cores() {
    let dir = TempDir::new("help-defaults");
    for (args, flag) in [(["work", "--help"], "--threads"), (["bench", "--help"], "--loops")] {
        let help = text(&keyorder(&dir.0, &args));
        let entry = help.split(&format!("{flag} <")).nth(1).expect("the flag is listed");
        // Up to the next flag's line.
        let entry: Vec<&str> = entry
            .lines()
            .enumerate()
            .take_while(|(i, l)| *i == 0 || !l.trim_start().starts_with('-'))
            .map(|(_, l)| l)
            .collect();
        let entry = entry.join("\n");
        assert!(entry.contains("Default: the number of cores"), "{args:?}: {entry}");
        assert!(!entry.contains("[default:"), "{args:?} prints a number: {entry}");
    }
}

#[test]
fn a_delivery_url_that_is_not_one_is_told_what_is_wrong() {
    let dir = TempDir::new("bad-url");
    let out = keyorder(&dir.0, &["work", "--deliver", "not a url", "--until-empty"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("is not a URL (it has no scheme and contains spaces)"),
        "{}",
        text(&out)
    );
    assert!(!dir.path("keyorder.db").exists(), "refused before anything was created");
}

/// `n` event lines, e0.. on sub_0..sub_4, as `events_file` writes them.
fn event_lines(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            format!("{{\"event_id\":\"e{i}\",\"subscription_id\":\"sub_{}\"}}", i % 5).into_bytes()
        })
        .collect()
}

/// Rows queued in `dir`'s keyorder.db.
fn queued(dir: &Path) -> i64 {
    let c = Connection::open(dir.join("keyorder.db")).unwrap();
    c.query_row("SELECT count(*) FROM delivery_queue", [], |r| r.get(0)).unwrap()
}

#[test]
fn every_enqueue_error_names_one_line_and_what_was_committed_before_it() {
    let dir = TempDir::new("enqueue-errors");
    // Line 13 of 15 is not UTF-8; batches of 5 committed lines 1-10 before it.
    let mut lines = event_lines(15);
    lines[12] = b"{\"event_id\":\"caf\xe9\",\"subscription_id\":\"s\"}".to_vec();
    std::fs::write(dir.path("latin1.jsonl"), lines.join(&b'\n')).unwrap();
    let out = keyorder(&dir.0, &["enqueue", "--batch", "5", "latin1.jsonl"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let committed =
        "enqueued 10 events from lines before 11 (0 duplicates skipped), nothing from line 11 on";
    assert!(text(&out).contains("line 13: not UTF-8 text"), "{}", text(&out));
    assert!(text(&out).contains(committed), "{}", text(&out));
    assert_eq!(queued(&dir.0), 10);
    // A JSON error: one line number, with serde's column, and the same wording of what landed.
    let dir = TempDir::new("enqueue-json");
    let mut lines = event_lines(8);
    lines[6] = b"{\"event_id\":\"e6\",\"subscription_id\" \"sub_1\"}".to_vec();
    std::fs::write(dir.path("bad.jsonl"), lines.join(&b'\n')).unwrap();
    let out = keyorder(&dir.0, &["enqueue", "--batch", "5", "bad.jsonl"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("line 7 column 36: expected `:`;"), "{}", text(&out));
    assert!(!text(&out).contains("at line 1"), "two line numbers: {}", text(&out));
    let committed =
        "enqueued 5 events from lines before 6 (0 duplicates skipped), nothing from line 6 on";
    assert!(text(&out).contains(committed), "{}", text(&out));
    assert_eq!(queued(&dir.0), 5);
}

#[test]
fn lag_shows_why_the_head_fails_and_when_it_is_tried_next() {
    let dir = TempDir::new("lag-head");
    #[allow(clippy::disallowed_methods)] // the endpoint's clock
    let receiver = super::endpoint::Endpoint::start(std::time::Instant::now());
    receiver.shared.lock().unwrap().poison.insert("e0".into());
    events_file(&dir.0, 5);
    assert!(keyorder(&dir.0, &["enqueue", "--partitions", "1", "events.jsonl"]).status.success());
    let out = keyorder(
        &dir.0,
        &[
            "work",
            "--deliver",
            &receiver.url,
            "--partitions",
            "1",
            "--threads",
            "1",
            "--backoff-base-ms",
            "60000",
            "--backoff-cap-ms",
            "60000",
            "--stop-after",
            "1",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let lag = keyorder(&dir.0, &["lag", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&lag.stdout).expect("json");
    let head = &v["partitions"][0];
    // Full jitter may have made a retry due within the second: at least one failure.
    assert!(head["head_attempts"].as_i64().is_some_and(|a| a >= 1), "{v}");
    assert!(head["last_error"].as_str().is_some_and(|e| e.contains("500")), "{v}");
    let next = head["next_attempt_in_seconds"].as_f64().expect("a backoff is recorded");
    assert!((0.0..=60.0).contains(&next), "{v}");
    assert!(head["next_attempt_at"].as_str().is_some_and(|t| t.ends_with("+00")), "{v}");
    let table = text(&keyorder(&dir.0, &["lag"]));
    assert!(table.contains("head's last error") && table.contains("500"), "{table}");
}

#[test]
fn dlq_list_pages_newest_first_with_limit_and_after() {
    let dir = TempDir::new("dlq-pages");
    assert!(keyorder(&dir.0, &["migrate"]).status.success());
    let c = Connection::open(dir.path("keyorder.db")).unwrap();
    for i in 1..=5 {
        c.execute(
            "INSERT INTO delivery_dlq (partition, partition_key, event_id, payload, attempts, reason)
             VALUES (0, 'k', ?1, '{}', 5, 'HTTP 500')",
            [format!("d{i}")],
        )
        .unwrap();
    }
    let page = |args: &[&str]| {
        let out = keyorder(&dir.0, &[&["dlq", "list", "--json"], args].concat());
        assert!(out.status.success(), "{}", text(&out));
        let ids: Vec<i64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_i64().unwrap())
            .collect();
        (ids, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ids, err) = page(&["--limit", "2"]);
    assert_eq!(ids, [5, 4]);
    assert!(err.contains("more may follow: keyorder dlq list --limit 2 --after 4"), "{err}");
    let (ids, _) = page(&["--limit", "2", "--after", "4"]);
    assert_eq!(ids, [3, 2]);
    let (ids, err) = page(&["--limit", "2", "--after", "2"]);
    assert_eq!(ids, [1]);
    assert!(!err.contains("more may follow"), "the last page: {err}");
    let (ids, err) = page(&["--after", "1"]);
    assert!(ids.is_empty() && err.contains("no dead letters below id 1"), "{err}");
    let out = keyorder(&dir.0, &["dlq", "list", "--limit", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--limit must be at least 1"), "{}", text(&out));
}

#[test]
fn bench_measures_each_read_ahead_asked_for_and_refuses_one_out_of_range() {
    let dir = TempDir::new("bench-read-ahead");
    let common = [
        "bench",
        "--database",
        "sqlite:bench.db",
        "--deliver",
        "noop",
        "--partitions",
        "4",
        "--only-delivery",
        "--events",
        "500",
        "--loops",
        "1",
        "--yes",
    ];
    let out = keyorder(&dir.0, &[&common[..], &["--read-ahead", "1,64"]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let rates: Vec<&str> = std::str::from_utf8(&out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.contains("deliveries/s"))
        .collect();
    assert_eq!(rates.len(), 2, "one drain per value: {rates:?}");
    assert!(rates[0].starts_with("read-ahead    1:"), "{rates:?}");
    assert!(rates[1].starts_with("read-ahead   64:"), "{rates:?}");
    for bad in ["0", "4097", "many"] {
        let out = keyorder(&dir.0, &[&common[..], &["--read-ahead", bad]].concat());
        assert_eq!(out.status.code(), Some(2), "--read-ahead {bad}: {}", text(&out));
        assert!(text(&out).contains("--read-ahead"), "the flag is named: {}", text(&out));
    }
    let out = keyorder(
        &dir.0,
        &["bench", "--database", "postgres://nobody@127.0.0.1:1/x", "--read-ahead", "8", "--yes"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--read-ahead is for SQLite"), "{}", text(&out));
}
