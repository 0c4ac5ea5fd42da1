//! The drain machine driven by random input sequences against a model queue. Invariants,
//! checked on every action: at most one delivery in flight; the head is never passed while
//! unresolved except by dead-lettering; attempts never exceed the maximum; every backoff lies
//! in [0, cap]; after a lease loss no action touches the partition until a new lease.

use std::collections::VecDeque;
use std::time::Duration;

use keyorder::drain::{Action, Drain, DrainConfig, Head, Input};
use keyorder::retry::RetryPolicy;
use keyorder::{Epoch, PartitionId, Seq, Time};
use proptest::prelude::*;

const MAX_ATTEMPTS: u32 = 4;
const CAP: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
enum Step {
    Succeed,
    Fail { retry_after_ms: Option<u64> },
    LoseLease,
    Acquire,
    Release,
    Tick { ms: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Succeed),
        4 => proptest::option::weighted(0.2, 0u64..2000).prop_map(|r| Step::Fail { retry_after_ms: r }),
        1 => Just(Step::LoseLease),
        2 => Just(Step::Acquire),
        1 => Just(Step::Release),
        3 => (0u64..800).prop_map(|ms| Step::Tick { ms }),
    ]
}

/// The store as the machine should see it: rows in seq order with their recorded attempts.
struct Model {
    queue: VecDeque<(Seq, u32)>,
    in_flight: Option<(Seq, u32)>,
    owned: bool,
    epoch: u64,
    now: Time,
    delivered: Vec<Seq>,
    dead: Vec<Seq>,
}

impl Model {
    fn head(&self) -> Option<Head> {
        self.queue.front().map(|&(seq, attempts)| Head {
            seq,
            event_id: format!("evt_{}", seq.0),
            key: "k".into(),
            payload: "{}".into(),
            attempts,
            not_before: None,
            last_error: None,
        })
    }

    /// Carries out every action, checking the invariants on each.
    fn apply(&mut self, drain: &mut Drain) -> Result<(), TestCaseError> {
        for _ in 0..100 {
            let Some(action) = drain.poll_action() else { return Ok(()) };
            prop_assert!(self.owned, "action {action:?} after the lease was lost");
            match action {
                Action::FetchHead { epoch, .. } => {
                    prop_assert_eq!(epoch, Epoch(self.epoch));
                    let head = self.head();
                    drain.handle(Input::HeadFetched(head), self.now).map_err(fail)?;
                }
                Action::Deliver { head, attempt, epoch, .. } => {
                    prop_assert_eq!(epoch, Epoch(self.epoch));
                    prop_assert!(self.in_flight.is_none(), "two deliveries in flight");
                    prop_assert_eq!(Some(head.seq), self.queue.front().map(|r| r.0), "head passed");
                    prop_assert!(attempt <= MAX_ATTEMPTS, "attempt {} > max", attempt);
                    self.in_flight = Some((head.seq, attempt));
                }
                Action::Acknowledge { seq, .. } => {
                    prop_assert_eq!(self.queue.pop_front().map(|r| r.0), Some(seq));
                    self.delivered.push(seq);
                }
                Action::ScheduleRetry { seq, attempts, not_before, .. } => {
                    prop_assert!(not_before.saturating_since(self.now) <= CAP, "backoff above cap");
                    prop_assert!(not_before >= self.now, "backoff below zero");
                    let front = self.queue.front_mut().expect("a head to retry");
                    prop_assert_eq!(front.0, seq);
                    front.1 = attempts;
                }
                Action::DeadLetter { seq, attempts, .. } => {
                    prop_assert_eq!(attempts, MAX_ATTEMPTS, "dead-lettered before exhaustion");
                    prop_assert_eq!(self.queue.pop_front().map(|r| r.0), Some(seq));
                    self.dead.push(seq);
                }
                Action::Release { .. } => self.owned = false,
            }
        }
        Err(TestCaseError::fail("more than 100 actions from one input"))
    }
}

fn fail(e: keyorder::drain::DrainError) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

fn run(steps: Vec<Step>, seed: u64, events: i64) -> Result<(), TestCaseError> {
    let mut config = DrainConfig::new(PartitionId(0), seed);
    config.retry = RetryPolicy::new(MAX_ATTEMPTS, Duration::from_millis(50), CAP).expect("valid");
    let mut drain = Drain::new(config);
    let mut m = Model {
        queue: (1..=events).map(|s| (Seq(s), 0)).collect(),
        in_flight: None,
        owned: false,
        epoch: 0,
        now: Time::ZERO,
        delivered: vec![],
        dead: vec![],
    };
    for step in steps {
        match step {
            Step::Acquire if !m.owned => {
                m.epoch += 1;
                m.owned = true;
                m.in_flight = None;
                drain
                    .handle(Input::LeaseAcquired { epoch: Epoch(m.epoch) }, m.now)
                    .map_err(fail)?;
            }
            Step::Succeed | Step::Fail { .. } => {
                let Some((seq, _)) = m.in_flight.take() else { continue };
                let input = match step {
                    Step::Succeed => Input::DeliverySucceeded { seq },
                    Step::Fail { retry_after_ms } => Input::DeliveryFailed {
                        seq,
                        error: "HTTP 503".into(),
                        retry_after: retry_after_ms.map(Duration::from_millis),
                    },
                    _ => unreachable!("matched above"),
                };
                // A late result after a lease loss must be accepted and ignored.
                drain.handle(input, m.now).map_err(fail)?;
            }
            Step::LoseLease if m.owned => {
                m.owned = false;
                drain.handle(Input::LeaseLost, m.now).map_err(fail)?;
            }
            Step::Release if m.owned => {
                drain.handle(Input::ReleaseRequested, m.now).map_err(fail)?
            }
            Step::Tick { ms } => {
                m.now = m.now.saturating_add(Duration::from_millis(ms));
                drain.handle_timeout(m.now);
            }
            _ => continue,
        }
        m.apply(&mut drain)?;
        if m.owned {
            prop_assert_eq!(drain.in_flight().map(|f| f.0), m.in_flight.map(|f| f.0));
        } else {
            prop_assert!(drain.in_flight().is_none(), "in flight without a lease");
            prop_assert!(drain.poll_timeout().is_none(), "a timer survived the lease");
        }
    }
    // Everything resolved so far was resolved in seq order.
    let mut resolved: Vec<Seq> = m.delivered.iter().chain(&m.dead).copied().collect();
    resolved.sort();
    prop_assert_eq!(resolved.clone(), (1..=resolved.len() as i64).map(Seq).collect::<Vec<_>>());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn drain_invariants_hold(steps in prop::collection::vec(step(), 0..200), seed in any::<u64>(), events in 1i64..20) {
        run(steps, seed, events)?;
    }
}
