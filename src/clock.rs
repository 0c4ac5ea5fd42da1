//! The one clock the worker reads. The core never reads one; the worker reads this, so a
//! simulation can substitute simulated time.

use crate::ids::Time;

/// A monotonic clock measured from the clock's own origin.
pub trait Clock {
    /// The current time.
    fn now(&self) -> Time;
}

/// Production time: tokio's monotonic clock (paused in the simulation, or by
/// `tokio::time::pause`), measured from the moment this clock was made.
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn start() -> Self {
        #[allow(clippy::disallowed_methods)] // the one place the worker reads the time
        let start = tokio::time::Instant::now();
        Self { start }
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Time {
        #[allow(clippy::disallowed_methods)] // the one place the worker reads the time
        let now = tokio::time::Instant::now();
        Time(now.duration_since(self.start))
    }
}
