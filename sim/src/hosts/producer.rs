//! The producer host: enqueues its keys' events at their planned times, routing each with its
//! own routing under the configuration in force (a pinned key to its pin, any other by its hash
//! under the count), in one transaction per event (insert, commit latency, commit).
//! One producer owns each key and enqueues its events one after another, so a key's seq order
//! is its commit order. A producer honours the pause switch between events.
//!
//! The `unserialised-producers` design breaks that: its producers run every event's
//! transaction on its own connection, started at the event's planned time (a process with a
//! connection pool), with commit times that vary, so transactions of one key overlap and may
//! commit out of seq order.

use std::rc::Rc;
use std::time::Duration;

use keyorder::{partition_for, PartitionCount, PartitionId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::control::SharedControl;
use crate::protocol::{Conn, StoreRequest, StoreResponse, STORE_PORT};
use crate::trace::{now, SharedRecorder};

/// Pause between reconnection attempts after a store error.
const RECONNECT_AFTER: Duration = Duration::from_millis(50);
/// Poll interval while paused.
const PAUSE_POLL: Duration = Duration::from_millis(5);

/// One planned event.
#[derive(Clone, Debug)]
pub struct Planned {
    /// When to enqueue it.
    pub at: Duration,
    /// Its key.
    pub key: String,
    /// Its id, `key#n`.
    pub event_id: String,
}

/// How a producer maps keys to partitions.
#[derive(Clone, Copy, Debug)]
pub enum Routing {
    /// The contract: BLAKE2b-8, big-endian, modulo the count in force.
    Blake2b,
    /// `random-hash`: a hash seeded per producer process, as Python's `hash()` is.
    Seeded(u64),
}

impl Routing {
    fn route(self, key: &str, count: PartitionCount) -> PartitionId {
        match self {
            Routing::Blake2b => partition_for(key, count),
            Routing::Seeded(seed) => partition_for(&format!("{seed:016x}/{key}"), count),
        }
    }
}

/// Everything a producer host is built from.
#[derive(Clone)]
pub struct ProducerHost {
    /// Producer index.
    pub index: usize,
    /// Its events, sorted by time.
    pub plan: Rc<[Planned]>,
    /// Its routing.
    pub routing: Routing,
    /// How long a transaction stays open.
    pub commit_latency: Duration,
    /// Extra open time drawn per transaction from `[0, commit_jitter]` (used by
    /// `unserialised-producers`, whose transactions race).
    pub commit_jitter: Duration,
    /// Seed of the jitter draws.
    pub rng_seed: u64,
    /// `unserialised-producers`: each event's transaction runs on its own connection from its
    /// planned time, beside the producer's other open transactions.
    pub concurrent: bool,
    /// Store request timeout.
    pub request_timeout: Duration,
    /// The configuration plane.
    pub control: SharedControl,
    /// The run's recorder.
    pub rec: SharedRecorder,
}

enum Enqueued {
    Done,
    Retry,
}

impl ProducerHost {
    /// The host factory.
    pub fn factory(self) -> impl Fn() -> crate::simulator::HostFuture {
        move || {
            let this = self.clone();
            Box::pin(async move {
                this.run().await;
                Ok(())
            })
        }
    }

    fn name(&self) -> String {
        format!("producer-{}", self.index)
    }

    async fn run(&self) {
        if self.concurrent {
            self.run_concurrent().await;
        } else {
            self.run_serial().await;
        }
        self.control.borrow_mut().finished.insert(self.index);
        self.rec.borrow_mut().log(
            now(),
            &self.name(),
            format_args!("finished {} events", self.plan.len()),
        );
    }

    /// The contract: one transaction at a time, in plan order, over one connection.
    async fn run_serial(&self) {
        let mut conn: Option<Conn> = None;
        let mut rng = StdRng::seed_from_u64(self.rng_seed);
        for event in self.plan.iter() {
            let wait = event.at.saturating_sub(now().0);
            tokio::time::sleep(wait).await;
            loop {
                self.wait_while_paused().await;
                let jitter_us = rng.random_range(0..=self.commit_jitter.as_micros() as u64);
                let outcome =
                    self.enqueue(&mut conn, event, Duration::from_micros(jitter_us)).await;
                self.control.borrow_mut().leave(self.index);
                match outcome {
                    Enqueued::Done => break,
                    Enqueued::Retry => {
                        conn = None;
                        tokio::time::sleep(RECONNECT_AFTER).await;
                    }
                }
            }
        }
    }

    /// `unserialised-producers`: every event starts its own transaction on its own connection
    /// at its planned time, whatever else is open; returns when all have committed.
    async fn run_concurrent(&self) {
        let mut rng = StdRng::seed_from_u64(self.rng_seed);
        let mut open = tokio::task::JoinSet::new();
        for event in self.plan.iter() {
            let wait = event.at.saturating_sub(now().0);
            tokio::time::sleep(wait).await;
            let jitter_us = rng.random_range(0..=self.commit_jitter.as_micros() as u64);
            let (this, event) = (self.clone(), event.clone());
            open.spawn_local(async move {
                let mut conn: Option<Conn> = None;
                loop {
                    this.wait_while_paused().await;
                    let jitter = Duration::from_micros(jitter_us);
                    let outcome = this.enqueue(&mut conn, &event, jitter).await;
                    this.control.borrow_mut().leave(this.index);
                    match outcome {
                        Enqueued::Done => break,
                        Enqueued::Retry => {
                            conn = None;
                            tokio::time::sleep(RECONNECT_AFTER).await;
                        }
                    }
                }
            });
        }
        while open.join_next().await.is_some() {}
    }

    /// Returns once producers may enqueue, marked busy in the same instant (no await between
    /// the check and the mark), so the driver never sees an unpaused producer as idle.
    async fn wait_while_paused(&self) {
        while self.control.borrow().paused {
            tokio::time::sleep(PAUSE_POLL).await;
        }
        self.control.borrow_mut().enter(self.index);
    }

    async fn enqueue(
        &self,
        conn: &mut Option<Conn>,
        event: &Planned,
        jitter: Duration,
    ) -> Enqueued {
        let conn = match conn {
            Some(c) => c,
            None => match Conn::connect(("store", STORE_PORT), self.request_timeout).await {
                Ok(c) => conn.insert(c),
                Err(_) => return Enqueued::Retry,
            },
        };
        // Count, pins and their layout epoch are read together: a row's layout always names
        // the routing it was routed with.
        let (count, pin, layout) = {
            let control = self.control.borrow();
            (control.count, control.pin_of(&event.key), control.layout)
        };
        let partition = pin.unwrap_or_else(|| self.routing.route(&event.key, count));
        let insert = StoreRequest::Insert {
            event_id: event.event_id.clone(),
            key: event.key.clone(),
            partition,
            layout,
        };
        match conn.call(&insert, "insert", self.request_timeout).await {
            Ok(StoreResponse::Inserted) => {}
            Ok(StoreResponse::Duplicate) => return Enqueued::Done,
            _ => return Enqueued::Retry,
        }
        let slow = self.control.borrow().slow_commits.get(&self.index).copied();
        tokio::time::sleep(self.commit_latency + jitter + slow.unwrap_or_default()).await;
        match conn.call(&StoreRequest::Commit, "commit", self.request_timeout).await {
            // A duplicate means an earlier, ambiguous commit of this event did land.
            Ok(StoreResponse::Ok | StoreResponse::Duplicate) => Enqueued::Done,
            _ => Enqueued::Retry,
        }
    }
}
