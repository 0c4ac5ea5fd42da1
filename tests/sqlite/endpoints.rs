//! Per-key endpoints: a key with a `keyorder_endpoint` row is delivered to its own URL, the
//! others to `--deliver`, and a key whose row cannot be used is dead-lettered with the reason,
//! never sent to the default.

use std::time::Instant;

use rusqlite::Connection;

use super::cli::{events_file, keyorder, TempDir};
use super::endpoint::Endpoint;

#[test]
fn each_key_goes_to_its_own_endpoint_and_a_bad_row_is_dead_lettered() {
    let dir = TempDir::new("endpoints");
    #[allow(clippy::disallowed_methods)] // the endpoints' clock
    let epoch = Instant::now();
    let (default, own) = (Endpoint::start(epoch), Endpoint::start(epoch));
    // 20 events over sub_0..sub_4.
    events_file(&dir.0, 20);
    let out = keyorder(&dir.0, &["enqueue", "events.jsonl"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c = Connection::open(dir.path("keyorder.db")).unwrap();
    c.execute(
        "INSERT INTO keyorder_endpoint (partition_key, url, secret_ref) VALUES ('sub_2', ?1, NULL),
         ('sub_3', ?1, 'env:KEYORDER_TEST_NO_SUCH_SECRET')",
        [&own.url],
    )
    .unwrap();
    let out = keyorder(
        &dir.0,
        &[
            "work",
            "--deliver",
            &default.url,
            "--max-attempts",
            "1",
            "--until-empty",
            // The test's endpoints are on loopback, which rows may not reach by default.
            "--allow-endpoint-network",
            "127.0.0.0/8",
        ],
    );
    // Drained, but with dead letters written during the run: exit 1, saying so.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the queue is empty, but 4 dead letter(s) were written during the run"),
        "{stderr}"
    );
    // A second run finds the queue empty: the dead letters of the first are not this run's.
    let again = keyorder(&dir.0, &["work", "--deliver", &default.url, "--until-empty"]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("no dead letters written during the run"), "{stderr}");
    let keys = |e: &Endpoint| {
        let mut k: Vec<String> = e.arrivals().into_iter().map(|a| a.key).collect();
        k.sort();
        k.dedup();
        k
    };
    assert_eq!(keys(&own), ["sub_2"], "only sub_2 has its own endpoint");
    assert_eq!(keys(&default), ["sub_0", "sub_1", "sub_4"], "the rest go to --deliver");
    let dead: Vec<(String, String)> = c
        .prepare("SELECT partition_key, reason FROM delivery_dlq ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(dead.len(), 4, "sub_3's four events are dead-lettered: {dead:?}");
    for (key, reason) in &dead {
        assert_eq!(key, "sub_3");
        assert!(
            reason.contains("misconfigured") && reason.contains("KEYORDER_TEST_NO_SUCH_SECRET"),
            "{reason}"
        );
    }
}
