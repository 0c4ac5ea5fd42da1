//! The fake store through the store conformance suite, as SQLite and PostgreSQL are run: what
//! the worker tests conclude holds only as far as the fake keeps the stores' semantics.

use super::*;
use crate::key::{partition_key, Event};
use crate::Router;

#[path = "../../../tests/conformance/mod.rs"]
mod suite;

/// One fresh in-memory database, routed over the suite's partition count.
struct FakeFixture {
    db: SharedDb,
    clock: TokioClock,
}

impl FakeFixture {
    fn new(clock: TokioClock) -> Self {
        let db = Rc::new(RefCell::new(Db { count: suite::PARTITIONS, ..Db::default() }));
        FakeFixture { db, clock }
    }

    /// Every queued row's `(seq, partition)`, in seq order.
    fn rows(&self) -> Vec<(Seq, PartitionId)> {
        let db = self.db.borrow();
        let queues = db.queues.iter();
        let mut rows: Vec<_> = queues.flat_map(|(p, q)| q.keys().map(|seq| (*seq, *p))).collect();
        rows.sort();
        rows
    }
}

impl suite::Fixture for FakeFixture {
    type S = FakeStore;

    fn store(&self) -> FakeStore {
        FakeStore { db: self.db.clone(), clock: self.clock }
    }

    async fn enqueue(&self, events: &[Event]) -> (u64, Vec<String>) {
        let router = Router::new(suite::count());
        let now = self.clock.now();
        let mut db = self.db.borrow_mut();
        let (mut inserted, mut duplicates) = (0, Vec::new());
        for event in events {
            let key = partition_key(event).expect("the suite's events are valid");
            let known = db.queues.values().flat_map(BTreeMap::values).chain(db.buried.values());
            if known.map(|row| &row.event_id).any(|id| *id == event.event_id) {
                duplicates.push(event.event_id.clone());
                continue;
            }
            db.next_seq += 1;
            let seq = Seq(db.next_seq);
            let row = Row {
                event_id: event.event_id.clone(),
                key: key.to_owned(),
                attempts: 0,
                not_before: None,
                last_error: None,
                enqueued_at: now,
            };
            db.queues.entry(router.route(key)).or_default().insert(seq, row);
            inserted += 1;
        }
        (inserted, duplicates)
    }

    async fn queued(&self) -> Vec<(i64, u16)> {
        self.rows().into_iter().map(|(seq, p)| (seq.0, p.0)).collect()
    }

    async fn dead(&self) -> Vec<(i64, String, i64, String)> {
        let db = self.db.borrow();
        let id = |seq: &Seq| db.buried[seq].event_id.clone();
        let dead = db.dead.iter();
        dead.map(|(_, seq, n, why)| (seq.0, id(seq), i64::from(*n), why.clone())).collect()
    }

    async fn lag(&self) -> Vec<((i64, i64, i64, i64), f64)> {
        let db = self.db.borrow();
        let now = self.clock.now();
        let queues = db.queues.iter().filter(|(_, q)| !q.is_empty());
        queues
            .map(|(p, q)| {
                let head = q.values().next().expect("not empty");
                let keys: BTreeSet<&str> = q.values().map(|row| row.key.as_str()).collect();
                let oldest = q.values().map(|row| row.enqueued_at).min().expect("not empty");
                let figures =
                    (i64::from(p.0), q.len() as i64, i64::from(head.attempts), keys.len() as i64);
                (figures, now.saturating_since(oldest).as_secs_f64())
            })
            .collect()
    }

    async fn row(&self, seq: i64) -> Option<(i64, Option<String>)> {
        let db = self.db.borrow();
        let row = db.queues.values().find_map(|q| q.get(&Seq(seq)))?;
        Some((i64::from(row.attempts), row.last_error.clone()))
    }

    async fn break_lease(&self, partition: PartitionId) {
        self.db.borrow_mut().held.remove(&partition);
    }
}

#[tokio::test(start_paused = true)]
async fn the_fake_store_keeps_the_stores_contract() {
    let clock = TokioClock::start();
    suite::all(|_| async move { FakeFixture::new(clock) }).await;
}
