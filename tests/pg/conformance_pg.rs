//! The store conformance suite (tests/conformance) against PostgreSQL: one server, a fresh
//! database per case; a lease is lost by killing its session.

use keyorder::key::Event;
use keyorder::store::postgres::{queue, PgOptions, PgStore};
use keyorder::PartitionId;

use super::conformance::{self, count, Fixture};
use super::harness::PgServer;
use super::util::{block_on, client, migrated};

pub struct PgFixture {
    url: String,
}

impl Fixture for PgFixture {
    type S = PgStore;
    // PgLease records the hand-back in keyorder_handover (schema 4).
    const RECORDS_HANDOVER: bool = true;

    fn store(&self) -> PgStore {
        PgStore::new(&self.url, count(), PgOptions::default()).unwrap()
    }

    async fn enqueue(&self, events: &[Event]) -> (u64, Vec<String>) {
        let mut c = client(&self.url).await;
        keyorder::store::postgres::layout::record(&c, count()).await.unwrap();
        let r = queue::enqueue(&mut c, events, false).await.unwrap();
        (r.inserted, r.duplicates)
    }

    async fn queued(&self) -> Vec<(i64, u16)> {
        let c = client(&self.url).await;
        c.query("SELECT seq, partition FROM delivery_queue ORDER BY seq", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get::<_, i16>(1) as u16))
            .collect()
    }

    async fn dead(&self) -> Vec<(i64, String, i64, String)> {
        let c = client(&self.url).await;
        c.query("SELECT seq, event_id, attempts::int8, reason FROM delivery_dlq ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    }

    async fn lag(&self) -> Vec<((i64, i64, i64, i64), f64)> {
        let c = client(&self.url).await;
        queue::lag(&c)
            .await
            .unwrap()
            .iter()
            .map(|l| {
                let figures = (i64::from(l.partition), l.depth, i64::from(l.head_attempts));
                ((figures.0, figures.1, figures.2, l.keys_affected), l.oldest_wait_seconds)
            })
            .collect()
    }

    async fn row(&self, seq: i64) -> Option<(i64, Option<String>)> {
        let c = client(&self.url).await;
        c.query_opt("SELECT attempts::int8, last_error FROM delivery_queue WHERE seq = $1", &[&seq])
            .await
            .unwrap()
            .map(|r| (r.get(0), r.get(1)))
    }

    async fn break_lease(&self, partition: PartitionId) {
        let c = client(&self.url).await;
        let killed: bool = c
            .query_one(
                "SELECT coalesce(bool_and(pg_terminate_backend(pid)), false) FROM pg_locks
                 WHERE locktype = 'advisory' AND classid = 4711 AND objid::int8 = $1 AND objsubid = 2 AND granted",
                &[&i64::from(partition.0)],
            )
            .await
            .unwrap()
            .get(0);
        assert!(killed, "no session held partition {partition}");
    }
}

#[test]
fn postgres_conforms() {
    let Some(pg) = PgServer::start() else { return };
    block_on(conformance::all(|name| {
        let url = pg.create_db(&format!("conf_{name}"));
        async move {
            drop(migrated(&url).await);
            PgFixture { url }
        }
    }));
}
