//! One definition of the session liveness bound, checked by `keyorder work` at start and by the
//! simulation when it loads a scenario.
//!
//! A partition's lease on PostgreSQL (and in the simulation's session-lock model) lives as long
//! as its session. The store ends a session that has been silent for the *session timeout*
//! (PostgreSQL: `idle_session_timeout`, set per session; the simulation: `detection_ms`), so a
//! frozen or cut-off worker's leases and membership end within that bound. Two things must hold
//! for this to be safe and to never end a healthy session:
//!
//! * **Fencing.** A holder starts a delivery only while, by its own clock, its session was heard
//!   less than `session_timeout − delivery_timeout − margin` ago (see
//!   [`LivenessConfig::delivery_window`]); the delivery then ends (answered or timed out) before
//!   the store can end the session and hand the lease on. A head read answered within the
//!   request timeout must leave that window open: the bound exceeds delivery timeout + request
//!   timeout + margin.
//! * **No false expiry.** A healthy session is never silent longer than its longest quiet
//!   period (the rebalance period for membership; for a lease the idle poll or the backoff cap,
//!   cut short by the keep-alive every third of the bound, during a delivery too), and a
//!   statement sent then is answered within the request timeout: the bound exceeds the longest
//!   quiet period plus the request timeout.

use std::time::Duration;

/// The timings the liveness bound is judged against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LivenessConfig {
    /// How long one delivery may take.
    pub delivery_timeout: Duration,
    /// How long any store call may take before the session is presumed dead.
    pub request_timeout: Duration,
    /// How long the store lets a session stay silent before it ends it (and its locks).
    pub session_timeout: Duration,
    /// How often the membership session speaks (the rebalance period).
    pub rebalance_every: Duration,
    /// The longest a lease session waits between statements on its own: the larger of the idle
    /// poll and the backoff cap (the keep-alive cuts it to a third of the bound).
    pub lease_quiet: Duration,
    /// Slack for how stale the holder's record of "last heard" may be (a store that serves
    /// read-ahead rows without a round trip for up to this long; clock-rate differences).
    pub margin: Duration,
}

/// A liveness configuration that breaks one of the rules, with the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LivenessError {
    /// A timeout is zero.
    #[error("the {what} must be greater than zero")]
    Zero {
        /// Which timeout.
        what: &'static str,
    },
    /// The bound does not leave a delivery started after a timely head read time to end.
    #[error(
        "the session timeout ({session:?}) must exceed the delivery timeout ({delivery:?}) + the request timeout ({request:?}) + the margin ({margin:?}), else a cut-off worker may still be delivering when its lease moves"
    )]
    Fencing {
        /// The session timeout.
        session: Duration,
        /// The delivery timeout.
        delivery: Duration,
        /// The request timeout.
        request: Duration,
        /// The margin.
        margin: Duration,
    },
    /// A healthy session may stay silent for longer than the bound.
    #[error(
        "the session timeout ({session:?}) must exceed the longest quiet period of a healthy session ({quiet:?}: rebalance period, or idle poll / backoff cap cut to a third of the bound by the keep-alive) + the request timeout ({request:?}), else a healthy worker loses its leases"
    )]
    Quiet {
        /// The session timeout.
        session: Duration,
        /// The longest quiet period.
        quiet: Duration,
        /// The request timeout.
        request: Duration,
    },
}

/// The default session timeout: three times the larger of the delivery and request timeouts,
/// like SQLite's lease expiry for the delivery timeout (see
/// [`crate::store::sqlite::SqliteOptions::for_delivery_timeout`]), and never so short that a
/// slow store answer breaks the rules (30 s for the defaults, 10 s and 5 s).
pub fn default_session_timeout(delivery_timeout: Duration, request_timeout: Duration) -> Duration {
    delivery_timeout.max(request_timeout).saturating_mul(3)
}

impl LivenessConfig {
    /// How often a lease session is kept alive when it has nothing else to say: a third of the
    /// bound, so two keep-alives may be late or lost before the bound is reached.
    pub fn keep_alive_every(&self) -> Duration {
        self.session_timeout / 3
    }

    /// The longest a healthy session (membership or lease) stays silent.
    pub fn longest_quiet(&self) -> Duration {
        self.rebalance_every.max(self.lease_quiet.min(self.keep_alive_every()))
    }

    /// The longest since its session was last heard that a holder may still start a delivery:
    /// `session_timeout − delivery_timeout − margin` (zero if that is negative).
    pub fn delivery_window(&self) -> Duration {
        self.session_timeout.saturating_sub(self.delivery_timeout + self.margin)
    }

    /// Checks both rules of the module doc; the first broken one is the error.
    pub fn validate(&self) -> Result<(), LivenessError> {
        for (what, d) in [
            ("delivery timeout", self.delivery_timeout),
            ("request timeout", self.request_timeout),
            ("session timeout", self.session_timeout),
        ] {
            if d.is_zero() {
                return Err(LivenessError::Zero { what });
            }
        }
        if self.delivery_timeout + self.request_timeout + self.margin >= self.session_timeout {
            return Err(LivenessError::Fencing {
                session: self.session_timeout,
                delivery: self.delivery_timeout,
                request: self.request_timeout,
                margin: self.margin,
            });
        }
        let quiet = self.longest_quiet();
        if quiet + self.request_timeout >= self.session_timeout {
            return Err(LivenessError::Quiet {
                session: self.session_timeout,
                quiet,
                request: self.request_timeout,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn production() -> LivenessConfig {
        LivenessConfig {
            delivery_timeout: ms(10_000),
            request_timeout: ms(5_000),
            session_timeout: ms(30_000),
            rebalance_every: ms(1_000),
            lease_quiet: ms(30_000),
            margin: ms(50),
        }
    }

    #[test]
    fn the_defaults_hold_and_the_keep_alive_cuts_the_backoff_cap() {
        let c = production();
        c.validate().unwrap();
        assert_eq!(c.longest_quiet(), ms(10_000));
        assert_eq!(c.delivery_window(), ms(19_950));
    }

    #[test]
    fn the_default_bound_holds_for_short_and_long_delivery_timeouts() {
        for (delivery, request) in [(10_000, 5_000), (1_000, 5_000), (300, 600), (60_000, 5_000)] {
            let (delivery, request) = (ms(delivery), ms(request));
            let session_timeout = default_session_timeout(delivery, request);
            let c = LivenessConfig {
                delivery_timeout: delivery,
                request_timeout: request,
                session_timeout,
                ..production()
            };
            c.validate().unwrap_or_else(|e| panic!("{delivery:?}, {request:?}: {e}"));
        }
        assert_eq!(default_session_timeout(ms(10_000), ms(5_000)), ms(30_000));
    }

    #[test]
    fn a_bound_too_short_for_a_delivery_is_refused() {
        let c = LivenessConfig { session_timeout: ms(15_050), ..production() };
        assert!(matches!(c.validate(), Err(LivenessError::Fencing { .. })));
        let c = LivenessConfig { session_timeout: ms(15_051), ..production() };
        // 15 051 / 3 = 5 017 quiet + 5 000 request < 15 051.
        c.validate().unwrap();
    }

    #[test]
    fn a_bound_shorter_than_a_quiet_period_is_refused() {
        let c = LivenessConfig { rebalance_every: ms(25_000), ..production() };
        let err = c.validate().unwrap_err();
        assert!(matches!(err, LivenessError::Quiet { .. }), "{err}");
        let c = LivenessConfig { delivery_timeout: ms(0), ..production() };
        assert_eq!(c.validate(), Err(LivenessError::Zero { what: "delivery timeout" }));
    }
}
