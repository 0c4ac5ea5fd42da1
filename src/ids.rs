//! Newtypes for the identifiers and quantities the core passes around.
//!
//! Each one is a distinct type so that a partition can never be passed where a sequence number
//! is expected, and so that JSON, traces and tables print them the same way everywhere.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A partition index, always below the [`PartitionCount`](crate::PartitionCount) it was routed
/// with. Stored in PostgreSQL as a `SMALLINT`, hence `u16` with a maximum of 32,766.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PartitionId(pub u16);

/// The queue's sequence number (`delivery_queue.seq`, a `BIGSERIAL`): FIFO order within a
/// partition, and enqueue order for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Seq(pub i64);

/// A lease generation. Every acquisition of a partition's lease gets a strictly larger epoch
/// than the one before it, so a statement fenced by an older epoch can be refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Epoch(pub u64);

/// A point on the caller's clock, as the time elapsed since the caller's origin.
///
/// The core never reads a clock: drivers pass `Time` in. A simulation passes simulated time,
/// production passes the time since the worker started. Traces print it in milliseconds.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Time(#[serde(with = "micros")] pub Duration);

impl Time {
    /// The origin of the caller's clock.
    pub const ZERO: Time = Time(Duration::ZERO);

    /// A time `ms` milliseconds after the origin.
    pub const fn from_millis(ms: u64) -> Time {
        Time(Duration::from_millis(ms))
    }

    /// The time elapsed since the origin, in whole milliseconds.
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }

    /// `self + d`, saturating instead of overflowing.
    pub fn saturating_add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d))
    }

    /// The duration from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

mod micros {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_micros)
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0.as_micros();
        write!(f, "{}.{:03}ms", micros / 1000, micros % 1000)
    }
}
