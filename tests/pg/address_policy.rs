//! The endpoint address policy end to end on PostgreSQL: rows at loopback (six spellings) and
//! at 169.254.169.254 get no connection and a dead letter naming the policy; with
//! `--allow-private-endpoints` the loopback rows are delivered; `--deliver` works throughout;
//! `keyorder endpoints set|list|rm` write the server's table and refuse bad rows with exit 2.

use super::cli::{keyorder, text};
use super::harness::PgServer;
use super::policy_case::{self, Listeners, METADATA_KEY};
use super::util::{block_on, client};

fn ok(args: &[&str], stdin: &str) -> String {
    let out = keyorder(args, stdin);
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    text(&out)
}

/// Drains the queue (`--until-empty`); `dead_letters`: whether the run writes some (exit 1).
fn work(url: &str, l: &Listeners, extra: &[&str], dead_letters: bool) {
    let mut args = policy_case::work_args(&l.default.url);
    args.extend(["--database", url].iter().chain(extra).map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = keyorder(&args, "");
    assert_eq!(out.status.code(), Some(i32::from(dead_letters)), "{}", text(&out));
}

#[test]
fn rows_at_private_addresses_are_refused_unless_allowed() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("address_policy");
    ok(&["migrate", "--database", &url], "");
    let l = Listeners::start();
    let rows = l.rows(true);
    ok(&["enqueue", "--database", &url], &policy_case::events(&rows, "deny"));
    let dead = block_on(async {
        let c = client(&url).await;
        for r in &rows {
            c.execute(
                "INSERT INTO keyorder_endpoint (partition_key, url) VALUES ($1, $2)",
                &[&r.key, &r.url],
            )
            .await
            .unwrap();
        }
        work(&url, &l, &[], true);
        let dead = c.query("SELECT partition_key, attempts, reason FROM delivery_dlq", &[]);
        dead.await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), i64::from(r.get::<_, i16>(1)), r.get(2)))
            .collect()
    });
    policy_case::check_refused(&l, &rows, dead);

    // Allowed: the same loopback rows (not the metadata one: nothing may connect there).
    ok(&["endpoints", "rm", METADATA_KEY, "--database", &url], "");
    let rows = l.rows(false);
    ok(&["enqueue", "--database", &url], &policy_case::events(&rows, "allow"));
    work(&url, &l, &["--allow-private-endpoints"], false);
    policy_case::check_allowed(&l, &rows);
}

#[test]
fn endpoints_set_list_rm_validate_each_row() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("endpoints_cmd");
    ok(&["migrate", "--database", &url], "");
    let db = ["--database", url.as_str()];
    let with = |args: &[&'static str]| -> Vec<&str> { args.iter().copied().chain(db).collect() };
    for (args, says) in [
        (&["endpoints", "set", "k", "gopher://h/"][..], "http:// or https://"),
        (&["endpoints", "set", "k", "http://h:99999/"], "invalid port"),
        (&["endpoints", "set", "k", "http://h/", "--secret-ref", "vault:x"], "env:NAME"),
        (&["endpoints", "set", "k", "http://[::1]:8/"], "::1/128"),
        (&["endpoints", "set", "k", "http://localhost/"], "127.0.0.0/8"),
        (&["endpoints", "rm", "k"], "no endpoint row"),
    ] {
        let out = keyorder(&with(args), "");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    assert!(ok(
        &with(&["endpoints", "set", "k", "https://h.example/a", "--secret-ref", "file:/etc/s"]),
        ""
    )
    .contains("added"));
    assert!(ok(&with(&["endpoints", "set", "k", "https://h.example/b"]), "").contains("replaced"));
    assert!(ok(
        &with(&["endpoints", "set", "l", "http://127.0.0.1:8/", "--allow-private-endpoints"]),
        ""
    )
    .contains("added"));
    assert_eq!(
        ok(&with(&["endpoints", "list"]), ""),
        "k\thttps://h.example/b\t-\nl\thttp://127.0.0.1:8/\t-\n"
    );
    assert!(ok(&with(&["endpoints", "rm", "l"]), "").contains("removed"));
    assert_eq!(ok(&with(&["endpoints", "list"]), ""), "k\thttps://h.example/b\t-\n");
}
