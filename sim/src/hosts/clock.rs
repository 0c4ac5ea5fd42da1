//! The clock the simulated workers and their store clients read: simulated time, offset by a
//! worker's clock skew.

use std::time::Duration;

use keyorder::clock::Clock;
use keyorder::Time;

use crate::trace::now;

/// Simulated time as a worker sees it: the store's clock plus the worker's offset (0 unless
/// the scenario skews it), never before the start.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimClock {
    /// This clock's offset from the store's, in ms.
    pub offset_ms: i64,
}

impl Clock for SimClock {
    fn now(&self) -> Time {
        let t = now();
        let offset = Duration::from_millis(self.offset_ms.unsigned_abs());
        Time(if self.offset_ms < 0 { t.0.saturating_sub(offset) } else { t.0 + offset })
    }
}
