//! The reference design's ordering test, ported: 20 keys × 25 events, 8 concurrent workers;
//! each key's deliveries must come in enqueue order, judged by the checker.

use std::time::{Duration, Instant};

use keyorder::check::{check, Kind};

use super::endpoint::Endpoint;
use super::harness::PgServer;
use super::util::*;

#[test]
fn per_key_order_holds_with_eight_workers() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("ordering");
    #[allow(clippy::disallowed_methods)] // the endpoint's wall-clock origin
    let endpoint = Endpoint::start(Instant::now());
    block_on(async {
        let mut c = migrated(&url).await;
        let keys: Vec<String> = (0..20).map(|i| format!("sub_{i}")).collect();
        enqueue(&mut c, &events(&keys, 25)).await;
        let enqueued = snapshot(&c).await;
        assert_eq!(enqueued.len(), 500);
        let reports = drain(&url, &endpoint, 8, Duration::from_secs(60)).await;
        let taken: u64 = reports.iter().map(|r| r.acquired).sum();
        assert!(taken >= 16, "every partition was leased: {reports:?}");
        let verdict = check(&history(&c, &enqueued, &endpoint).await);
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!(verdict.count(Kind::Lost), 0);
        // Every key's events arrived, first deliveries in enqueue order (the reference test).
        for key in &keys {
            let mut seen: Vec<String> = Vec::new();
            for a in endpoint.arrivals().iter().filter(|a| &a.key == key && a.accepted) {
                if !seen.contains(&a.event_id) {
                    seen.push(a.event_id.clone());
                }
            }
            let expected: Vec<String> = (0..25).map(|r| format!("{key}-{r}")).collect();
            assert_eq!(seen, expected, "order broken for {key}");
        }
    });
}
