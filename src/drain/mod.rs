//! The per-partition drain state machine: one event in flight, in `seq` order, fenced by an
//! epoch.
//!
//! Sans-IO in the style of quinn-proto and str0m. Method families:
//!
//! * getters: [`Drain::partition`], [`Drain::epoch`], [`Drain::in_flight`], [`Drain::is_owned`];
//! * input: [`Drain::handle`] (something happened) and [`Drain::handle_timeout`] (time passed);
//! * output, in this order after every input: [`Drain::poll_action`] until it returns `None`,
//!   then [`Drain::poll_timeout`] for the next wake-up.
//!
//! Guarantees, checked by paired `debug_assert!`s where an action is emitted and again where
//! its result is applied:
//!
//! * at most one [`Action::Deliver`] is outstanding, and only for the oldest row of a key that
//!   is not parked;
//! * nothing past a key's oldest row is delivered until that row is acknowledged or
//!   dead-lettered: each key's events go out in `seq` order;
//! * a head that fails and goes into backoff *parks* its key until its retry time (at most
//!   [`DrainConfig::max_parked_keys`] keys at once): every [`Action::FetchHead`] names the
//!   parked keys, and the store answers with the oldest row of any other key, so a failing key
//!   holds up only itself. Past the bound, or with [`DrainConfig::strict_partition_order`], the
//!   partition waits for its head as a partition-FIFO queue does. A lease loss or hand-back
//!   forgets the parked set: the next holder starts from the partition's oldest row;
//! * every action carries the epoch of the lease it was decided under;
//! * after [`Input::LeaseLost`] no action touches the partition until a new lease with a larger
//!   epoch is acquired, and a late delivery result is ignored (nothing is acknowledged);
//! * a new lease reads nothing before `takeover_delay` has passed: a previous holder that lost
//!   its lease without knowing (its session was dropped by a store restart, say) may still
//!   have one delivery in flight, and that delivery ends within the delivery timeout.
//!
//! The run loop a driver writes (here against an in-memory queue whose endpoint accepts
//! everything; [`crate::worker`] is the real one):
//!
//! ```
//! use std::collections::VecDeque;
//! use keyorder::drain::{Action, Drain, DrainConfig, Head, Input};
//! use keyorder::{Epoch, PartitionId, Seq, Time};
//!
//! let head = |seq| Head { seq: Seq(seq), event_id: format!("e{seq}"), key: "sub_1".into(),
//!     payload: "{}".into(), attempts: 0, not_before: None, last_error: None };
//! let mut queue: VecDeque<Head> = (1..=3).map(head).collect();
//! let mut delivered = Vec::new();
//! let mut drain = Drain::new(DrainConfig::new(PartitionId(0), 7));
//! let now = Time::ZERO;
//! drain.handle(Input::LeaseAcquired { epoch: Epoch(1) }, now).unwrap();
//! // After every input: carry out actions until there are none, then wait for the timeout.
//! while let Some(action) = drain.poll_action() {
//!     let input = match action {
//!         Action::FetchHead { skip, .. } => {
//!             Input::HeadFetched(queue.iter().find(|h| !skip.contains(&h.key)).cloned())
//!         }
//!         Action::Deliver { head, .. } => {
//!             delivered.push(head.seq);
//!             Input::DeliverySucceeded { seq: head.seq }
//!         }
//!         Action::Acknowledge { .. } => { queue.pop_front(); continue; }
//!         _ => continue,
//!     };
//!     drain.handle(input, now).unwrap();
//! }
//! assert_eq!(delivered, vec![Seq(1), Seq(2), Seq(3)]);
//! assert!(drain.poll_timeout().is_some(), "an empty partition polls again later");
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::ids::{Epoch, PartitionId, Seq, Time};
use crate::retry::{RetryDecision, RetryPolicy};

mod timer;

use timer::{Timer, TimerTable};

/// How long an empty partition waits before it looks at its head again, by default.
pub const DEFAULT_IDLE_POLL: Duration = Duration::from_millis(200);

/// How many keys of one partition may be parked at once, by default.
pub const DEFAULT_MAX_PARKED_KEYS: usize = 16;

/// The keys a head read must skip: keys whose oldest row failed and waits for its retry time.
///
/// Sorted and without duplicates, so two equal sets compare (and serialise) equal; at most
/// [`DrainConfig::max_parked_keys`] long. The first row in `seq` order whose key is not in the
/// set is necessarily the oldest row of its key, so a store that returns that row keeps every
/// key in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParkedKeys(Vec<String>);

impl ParkedKeys {
    /// No key parked: the head read returns the partition's oldest row.
    pub const NONE: ParkedKeys = ParkedKeys(Vec::new());

    /// The set of `keys` (sorted, duplicates dropped).
    pub fn new(keys: impl IntoIterator<Item = String>) -> Self {
        let mut keys: Vec<String> = keys.into_iter().collect();
        keys.sort();
        keys.dedup();
        Self(keys)
    }

    /// Whether no key is parked.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many keys are parked.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `key` is parked.
    pub fn contains(&self, key: &str) -> bool {
        self.0.binary_search_by(|k| k.as_str().cmp(key)).is_ok()
    }

    /// The parked keys, in sorted order.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// Whether every key parked here is parked in `other` too: when not, a key was unparked
    /// in between, and its oldest row may lie behind any read cursor.
    pub fn is_subset(&self, other: &ParkedKeys) -> bool {
        self.0.iter().all(|k| other.contains(k))
    }
}

/// The head row of a partition as the store returned it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// The row's sequence number.
    pub seq: Seq,
    /// The event's unique id.
    pub event_id: String,
    /// The event's partition key.
    pub key: String,
    /// The payload, as JSON text, passed through untouched.
    pub payload: String,
    /// Failed delivery attempts already recorded for this row.
    pub attempts: u32,
    /// Not to be delivered before this time (a recorded backoff), if any.
    pub not_before: Option<Time>,
    /// The error of the last failed attempt, if any.
    pub last_error: Option<String>,
}

/// Something that happened to the partition, fed to [`Drain::handle`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// The lease was acquired with this epoch (larger than any epoch seen before).
    LeaseAcquired {
        /// The new lease's epoch.
        epoch: Epoch,
    },
    /// The answer to [`Action::FetchHead`]: the head row, or `None` when the partition is empty.
    HeadFetched(Option<Head>),
    /// The endpoint accepted the delivery of `seq`.
    DeliverySucceeded {
        /// The delivered row.
        seq: Seq,
    },
    /// The delivery of `seq` failed (a non-2xx status, a timeout, a refused connection).
    DeliveryFailed {
        /// The row whose delivery failed.
        seq: Seq,
        /// What went wrong, kept as the dead-letter reason's tail.
        error: String,
        /// A `Retry-After`-style minimum delay from the endpoint.
        retry_after: Option<Duration>,
    },
    /// The lease is gone (the session died, or a fenced statement was refused).
    LeaseLost,
    /// Give the partition back once the in-flight delivery, if any, is resolved.
    ReleaseRequested,
}

/// What the driver must do next, polled from [`Drain::poll_action`]. Every action carries the
/// epoch of the lease it was decided under; the store must refuse it under any other epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Action {
    /// Read the partition's oldest row whose key is not in `skip` and answer with
    /// [`Input::HeadFetched`].
    FetchHead {
        /// The partition.
        partition: PartitionId,
        /// The lease epoch.
        epoch: Epoch,
        /// The parked keys, whose rows the read must pass over (empty under
        /// [`DrainConfig::strict_partition_order`]).
        skip: ParkedKeys,
    },
    /// Deliver the head to its endpoint and answer with a delivery input.
    Deliver {
        /// The partition.
        partition: PartitionId,
        /// The lease epoch.
        epoch: Epoch,
        /// The head being delivered.
        head: Head,
        /// This delivery's attempt number, from 1.
        attempt: u32,
    },
    /// Delete the delivered head from the queue.
    Acknowledge {
        /// The partition.
        partition: PartitionId,
        /// The lease epoch.
        epoch: Epoch,
        /// The delivered row.
        seq: Seq,
    },
    /// Record a failed attempt on the head: its attempt count and earliest next delivery.
    ScheduleRetry {
        /// The partition.
        partition: PartitionId,
        /// The lease epoch.
        epoch: Epoch,
        /// The failing row.
        seq: Seq,
        /// Failed attempts so far, including this one.
        attempts: u32,
        /// The earliest time of the next attempt.
        not_before: Time,
        /// The failure, recorded as the row's last error.
        error: String,
    },
    /// Move the head to the dead-letter table with its reason, in one transaction.
    DeadLetter {
        /// The partition.
        partition: PartitionId,
        /// The lease epoch.
        epoch: Epoch,
        /// The ejected row.
        seq: Seq,
        /// Attempts made.
        attempts: u32,
        /// `"exhausted after N attempts: <last error>"`.
        reason: String,
    },
    /// Give the lease back; the machine owns nothing afterwards.
    Release {
        /// The partition.
        partition: PartitionId,
        /// The lease epoch being released.
        epoch: Epoch,
    },
}

impl Action {
    /// The partition the action is for.
    pub fn partition(&self) -> PartitionId {
        match self {
            Action::FetchHead { partition, .. }
            | Action::Deliver { partition, .. }
            | Action::Acknowledge { partition, .. }
            | Action::ScheduleRetry { partition, .. }
            | Action::DeadLetter { partition, .. }
            | Action::Release { partition, .. } => *partition,
        }
    }

    /// The epoch of the lease the action was decided under.
    pub fn epoch(&self) -> Epoch {
        match self {
            Action::FetchHead { epoch, .. }
            | Action::Deliver { epoch, .. }
            | Action::Acknowledge { epoch, .. }
            | Action::ScheduleRetry { epoch, .. }
            | Action::DeadLetter { epoch, .. }
            | Action::Release { epoch, .. } => *epoch,
        }
    }
}

/// Inputs that do not fit the machine's state. Returned, never panicked on: a driver bug or a
/// late message is something to log, not to crash on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DrainError {
    /// A delivery result arrived while nothing was in flight.
    #[error("partition {partition}: delivery result for seq {seq} but nothing is in flight")]
    NothingInFlight {
        /// The partition.
        partition: PartitionId,
        /// The seq the result named.
        seq: Seq,
    },
    /// A delivery result named another row than the one in flight.
    #[error(
        "partition {partition}: delivery result for seq {got} but seq {expected} is in flight"
    )]
    WrongSeq {
        /// The partition.
        partition: PartitionId,
        /// The seq in flight.
        expected: Seq,
        /// The seq the result named.
        got: Seq,
    },
    /// A head arrived that nobody asked for.
    #[error("partition {partition}: a head arrived but none was requested")]
    UnexpectedHead {
        /// The partition.
        partition: PartitionId,
    },
    /// A lease was acquired while one is held.
    #[error("partition {partition}: lease acquired with epoch {epoch} while epoch {held} is held")]
    AlreadyOwned {
        /// The partition.
        partition: PartitionId,
        /// The epoch already held.
        held: Epoch,
        /// The epoch offered.
        epoch: Epoch,
    },
    /// A lease was acquired with an epoch not larger than one seen before.
    #[error("partition {partition}: epoch {epoch} is not newer than epoch {last}")]
    StaleEpoch {
        /// The partition.
        partition: PartitionId,
        /// The newest epoch seen before.
        last: Epoch,
        /// The epoch offered.
        epoch: Epoch,
    },
}

/// Configuration of one partition's drain machine.
#[derive(Clone, Debug)]
pub struct DrainConfig {
    /// The partition this machine drains.
    pub partition: PartitionId,
    /// Attempts, backoff and dead-lettering.
    pub retry: RetryPolicy,
    /// How long an empty partition waits before it fetches its head again.
    pub idle_poll: Duration,
    /// Seed of the jitter RNG: the same seed and inputs give the same delays.
    pub rng_seed: u64,
    /// How long a new lease waits before its first read: at least the delivery timeout, so
    /// that a previous holder's in-flight delivery has ended (a store restart drops every
    /// lease at once while deliveries are still out).
    pub takeover_delay: Duration,
    /// The most keys parked at once; past it a failing head blocks its partition. Zero turns
    /// parking off.
    pub max_parked_keys: usize,
    /// Partition FIFO: a failing head blocks every key of its partition until it is delivered
    /// or dead-lettered (no parking: the machine behaves, action for action, as it did before
    /// parking existed).
    pub strict_partition_order: bool,
}

impl DrainConfig {
    /// The defaults for `partition`, with jitter seeded from `rng_seed`.
    pub fn new(partition: PartitionId, rng_seed: u64) -> Self {
        Self {
            partition,
            retry: RetryPolicy::default(),
            idle_poll: DEFAULT_IDLE_POLL,
            rng_seed,
            takeover_delay: Duration::ZERO,
            max_parked_keys: DEFAULT_MAX_PARKED_KEYS,
            strict_partition_order: false,
        }
    }
}

/// Where the machine is. `Unowned` covers "never owned", "released" and "lost".
#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Unowned,
    TakingOver,
    Fetching,
    Empty,
    Waiting(Head),
    InFlight { head: Head, attempt: u32 },
}

/// One partition's drain state machine. See the module docs for the call order.
///
/// `Clone` copies the whole machine, jitter RNG included, so a copy makes the same decisions
/// from the same inputs (the model checker keeps one copy per explored state).
#[derive(Clone, Debug)]
pub struct Drain {
    config: DrainConfig,
    rng: StdRng,
    now: Time,
    epoch: Option<Epoch>,
    last_epoch: Option<Epoch>,
    phase: Phase,
    release_pending: bool,
    /// The seq that was in flight when the lease was lost: its late result is ignored.
    orphaned: Option<Seq>,
    /// Parked keys and when each is due again; ordered by key, so nothing depends on hashing.
    parked: BTreeMap<String, Time>,
    /// A key was unparked while a head read was out: an empty answer is read again at once.
    unparked_while_fetching: bool,
    timers: TimerTable,
    actions: VecDeque<Action>,
}

impl Drain {
    /// A machine that owns nothing yet; feed it [`Input::LeaseAcquired`] to start.
    pub fn new(config: DrainConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.rng_seed);
        Self {
            config,
            rng,
            now: Time::ZERO,
            epoch: None,
            last_epoch: None,
            phase: Phase::Unowned,
            release_pending: false,
            orphaned: None,
            parked: BTreeMap::new(),
            unparked_while_fetching: false,
            timers: TimerTable::default(),
            actions: VecDeque::new(),
        }
    }

    /// The partition this machine drains.
    pub fn partition(&self) -> PartitionId {
        self.config.partition
    }

    /// The epoch of the lease held, if any.
    pub fn epoch(&self) -> Option<Epoch> {
        self.epoch
    }

    /// Whether a lease is held.
    pub fn is_owned(&self) -> bool {
        self.epoch.is_some()
    }

    /// How many keys are parked now (at most [`DrainConfig::max_parked_keys`]).
    pub fn parked_count(&self) -> usize {
        self.parked.len()
    }

    /// The keys parked now (their rows are skipped by head reads until their retry time).
    pub fn parked(&self) -> ParkedKeys {
        ParkedKeys(self.parked.keys().cloned().collect())
    }

    /// The row in flight and its attempt number, if a delivery is outstanding.
    pub fn in_flight(&self) -> Option<(Seq, u32)> {
        match &self.phase {
            Phase::InFlight { head, attempt } => Some((head.seq, *attempt)),
            _ => None,
        }
    }

    /// Applies one input at `now` (a `now` earlier than one seen before is ignored). Errors
    /// leave the state unchanged.
    pub fn handle(&mut self, input: Input, now: Time) -> Result<(), DrainError> {
        self.advance(now);
        match input {
            Input::LeaseAcquired { epoch } => self.on_lease_acquired(epoch),
            Input::HeadFetched(head) => self.on_head(head),
            Input::DeliverySucceeded { seq } => self.on_success(seq),
            Input::DeliveryFailed { seq, error, retry_after } => {
                self.on_failure(seq, error, retry_after)
            }
            Input::LeaseLost => {
                self.on_lease_lost();
                Ok(())
            }
            Input::ReleaseRequested => {
                self.on_release_requested();
                Ok(())
            }
        }
    }

    /// Fires the timers due at `now`. Early calls are no-ops.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
        while let Some(timer) = self.timers.expired(self.now) {
            self.on_timer(timer);
        }
    }

    /// The next action for the driver, in the order they must be carried out.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Drain::handle_timeout`] must be called next, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.next()
    }

    fn advance(&mut self, now: Time) {
        self.now = self.now.max(now);
    }

    fn on_lease_acquired(&mut self, epoch: Epoch) -> Result<(), DrainError> {
        let partition = self.partition();
        if let Some(held) = self.epoch {
            return Err(DrainError::AlreadyOwned { partition, held, epoch });
        }
        if let Some(last) = self.last_epoch.filter(|last| *last >= epoch) {
            return Err(DrainError::StaleEpoch { partition, last, epoch });
        }
        self.epoch = Some(epoch);
        self.last_epoch = Some(epoch);
        self.release_pending = false;
        if self.config.takeover_delay.is_zero() {
            self.fetch(epoch);
        } else {
            self.phase = Phase::TakingOver;
            self.timers.set(Timer::Takeover, self.now.saturating_add(self.config.takeover_delay));
        }
        Ok(())
    }

    fn on_head(&mut self, head: Option<Head>) -> Result<(), DrainError> {
        let (Phase::Fetching, Some(epoch)) = (&self.phase, self.epoch) else {
            return Err(DrainError::UnexpectedHead { partition: self.partition() });
        };
        if self.release_pending {
            self.release(epoch);
            return Ok(());
        }
        match head {
            None if self.unparked_while_fetching => self.fetch(epoch),
            None => {
                self.phase = Phase::Empty;
                self.timers.set(Timer::IdlePoll, self.now.saturating_add(self.config.idle_poll));
            }
            Some(head) if head.attempts >= self.config.retry.max_attempts() => {
                // Exhausted before this lease (a crash between the last failure and the move):
                // dead-letter without another attempt, so attempts never exceed the maximum.
                let reason = format!(
                    "exhausted after {} attempts: {}",
                    head.attempts,
                    head.last_error.as_deref().unwrap_or("unknown error")
                );
                self.dead_letter(epoch, head.seq, head.attempts, reason);
            }
            Some(head) => match head.not_before.filter(|t| *t > self.now) {
                // Backing off (recorded by an earlier holder, or held by the barrier): park the
                // key and look for another one.
                Some(t) if self.can_park(&head.key) => {
                    self.park(head.key, t);
                    self.fetch(epoch);
                }
                Some(t) => {
                    self.timers.set(Timer::Retry, t);
                    self.phase = Phase::Waiting(head);
                }
                None => self.deliver(epoch, head),
            },
        }
        Ok(())
    }

    fn on_success(&mut self, seq: Seq) -> Result<(), DrainError> {
        let head = self.take_in_flight(seq)?;
        let Some(head) = head else { return Ok(()) };
        let epoch = self.epoch.expect("in flight implies owned");
        self.push(Action::Acknowledge { partition: self.partition(), epoch, seq: head.seq });
        self.fetch_or_release(epoch);
        Ok(())
    }

    fn on_failure(
        &mut self,
        seq: Seq,
        error: String,
        retry_after: Option<Duration>,
    ) -> Result<(), DrainError> {
        let Some(mut head) = self.take_in_flight(seq)? else { return Ok(()) };
        let epoch = self.epoch.expect("in flight implies owned");
        let failures = head.attempts + 1;
        match self.config.retry.decide(failures, &error, retry_after, &mut self.rng) {
            RetryDecision::DeadLetter { reason } => {
                self.dead_letter(epoch, head.seq, failures, reason)
            }
            RetryDecision::Retry { delay } => {
                debug_assert!(delay <= self.config.retry.cap(), "backoff above the cap");
                let not_before = self.now.saturating_add(delay);
                self.push(Action::ScheduleRetry {
                    partition: self.partition(),
                    epoch,
                    seq: head.seq,
                    attempts: failures,
                    not_before,
                    error: error.clone(),
                });
                if self.release_pending {
                    self.release(epoch);
                    return Ok(());
                }
                if self.can_park(&head.key) {
                    self.park(head.key, not_before);
                    self.fetch(epoch);
                    return Ok(());
                }
                head.attempts = failures;
                head.not_before = Some(not_before);
                head.last_error = Some(error);
                self.timers.set(Timer::Retry, not_before);
                self.phase = Phase::Waiting(head);
            }
        }
        Ok(())
    }

    /// Ends the in-flight delivery of `seq`. `Ok(None)` means the result is a late one for a
    /// delivery orphaned by a lease loss, to be ignored.
    fn take_in_flight(&mut self, seq: Seq) -> Result<Option<Head>, DrainError> {
        let partition = self.partition();
        match &self.phase {
            Phase::InFlight { head, .. } if head.seq == seq => {}
            Phase::InFlight { head, .. } => {
                return Err(DrainError::WrongSeq { partition, expected: head.seq, got: seq })
            }
            _ if self.orphaned == Some(seq) => {
                self.orphaned = None;
                return Ok(None);
            }
            _ => return Err(DrainError::NothingInFlight { partition, seq }),
        }
        let Phase::InFlight { head, .. } = std::mem::replace(&mut self.phase, Phase::Fetching)
        else {
            unreachable!("matched InFlight above")
        };
        debug_assert!(self.epoch.is_some(), "a delivery was in flight without a lease");
        Ok(Some(head))
    }

    fn on_lease_lost(&mut self) {
        self.orphaned = self.in_flight().map(|(seq, _)| seq);
        self.drop_lease();
        // Nothing decided under the lost lease may reach the store any more.
        self.actions.clear();
    }

    fn on_release_requested(&mut self) {
        let Some(epoch) = self.epoch else { return };
        match self.phase {
            Phase::TakingOver | Phase::Empty | Phase::Waiting(_) => self.release(epoch),
            Phase::Fetching | Phase::InFlight { .. } => self.release_pending = true,
            Phase::Unowned => {}
        }
    }

    fn on_timer(&mut self, timer: Timer) {
        let Some(epoch) = self.epoch else { return };
        if timer == Timer::Parked {
            self.on_parked_due(epoch);
            return;
        }
        match (timer, std::mem::replace(&mut self.phase, Phase::Unowned)) {
            (Timer::IdlePoll, Phase::Empty) | (Timer::Takeover, Phase::TakingOver) => {
                self.fetch(epoch)
            }
            // Fetch again rather than deliver the held row: every delivery then follows a fenced
            // read by no more than the time it takes to start it, so a worker that lost its
            // lease during the backoff learns it before it delivers.
            (Timer::Retry, Phase::Waiting(_)) => self.fetch(epoch),
            (_, phase) => self.phase = phase,
        }
    }

    /// Unparks every key due by now; a partition that waits (empty, or blocked at the bound)
    /// reads again at once, since the unparked key's row may be the head now.
    fn on_parked_due(&mut self, epoch: Epoch) {
        let now = self.now;
        self.parked.retain(|_, due| *due > now);
        self.arm_parked();
        match self.phase {
            Phase::Empty | Phase::Waiting(_) => {
                self.timers.clear(Timer::IdlePoll);
                self.timers.clear(Timer::Retry);
                self.fetch(epoch);
            }
            Phase::Fetching => self.unparked_while_fetching = true,
            Phase::Unowned | Phase::TakingOver | Phase::InFlight { .. } => {}
        }
    }

    /// Whether a failing `key` may be parked: parking is on and the bound leaves room.
    fn can_park(&self, key: &str) -> bool {
        !self.config.strict_partition_order
            && (self.parked.len() < self.config.max_parked_keys || self.parked.contains_key(key))
    }

    /// Parks `key` until `due`: head reads skip its rows until then.
    fn park(&mut self, key: String, due: Time) {
        debug_assert!(self.can_park(&key), "parked past the bound");
        self.parked.insert(key, due);
        self.arm_parked();
    }

    /// Arms the parked-key timer for the earliest due key, or clears it.
    fn arm_parked(&mut self) {
        match self.parked.values().min() {
            Some(due) => self.timers.set(Timer::Parked, *due),
            None => self.timers.clear(Timer::Parked),
        }
    }

    fn fetch(&mut self, epoch: Epoch) {
        self.phase = Phase::Fetching;
        self.unparked_while_fetching = false;
        let skip = self.parked();
        debug_assert!(skip.len() <= self.config.max_parked_keys, "parked past the bound");
        self.push(Action::FetchHead { partition: self.partition(), epoch, skip });
    }

    fn fetch_or_release(&mut self, epoch: Epoch) {
        if self.release_pending {
            self.release(epoch);
        } else {
            self.fetch(epoch);
        }
    }

    fn deliver(&mut self, epoch: Epoch, head: Head) {
        debug_assert!(self.in_flight().is_none(), "two deliveries in flight");
        let attempt = head.attempts + 1;
        debug_assert!(attempt <= self.config.retry.max_attempts(), "attempts above the maximum");
        self.push(Action::Deliver {
            partition: self.partition(),
            epoch,
            head: head.clone(),
            attempt,
        });
        self.phase = Phase::InFlight { head, attempt };
    }

    fn dead_letter(&mut self, epoch: Epoch, seq: Seq, attempts: u32, reason: String) {
        self.push(Action::DeadLetter { partition: self.partition(), epoch, seq, attempts, reason });
        self.fetch_or_release(epoch);
    }

    fn release(&mut self, epoch: Epoch) {
        self.push(Action::Release { partition: self.partition(), epoch });
        self.drop_lease();
    }

    /// Forgets the lease: no timer, nothing in flight and no parked key survives it.
    fn drop_lease(&mut self) {
        self.epoch = None;
        self.phase = Phase::Unowned;
        self.release_pending = false;
        self.parked.clear();
        self.unparked_while_fetching = false;
        self.timers = TimerTable::default();
    }

    fn push(&mut self, action: Action) {
        debug_assert!(
            !matches!(action, Action::Deliver { .. })
                || !self.actions.iter().any(|a| matches!(a, Action::Deliver { .. })),
            "two deliveries queued"
        );
        self.actions.push_back(action);
    }
}

#[cfg(test)]
mod tests;
