//! A delivery history: what the checker judges. Drivers record it; nothing here decides.

use serde::{Deserialize, Serialize};

use crate::ids::{Epoch, PartitionId, Seq, Time};

/// Everything observed in one run, each list in the order it was observed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    /// Events that committed into the queue.
    pub enqueued: Vec<Enqueued>,
    /// Delivery attempts as the endpoints saw them, in arrival order.
    pub deliveries: Vec<Delivery>,
    /// Rows deleted after a successful delivery.
    pub acks: Vec<Acked>,
    /// Rows moved to the dead-letter table.
    pub dead_letters: Vec<DeadLettered>,
    /// Lease acquisitions, releases and losses.
    pub leases: Vec<LeaseChange>,
    /// Rows still in the queue when the history ends: stuck, not lost.
    #[serde(default)]
    pub queued_at_end: Vec<Seq>,
    /// When the history ends (the end of the quiescent tail).
    pub end: Time,
    /// Enqueues that rolled back: events that must never be delivered. Empty for a simulated
    /// history.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aborted: Vec<Enqueued>,
}

/// An event that committed into the queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enqueued {
    /// The event's id.
    pub event_id: String,
    /// Its partition key.
    pub key: String,
    /// Its queue sequence number: the per-key order.
    pub seq: Seq,
    /// The partition the producer routed it to.
    pub partition: PartitionId,
    /// The layout (partition-count epoch) it was routed under.
    #[serde(default)]
    pub layout: u64,
    /// When it became visible (its commit).
    pub at: Time,
}

/// How the endpoint answered a delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A 2xx: the endpoint has the event.
    Accepted,
    /// Anything else, with what it was.
    Rejected(String),
}

/// One delivery attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The event's id.
    pub event_id: String,
    /// Its partition key.
    pub key: String,
    /// Its queue sequence number.
    pub seq: Seq,
    /// The partition it was delivered from.
    pub partition: PartitionId,
    /// The attempt number the worker gave it.
    pub attempt: u32,
    /// The delivering worker.
    pub worker: String,
    /// When the worker sent it.
    pub sent_at: Time,
    /// When the endpoint received it.
    pub arrived_at: Time,
    /// When the worker stopped waiting for it (answer or timeout); `None` if it never did
    /// (it crashed), in which case the delivery counts as ending when it arrived.
    pub finished_at: Option<Time>,
    /// The endpoint's answer.
    pub outcome: Outcome,
}

impl Delivery {
    /// When the worker's delivery ended, for the one-in-flight check.
    pub fn end(&self) -> Time {
        self.finished_at.unwrap_or(self.arrived_at).max(self.sent_at)
    }
}

/// A row deleted after delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acked {
    /// The row.
    pub seq: Seq,
    /// When the delete committed.
    pub at: Time,
}

/// A row moved to the dead-letter table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLettered {
    /// The row.
    pub seq: Seq,
    /// The recorded reason.
    pub reason: String,
    /// When the move committed.
    pub at: Time,
}

/// A change of a partition's owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseChange {
    /// The partition.
    pub partition: PartitionId,
    /// The worker.
    pub worker: String,
    /// The lease's epoch.
    pub epoch: Epoch,
    /// What happened.
    pub change: LeaseEvent,
    /// When the store saw it.
    pub at: Time,
}

/// What happened to a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseEvent {
    /// The worker took it.
    Acquired,
    /// The worker gave it back.
    Released,
    /// The store dropped it (the session died).
    Lost,
}
