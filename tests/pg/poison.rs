//! A poison event reaches the dead-letter table after exactly `max_attempts` attempts, with
//! backoff between them, and its partition moves on.

use std::time::{Duration, Instant};

use keyorder::check::{check, Kind};

use super::endpoint::Endpoint;
use super::harness::PgServer;
use super::util::*;

#[test]
fn a_poison_event_is_dead_lettered_after_exactly_max_attempts() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("poison");
    #[allow(clippy::disallowed_methods)]
    let endpoint = Endpoint::start(Instant::now());
    endpoint.shared.lock().unwrap().poison.insert("sub_p-0".into());
    block_on(async {
        let mut c = migrated(&url).await;
        enqueue(&mut c, &events(&["sub_p".to_owned()], 3)).await;
        let enqueued = snapshot(&c).await;
        drain(&url, &endpoint, 1, Duration::from_secs(30)).await;
        let arrivals = endpoint.arrivals();
        let poison: Vec<_> = arrivals.iter().filter(|a| a.event_id == "sub_p-0").collect();
        assert_eq!(
            poison.iter().map(|a| a.attempt).collect::<Vec<_>>(),
            vec![1, 2, 3, 4],
            "exactly max_attempts = 4"
        );
        let gaps: Duration = poison.windows(2).map(|w| w[1].at.saturating_sub(w[0].done)).sum();
        assert!(gaps >= Duration::from_millis(5), "no backoff between attempts: {gaps:?}");
        let row = c
            .query_one("SELECT event_id, attempts::int4, reason FROM delivery_dlq", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "sub_p-0");
        assert_eq!(row.get::<_, i32>(1), 4);
        assert_eq!(row.get::<_, String>(2), "exhausted after 4 attempts: HTTP 500");
        let after: Vec<_> = arrivals
            .iter()
            .filter(|a| a.event_id != "sub_p-0")
            .map(|a| a.event_id.as_str())
            .collect();
        assert_eq!(after, vec!["sub_p-1", "sub_p-2"], "the partition moved on, in order");
        let verdict = check(&history(&c, &enqueued, &endpoint).await);
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!(verdict.count(Kind::Gap), 1, "the dead-letter is a counted gap");
    });
    // The dead-letter commands: list and show it; redrive only with the gap acknowledged.
    let keyorder = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_keyorder"))
            .args(args)
            .output()
            .expect("runs");
        (
            o.status.code(),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        )
    };
    let (code, out) = keyorder(&["dlq", "--database", &url, "list"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("sub_p-0") && out.contains("exhausted after 4 attempts"), "{out}");
    let id = out.split_whitespace().next().expect("an id").to_owned();
    let (code, out) = keyorder(&["dlq", "--database", &url, "show", &id]);
    assert_eq!(code, Some(0));
    assert!(out.contains("\"payload\""), "{out}");
    let (code, out) = keyorder(&["dlq", "--database", &url, "redrive", &id]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("ordering gap"), "{out}");
    let (code, out) = keyorder(&["dlq", "--database", &url, "redrive", &id, "--accept-gap"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("at the tail"), "{out}");
    let (code, _) = keyorder(&["dlq", "--database", &url, "show", &id]);
    assert_eq!(code, Some(2), "the redriven row left the dead-letter table");
    block_on(async {
        let c = client(&url).await;
        let back: i64 = c
            .query_one("SELECT count(*) FROM delivery_queue WHERE event_id = 'sub_p-0'", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(back, 1, "the redriven event is queued again");
    });
}
