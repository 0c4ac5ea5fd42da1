//! The drain machine's timers: a fixed table, no heap, fixed order (as quinn-proto's).

use crate::ids::Time;

/// Why the machine wants to wake up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Timer {
    /// A failed head may be delivered again.
    Retry = 0,
    /// An empty partition looks at its head again.
    IdlePoll = 1,
    /// A new lease may start delivering: the previous holder's delivery has timed out.
    Takeover = 2,
    /// The earliest parked key is due again.
    Parked = 3,
}

/// Firing order. A due parked key fires first, so that a read started by another timer at the
/// same instant already includes the unparked key.
const TIMERS: [Timer; 4] = [Timer::Parked, Timer::Retry, Timer::IdlePoll, Timer::Takeover];

/// One optional deadline per [`Timer`].
#[derive(Clone, Debug, Default)]
pub(super) struct TimerTable {
    data: [Option<Time>; 4],
}

impl TimerTable {
    pub(super) fn set(&mut self, timer: Timer, at: Time) {
        self.data[timer as usize] = Some(at);
    }

    pub(super) fn clear(&mut self, timer: Timer) {
        self.data[timer as usize] = None;
    }

    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Time> {
        self.data.iter().flatten().min().copied()
    }

    /// Clears and returns one timer due at `now`, in table order.
    pub(super) fn expired(&mut self, now: Time) -> Option<Timer> {
        let timer =
            TIMERS.into_iter().find(|t| self.data[*t as usize].is_some_and(|at| at <= now))?;
        self.data[timer as usize] = None;
        Some(timer)
    }
}
