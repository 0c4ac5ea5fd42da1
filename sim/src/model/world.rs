//! The model's world: what the store, the producer and the endpoints hold. Everything here is
//! data the checker hashes; no rule of production's lives here, only the store's semantics
//! (rows visible at commit, advisory locks that end with their session, the dead-letter table)
//! and what the endpoints have seen.

use keyorder::{Epoch, Seq, Time};

/// One event of the configuration: its key and partition are fixed by its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// Its seq: taken when its transaction begins, in index order.
    pub seq: Seq,
    /// Its key's index (`k0`, `k1`, …).
    pub key: u8,
    /// Its partition's index.
    pub partition: u8,
}

impl EventSpec {
    /// The event's id as histories name it.
    pub fn id(&self) -> String {
        format!("e{}", self.seq.0)
    }

    /// The key's name.
    pub fn key_name(&self) -> String {
        format!("k{}", self.key)
    }
}

/// One queue row of a partition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// The event it carries (an index into the configuration's events).
    pub event: u8,
    /// Its place in the partition's order (the event's seq, unless a broken design moved it).
    pub seq: Seq,
    /// Failed attempts recorded.
    pub attempts: u32,
    /// Not to be delivered before this time (a recorded retry).
    pub not_before: Option<Time>,
    /// The last recorded failure.
    pub last_error: Option<String>,
    /// Whether its producer's transaction committed: only committed rows are read.
    pub committed: bool,
}

/// One partition of the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Partition {
    /// Its rows, in seq order.
    pub rows: Vec<Row>,
    /// The epochs of the sessions that hold its advisory lock (at most one unless a broken
    /// design shares it).
    pub holders: Vec<Epoch>,
    /// The last epoch granted.
    pub epoch: Epoch,
    /// Whether the last holder handed the lease back clean (true before the first holder).
    pub clean: bool,
}

impl Partition {
    /// The row of `seq`, if still queued.
    pub fn row_mut(&mut self, seq: Seq) -> Option<&mut Row> {
        self.rows.iter_mut().find(|r| r.seq == seq)
    }
}

/// What an endpoint did with a delivery that reached it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Answer {
    /// A 2xx.
    Accept,
    /// A 503 with a `Retry-After` of the retry cap.
    Refuse,
    /// No answer at all: the worker's delivery timeout ends it.
    Silent,
}

/// A delivery request between a worker and an endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    /// The sending worker.
    pub worker: u8,
    /// The partition it was delivered from.
    pub partition: u8,
    /// The lease it was sent under.
    pub epoch: Epoch,
    /// The event.
    pub event: u8,
    /// The queue row (what the worker acknowledges).
    pub seq: Seq,
    /// The attempt number.
    pub attempt: u32,
    /// When it was sent (the model's clock).
    pub sent: Time,
    /// The endpoint's answer once it arrived.
    pub answer: Option<Answer>,
    /// Its worker stopped waiting (a crash) or its call kept running after the worker's
    /// timeout (a broken design): nobody takes its answer.
    pub orphan: bool,
    /// It may still arrive whatever the clock (the call outlived the worker's timeout).
    pub unbounded: bool,
}

/// The producer: events begin their transactions in seq order; a late one stays open while
/// later events commit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Producer {
    /// The next event whose transaction begins.
    pub next: u8,
    /// Events whose transactions are open (begun, not committed).
    pub open: Vec<u8>,
}

/// The store, the producer and the endpoints.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct World {
    /// The bounded discrete clock (see `docs/design/model-check.md`).
    pub clock: Time,
    /// The partitions.
    pub partitions: Vec<Partition>,
    /// Events in the dead-letter table.
    pub dead: Vec<u8>,
    /// Events an endpoint accepted at least once.
    pub accepted: Vec<bool>,
    /// Deliveries sent and not yet ended.
    pub requests: Vec<Request>,
    /// The producer.
    pub producer: Producer,
}

impl World {
    /// An empty store at time zero, every lock free.
    pub fn new(partitions: u8, events: u8) -> Self {
        let partition =
            Partition { rows: Vec::new(), holders: Vec::new(), epoch: Epoch(0), clean: true };
        World {
            clock: Time::ZERO,
            partitions: vec![partition; usize::from(partitions)],
            dead: Vec::new(),
            accepted: vec![false; usize::from(events)],
            requests: Vec::new(),
            producer: Producer::default(),
        }
    }

    /// The transaction ids running now (an event's xid is its seq).
    pub fn running(&self, events: &[EventSpec]) -> Vec<u64> {
        self.producer.open.iter().map(|&e| events[usize::from(e)].seq.0 as u64).collect()
    }

    /// Whether every event is out of the queue and the producer is done.
    pub fn drained(&self, events: u8) -> bool {
        self.producer.next == events
            && self.producer.open.is_empty()
            && self.partitions.iter().all(|p| p.rows.is_empty())
    }
}
