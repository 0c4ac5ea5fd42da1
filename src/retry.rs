//! Retry policy: bounded attempts at the head, exponential backoff with full jitter, then the
//! dead-letter table.
//!
//! Pure functions of (policy, attempt count, caller's seeded RNG): no clock, no global RNG.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// The default number of delivery attempts before a head is dead-lettered (the reference's
/// `MAX_ATTEMPTS`).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// Errors of retry configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryError {
    /// Zero attempts would dead-letter every event without trying it.
    #[error("max_attempts must be at least 1")]
    ZeroAttempts,
    /// The backoff base is larger than its cap, so no delay could grow.
    #[error("backoff base {base:?} is larger than the cap {cap:?}")]
    BaseAboveCap {
        /// The base delay.
        base: Duration,
        /// The cap.
        cap: Duration,
    },
}

/// How a failing head is retried. Guarantees: at most `max_attempts` deliveries of one event
/// by one lease holder's accounting, and every delay within `[0, cap]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    max_attempts: u32,
    #[serde(with = "millis")]
    base: Duration,
    #[serde(with = "millis")]
    cap: Duration,
}

/// What to do with a head whose delivery just failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    /// Deliver again, not before `delay` from now.
    Retry {
        /// The delay, within `[0, cap]`.
        delay: Duration,
    },
    /// Move the event to the dead-letter table with `reason`: a deliberate, recorded gap.
    DeadLetter {
        /// `"exhausted after N attempts: <last error>"`.
        reason: String,
    },
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base: Duration::from_millis(200),
            cap: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// A policy of `max_attempts` deliveries with backoff `base * 2^(n-1)` capped at `cap`.
    pub fn new(max_attempts: u32, base: Duration, cap: Duration) -> Result<Self, RetryError> {
        if max_attempts == 0 {
            return Err(RetryError::ZeroAttempts);
        }
        if base > cap {
            return Err(RetryError::BaseAboveCap { base, cap });
        }
        Ok(Self { max_attempts, base, cap })
    }

    /// The number of deliveries of one event before it is dead-lettered.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The largest delay this policy ever asks for.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The backoff before attempt `failures + 1`, after `failures >= 1` failed attempts:
    /// uniform in `[0, min(cap, base * 2^(failures - 1))]` ("full jitter").
    pub fn backoff<R: Rng + ?Sized>(&self, failures: u32, rng: &mut R) -> Duration {
        let exp = failures.saturating_sub(1).min(63);
        let ceiling =
            self.base.saturating_mul(1u32.checked_shl(exp).unwrap_or(u32::MAX)).min(self.cap);
        let micros = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rng.random_range(0..=micros))
    }

    /// Decides after the `failures`-th failed attempt (counting this one). A `retry_after`
    /// hint from the endpoint is honoured as a minimum delay, up to the cap, so a hint of
    /// "a year" cannot stall the partition for longer than the policy allows.
    pub fn decide<R: Rng + ?Sized>(
        &self,
        failures: u32,
        last_error: &str,
        retry_after: Option<Duration>,
        rng: &mut R,
    ) -> RetryDecision {
        if failures >= self.max_attempts {
            return RetryDecision::DeadLetter {
                reason: format!("exhausted after {failures} attempts: {last_error}"),
            };
        }
        let jittered = self.backoff(failures, rng);
        let floor = retry_after.unwrap_or(Duration::ZERO).min(self.cap);
        RetryDecision::Retry { delay: jittered.max(floor) }
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy::new(5, Duration::from_millis(100), Duration::from_secs(2)).expect("valid")
    }

    #[test]
    fn backoff_stays_within_zero_and_cap_and_grows() {
        let mut rng = StdRng::seed_from_u64(7);
        let p = policy();
        for failures in 1..=40 {
            let ceiling =
                Duration::from_millis(100).saturating_mul(1 << (failures - 1).min(20)).min(p.cap());
            for _ in 0..200 {
                let d = p.backoff(failures, &mut rng);
                assert!(d <= ceiling, "failures={failures}: {d:?} > {ceiling:?}");
            }
        }
        // Full jitter spreads: 200 draws at the cap are not all equal.
        let draws: std::collections::BTreeSet<_> =
            (0..200).map(|_| p.backoff(10, &mut rng)).collect();
        assert!(draws.len() > 100);
    }

    #[test]
    fn exhaustion_dead_letters_with_the_reason() {
        let mut rng = StdRng::seed_from_u64(1);
        let p = policy();
        assert!(matches!(p.decide(4, "503", None, &mut rng), RetryDecision::Retry { .. }));
        assert_eq!(
            p.decide(5, "HTTP 503", None, &mut rng),
            RetryDecision::DeadLetter { reason: "exhausted after 5 attempts: HTTP 503".into() }
        );
    }

    #[test]
    fn retry_after_is_a_floor_up_to_the_cap() {
        let mut rng = StdRng::seed_from_u64(3);
        let p = policy();
        for _ in 0..50 {
            match p.decide(1, "429", Some(Duration::from_millis(1500)), &mut rng) {
                RetryDecision::Retry { delay } => assert!(delay >= Duration::from_millis(1500)),
                other => panic!("expected a retry, got {other:?}"),
            }
        }
        match p.decide(1, "429", Some(Duration::from_secs(3600)), &mut rng) {
            RetryDecision::Retry { delay } => assert_eq!(delay, p.cap()),
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn bad_policies_are_refused() {
        assert_eq!(
            RetryPolicy::new(0, Duration::ZERO, Duration::ZERO),
            Err(RetryError::ZeroAttempts)
        );
        assert!(matches!(
            RetryPolicy::new(3, Duration::from_secs(2), Duration::from_secs(1)),
            Err(RetryError::BaseAboveCap { .. })
        ));
    }

    #[test]
    fn a_policy_round_trips_through_json_in_milliseconds() {
        let p = policy();
        let json = serde_json::to_value(p).unwrap();
        assert_eq!(json, serde_json::json!({"max_attempts": 5, "base": 100, "cap": 2000}));
        let back: RetryPolicy = serde_json::from_value(json).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.cap(), Duration::from_secs(2));
    }
}
