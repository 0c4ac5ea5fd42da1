//! The drain machine driven by random input sequences against a model queue. Invariants,
//! checked on every action: at most one delivery in flight; the head is never passed while
//! unresolved except by dead-lettering; attempts never exceed the maximum; every backoff lies
//! in [0, cap]; after a lease loss no action touches the partition until a new lease.

use std::collections::VecDeque;
use std::time::Duration;

use std::collections::BTreeMap;

use keyorder::drain::{Action, Drain, DrainConfig, Head, Input, ParkedKeys};
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
                Action::FetchHead { epoch, skip, .. } => {
                    prop_assert_eq!(epoch, Epoch(self.epoch));
                    // One key: parked, it hides the whole queue, as a store would.
                    let head = self.head().filter(|h| !skip.contains(&h.key));
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

// Parking (issue #21): several keys on one partition, any interleaving of failures,
// successes, timeouts and Retry-After values.

const KEYS: [&str; 3] = ["a", "b", "c"];
const MAX_PARKED: usize = 2;

#[derive(Clone, Debug)]
enum KeyedStep {
    Succeed,
    Fail {
        retry_after_ms: Option<u64>,
    },
    /// The delivery timed out: a failure without an answer.
    TimeOut,
    LoseLease,
    Tick {
        ms: u64,
    },
}

fn keyed_step() -> impl Strategy<Value = KeyedStep> {
    prop_oneof![
        4 => Just(KeyedStep::Succeed),
        4 => proptest::option::weighted(0.4, 0u64..1500)
            .prop_map(|r| KeyedStep::Fail { retry_after_ms: r }),
        1 => Just(KeyedStep::TimeOut),
        1 => Just(KeyedStep::LoseLease),
        3 => (0u64..600).prop_map(|ms| KeyedStep::Tick { ms }),
    ]
}

/// A queued row of the keyed model.
#[derive(Clone, Debug)]
struct Row {
    seq: Seq,
    key: &'static str,
    attempts: u32,
    not_before: Option<Time>,
}

/// The store and endpoint as the machine should see them, with several keys.
struct KeyedModel {
    queue: Vec<Row>,
    in_flight: Option<Seq>,
    /// The skip set of the read whose answer is being delivered.
    last_skip: ParkedKeys,
    owned: bool,
    epoch: u64,
    now: Time,
    /// Resolved (delivered or dead-lettered) seqs per key, in resolution order.
    resolved: BTreeMap<&'static str, Vec<Seq>>,
    /// Per seq, the earliest time a retry may go out (the failure time plus its Retry-After).
    earliest: BTreeMap<Seq, Time>,
}

impl KeyedModel {
    fn new(keys: &[usize]) -> Self {
        let queue = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Row {
                seq: Seq(i as i64 + 1),
                key: KEYS[*k],
                attempts: 0,
                not_before: None,
            })
            .collect();
        Self {
            queue,
            in_flight: None,
            last_skip: ParkedKeys::NONE,
            owned: false,
            epoch: 0,
            now: Time::ZERO,
            resolved: BTreeMap::new(),
            earliest: BTreeMap::new(),
        }
    }

    fn row(&mut self, seq: Seq) -> Result<&mut Row, TestCaseError> {
        self.queue
            .iter_mut()
            .find(|r| r.seq == seq)
            .ok_or_else(|| TestCaseError::fail(format!("seq {} is not queued", seq.0)))
    }

    fn resolve(&mut self, seq: Seq) -> Result<(), TestCaseError> {
        let i = self.queue.iter().position(|r| r.seq == seq);
        let i = i.ok_or_else(|| TestCaseError::fail(format!("seq {} resolved twice", seq.0)))?;
        let row = self.queue.remove(i);
        self.resolved.entry(row.key).or_default().push(seq);
        Ok(())
    }

    /// Carries out every action, checking the invariants on each.
    fn apply(&mut self, drain: &mut Drain) -> Result<(), TestCaseError> {
        for _ in 0..100 {
            let Some(action) = drain.poll_action() else { return Ok(()) };
            prop_assert!(self.owned, "action {:?} after the lease was lost", action);
            match action {
                Action::FetchHead { skip, .. } => {
                    prop_assert!(skip.len() <= MAX_PARKED, "{} keys parked", skip.len());
                    let now = self.now;
                    let head = self.queue.iter().find(|r| !skip.contains(r.key)).map(|r| Head {
                        seq: r.seq,
                        event_id: format!("evt_{}", r.seq.0),
                        key: r.key.into(),
                        payload: "{}".into(),
                        attempts: r.attempts,
                        not_before: r.not_before.filter(|t| *t > now),
                        last_error: None,
                    });
                    self.last_skip = skip;
                    drain.handle(Input::HeadFetched(head), self.now).map_err(fail)?;
                }
                Action::Deliver { head, attempt, .. } => {
                    prop_assert!(self.in_flight.is_none(), "two deliveries in flight");
                    prop_assert!(attempt <= MAX_ATTEMPTS, "attempt {} > max", attempt);
                    let oldest = self.queue.iter().find(|r| r.key == head.key).map(|r| r.seq);
                    prop_assert_eq!(oldest, Some(head.seq), "a key's later event went first");
                    prop_assert!(!self.last_skip.contains(&head.key), "a parked key delivered");
                    if let Some(at) = self.earliest.get(&head.seq) {
                        prop_assert!(self.now >= *at, "retried before its Retry-After");
                    }
                    self.in_flight = Some(head.seq);
                }
                Action::Acknowledge { seq, .. } => self.resolve(seq)?,
                Action::ScheduleRetry { seq, attempts, not_before, .. } => {
                    prop_assert!(not_before >= self.now, "backoff below zero");
                    let row = self.row(seq)?;
                    row.attempts = attempts;
                    row.not_before = Some(not_before);
                }
                Action::DeadLetter { seq, attempts, .. } => {
                    prop_assert_eq!(attempts, MAX_ATTEMPTS, "dead-lettered before exhaustion");
                    self.resolve(seq)?;
                }
                Action::Release { .. } => self.owned = false,
            }
        }
        Err(TestCaseError::fail("more than 100 actions from one input"))
    }

    fn acquire(&mut self, drain: &mut Drain) -> Result<(), TestCaseError> {
        self.epoch += 1;
        self.owned = true;
        self.in_flight = None;
        drain.handle(Input::LeaseAcquired { epoch: Epoch(self.epoch) }, self.now).map_err(fail)?;
        self.apply(drain)
    }

    /// Feeds the result of the delivery in flight, if any.
    fn answer(&mut self, drain: &mut Drain, step: &KeyedStep) -> Result<(), TestCaseError> {
        let Some(seq) = self.in_flight.take() else { return Ok(()) };
        let input = match step {
            KeyedStep::Succeed => Input::DeliverySucceeded { seq },
            KeyedStep::Fail { retry_after_ms } => {
                let retry_after = retry_after_ms.map(Duration::from_millis);
                // The floor the machine must keep, up to the cap (the policy's documented rule).
                let floor = retry_after.unwrap_or_default().min(CAP);
                self.earliest.insert(seq, self.now.saturating_add(floor));
                Input::DeliveryFailed { seq, error: "HTTP 503".into(), retry_after }
            }
            _ => Input::DeliveryFailed { seq, error: "timed out".into(), retry_after: None },
        };
        drain.handle(input, self.now).map_err(fail)?;
        self.apply(drain)
    }

    fn tick(&mut self, drain: &mut Drain, ms: u64) -> Result<(), TestCaseError> {
        self.now = self.now.saturating_add(Duration::from_millis(ms));
        drain.handle_timeout(self.now);
        self.apply(drain)
    }
}

fn run_keyed(steps: Vec<KeyedStep>, seed: u64, keys: Vec<usize>) -> Result<(), TestCaseError> {
    let mut config = DrainConfig::new(PartitionId(0), seed);
    config.retry = RetryPolicy::new(MAX_ATTEMPTS, Duration::from_millis(50), CAP).expect("valid");
    config.idle_poll = Duration::from_millis(100);
    config.max_parked_keys = MAX_PARKED;
    let mut drain = Drain::new(config);
    let mut m = KeyedModel::new(&keys);
    m.acquire(&mut drain)?;
    for step in &steps {
        match step {
            KeyedStep::LoseLease if m.owned => {
                m.owned = false;
                drain.handle(Input::LeaseLost, m.now).map_err(fail)?;
                // A late result after the loss is ignored, then a newer lease starts over.
                if let Some(seq) = m.in_flight.take() {
                    drain.handle(Input::DeliverySucceeded { seq }, m.now).map_err(fail)?;
                }
                prop_assert!(drain.parked().is_empty(), "parked keys survived the lease");
                m.acquire(&mut drain)?;
            }
            KeyedStep::Tick { ms } => m.tick(&mut drain, *ms)?,
            step => m.answer(&mut drain, step)?,
        }
        prop_assert_eq!(drain.in_flight().map(|f| f.0), m.in_flight);
    }
    // Then the endpoint heals: everything is delivered or dead-lettered, within a bound.
    for _ in 0..10_000 {
        if m.queue.is_empty() {
            break;
        }
        if m.in_flight.is_some() {
            m.answer(&mut drain, &KeyedStep::Succeed)?;
        } else {
            let next = drain.poll_timeout().expect("an idle machine with rows left has a timer");
            m.tick(&mut drain, next.saturating_since(m.now).as_millis() as u64 + 1)?;
        }
    }
    prop_assert!(m.queue.is_empty(), "rows neither delivered nor dead-lettered: {:?}", m.queue);
    for (key, seqs) in &m.resolved {
        let mut sorted = seqs.clone();
        sorted.sort();
        prop_assert_eq!(&sorted, seqs, "key {} resolved out of seq order", key);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn parking_keeps_every_key_in_order_and_loses_nothing(
        steps in prop::collection::vec(keyed_step(), 0..200),
        seed in any::<u64>(),
        keys in prop::collection::vec(0usize..KEYS.len(), 1..16),
    ) {
        run_keyed(steps, seed, keys)?;
    }
}
