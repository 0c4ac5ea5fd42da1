//! The endpoint address policy end to end on a SQLite file: rows at loopback (six spellings)
//! and at 169.254.169.254 get no connection and a dead letter naming the policy; with
//! `--allow-private-endpoints` the loopback rows are delivered; `--deliver` works throughout.
//! And `keyorder endpoints set|list|rm`, refusing bad rows with exit 2.

use rusqlite::Connection;

use super::cli::{keyorder, TempDir};
use super::policy_case::{self, Listeners, METADATA_KEY};

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn enqueue(dir: &TempDir, lines: &str) {
    std::fs::write(dir.path("events.jsonl"), lines).unwrap();
    let out = keyorder(&dir.0, &["enqueue", "events.jsonl"]);
    assert!(out.status.success(), "{}", text(&out));
}

/// Drains the queue (`--until-empty`); `dead_letters`: whether the run writes some (exit 1).
fn work(dir: &TempDir, l: &Listeners, extra: &[&str], dead_letters: bool) {
    let mut args = policy_case::work_args(&l.default.url);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = keyorder(&dir.0, &args);
    assert_eq!(out.status.code(), Some(i32::from(dead_letters)), "{}", text(&out));
}

#[test]
fn rows_at_private_addresses_are_refused_unless_allowed() {
    let dir = TempDir::new("address-policy");
    let l = Listeners::start();
    let rows = l.rows(true);
    enqueue(&dir, &policy_case::events(&rows, "deny"));
    let c = Connection::open(dir.path("keyorder.db")).unwrap();
    for r in &rows {
        c.execute(
            "INSERT INTO keyorder_endpoint (partition_key, url) VALUES (?1, ?2)",
            [r.key, &r.url],
        )
        .unwrap();
    }
    work(&dir, &l, &[], true);
    let dead = c
        .prepare("SELECT partition_key, attempts, reason FROM delivery_dlq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    policy_case::check_refused(&l, &rows, dead);

    // Allowed: the same loopback rows (not the metadata one: nothing may connect there).
    let out = keyorder(&dir.0, &["endpoints", "rm", METADATA_KEY]);
    assert!(out.status.success(), "{}", text(&out));
    let rows = l.rows(false);
    enqueue(&dir, &policy_case::events(&rows, "allow"));
    work(&dir, &l, &["--allow-private-endpoints"], false);
    policy_case::check_allowed(&l, &rows);
    let depth: i64 = c.query_row("SELECT count(*) FROM delivery_queue", [], |r| r.get(0)).unwrap();
    assert_eq!(depth, 0, "everything delivered");
}

#[test]
fn endpoints_set_list_rm_validate_each_row() {
    let dir = TempDir::new("endpoints-cmd");
    assert!(keyorder(&dir.0, &["migrate"]).status.success());
    let run = |args: &[&str]| keyorder(&dir.0, args);
    let refused = |args: &[&str], says: &str| {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    };
    refused(&["endpoints", "set", "k", "ftp://h/"], "http:// or https://");
    refused(&["endpoints", "set", "k", "http://a b/"], "no valid host");
    refused(&["endpoints", "set", "k", "http://h/", "--secret-ref", "whsec_abc"], "env:NAME");
    refused(&["endpoints", "set", "k", "http://h/", "--secret-ref", "file:s.txt"], "absolute");
    refused(&["endpoints", "set", "k", "http://0x7f000001:8/"], "127.0.0.0/8");
    refused(&["endpoints", "set", "k", "http://[fd00:ec2::254]/"], "cloud metadata");
    refused(
        &["endpoints", "set", "k", "http://h/", "--allow-endpoint-network", "10.1.2.3/8"],
        "did you mean 10.0.0.0/8",
    );
    refused(&["endpoints", "rm", "k"], "no endpoint row");
    let ok = |args: &[&str], says: &str| {
        let out = run(args);
        assert!(out.status.success() && text(&out).contains(says), "{args:?}: {}", text(&out));
    };
    ok(
        &["endpoints", "set", "k", "https://hooks.example.com/a", "--secret-ref", "env:K_SECRET"],
        "added",
    );
    ok(&["endpoints", "set", "k", "https://hooks.example.com/b"], "replaced");
    ok(
        &["endpoints", "set", "p", "http://10.2.0.1/", "--allow-endpoint-network", "10.2.0.0/16"],
        "added",
    );
    ok(&["endpoints", "list"], "k\thttps://hooks.example.com/b\t-\np\thttp://10.2.0.1/\t-\n");
    let json = run(&["endpoints", "list", "--json"]);
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&json.stdout).lines().next().unwrap())
            .unwrap();
    assert_eq!(first["url"], "https://hooks.example.com/b");
    ok(&["endpoints", "rm", "k"], "removed");
    ok(&["endpoints", "list"], "p\t");
    assert!(!text(&run(&["endpoints", "list"])).contains("hooks.example.com"));
    let help = text(&run(&["work", "--help"]));
    assert!(
        help.contains("--allow-endpoint-network") && help.contains("--allow-private-endpoints")
    );
}
