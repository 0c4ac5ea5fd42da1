//! One source of truth for routing (#20), on SQLite files: the partition count lives in the
//! database (a disagreeing `--partitions` is refused naming both counts), rows a wrong
//! producer inserted by SQL are reported by `lag` and `work`, and a pin moves a key with
//! queued rows without splitting it, for keyorder's enqueue and a plain SQL insert alike.

use std::path::Path;
use std::process::Output;
use std::time::Instant;

use rusqlite::Connection;

use super::cli::{keyorder, TempDir};
use super::endpoint::Endpoint;

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Writes `file` with events `first..first + n`, event i of key `key(i)`.
fn events(dir: &Path, file: &str, first: usize, n: usize, key: impl Fn(usize) -> String) {
    let lines: Vec<String> = (first..first + n)
        .map(|i| {
            serde_json::json!({"event_id": format!("e{i}"), "subscription_id": key(i),
                "tenant_id": "t", "resource_id": "r", "payload": {"n": i}})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join(file), lines.join("\n")).unwrap();
}

type KeyRows = Vec<(String, i64, i64, i64)>;

/// The triggers' per-key counts (key, layout, partition, rows).
fn counted(c: &Connection) -> KeyRows {
    rows(
        c,
        "SELECT partition_key, layout, partition, queued FROM keyorder_key_rows ORDER BY 1, 2, 3",
    )
}

/// The same, counted from the queue itself.
fn grouped(c: &Connection) -> KeyRows {
    rows(
        c,
        "SELECT partition_key, layout, partition, count(*) FROM delivery_queue
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
    )
}

fn rows(c: &Connection, sql: &str) -> KeyRows {
    let mut stmt = c.prepare(sql).unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

fn layouts(c: &Connection) -> Vec<(i64, i64)> {
    c.prepare("SELECT epoch, partitions FROM keyorder_layout ORDER BY 1")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn a_count_that_disagrees_with_the_database_is_refused_naming_both() {
    let dir = TempDir::new("routing-mismatch");
    events(&dir.0, "a.jsonl", 0, 200, |i| format!("sub_{}", i % 40));
    let out = keyorder(&dir.0, &["enqueue", "--partitions", "64", "a.jsonl"]);
    assert!(out.status.success(), "{}", text(&out));
    let recorded =
        |l: &str| l.contains("recorded the partition count") && l.contains("partitions=64");
    assert!(text(&out).lines().any(recorded), "{}", text(&out));
    let c = Connection::open(dir.path("keyorder.db")).unwrap();
    assert_eq!(layouts(&c), [(0, 64)]);
    // The issue's mistake: a worker (or a redrive, or a second producer) with another count.
    for args in [
        &["work", "--partitions", "16", "--deliver", "http://127.0.0.1:9/", "--stop-after", "1"][..],
        &["enqueue", "--partitions", "16", "a.jsonl"][..],
        &["dlq", "redrive", "1", "--partitions", "16", "--accept-gap"][..],
        &["migrate", "--partitions", "16"][..],
    ] {
        let out = keyorder(&dir.0, args);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.contains("--partitions 16 disagrees") && said.contains("records 64 partitions"),
            "{args:?}: {said}"
        );
    }
    // Counts outside 1..=32767 are bad input too.
    for bad in ["0", "40000", "-3", "many"] {
        let out = keyorder(&dir.0, &["migrate", "--partitions", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out));
        assert!(text(&out).contains("--partitions"), "{bad}: {}", text(&out));
    }
    assert_eq!(layouts(&c), [(0, 64)], "nothing changed");
    let queued: i64 = c.query_row("SELECT count(*) FROM delivery_queue", [], |r| r.get(0)).unwrap();
    assert_eq!(queued, 200, "the refused enqueue inserted nothing");
    // Without the flag the worker leases the recorded count.
    let out = keyorder(
        &dir.0,
        &["work", "--deliver", "http://127.0.0.1:9/", "--stop-after", "1", "--threads", "1"],
    );
    let delivering = |l: &str| l.contains(" INFO delivering") && l.contains(" partitions=64 ");
    assert!(text(&out).lines().any(delivering), "{}", text(&out));
}

#[test]
fn rows_a_wrong_producer_inserted_by_sql_are_reported_by_lag_and_work() {
    let dir = TempDir::new("routing-stranded");
    events(&dir.0, "a.jsonl", 0, 40, |i| format!("sub_{}", i % 8));
    assert!(keyorder(&dir.0, &["enqueue", "a.jsonl"]).status.success());
    let c = Connection::open(dir.path("keyorder.db")).unwrap();
    // A producer routing with 64 (partition 40: no worker of 16 reads it) and one with
    // another hash (sub_1 on a partition that is not its own).
    let own: i64 = c
        .query_row(
            "SELECT partition FROM delivery_queue WHERE partition_key = 'sub_1' LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    c.execute(
        "INSERT INTO delivery_queue (partition, partition_key, event_id, payload, enqueued_at)
         VALUES (40, 'stray_key', 'x1', '{}', 0), (?1, 'sub_1', 'x2', '{}', 0)",
        [(own + 1) % 16],
    )
    .unwrap();
    let lag = keyorder(&dir.0, &["lag"]);
    let said = text(&lag);
    assert!(said.contains("layout 0: 16 partitions"), "{said}");
    assert!(
        said.contains("1 rows on partitions no worker reads")
            && said.contains("\"stray_key\" on 40"),
        "{said}"
    );
    assert!(
        said.contains("1 rows not where their key routes") && said.contains("\"sub_1\""),
        "{said}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&keyorder(&dir.0, &["lag", "--json"]).stdout).unwrap();
    assert_eq!(json["routing"]["stranded_rows"], 1, "{json}");
    assert_eq!(json["routing"]["misrouted_rows"], 1, "{json}");
    assert_eq!(json["layout"]["partitions"], 16, "{json}");
    let prom = String::from_utf8_lossy(&keyorder(&dir.0, &["lag", "--prom"]).stdout).to_string();
    assert!(prom.contains("keyorder_queue_stranded_rows 1"), "{prom}");
    assert!(prom.contains("keyorder_queue_misrouted_rows 1"), "{prom}");
    // The layout's 16 partitions, 0 when empty, and the stranded partition's own series.
    let depth: Vec<&str> =
        prom.lines().filter(|l| l.starts_with("keyorder_partition_depth{")).collect();
    assert_eq!(depth.len(), 17, "{prom}");
    assert!(depth[16].starts_with("keyorder_partition_depth{partition=\"40\"} 1"), "{prom}");
    let work = keyorder(
        &dir.0,
        &["work", "--deliver", "http://127.0.0.1:9/", "--stop-after", "1", "--threads", "1"],
    );
    let said = text(&work);
    assert!(said.contains(" WARN ") && said.contains("\"stray_key\" on 40"), "{said}");
}

#[test]
fn a_pin_moves_a_queued_key_without_a_split_for_keyorder_and_plain_sql_producers() {
    let dir = TempDir::new("routing-pin");
    #[allow(clippy::disallowed_methods)] // the endpoint's clock
    let epoch = Instant::now();
    let endpoint = Endpoint::start(epoch);
    events(&dir.0, "a.jsonl", 0, 100, |i| format!("sub_{}", i % 5));
    assert!(keyorder(&dir.0, &["enqueue", "a.jsonl"]).status.success());
    let c = Connection::open(dir.path("keyorder.db")).unwrap();
    let hashed: i64 = c
        .query_row(
            "SELECT partition FROM delivery_queue WHERE partition_key = 'sub_1' LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let target = (hashed + 7) % 16;
    // Bad pins change nothing.
    for (args, says) in [
        (vec!["pin", "sub_1", "16"], "partition 16 does not exist"),
        (vec!["pin", "", "3"], "the key is empty"),
        (vec!["pin", "sub_1", "-1"], "-1"),
    ] {
        let out = keyorder(&dir.0, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    assert_eq!(layouts(&c), [(0, 16)]);
    let t = target.to_string();
    let out = keyorder(&dir.0, &["pin", "sub_1", &t]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("its 20 queued row(s) are delivered first"), "{}", text(&out));
    assert_eq!(layouts(&c), [(0, 16), (1, 16)], "a pin is a new layout of the same count");
    let pins = text(&keyorder(&dir.0, &["pins"]));
    assert!(pins.contains("sub_1") && pins.contains(&format!("partition {t}")), "{pins}");
    // keyorder's producer and a reference producer (plain SQL, routing by hash) both follow.
    events(&dir.0, "b.jsonl", 100, 20, |_| "sub_1".into());
    assert!(keyorder(&dir.0, &["enqueue", "b.jsonl"]).status.success());
    c.execute(
        "INSERT INTO delivery_queue (partition, partition_key, event_id, payload) VALUES (?1, 'sub_1', 'sql-1', '{}')",
        [hashed],
    )
    .unwrap();
    let placed: Vec<(i64, i64, i64)> = c
        .prepare("SELECT partition, layout, count(*) FROM delivery_queue WHERE partition_key = 'sub_1' GROUP BY 1, 2 ORDER BY 2")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(placed, [(hashed, 0, 20), (target, 1, 21)], "old rows stay, new rows go to the pin");
    assert_eq!(counted(&c), grouped(&c), "the per-key counts follow every insert and the pin");
    assert!(counted(&c).contains(&("sub_1".into(), 0, hashed, 20)), "{:?}", counted(&c));
    let lag = text(&keyorder(&dir.0, &["lag"]));
    assert!(!lag.contains("WARNING"), "nothing is misplaced: {lag}");
    let out =
        keyorder(&dir.0, &["work", "--deliver", &endpoint.url, "--until-empty", "--threads", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Every event once, and each key's first deliveries in seq order: sub_1's 20 old rows
    // before any of its 21 new ones, though they sat on two partitions.
    let arrivals = endpoint.arrivals();
    let mut firsts: Vec<(String, i64)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for a in arrivals.iter().filter(|a| a.accepted) {
        if seen.insert(a.event_id.clone()) {
            firsts.push((a.key.clone(), a.seq));
        }
    }
    assert_eq!(seen.len(), 121, "every event delivered");
    assert_eq!(counted(&c), [], "every acknowledgement took its row's count away");
    for key in ["sub_0", "sub_1", "sub_2", "sub_3", "sub_4"] {
        let seqs: Vec<i64> = firsts.iter().filter(|(k, _)| k == key).map(|(_, s)| *s).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{key} out of order: {seqs:?}");
    }
    let sub_1_partitions: std::collections::BTreeSet<u16> =
        arrivals.iter().filter(|a| a.key == "sub_1").map(|a| a.partition).collect();
    assert_eq!(sub_1_partitions.len(), 2, "sub_1 was delivered from both partitions");
    // Unpinning moves it back the same way; unpinning again changes nothing.
    assert!(text(&keyorder(&dir.0, &["unpin", "sub_1"])).contains("routes by its hash again"));
    assert!(text(&keyorder(&dir.0, &["unpin", "sub_1"])).contains("nothing changed"));
    assert_eq!(layouts(&c).len(), 3);
}
