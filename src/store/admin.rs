//! What the admin operations report (enqueue, lag, heaviest and split keys, layouts, dead
//! letters): the same types for every store.

use serde::Serialize;

/// What a batch enqueue did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EnqueueReport {
    /// Rows inserted.
    pub inserted: u64,
    /// Event ids already in the queue (the batch went on without them).
    pub duplicates: Vec<String>,
}

/// A layout: a partition count in force from an epoch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// The epoch rows routed under it carry.
    pub epoch: i32,
    /// Its partition count.
    pub partitions: u16,
}

/// One partition's lag.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PartitionLag {
    /// The partition.
    pub partition: i16,
    /// Rows queued.
    pub depth: i64,
    /// Age of the oldest queued row, in seconds.
    pub oldest_wait_seconds: f64,
    /// Distinct keys queued.
    pub keys_affected: i64,
    /// Failed attempts recorded at the head.
    pub head_attempts: i32,
}

/// A key's queued rows, for skew reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KeyDepth {
    /// The key.
    pub key: String,
    /// Its queued rows.
    pub depth: i64,
}

/// A key queued on more than one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SplitKey {
    /// The key.
    pub key: String,
    /// The partitions it is queued on.
    pub partitions: Vec<i16>,
}

/// A dead-lettered row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeadRow {
    /// The dead-letter id.
    pub id: i64,
    /// Its queue seq, if it came from keyorder.
    pub seq: Option<i64>,
    /// Its partition.
    pub partition: i16,
    /// Its key.
    pub key: String,
    /// Its event id.
    pub event_id: String,
    /// Attempts made.
    pub attempts: i16,
    /// Why.
    pub reason: String,
    /// When, as text.
    pub dead_lettered_at: String,
    /// The payload, as JSON text.
    pub payload: String,
}
