//! The conformance fixture on SQLite: a fresh file per case; a lease is lost by its expiry.

use std::path::PathBuf;
use std::time::Duration;

use keyorder::clock::TokioClock;
use keyorder::key::Event;
use keyorder::store::sqlite::{queue, schema, SqliteOptions, SqliteStore};
use keyorder::PartitionId;
use rusqlite::Connection;

use super::cli::TempDir;
use super::conformance::{self, count, Fixture};

pub struct SqliteFixture {
    /// Removes the file with its folder at the end.
    pub _dir: TempDir,
    pub file: PathBuf,
}

impl SqliteFixture {
    pub fn new(name: &str) -> SqliteFixture {
        let dir = TempDir::new(&format!("conf-{name}"));
        let file = dir.path("q.db");
        drop(schema::open(&file, schema::OpenMode::Create).expect("creates"));
        SqliteFixture { _dir: dir, file }
    }

    pub fn conn(&self) -> Connection {
        schema::open(&self.file, schema::OpenMode::Existing).expect("opens")
    }
}

pub fn options() -> SqliteOptions {
    let mut o = SqliteOptions::for_delivery_timeout(Duration::from_millis(500));
    o.ack_delay = Duration::from_millis(10);
    o
}

impl Fixture for SqliteFixture {
    type S = SqliteStore;

    fn store(&self) -> SqliteStore {
        SqliteStore::new(&self.file, count(), options(), TokioClock::start()).unwrap()
    }

    async fn enqueue(&self, events: &[Event]) -> (u64, Vec<String>) {
        let mut c = self.conn();
        keyorder::store::sqlite::layout::record(&c, count()).unwrap();
        let r = queue::enqueue(&mut c, events).unwrap();
        (r.inserted, r.duplicates)
    }

    async fn queued(&self) -> Vec<(i64, u16)> {
        let c = self.conn();
        let mut st = c.prepare("SELECT seq, partition FROM delivery_queue ORDER BY seq").unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    }

    async fn dead(&self) -> Vec<(i64, String, i64, String)> {
        let c = self.conn();
        let mut st = c
            .prepare("SELECT seq, event_id, attempts, reason FROM delivery_dlq ORDER BY id")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    async fn lag(&self) -> Vec<((i64, i64, i64, i64), f64)> {
        queue::lag(&self.conn())
            .unwrap()
            .iter()
            .map(|l| {
                let figures = (i64::from(l.partition), l.depth, i64::from(l.head_attempts));
                ((figures.0, figures.1, figures.2, l.keys_affected), l.oldest_wait_seconds)
            })
            .collect()
    }

    async fn row(&self, seq: i64) -> Option<(i64, Option<String>)> {
        self.conn()
            .query_row(
                "SELECT attempts, last_error FROM delivery_queue WHERE seq = ?1",
                [seq],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .ok()
    }

    async fn break_lease(&self, partition: PartitionId) {
        // What the passing of its expiry does, without waiting for all of it: the row expires
        // now, and the holder's own view of its expiry, by which it hands out heads it read
        // ahead, runs out.
        let n = self
            .conn()
            .execute(
                "UPDATE keyorder_lease SET expires_at = 0 WHERE partition = ?1",
                [i64::from(partition.0)],
            )
            .unwrap();
        assert_eq!(n, 1);
        tokio::time::sleep(read_ahead_window(&options())).await;
    }
}

/// How long after its last head read a holder may still hand out rows it read ahead: until its
/// lease, as last read, no longer lasts a delivery timeout plus the clock-skew bound.
fn read_ahead_window(o: &SqliteOptions) -> Duration {
    o.lease_expiry.saturating_sub(o.delivery_timeout + o.clock_skew()) + Duration::from_millis(50)
}

fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    tokio::task::LocalSet::new().block_on(&rt, fut)
}

#[test]
fn sqlite_conforms() {
    block_on(conformance::all(|name| async move { SqliteFixture::new(name) }));
}

/// The fence is what stops a lost lease: the same steps against a store whose fence is gone
/// (the lease row rewritten to look held by the old session) let the old holder read on, so
/// the conformance check can fail.
#[test]
fn the_fencing_check_fails_without_the_fence() {
    block_on(async {
        use keyorder::store::{LeaseSession, Store};
        let fx = SqliteFixture::new("unfenced");
        let key = conformance::key_on(0, 0);
        fx.enqueue(&[conformance::event("u0", &key), conformance::event("u1", &key)]).await;
        let s = fx.store();
        let mut old = s.acquire(PartitionId(0)).await.unwrap().unwrap();
        let holder: String = fx
            .conn()
            .query_row("SELECT holder FROM keyorder_lease WHERE partition = 0", [], |r| r.get(0))
            .unwrap();
        fx.break_lease(PartitionId(0)).await;
        let _new = fx.store().acquire(PartitionId(0)).await.unwrap().expect("taken over");
        assert!(
            old.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.is_err(),
            "fenced: the old holder is refused"
        );
        // Break the fence: make the row say the old holder still holds it.
        fx.conn()
            .execute(
                "UPDATE keyorder_lease SET holder = ?1, epoch = ?2, expires_at = keyorder_clock() + 60, boot = keyorder_boot()",
                rusqlite::params![holder, old.epoch().0 as i64],
            )
            .unwrap();
        assert!(
            old.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.is_ok(),
            "unfenced, the old holder reads again"
        );
    });
}

/// A lease that nobody renews (its process stopped) expires by itself and is then refused;
/// renewal keeps a lease held far beyond its expiry while the process runs.
#[test]
fn leases_expire_unrenewed_and_renewal_keeps_them() {
    block_on(async {
        use keyorder::store::{LeaseSession, Store};
        let fx = SqliteFixture::new("expiry");
        fx.enqueue(&[conformance::event("e0", &conformance::key_on(0, 0))]).await;
        let mut o = options();
        o.delivery_timeout = Duration::from_millis(100);
        o.lease_expiry = Duration::from_millis(300);
        let s = SqliteStore::new(&fx.file, count(), o, TokioClock::start()).unwrap();
        let mut held = s.acquire(PartitionId(0)).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(
            held.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().is_some(),
            "renewed: still held after 1 s"
        );
        assert!(s.acquire(PartitionId(0)).await.unwrap().is_none(), "and still exclusive");
        // Stop the renewal as a stopped process would: freeze the row's expiry in the past.
        let row = keyorder::store::sqlite::lease_row(&fx.conn(), PartitionId(0)).unwrap().unwrap();
        assert!(row.expires_in > 0.1 && row.expires_in <= 0.31, "{row:?}");
        assert!(!row.clean, "a held lease is unclean until released");
        fx.break_lease(PartitionId(0)).await;
        assert!(matches!(
            held.fetch_head(&keyorder::drain::ParkedKeys::NONE).await,
            Err(keyorder::store::StoreError::LeaseNotHeld { .. })
        ));
    });
}

/// The leases of one connection flush their acknowledgements together, each under its own
/// fence: a flush run by a live lease deletes its own rows, leaves a lost lease's rows queued
/// for the next holder, and the lost lease is refused at its next call.
#[test]
fn a_shared_flush_deletes_only_the_rows_of_leases_still_held() {
    block_on(async {
        use keyorder::store::{LeaseSession, Store, StoreError};
        let fx = SqliteFixture::new("shared-flush");
        let (k0, k1) = (conformance::key_on(0, 0), conformance::key_on(1, 0));
        fx.enqueue(&[conformance::event("a0", &k0), conformance::event("b0", &k1)]).await;
        let mut o = options();
        // Only age triggers a flush here: the first ack waits, the second (later) flushes both.
        o.ack_delay = Duration::from_millis(200);
        let s = SqliteStore::new(&fx.file, count(), o, TokioClock::start()).unwrap();
        let mut lost = s.acquire(PartitionId(0)).await.unwrap().unwrap();
        let mut live = s.acquire(PartitionId(1)).await.unwrap().unwrap();
        let a =
            lost.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().expect("a0 queued");
        let b =
            live.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().expect("b0 queued");
        lost.ack(a.seq).await.unwrap();
        assert_eq!(fx.queued().await.len(), 2, "one fresh ack: nothing deleted yet");
        tokio::time::sleep(Duration::from_millis(250)).await;
        fx.break_lease(PartitionId(0)).await;
        live.ack(b.seq).await.expect("the live lease's flush succeeds");
        assert_eq!(
            fx.queued().await,
            vec![(a.seq.0, 0)],
            "the live lease's row is deleted, the lost lease's row stays queued"
        );
        assert!(matches!(
            lost.fetch_head(&keyorder::drain::ParkedKeys::NONE).await,
            Err(StoreError::LeaseNotHeld { .. })
        ));
        assert!(matches!(lost.ack(a.seq).await, Err(StoreError::LeaseNotHeld { .. })));
    });
}

/// The online repartition's barrier in the head read: a head of a newer layout whose key still
/// has a row of an older layout queued (on another partition) is held for a short wait, and
/// only then. The head read consults the barrier only while rows of an older layout are queued
/// at all, so this checks the answer is the same either way.
#[test]
fn a_head_is_held_while_its_key_has_a_row_of_an_older_layout() {
    block_on(async {
        use keyorder::repartition::DEFAULT_HOLD_POLL;
        use keyorder::store::{LeaseSession, Store};
        let fx = SqliteFixture::new("barrier");
        let (key, other) = (conformance::key_on(0, 0), conformance::key_on(0, 1));
        fx.enqueue(&[conformance::event("old", &key)]).await;
        // What a switch to layout 1 would route: the key's next row to partition 1, another
        // key's (nothing older queued) to partition 2.
        let c = fx.conn();
        c.execute(
            "INSERT INTO keyorder_layout (epoch, partitions) VALUES (1, ?1)",
            [i64::from(count().get())],
        )
        .unwrap();
        for (p, k, id) in [(1, &key, "new"), (2, &other, "free")] {
            c.execute(
                "INSERT INTO delivery_queue (partition, partition_key, event_id, payload, layout)
                 VALUES (?1, ?2, ?3, '{}', 1)",
                rusqlite::params![p, k, id],
            )
            .unwrap();
        }
        let s = fx.store();
        let none = keyorder::drain::ParkedKeys::NONE;
        let mut p0 = s.acquire(PartitionId(0)).await.unwrap().unwrap();
        let mut p1 = s.acquire(PartitionId(1)).await.unwrap().unwrap();
        let mut p2 = s.acquire(PartitionId(2)).await.unwrap().unwrap();
        let old = p0.fetch_head(&none).await.unwrap().expect("old queued");
        assert_eq!((old.event_id.as_str(), old.wait), ("old", None), "layout 0 is never held");
        let held = p1.fetch_head(&none).await.unwrap().expect("new queued");
        assert_eq!(held.event_id, "new");
        assert!(held.wait.is_some_and(|w| w >= DEFAULT_HOLD_POLL), "held: {:?}", held.wait);
        let free = p2.fetch_head(&none).await.unwrap().expect("free queued");
        assert_eq!((free.event_id.as_str(), free.wait), ("free", None), "no older row of its key");
        // The older row leaves the queue (delivered): the barrier lets the key's next row go.
        c.execute("DELETE FROM delivery_queue WHERE event_id = 'old'", []).unwrap();
        let released = p1.fetch_head(&none).await.unwrap().expect("new still queued");
        assert_eq!((released.event_id.as_str(), released.wait), ("new", None));
    });
}

/// Read-ahead: one head read reads a batch, and the holder hands the rows out in order without
/// a statement each, while its lease (as last read) lasts a delivery timeout plus the clock-skew
/// bound; after that it reads from the store again, where a lease that ended is refused. The
/// lease is ended by fiat here (no real expiry passes), which is exactly what read-ahead may
/// not see: within the window the holder reads on, after it it is refused.
#[test]
fn read_ahead_rows_are_handed_out_only_while_the_lease_lasts() {
    block_on(async {
        use keyorder::store::{LeaseSession, Store, StoreError};
        let fx = SqliteFixture::new("read-ahead");
        let key = conformance::key_on(0, 0);
        let events: Vec<Event> =
            (0..4).map(|i| conformance::event(&format!("r{i}"), &key)).collect();
        fx.enqueue(&events).await;
        let s = fx.store();
        let none = keyorder::drain::ParkedKeys::NONE;
        let mut l = s.acquire(PartitionId(0)).await.unwrap().unwrap();
        let first = l.fetch_head(&none).await.unwrap().expect("r0");
        assert_eq!(first.event_id, "r0");
        // Taken from under the holder without its expiry passing.
        fx.conn()
            .execute(
                "UPDATE keyorder_lease SET holder = 'thief', epoch = epoch + 1000, expires_at = 0",
                [],
            )
            .unwrap();
        assert_eq!(
            l.fetch_head(&none).await.unwrap().map(|h| h.event_id),
            Some("r0".into()),
            "not acknowledged: the same head"
        );
        l.ack(first.seq).await.unwrap();
        let second = l.fetch_head(&none).await.unwrap().expect("read ahead");
        assert_eq!(second.event_id, "r1", "in order, from the rows read ahead");
        tokio::time::sleep(read_ahead_window(&options())).await;
        assert!(
            matches!(l.fetch_head(&none).await, Err(StoreError::LeaseNotHeld { .. })),
            "past the window the holder reads from the store, and is refused"
        );
        assert_eq!(fx.queued().await.len(), 4, "the lost lease deleted nothing");
    });
}

/// With `read_ahead` 1 every head is its own fenced statement: a lease ended by fiat is refused
/// at once. The same steps as above, so the window above is read-ahead's, not the fixture's.
#[test]
fn without_read_ahead_each_head_is_read_under_the_fence() {
    block_on(async {
        use keyorder::store::{LeaseSession, Store, StoreError};
        let fx = SqliteFixture::new("no-read-ahead");
        let key = conformance::key_on(0, 0);
        let events: Vec<Event> =
            (0..4).map(|i| conformance::event(&format!("r{i}"), &key)).collect();
        fx.enqueue(&events).await;
        let mut o = options();
        o.read_ahead = 1;
        let s = SqliteStore::new(&fx.file, count(), o, TokioClock::start()).unwrap();
        let none = keyorder::drain::ParkedKeys::NONE;
        let mut l = s.acquire(PartitionId(0)).await.unwrap().unwrap();
        let first = l.fetch_head(&none).await.unwrap().expect("r0");
        l.ack(first.seq).await.unwrap();
        fx.conn()
            .execute(
                "UPDATE keyorder_lease SET holder = 'thief', epoch = epoch + 1000, expires_at = 0",
                [],
            )
            .unwrap();
        assert!(matches!(l.fetch_head(&none).await, Err(StoreError::LeaseNotHeld { .. })));
    });
}
