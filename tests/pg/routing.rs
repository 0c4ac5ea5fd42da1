//! One source of truth for routing (#20) on PostgreSQL: the count is recorded by `migrate` and
//! a disagreeing `--partitions` is refused naming both; an old queue's count is inferred from
//! its rows; rows a producer inserted by SQL with another count or hash are reported by `lag`
//! and `work`; a pin routes a plain SQL insert (the trigger) and blocks a switch that would
//! drop its partition; `plan --database` reads the count and the pins.

use super::cli::{keyorder, psql, text};
use super::harness::PgServer;

fn events(first: usize, n: usize, key: impl Fn(usize) -> String) -> String {
    (first..first + n)
        .map(|i| format!("{{\"event_id\":\"e{i}\",\"subscription_id\":\"{}\"}}\n", key(i)))
        .collect()
}

#[test]
fn the_count_lives_in_the_database_and_misplaced_rows_are_reported() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("routing");
    let o = keyorder(&["migrate", "--database", &url, "--partitions", "64"], "");
    assert!(text(&o).contains("recorded the partition count: 64"), "{}", text(&o));
    let o =
        keyorder(&["enqueue", "--database", &url], &events(0, 200, |i| format!("sub_{}", i % 40)));
    assert!(o.status.success(), "{}", text(&o));
    for args in [
        &[
            "work",
            "--database",
            &url,
            "--partitions",
            "16",
            "--deliver",
            "http://127.0.0.1:9/",
            "--stop-after",
            "1",
        ][..],
        &["enqueue", "--database", &url, "--partitions", "16"][..],
        &["dlq", "--database", &url, "redrive", "1", "--partitions", "16", "--accept-gap"][..],
        &["plan", "--database", &url, "--from", "16", "--to", "32"][..],
    ] {
        let o = keyorder(args, &events(500, 1, |_| "sub_1".into()));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("16 disagrees") && text(&o).contains("64 partitions"),
            "{args:?}: {}",
            text(&o)
        );
    }
    assert_eq!(psql(&pg, "routing", "SELECT count(*) FROM delivery_queue"), "200");
    // An old queue: the record forgotten, `migrate` infers 64 from the rows.
    psql(&pg, "routing", "DELETE FROM keyorder_layout");
    let o = keyorder(&["migrate", "--database", &url], "");
    assert!(
        text(&o).contains("routed with 64 partitions (no other count fits them)"),
        "{}",
        text(&o)
    );
    assert_eq!(
        psql(&pg, "routing", "SELECT epoch || ',' || partitions FROM keyorder_layout"),
        "0,64"
    );
    // A producer routing with another count (partition 70) and one with another hash.
    let own = psql(
        &pg,
        "routing",
        "SELECT partition FROM delivery_queue WHERE partition_key = 'sub_1' LIMIT 1",
    );
    let wrong = (own.parse::<i32>().unwrap() + 1) % 64;
    psql(
        &pg,
        "routing",
        &format!("INSERT INTO delivery_queue (partition, partition_key, event_id, payload) VALUES (70, 'stray_key', 'x1', '{{}}'), ({wrong}, 'sub_1', 'x2', '{{}}')"),
    );
    let o = keyorder(&["lag", "--database", &url], "");
    assert!(
        text(&o).contains("\"stray_key\" on 70") && text(&o).contains("\"sub_1\" on"),
        "{}",
        text(&o)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&keyorder(&["lag", "--database", &url, "--json"], "").stdout)
            .unwrap();
    assert_eq!(
        (json["routing"]["stranded_rows"].as_i64(), json["routing"]["misrouted_rows"].as_i64()),
        (Some(1), Some(1)),
        "{json}"
    );
    let o = keyorder(
        &[
            "work",
            "--database",
            &url,
            "--deliver",
            "http://127.0.0.1:9/",
            "--stop-after",
            "1",
            "--threads",
            "1",
        ],
        "",
    );
    assert!(
        text(&o).contains(" WARN ") && text(&o).contains("\"stray_key\" on 70"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_pin_routes_plain_sql_inserts_and_bounds_a_switch() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("pins");
    assert!(keyorder(&["migrate", "--database", &url], "").status.success());
    let o =
        keyorder(&["enqueue", "--database", &url], &events(0, 50, |i| format!("sub_{}", i % 5)));
    assert!(o.status.success(), "{}", text(&o));
    let hashed: i32 = psql(
        &pg,
        "pins",
        "SELECT partition FROM delivery_queue WHERE partition_key = 'sub_1' LIMIT 1",
    )
    .parse()
    .unwrap();
    let target = (hashed + 5) % 16;
    for (args, says) in [
        (vec!["pin", "--database", &url, "sub_1", "16"], "partition 16 does not exist"),
        (vec!["pin", "--database", &url, "", "2"], "the key is empty"),
    ] {
        let o = keyorder(&args, "");
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{}", text(&o));
    }
    let t = target.to_string();
    let o = keyorder(&["pin", "--database", &url, "sub_1", &t], "");
    assert!(text(&o).contains("its 10 queued row(s)"), "{}", text(&o));
    // A reference producer routes by hash with plain SQL: the trigger sends it to the pin.
    psql(&pg, "pins", &format!("INSERT INTO delivery_queue (partition, partition_key, event_id, payload) VALUES ({hashed}, 'sub_1', 'sql-1', '{{}}')"));
    assert_eq!(
        psql(
            &pg,
            "pins",
            "SELECT partition || ',' || layout FROM delivery_queue WHERE event_id = 'sql-1'"
        ),
        format!("{target},1")
    );
    assert!(keyorder(&["enqueue", "--database", &url], &events(100, 1, |_| "sub_1".into()))
        .status
        .success());
    assert_eq!(
        psql(
            &pg,
            "pins",
            "SELECT partition || ',' || layout FROM delivery_queue WHERE event_id = 'e100'"
        ),
        format!("{target},1")
    );
    assert!(!text(&keyorder(&["lag", "--database", &url], "")).contains("WARNING"));
    // A switch to a count without the pinned partition is refused, naming the pin.
    if target >= 8 {
        let o = keyorder(
            &["switch", "--database", &url, "--from", "16", "--to", "8", "--producers-follow"],
            "",
        );
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("\"sub_1\" is pinned"), "{}", text(&o));
    }
    // plan reads the count and the pin; --pin tries another.
    let o =
        keyorder(&["plan", "--database", &url, "--to", "32", "--pin", "sub_2=31", "--json"], "");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    assert_eq!(json["from"], 16, "{}", text(&o));
    let heaviest = json["heaviest_keys"].as_array().cloned().unwrap_or_default();
    let after = |key: &str| heaviest.iter().find(|k| k["key"] == key).map(|k| k["after"].clone());
    assert_eq!(after("sub_1"), Some(serde_json::json!(target)), "{}", text(&o));
    assert_eq!(after("sub_2"), Some(serde_json::json!(31)), "{}", text(&o));
    let o = keyorder(&["plan", "--database", &url, "--to", "32", "--pin", "sub_2=40"], "");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
