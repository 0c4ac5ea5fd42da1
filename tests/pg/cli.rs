//! The command line against a real server: bad input gives clear errors and a non-zero exit
//! with nothing lost; `plan --database` judges whether the live queue is safe to switch.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use super::harness::PgServer;

/// Runs `keyorder ARGS` with `stdin` (and no DATABASE_URL from the caller's environment).
pub(super) fn keyorder(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(args)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keyorder runs");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Standard output and standard error, as text.
pub(super) fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

pub(super) fn psql(pg: &PgServer, db: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port.to_string(),
            "-U",
            "postgres",
            "-d",
            db,
            "-tA",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .output()
        .expect("psql");
    assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn bad_input_is_refused_clearly_and_nothing_is_lost() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("cli");
    // Unknown tables: the commands say to migrate.
    let o = keyorder(&["lag", "--database", &url], "");
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).contains("keyorder migrate"), "{}", text(&o));
    // ...without repeating the URL, which may hold a password.
    assert!(!text(&o).contains(&url), "{}", text(&o));
    assert!(keyorder(&["migrate", "--database", &url], "").status.success());
    assert!(text(&keyorder(&["migrate", "--database", &url], "")).contains("schema is current"));
    // A malformed line: exit 2 naming it; the batch it was in is not half-enqueued.
    let input = "{\"event_id\":\"e1\",\"subscription_id\":\"sub_1\"}\n{not json\n";
    let o = keyorder(&["enqueue", "--database", &url], input);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("line 2"), "{}", text(&o));
    assert_eq!(psql(&pg, "cli", "SELECT count(*) FROM delivery_queue"), "0");
    let o = keyorder(
        &["enqueue", "--database", &url],
        "{\"event_id\":\"e1\",\"subscription_id\":\"\"}\n",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("empty subscription id"), "{}", text(&o));
    // Good input lands; a repeat is reported as duplicates, not an error.
    let good = "{\"event_id\":\"e1\",\"subscription_id\":\"sub_1\",\"payload\":{\"a\":1}}\n{\"event_id\":\"e2\",\"subscription_id\":\"sub_1\"}\n";
    assert!(text(&keyorder(&["enqueue", "--database", &url], good)).contains("enqueued 2 events"));
    let o = keyorder(&["enqueue", "--database", &url], good);
    assert!(o.status.success());
    assert!(text(&o).contains("2 duplicates"), "{}", text(&o));
    // A wrong URL and a wrong delivery URL.
    let o = keyorder(&["lag", "--database", "postgres://postgres@127.0.0.1:1/nowhere"], "");
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).contains("cannot connect"), "{}", text(&o));
    let o = keyorder(&["work", "--database", &url, "--deliver", "ftp://x/"], "");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("http://"), "{}", text(&o));
    let serialised = "{\"event_id\":\"e3\",\"subscription_id\":\"sub_2\"}\n";
    let o = keyorder(&["enqueue", "--database", &url, "--serialise-keys"], serialised);
    assert!(text(&o).contains("enqueued 1 events"), "{}", text(&o));
    let o = keyorder(&["lag", "--database", &url, "--prom"], "");
    assert!(text(&o).contains("keyorder_partition_depth{partition="), "{}", text(&o));
}

#[test]
fn plan_database_says_safe_only_when_drained_and_unsplit() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("plan");
    assert!(keyorder(&["migrate", "--database", &url], "").status.success());
    let events: String = (0..30)
        .map(|i| format!("{{\"event_id\":\"e{i}\",\"subscription_id\":\"sub_{}\"}}\n", i % 7))
        .collect();
    assert!(keyorder(&["enqueue", "--database", &url], &events).status.success());
    let o = keyorder(&["plan", "--from", "16", "--to", "32", "--database", &url], "");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("NOT SAFE") && text(&o).contains("depth 30"), "{}", text(&o));
    assert!(
        text(&o).contains("keys in sample        7 (total weight 30.0)"),
        "the queued keys are the sample: {}",
        text(&o)
    );
    let o = keyorder(
        &["plan", "--from", "16", "--to", "32", "--database", &url, "--wait-drained", "1"],
        "",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("waiting to drain: 30 event(s) still queued"), "{}", text(&o));
    assert!(text(&o).contains("do NOT switch"), "{}", text(&o));
    psql(&pg, "plan", "DELETE FROM delivery_queue");
    let o = keyorder(&["plan", "--from", "16", "--to", "32", "--database", &url, "--json"], "");
    assert!(o.status.success(), "{}", text(&o));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["verdict"]["safe"], true);
    let o = keyorder(&["plan", "--from", "16", "--to", "32", "--database", &url], "");
    assert!(text(&o).contains("SAFE TO SWITCH"), "{}", text(&o));
    // One key by hand on two partitions.
    psql(&pg, "plan", "INSERT INTO delivery_queue (partition, partition_key, event_id, payload) VALUES (1, 'sub_split', 'x1', '{}'), (2, 'sub_split', 'x2', '{}')");
    let o = keyorder(&["plan", "--from", "16", "--to", "32", "--database", &url], "");
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("NOT SAFE") && text(&o).contains("sub_split"), "{}", text(&o));
}

#[test]
fn an_online_switch_needs_consent_and_the_count_in_force() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("switch");
    assert!(keyorder(&["migrate", "--database", &url], "").status.success());
    let o = keyorder(&["switch", "--database", &url, "--from", "16", "--to", "32"], "");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("--producers-follow"), "{}", text(&o));
    let o = keyorder(
        &["switch", "--database", &url, "--from", "16", "--to", "32", "--producers-follow"],
        "",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("layout 1 in force"), "{}", text(&o));
    // Producers now route with 32: a key's row lands on its 32-partition.
    assert!(keyorder(
        &["enqueue", "--database", &url],
        "{\"event_id\":\"e1\",\"subscription_id\":\"sub_42\"}\n"
    )
    .status
    .success());
    let expected =
        keyorder::partition_for("sub_42", keyorder::PartitionCount::new(32).unwrap()).0.to_string();
    assert_eq!(
        psql(&pg, "switch", "SELECT partition || ',' || layout FROM delivery_queue"),
        format!("{expected},1")
    );
    let o = keyorder(
        &["switch", "--database", &url, "--from", "16", "--to", "64", "--producers-follow"],
        "",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("--from 16 disagrees") && text(&o).contains("records 32 partitions"),
        "{}",
        text(&o)
    );
    // Without --from the switch starts from the recorded count.
    let o = keyorder(&["switch", "--database", &url, "--to", "64", "--producers-follow"], "");
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("layout 2 in force"), "{}", text(&o));
}

#[test]
fn work_until_empty_exits_1_for_dead_letters_of_its_own_run_only() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("until_empty");
    assert!(keyorder(&["migrate", "--database", &url], "").status.success());
    #[allow(clippy::disallowed_methods)] // the endpoint's clock
    let receiver = super::endpoint::Endpoint::start(std::time::Instant::now());
    receiver.shared.lock().unwrap().poison.insert("e3".into());
    let input: String = (0..10)
        .map(|i| format!("{{\"event_id\":\"e{i}\",\"subscription_id\":\"sub_{}\"}}\n", i % 3))
        .collect();
    assert!(keyorder(&["enqueue", "--database", &url], &input).status.success());
    let work = ["work", "--database", &url, "--deliver", &receiver.url, "--until-empty"];
    let o = keyorder(&[&work[..], &["--max-attempts", "1"]].concat(), "");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("but 1 dead letter(s) were written during the run"), "{}", text(&o));
    assert_eq!(psql(&pg, "until_empty", "SELECT count(*) FROM delivery_queue"), "0");
    // The next run finds nothing to do and the earlier dead letter is not its own.
    let o = keyorder(&work, "");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("no dead letters written during the run"), "{}", text(&o));
}

#[test]
fn lag_carries_the_heads_last_error_and_next_attempt() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("lag_head");
    assert!(keyorder(&["migrate", "--database", &url], "").status.success());
    let input = "{\"event_id\":\"e1\",\"subscription_id\":\"sub_1\"}\n{\"event_id\":\"e2\",\"subscription_id\":\"sub_1\"}\n";
    assert!(keyorder(&["enqueue", "--database", &url], input).status.success());
    // A head never tried: no error, no next attempt.
    let o = keyorder(&["lag", "--database", &url, "--json"], "");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let head = &v["partitions"][0];
    assert!(head["last_error"].is_null() && head["next_attempt_in_seconds"].is_null(), "{v}");
    // What a failed delivery records at the head (as the worker's backoff write does).
    psql(
        &pg,
        "lag_head",
        "UPDATE delivery_queue SET attempts = 2, last_error = 'HTTP 503 from the receiver',
         not_before = now() + interval '30 seconds' WHERE event_id = 'e1'",
    );
    let o = keyorder(&["lag", "--database", &url, "--json"], "");
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let head = &v["partitions"][0];
    assert_eq!(head["head_attempts"], 2, "{v}");
    assert_eq!(head["last_error"], "HTTP 503 from the receiver", "{v}");
    let next = head["next_attempt_in_seconds"].as_f64().expect("a backoff is recorded");
    assert!(next > 20.0 && next <= 30.0, "{v}");
    assert!(head["next_attempt_at"].as_str().is_some_and(|t| t.ends_with("+00")), "{v}");
    let o = keyorder(&["lag", "--database", &url], "");
    assert!(text(&o).contains("HTTP 503 from the receiver"), "{}", text(&o));
}

#[test]
fn dlq_list_pages_with_limit_and_after() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("dlq_pages");
    assert!(keyorder(&["migrate", "--database", &url], "").status.success());
    psql(
        &pg,
        "dlq_pages",
        "INSERT INTO delivery_dlq (partition, partition_key, event_id, payload, attempts, reason)
         SELECT 0, 'k', 'd' || i, '{}', 5, 'HTTP 500' FROM generate_series(1, 5) AS i",
    );
    let ids = |o: &Output| -> Vec<i64> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_i64().unwrap())
            .collect()
    };
    let o = keyorder(&["dlq", "--database", &url, "list", "--json", "--limit", "3"], "");
    assert_eq!(ids(&o), [5, 4, 3], "{}", text(&o));
    assert!(text(&o).contains("--after 3"), "{}", text(&o));
    let o = keyorder(&["dlq", "--database", &url, "list", "--json", "--after", "3"], "");
    assert_eq!(ids(&o), [2, 1], "{}", text(&o));
}
