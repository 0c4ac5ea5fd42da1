//! The store conformance suite, written once against the `Store` trait and run against every
//! store (SQLite in tests/sqlite, PostgreSQL in tests/pg). A behaviour that differs between
//! stores is a bug in one of them.
//!
//! Each case takes a [`Fixture`]: a fresh, migrated database and the few things the trait does
//! not cover (enqueue, what the tables hold, and breaking a lease the way that store loses one).

#![allow(dead_code, async_fn_in_trait)]

use std::time::Duration;

use keyorder::drain::ParkedKeys;
use keyorder::key::Event;
use keyorder::store::{Handover, LeaseSession, MembershipSession, Store, StoreError};
use keyorder::{PartitionCount, PartitionId, Router};

/// The partition count every case routes with.
pub const PARTITIONS: i64 = 4;

pub fn count() -> PartitionCount {
    PartitionCount::new(PARTITIONS).unwrap()
}

/// One fresh database of the store under test.
pub trait Fixture {
    /// The store.
    type S: Store;
    /// Whether the store records how a lease was given up (`LeaseSession::handover`); one that
    /// does not answers `Unclean` always, which is safe but slower, and skips those checks.
    const RECORDS_HANDOVER: bool = true;
    /// A new store handle (as a new worker process would make).
    fn store(&self) -> Self::S;
    /// Enqueues `events` routed over [`PARTITIONS`]; returns (inserted, duplicate ids).
    async fn enqueue(&self, events: &[Event]) -> (u64, Vec<String>);
    /// Rows in the queue, `(seq, partition)` in seq order.
    async fn queued(&self) -> Vec<(i64, u16)>;
    /// Dead-lettered rows: `(seq, event_id, attempts, reason)`.
    async fn dead(&self) -> Vec<(i64, String, i64, String)>;
    /// `(partition, depth, head attempts, keys)` as the store's lag report gives them, and
    /// each partition's oldest wait in seconds.
    async fn lag(&self) -> Vec<((i64, i64, i64, i64), f64)>;
    /// The head row's `(attempts, last_error)` of `seq`.
    async fn row(&self, seq: i64) -> Option<(i64, Option<String>)>;
    /// Makes `partition`'s current lease lost the way this store loses one (PostgreSQL: the
    /// session is killed; SQLite: its expiry passes).
    async fn break_lease(&self, partition: PartitionId);
}

pub fn event(id: &str, key: &str) -> Event {
    Event {
        event_id: id.into(),
        tenant_id: "t".into(),
        subscription_id: key.into(),
        resource_id: "r".into(),
        payload: serde_json::json!({"id": id}),
    }
}

/// A key that routes to `partition`.
pub fn key_on(partition: u16, n: usize) -> String {
    let router = Router::new(count());
    (0..).map(|i| format!("k{partition}-{n}-{i}")).find(|k| router.route(k).0 == partition).unwrap()
}

async fn lease<S: Store>(s: &S, p: u16) -> S::Lease {
    s.acquire(PartitionId(p)).await.expect("acquire").expect("partition is free")
}

/// Takes `p` over after its lease was broken: a killed PostgreSQL session frees its lock a
/// moment later, so this tries for a while.
async fn take_over<S: Store>(s: &S, p: u16) -> S::Lease {
    for _ in 0..250 {
        if let Some(l) = s.acquire(PartitionId(p)).await.expect("acquire") {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("partition {p} was not free 5 s after its lease was broken");
}

/// Reads and acknowledges every head of `lease`'s partition; returns the seqs in order.
async fn drain_all<L: LeaseSession>(lease: &mut L) -> Vec<i64> {
    let mut seqs = Vec::new();
    for _ in 0..10_000 {
        let Some(h) = lease.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.expect("fetch")
        else {
            return seqs;
        };
        seqs.push(h.seq.0);
        lease.ack(h.seq).await.expect("ack");
    }
    panic!("partition did not drain");
}

/// Heads come in seq order per partition, only that partition's, and the queue drains to zero.
pub async fn fifo_per_partition<F: Fixture>(fx: &F) {
    let mut events = Vec::new();
    for round in 0..5 {
        for p in 0..PARTITIONS as u16 {
            for k in 0..2 {
                let key = key_on(p, k);
                events.push(event(&format!("{key}-{round}"), &key));
            }
        }
    }
    assert_eq!(fx.enqueue(&events).await.0, events.len() as u64);
    let queued = fx.queued().await;
    let s = fx.store();
    for p in 0..PARTITIONS as u16 {
        let mut l = lease(&s, p).await;
        let got = drain_all(&mut l).await;
        let want: Vec<i64> = queued.iter().filter(|(_, q)| *q == p).map(|(s, _)| *s).collect();
        assert_eq!(got, want, "partition {p}: heads out of seq order, or another's rows");
        l.release(Handover::Clean).await.expect("release");
    }
    assert!(fx.queued().await.is_empty(), "the queue drained to zero");
    assert!(fx.lag().await.is_empty(), "lag of an empty queue lists no partition");
}

/// One holder per partition; a release lets the next in with a newer epoch and a clean
/// handover, which a fresh partition has too.
pub async fn lease_exclusivity_and_clean_handover<F: Fixture>(fx: &F) {
    let (a, b) = (fx.store(), fx.store());
    let first = lease(&a, 0).await;
    let handover = |l: &<F::S as Store>::Lease, want: Handover| {
        let got = l.handover();
        if F::RECORDS_HANDOVER {
            assert_eq!(got, want);
        } else {
            assert_eq!(got, Handover::Unclean, "a store that does not record it says Unclean");
        }
    };
    handover(&first, Handover::Clean); // never leased
    assert!(b.acquire(PartitionId(0)).await.unwrap().is_none(), "a second holder got the lease");
    assert!(a.acquire(PartitionId(0)).await.unwrap().is_none(), "the same store got it twice");
    assert!(b.acquire(PartitionId(1)).await.unwrap().is_some(), "another partition is free");
    let epoch = first.epoch();
    first.release(Handover::Clean).await.expect("release");
    let second = lease(&b, 0).await;
    assert!(second.epoch() > epoch, "the new lease has a newer epoch");
    handover(&second, Handover::Clean); // released clean
    second.release(Handover::Unclean).await.expect("release");
    let third = lease(&a, 0).await;
    handover(&third, Handover::Unclean); // released unclean
}

/// A lost lease reads no head and acknowledges nothing; the next holder sees it as unclean and
/// finds the rows the lost one did not get to acknowledge.
pub async fn fencing_after_lease_loss<F: Fixture>(fx: &F) {
    let key = key_on(0, 0);
    let events: Vec<Event> = (0..3).map(|i| event(&format!("f{i}"), &key)).collect();
    fx.enqueue(&events).await;
    let (a, b) = (fx.store(), fx.store());
    let mut old = lease(&a, 0).await;
    let head = old.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().expect("a head");
    fx.break_lease(PartitionId(0)).await;
    let new = take_over(&b, 0).await;
    // PostgreSQL serves rows it read ahead for up to its ack delay (50 ms) after it last heard
    // from the server; a new holder's takeover wait covers that. Step past it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(new.epoch() > old.epoch(), "the new lease has a newer epoch");
    assert_eq!(new.handover(), Handover::Unclean, "a lost lease is an unclean handover");
    // The old holder may buffer the acknowledgement, but it must never reach the table.
    let acked = old.ack(head.seq).await;
    let next = old.fetch_head(&keyorder::drain::ParkedKeys::NONE).await;
    let released = old.release(Handover::Clean).await;
    assert!(next.is_err(), "a lost lease read the next head: {next:?}");
    assert!(acked.is_err() || released.is_err(), "the lost lease's acknowledgement went through");
    if let Err(e) = &next {
        assert!(
            matches!(
                e,
                StoreError::LeaseNotHeld { .. } | StoreError::Backend { .. } | StoreError::Io(_)
            ),
            "{e:?}"
        );
    }
    assert_eq!(fx.queued().await.len(), 3, "a lost lease acknowledged a row");
    let mut new = new;
    assert_eq!(
        new.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().map(|h| h.seq),
        Some(head.seq)
    );
}

/// A failed attempt is recorded with its error and backoff (`not_before`): the head comes back
/// with the attempt count and a wait no longer than the backoff.
pub async fn retry_bookkeeping<F: Fixture>(fx: &F) {
    fx.enqueue(&[event("r0", &key_on(1, 0)), event("r1", &key_on(1, 0))]).await;
    let s = fx.store();
    let mut l = lease(&s, 1).await;
    let head = l.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().unwrap();
    assert_eq!((head.attempts, head.wait, head.last_error.clone()), (0, None, None));
    l.schedule_retry(head.seq, 1, Duration::from_secs(30), "HTTP 503").await.unwrap();
    let again = l.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().unwrap();
    assert_eq!(again.seq, head.seq, "the retried row stays the head");
    assert_eq!(again.attempts, 1);
    assert_eq!(again.last_error.as_deref(), Some("HTTP 503"));
    let wait = again.wait.expect("a recorded backoff");
    assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30), "{wait:?}");
    assert_eq!(fx.row(head.seq.0).await, Some((1, Some("HTTP 503".into()))));
    l.schedule_retry(head.seq, 2, Duration::ZERO, "timeout").await.unwrap();
    let due = l.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().unwrap();
    assert_eq!((due.attempts, due.wait), (2, None), "a due retry has no wait");
    let lag: Vec<_> = fx.lag().await.into_iter().map(|(l, _)| l).collect();
    assert_eq!(lag, vec![(1, 2, 2, 1)], "lag shows depth 2 and the head's attempts");
}

/// Dead-lettering moves the row to the DLQ with its reason and attempts, atomically: the row is
/// in exactly one of the two tables, and the next row becomes the head.
pub async fn dead_letter_moves_atomically<F: Fixture>(fx: &F) {
    fx.enqueue(&[event("d0", &key_on(2, 0)), event("d1", &key_on(2, 0))]).await;
    let s = fx.store();
    let mut l = lease(&s, 2).await;
    let head = l.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().unwrap();
    l.dead_letter(head.seq, 5, "HTTP 500 five times").await.unwrap();
    assert_eq!(fx.dead().await, vec![(head.seq.0, "d0".into(), 5, "HTTP 500 five times".into())]);
    let queued: Vec<i64> = fx.queued().await.iter().map(|(s, _)| *s).collect();
    assert!(!queued.contains(&head.seq.0), "the dead-lettered row is still queued");
    let next = l.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().unwrap();
    assert_eq!(next.event_id, "d1");
    // A lost lease cannot dead-letter: neither table changes.
    fx.break_lease(PartitionId(2)).await;
    let _taker = take_over(&fx.store(), 2).await;
    assert!(l.dead_letter(next.seq, 5, "late").await.is_err(), "a lost lease dead-lettered");
    assert_eq!(fx.dead().await.len(), 1);
    assert_eq!(fx.queued().await.len(), 1);
}

/// A head read passes over the rows of parked keys (the first row left is its key's oldest),
/// under the same fence; once a key is unparked its oldest row, behind every row read since,
/// is the head again (a read cursor or read-ahead buffer must not hide it).
pub async fn parked_keys_are_skipped_then_found_again<F: Fixture>(fx: &F) {
    let (a, b) = (key_on(0, 0), key_on(0, 1));
    let names = ["a0", "b0", "a1", "b1", "b2", "b3"];
    let events: Vec<Event> =
        names.iter().map(|n| event(n, if n.starts_with('a') { &a } else { &b })).collect();
    fx.enqueue(&events).await;
    let s = fx.store();
    let mut l = lease(&s, 0).await;
    let none = ParkedKeys::NONE;
    let parked = ParkedKeys::new([a.clone()]);
    let head = l.fetch_head(&none).await.unwrap().unwrap();
    assert_eq!(head.event_id, "a0");
    l.schedule_retry(head.seq, 1, Duration::from_secs(30), "HTTP 503").await.unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        let h = l.fetch_head(&parked).await.unwrap().expect("b's rows are left");
        got.push(h.event_id.clone());
        l.ack(h.seq).await.unwrap();
    }
    assert_eq!(got, ["b0", "b1"], "a parked key's later row was served, or b out of order");
    // Unparked: a0 is the head again, though b2 and b3 come after the last acknowledged row.
    let again = l.fetch_head(&none).await.unwrap().unwrap();
    assert_eq!((again.event_id.as_str(), again.attempts), ("a0", 1), "the unparked head is lost");
    l.ack(again.seq).await.unwrap();
    let order: Vec<String> = {
        let mut v = Vec::new();
        while let Some(h) = l.fetch_head(&none).await.unwrap() {
            v.push(h.event_id.clone());
            l.ack(h.seq).await.unwrap();
            assert!(v.len() <= names.len(), "rows served twice");
        }
        v
    };
    assert_eq!(order, ["a1", "b2", "b3"]);
    // The skipping read is fenced like any other.
    fx.break_lease(PartitionId(0)).await;
    let _taker = take_over(&fx.store(), 0).await;
    assert!(l.fetch_head(&parked).await.is_err(), "a lost lease read past a parked key");
}

/// A duplicate event id is reported and skipped; the rest of the batch goes in.
pub async fn duplicate_event_id<F: Fixture>(fx: &F) {
    let key = key_on(3, 0);
    assert_eq!(fx.enqueue(&[event("x", &key)]).await, (1, vec![]));
    let (n, dups) = fx.enqueue(&[event("x", &key), event("y", &key)]).await;
    assert_eq!((n, dups), (1, vec!["x".to_string()]));
    assert_eq!(fx.queued().await.len(), 2);
}

/// The lag report: depth, keys and oldest wait per partition, and the count of live workers.
pub async fn lag_and_membership<F: Fixture>(fx: &F) {
    let mut events = Vec::new();
    for i in 0..3 {
        events.push(event(&format!("a{i}"), &key_on(0, 0)));
    }
    events.push(event("a3", &key_on(0, 1)));
    events.push(event("b0", &key_on(3, 0)));
    fx.enqueue(&events).await;
    let mut lag = fx.lag().await;
    lag.sort_by_key(|(l, _)| *l);
    let figures: Vec<_> = lag.iter().map(|(l, _)| *l).collect();
    assert_eq!(figures, vec![(0, 4, 0, 2), (3, 1, 0, 1)], "depth 4 of two keys, and 1 of one");
    for (l, wait) in &lag {
        assert!((0.0..60.0).contains(wait), "partition {}: oldest wait {wait} s", l.0);
    }
    let s = fx.store();
    let mut one = s.connect("one").await.unwrap();
    assert_eq!(one.live_workers().await.unwrap(), 1);
    let two = fx.store().connect("two").await.unwrap();
    assert_eq!(one.live_workers().await.unwrap(), 2, "a second worker counts as live");
    assert_eq!(one.partition_count().await.unwrap(), count());
    drop(two);
    // The departed worker stops counting once its session is gone (promptly, but not
    // synchronously: give the store a moment).
    let mut live = 2;
    for _ in 0..100 {
        live = one.live_workers().await.unwrap();
        if live == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(live, 1, "a closed session still counts as live");
}

/// Runs every case, each on a fresh fixture from `make` (given the case's name).
pub async fn all<F: Fixture, Fut: std::future::Future<Output = F>>(
    mut make: impl FnMut(&'static str) -> Fut,
) {
    fifo_per_partition(&make("fifo").await).await;
    lease_exclusivity_and_clean_handover(&make("exclusive").await).await;
    fencing_after_lease_loss(&make("fencing").await).await;
    retry_bookkeeping(&make("retry").await).await;
    dead_letter_moves_atomically(&make("dlq").await).await;
    parked_keys_are_skipped_then_found_again(&make("parked").await).await;
    duplicate_event_id(&make("dup").await).await;
    lag_and_membership(&make("lag").await).await;
}
