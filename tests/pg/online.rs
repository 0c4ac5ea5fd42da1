//! The online repartition on PostgreSQL: 16 → 32 partitions mid-drain with no write pause.
//! Producers switch layout at once, moving keys are held until their old rows are delivered,
//! workers lease both layouts meanwhile; the checker (layout-aware) finds no violation.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keyorder::check::{check, Enqueued};
use keyorder::store::postgres::queue;
use keyorder::{partition_for, PartitionCount, Seq};

use super::endpoint::Endpoint;
use super::harness::PgServer;
use super::util::*;

#[test]
fn an_online_switch_keeps_per_key_order_without_a_write_pause() {
    let Some(pg) = PgServer::start() else { return };
    let url = pg.create_db("online");
    #[allow(clippy::disallowed_methods)]
    let endpoint = Endpoint::start(Instant::now());
    endpoint.shared.lock().unwrap().latency = Duration::from_millis(3);
    block_on(async {
        let mut c = migrated(&url).await;
        let keys: Vec<String> = (0..16).map(|i| format!("sub_{i}")).collect();
        enqueue(&mut c, &events(&keys, 20)).await;
        let mut seen: BTreeMap<Seq, Enqueued> =
            snapshot(&c).await.into_iter().map(|e| (e.seq, e)).collect();
        let drained = drain(&url, &endpoint, 2, Duration::from_secs(90));
        let during = async {
            #[allow(clippy::disallowed_methods)]
            let start = Instant::now();
            while endpoint.arrivals().len() < 40 {
                assert!(start.elapsed() < Duration::from_secs(30));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let (from, to) = (PartitionCount::new(16).unwrap(), PartitionCount::new(32).unwrap());
            let mut sc = client(&url).await;
            queue::switch_online(&mut sc, from, to, &Default::default(), &mut None)
                .await
                .expect("switch");
            // Producers keep writing: these route with 32 under layout 1.
            let later: Vec<_> = events(&keys, 40).into_iter().skip(16 * 20).collect();
            enqueue(&mut sc, &later).await;
            snapshot(&sc).await
        };
        let (_, after) = tokio::join!(drained, during);
        seen.extend(after.into_iter().map(|e| (e.seq, e)));
        let enqueued: Vec<Enqueued> = seen.into_values().collect();
        let moved = keys
            .iter()
            .filter(|k| {
                partition_for(k, PartitionCount::new(16).unwrap())
                    != partition_for(k, PartitionCount::new(32).unwrap())
            })
            .count();
        assert!(moved > 0, "some keys move");
        assert!(enqueued.iter().any(|e| e.layout == 1) && enqueued.iter().any(|e| e.layout == 0));
        let verdict = check(&history(&c, &enqueued, &endpoint).await);
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!(verdict.events, 16 * 40);
    });
}
