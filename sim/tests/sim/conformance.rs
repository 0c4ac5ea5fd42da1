//! The store conformance suite (tests/conformance) against the simulation's store: the very
//! client the simulated workers use ([`SimStore`], the `Store` trait over the simulated
//! network) talking to the store host, once with session locks (PostgreSQL's semantics) and
//! once with expiry leases (SQLite's). The suite runs as a simulated host of its own; the fixture reads and writes the store
//! host's state directly, as the other fixtures use SQL beside the trait.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use keyorder::key::{partition_key, Event};
use keyorder::store::{LeaseSession, Store, StoreError};
use keyorder::{PartitionId, Router};
use keyorder_sim::control::{Control, SharedControl};
use keyorder_sim::hosts::store::{self, SharedStore, StoreState};
use keyorder_sim::hosts::store_client::{ExpiryClient, SimStore};
use keyorder_sim::hosts::worker::SimClock;
use keyorder_sim::simulator::Builder;
use keyorder_sim::trace::{Recorder, SharedRecorder};

use super::conformance_suite::{self as suite, count, Fixture};

const REQUEST_TIMEOUT: Duration = Duration::from_millis(800);
const DETECTION: Duration = Duration::from_secs(3);
const EXPIRY: Duration = Duration::from_secs(2);

/// The store host's state (wiped for each case: a fresh database) and a client factory.
struct SimFixture {
    state: SharedStore,
    rec: SharedRecorder,
    control: SharedControl,
    expiry: Option<ExpiryClient>,
    stores: Cell<u32>,
}

impl Fixture for SimFixture {
    type S = SimStore;

    fn store(&self) -> SimStore {
        // Each handle is a worker process of its own, with its own name.
        self.stores.set(self.stores.get() + 1);
        let name = format!("conformance-{}", self.stores.get());
        SimStore::new(
            &name,
            self.control.clone(),
            REQUEST_TIMEOUT,
            SimClock::default(),
            self.expiry,
        )
    }

    async fn enqueue(&self, events: &[Event]) -> (u64, Vec<String>) {
        let router = Router::new(count());
        let (mut inserted, mut duplicates) = (0, Vec::new());
        let mut state = self.state.borrow_mut();
        for e in events {
            let key = partition_key(e).expect("suite events have keys");
            match state.enqueue_committed(&e.event_id, key, router.route(key), &self.rec) {
                Some(_) => inserted += 1,
                None => duplicates.push(e.event_id.clone()),
            }
        }
        (inserted, duplicates)
    }

    async fn queued(&self) -> Vec<(i64, u16)> {
        let state = self.state.borrow();
        let mut rows: Vec<(i64, u16)> =
            state.durable.rows.keys().map(|(p, seq)| (seq.0, p.0)).collect();
        rows.sort_unstable();
        rows
    }

    async fn dead(&self) -> Vec<(i64, String, i64, String)> {
        let state = self.state.borrow();
        let dead = state.durable.dead.iter();
        dead.map(|(seq, row, why)| {
            (seq.0, row.event_id.clone(), i64::from(row.attempts), why.clone())
        })
        .collect()
    }

    async fn lag(&self) -> Vec<((i64, i64, i64, i64), f64)> {
        let state = self.state.borrow();
        let mut lag: Vec<(i64, i64, i64, std::collections::BTreeSet<&str>)> = Vec::new();
        // Rows are in (partition, seq) order: the first of a partition is its head.
        for ((p, _), row) in &state.durable.rows {
            match lag.last_mut() {
                Some(last) if last.0 == i64::from(p.0) => {
                    last.1 += 1;
                    last.3.insert(&row.key);
                }
                _ => lag.push((i64::from(p.0), 1, i64::from(row.attempts), [&*row.key].into())),
            }
        }
        // The simulated store keeps no enqueue time: its rows are as old as the run.
        lag.into_iter()
            .map(|(p, depth, attempts, keys)| ((p, depth, attempts, keys.len() as i64), 0.0))
            .collect()
    }

    async fn row(&self, seq: i64) -> Option<(i64, Option<String>)> {
        let state = self.state.borrow();
        let mut rows = state.durable.rows.iter();
        rows.find(|((_, s), _)| s.0 == seq)
            .map(|(_, r)| (i64::from(r.attempts), r.last_error.clone()))
    }

    async fn break_lease(&self, partition: PartitionId) {
        let broke = self.state.borrow_mut().break_lease(partition, &self.rec);
        assert!(broke, "no lease held partition {partition}");
        if let Some(client) = self.expiry {
            // What the passing of the expiry does to the holder: its own view of the expiry,
            // by which it hands out heads it read ahead, runs out (as the SQLite fixture does).
            let window = EXPIRY.saturating_sub(client.delivery_timeout + client.margin);
            tokio::time::sleep(window + Duration::from_millis(50)).await;
        }
    }
}

/// Runs `client` in one simulation beside a store host with `expiry` leases (`None`:
/// session locks); `client` gets the store's state, the recorder and the client settings.
fn in_sim<Fut>(expiry: Option<Duration>, client: impl FnOnce(Shared) -> Fut + 'static)
where
    Fut: std::future::Future<Output = ()> + 'static,
{
    let mut sim = Builder::new(7).build();
    let state: SharedStore = Rc::new(RefCell::new(StoreState::default()));
    state.borrow_mut().leases = store::Leases::new(expiry);
    let rec: SharedRecorder = Rc::new(RefCell::new(Recorder::default()));
    sim.host("store", store::host(state.clone(), rec.clone(), DETECTION));
    let settings = expiry
        .map(|e| ExpiryClient::new(Duration::from_millis(150), e / 3, Duration::from_millis(500)));
    let shared = Shared { state, rec, expiry: settings };
    let client = async move {
        client(shared).await;
        Ok(())
    };
    sim.run_client("suite", client, Duration::from_secs(3_600))
        .expect("the client's checks pass on the simulated store");
}

/// What a client of [`in_sim`] shares with the store host.
#[derive(Clone)]
struct Shared {
    state: SharedStore,
    rec: SharedRecorder,
    expiry: Option<ExpiryClient>,
}

impl Shared {
    /// A fixture on the store as it is now.
    fn fixture(&self) -> SimFixture {
        SimFixture {
            state: self.state.clone(),
            rec: self.rec.clone(),
            control: Control::new(count()),
            expiry: self.expiry,
            stores: Cell::new(0),
        }
    }
}

/// Runs the whole suite, each case on a wiped store.
fn conforms(expiry: Option<Duration>) {
    in_sim(expiry, |shared| async move {
        suite::all(|_name| {
            shared.state.borrow_mut().wipe();
            let fixture = shared.fixture();
            async move { fixture }
        })
        .await;
    });
}

#[test]
fn the_simulated_store_conforms_with_session_locks() {
    conforms(None);
}

#[test]
fn the_simulated_store_conforms_with_expiry_leases() {
    conforms(Some(EXPIRY));
}

/// The `unfenced-expiry` switch removes the epoch check and nothing else: a holder whose lease
/// expired and was taken over is refused with the check, and with the switch on reads the new
/// holder's head, passes its delivery check (the store answered with the new holder's expiry)
/// and acknowledges the row, so the conformance suite's fencing case would fail on it.
#[test]
fn the_unfenced_expiry_switch_lets_an_expired_holder_advance_the_partition() {
    in_sim(Some(EXPIRY), |shared| async move {
        let fx = shared.fixture();
        let key = suite::key_on(0, 0);
        fx.enqueue(&[suite::event("u0", &key), suite::event("u1", &key)]).await;
        let (a, b) = (fx.store(), fx.store());
        let mut old = a.acquire(PartitionId(0)).await.unwrap().expect("a free partition");
        let head =
            old.fetch_head(&keyorder::drain::ParkedKeys::NONE).await.unwrap().expect("a head");
        fx.break_lease(PartitionId(0)).await;
        let new = b.acquire(PartitionId(0)).await.unwrap().expect("the expired lease is free");
        assert!(new.epoch() > old.epoch());
        let fenced = old.fetch_head(&keyorder::drain::ParkedKeys::NONE).await;
        assert!(matches!(fenced, Err(StoreError::LeaseNotHeld { .. })), "{fenced:?}");

        shared.state.borrow_mut().durable.breaks.unfenced_expiry = true;
        let unfenced = old
            .fetch_head(&keyorder::drain::ParkedKeys::NONE)
            .await
            .expect("unfenced, the old holder reads on");
        assert_eq!(unfenced.map(|h| h.seq), Some(head.seq), "the new holder's head");
        old.ensure_lasts(Duration::from_millis(400)).await.expect("and trusts the answered expiry");
        old.ack(head.seq).await.expect("unfenced, the old holder acknowledges");
        // The hand-back deletes the buffered acknowledgement first (loosely, like the other
        // queue statements), then is refused: hand-backs stay fenced.
        let handback = old.release(keyorder::store::Handover::Clean).await;
        assert!(matches!(handback, Err(StoreError::LeaseNotHeld { .. })), "{handback:?}");
        assert_eq!(fx.queued().await.len(), 1, "the lost lease advanced the partition");
        // The statements renewed the lease they found, which stays the new holder's.
        let row = shared.state.borrow().leases.expiry_row(PartitionId(0)).cloned().expect("leased");
        assert_eq!(row.epoch, new.epoch(), "the lease is still the new holder's");
    });
}

/// An expiry lease's acknowledgements are buffered and deleted together, as production
/// SQLite's are: none while the partition has rows after the cursor, all of them once a head
/// read finds it empty. A lease lost with acknowledgements still buffered deletes none of them
/// (its flush is refused), so the next holder delivers those rows again.
#[test]
fn an_expiry_leases_acknowledgements_are_deleted_together_and_a_lost_one_deletes_none() {
    in_sim(Some(EXPIRY), |shared| async move {
        let fx = shared.fixture();
        let key = suite::key_on(0, 0);
        let none = keyorder::drain::ParkedKeys::NONE;
        fx.enqueue(&(0..3).map(|i| suite::event(&format!("b{i}"), &key)).collect::<Vec<_>>()).await;
        let a = fx.store();
        let mut lease = a.acquire(PartitionId(0)).await.unwrap().expect("a free partition");
        for _ in 0..3 {
            let head = lease.fetch_head(&none).await.unwrap().expect("a head");
            lease.ack(head.seq).await.unwrap();
        }
        assert_eq!(fx.queued().await.len(), 3, "buffered, not yet deleted");
        assert!(lease.fetch_head(&none).await.unwrap().is_none(), "nothing after the cursor");
        assert_eq!(fx.queued().await.len(), 0, "the empty read deleted them together");

        fx.enqueue(&[suite::event("b3", &key), suite::event("b4", &key)]).await;
        let head = lease.fetch_head(&none).await.unwrap().expect("a head");
        lease.ack(head.seq).await.unwrap();
        fx.break_lease(PartitionId(0)).await;
        // A delivery (500 ms) no longer fits what the holder knows: the renewal is refused.
        let ended = lease.ensure_lasts(Duration::from_millis(500)).await;
        assert!(matches!(ended, Err(StoreError::LeaseNotHeld { .. })), "{ended:?}");
        assert_eq!(fx.queued().await.len(), 2, "the lost lease's acknowledgement stays queued");
        let b = fx.store();
        let mut next = b.acquire(PartitionId(0)).await.unwrap().expect("the expired lease");
        let again = next.fetch_head(&none).await.unwrap().expect("a head");
        assert_eq!(again.seq, head.seq, "the next holder delivers it again");
    });
}
