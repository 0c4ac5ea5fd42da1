//! The endpoint boundary: deliver one event, learn whether the endpoint accepted it.

// See `store`: the worker's futures need no `Send` bound.
#![allow(async_fn_in_trait)]

use std::time::Duration;

use crate::drain::Head;
use crate::ids::PartitionId;

/// Why a delivery did not succeed. All of them are retried by the policy.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeliverError {
    /// The endpoint answered with a non-2xx status.
    #[error("HTTP {status}")]
    Status {
        /// The status code.
        status: u16,
        /// The endpoint's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// The endpoint did not answer within the delivery timeout.
    #[error("timed out after {after:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// The endpoint could not be reached or the connection broke.
    #[error("connection failed: {0}")]
    Io(#[from] std::io::Error),
}

impl DeliverError {
    /// The endpoint's minimum delay before the next attempt, if it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            DeliverError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Delivers events to their endpoint. The worker clones one per leased partition, and calls it
/// one event at a time.
pub trait Deliver: Clone + 'static {
    /// Delivers `head` (attempt `attempt`) from `partition`. `Ok` means a 2xx.
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError>;
}
