//! The address-policy scenario both stores run end to end with `keyorder work`: endpoint rows
//! (written by SQL, as a platform would) pointing at loopback in six spellings and at the cloud
//! metadata address, the test's own loopback listeners behind them, and a default `--deliver`
//! listener on 127.0.0.1 that must work as before.

use std::time::Instant;

use super::endpoint::Endpoint;

/// The key whose events go to `--deliver` (it has no row).
pub const DEFAULT_KEY: &str = "k_default";
/// The key whose row names the cloud metadata address: never part of an allowing run.
pub const METADATA_KEY: &str = "k_metadata";

/// The listeners: `--deliver`'s, and the ones behind the rows on 127.0.0.1 and [::1].
pub struct Listeners {
    pub default: Endpoint,
    pub v4: Endpoint,
    pub v6: Endpoint,
}

/// One row: its key, URL, the listener that would receive it, and what a refusal names.
pub struct Row {
    pub key: &'static str,
    pub url: String,
    /// `Some(true)`: the [::1] listener; `Some(false)`: 127.0.0.1; `None`: nobody.
    pub v6: Option<bool>,
    pub ip: &'static str,
    pub rule: &'static str,
}

impl Listeners {
    pub fn start() -> Listeners {
        #[allow(clippy::disallowed_methods)] // the endpoints' clock
        let epoch = Instant::now();
        Listeners {
            default: Endpoint::start(epoch),
            v4: Endpoint::start(epoch),
            v6: Endpoint::start_at("[::1]:0", epoch),
        }
    }

    /// The rows; `metadata` adds the 169.254.169.254 one (port 9: nothing listens, and the
    /// policy refuses it before any connection).
    pub fn rows(&self, metadata: bool) -> Vec<Row> {
        let port =
            |e: &Endpoint| e.url.rsplit(':').next().unwrap().trim_end_matches("/hook").to_owned();
        let (p4, p6) = (port(&self.v4), port(&self.v6));
        let v4 = |key, url: String| Row {
            key,
            url,
            v6: Some(false),
            ip: "127.0.0.1",
            rule: "127.0.0.0/8",
        };
        let mut rows = vec![
            v4("k_loopback", format!("http://127.0.0.1:{p4}/hook")),
            v4("k_localhost", format!("http://localhost:{p4}/hook")),
            v4("k_numeric", format!("http://2130706433:{p4}/hook")),
            v4("k_mapped", format!("http://[::ffff:127.0.0.1]:{p4}/hook")),
            Row {
                key: "k_v6",
                url: format!("http://[::1]:{p6}/hook"),
                v6: Some(true),
                ip: "::1",
                rule: "::1/128",
            },
        ];
        if metadata {
            rows.push(Row {
                key: METADATA_KEY,
                url: "http://169.254.169.254:9/latest/meta-data/".into(),
                v6: None,
                ip: "169.254.169.254",
                rule: "cloud metadata service",
            });
        }
        rows
    }
}

/// JSON lines: one event per key of `rows` and one for [`DEFAULT_KEY`], ids prefixed `tag`.
pub fn events(rows: &[Row], tag: &str) -> String {
    let keys = rows.iter().map(|r| r.key).chain([DEFAULT_KEY]);
    keys.map(|k| {
        serde_json::json!({"event_id": format!("{tag}-{k}"), "subscription_id": k,
            "tenant_id": "t", "resource_id": "r", "payload": {"k": k}})
        .to_string()
    })
    .collect::<Vec<_>>()
    .join("\n")
}

/// The distinct keys an endpoint received events of, sorted.
pub fn keys(e: &Endpoint) -> Vec<String> {
    let mut k: Vec<String> = e.arrivals().into_iter().map(|a| a.key).collect();
    k.sort();
    k.dedup();
    k
}

/// The `work` flags of both runs: two attempts 1 ms apart, until the queue is empty (exit 1
/// when the run dead-lettered anything), one thread.
pub fn work_args(deliver: &str) -> Vec<String> {
    [
        "work",
        "--deliver",
        deliver,
        "--max-attempts",
        "2",
        "--backoff-base-ms",
        "1",
        "--backoff-cap-ms",
        "1",
        "--until-empty",
        "--threads",
        "1",
        "--idle-poll-ms",
        "20",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Checks the refusing run: no listener behind a row saw anything, `--deliver` got exactly
/// the default key, and `dead` (key, attempts, reason) holds one dead letter per row, after
/// both attempts, whose reason names the policy, the address and the rule.
pub fn check_refused(l: &Listeners, rows: &[Row], mut dead: Vec<(String, i64, String)>) {
    assert_eq!((l.v4.connections(), l.v6.connections()), (0, 0), "no connection at all");
    assert!(l.v4.arrivals().is_empty(), "127.0.0.1 saw {:?}", keys(&l.v4));
    assert!(l.v6.arrivals().is_empty(), "[::1] saw {:?}", keys(&l.v6));
    assert_eq!(keys(&l.default), [DEFAULT_KEY], "--deliver works as before, and only for it");
    dead.sort();
    let mut expected: Vec<&Row> = rows.iter().collect();
    expected.sort_by_key(|r| r.key);
    assert_eq!(dead.len(), expected.len(), "one dead letter per row: {dead:?}");
    for ((key, attempts, reason), row) in dead.iter().zip(expected) {
        assert_eq!(key, row.key);
        assert_eq!(*attempts, 2, "{key}: retried, then dead-lettered");
        assert!(
            reason.contains("address policy")
                && reason.contains(row.ip)
                && reason.contains(row.rule),
            "{key}: {reason}"
        );
    }
}

/// Checks the allowing run (rows without the metadata one): each row's listener got its key.
pub fn check_allowed(l: &Listeners, rows: &[Row]) {
    let mut on_v4: Vec<String> =
        rows.iter().filter(|r| r.v6 == Some(false)).map(|r| r.key.to_owned()).collect();
    on_v4.sort();
    assert_eq!(keys(&l.v4), on_v4, "every 127.0.0.1 spelling is delivered");
    assert_eq!(keys(&l.v6), ["k_v6"], "[::1] is delivered");
    assert!(l
        .v4
        .arrivals()
        .iter()
        .chain(&l.v6.arrivals())
        .all(|a| a.event_id.starts_with("allow-")));
}
