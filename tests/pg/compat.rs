//! A producer that knows only the reference schema's INSERT enqueues into a migrated table, and
//! keyorder's worker delivers those events in order.

use std::time::{Duration, Instant};

use keyorder::check::check;
use keyorder::partition_for;

use super::endpoint::Endpoint;
use super::harness::PgServer;
use super::util::*;

#[test]
fn a_reference_producer_is_delivered_in_order() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("compat");
    #[allow(clippy::disallowed_methods)]
    let endpoint = Endpoint::start(Instant::now());
    block_on(async {
        let c = migrated(&url).await;
        // The reference's enqueue(), statement for statement (payload as the JSON it sends).
        for round in 0..10 {
            for k in 0..5 {
                let key = format!("sub_{k}");
                let partition = partition_for(&key, count()).0 as i16;
                let event_id = format!("{key}-{round}");
                c.execute(
                    "INSERT INTO delivery_queue (partition, partition_key, event_id, payload) VALUES ($1, $2, $3, $4::text::jsonb)",
                    &[&partition, &key, &event_id, &format!("{{\"event_id\": \"{event_id}\"}}")],
                )
                .await
                .expect("the reference INSERT works against the migrated schema");
            }
        }
        let enqueued = snapshot(&c).await;
        drain(&url, &endpoint, 2, Duration::from_secs(30)).await;
        let verdict = check(&history(&c, &enqueued, &endpoint).await);
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!(endpoint.arrivals().len(), 50);
    });
}
