//! An exhaustive model check of keyorder's drain and lease rules, built on stateright: every
//! interleaving of a small configuration, where the simulation samples some.
//!
//! The model's workers decide with production's code: each leased partition is a
//! [`keyorder::drain::Drain`] (parking, the retry policy, the takeover wait) whose head reads
//! and acknowledgements go through a [`keyorder::store::session_drain::SessionDrain`], carried
//! out one action per step as the worker's partition task does ([`worker`]). The model supplies
//! only the world ([`world`]): queue rows per partition, advisory locks that end with their
//! session, the dead-letter table, commit visibility, endpoints, and the faults ([`faults`]).
//! Each path's history is judged by [`keyorder::check`] ([`properties`]); the catalogue's
//! broken designs are switches ([`switches`]).
//!
//! Time is a bounded discrete clock (`World::clock`): it moves only to the next deadline some
//! part of the model is waiting for (a drain timer, a delivery timeout), never past the
//! horizon, and everything else happens between those moves in every order. See
//! `docs/design/model-check.md`.

use std::time::Duration;

use keyorder::check::Kind;
use keyorder::retry::RetryPolicy;
use keyorder::{Seq, Time};
use stateright::{Model, Property};

pub mod faults;
pub mod history;
pub mod lease;
pub mod properties;
pub mod run;
pub mod switches;
pub mod worker;
pub mod world;

pub use faults::Budget;
pub use run::{check, Outcome, Summary};
pub use switches::{Switches, Unsupported, UNSUPPORTED};

use history::Trace;
use worker::Actor;
use world::{Answer, EventSpec, World};

/// How long an empty partition waits before it reads again.
pub const IDLE_POLL: Duration = Duration::from_millis(100);
/// The worker's delivery timeout.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_millis(100);
/// The takeover wait after an unclean hand-back: the delivery timeout plus the session drain's
/// `ack_delay` (a lost session may start a delivery up to `ack_delay` after the loss).
pub const TAKEOVER: Duration = Duration::from_millis(150);
/// The retry policy's base and cap; every refusal asks `Retry-After` this long.
pub const RETRY_CAP: Duration = Duration::from_millis(100);

/// The size of the configuration checked, and each fault's budget per path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Workers.
    pub workers: u8,
    /// Partitions.
    pub partitions: u8,
    /// Keys; event `i` has key `i % keys`, and key `k` lives on partition `k % partitions`.
    pub keys: u8,
    /// Events.
    pub events: u8,
    /// Worker crashes.
    pub crashes: u8,
    /// Sessions ended by the server.
    pub lease_losses: u8,
    /// Endpoint refusals.
    pub refusals: u8,
    /// Deliveries never answered.
    pub silences: u8,
    /// Producer commits that land late.
    pub late_commits: u8,
    /// Delivery attempts before a dead letter.
    pub attempts: u32,
    /// The clock's horizon.
    pub horizon: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            workers: 2,
            partitions: 1,
            keys: 2,
            events: 2,
            crashes: 0,
            lease_losses: 0,
            refusals: 0,
            silences: 0,
            late_commits: 0,
            attempts: 2,
            horizon: Duration::from_millis(600),
        }
    }
}

impl Bounds {
    /// The bounds as command-line flags.
    pub fn flags(&self) -> String {
        format!(
            "--workers {} --partitions {} --keys {} --events {} --crashes {} --lease-losses {} \
             --refusals {} --silences {} --late-commits {} --attempts {} --horizon-ms {}",
            self.workers,
            self.partitions,
            self.keys,
            self.events,
            self.crashes,
            self.lease_losses,
            self.refusals,
            self.silences,
            self.late_commits,
            self.attempts,
            self.horizon.as_millis()
        )
    }

    /// The budget of faults every path starts with.
    pub fn budget(&self) -> Budget {
        Budget {
            crashes: self.crashes,
            lease_losses: self.lease_losses,
            refusals: self.refusals,
            silences: self.silences,
            late_commits: self.late_commits,
        }
    }
}

/// What the model is checked with: the bounds, the events they give, the broken design.
#[derive(Clone, Debug)]
pub struct Config {
    /// The bounds.
    pub bounds: Bounds,
    /// The broken design's switches (all off: the correct design).
    pub switches: Switches,
    /// The events, in seq order.
    pub events: Vec<EventSpec>,
    /// The drains' retry policy.
    pub retry: RetryPolicy,
}

/// Why a configuration cannot be checked.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A bound out of range.
    #[error("{0}")]
    Bound(String),
}

impl Config {
    /// The configuration of `bounds` with `switches`.
    pub fn new(bounds: Bounds, switches: Switches) -> Result<Self, ConfigError> {
        let bad = |m: &str| Err(ConfigError::Bound(m.to_owned()));
        if bounds.workers == 0 || bounds.partitions == 0 || bounds.keys == 0 {
            return bad("--workers, --partitions and --keys must each be at least 1");
        }
        if bounds.events == 0 || bounds.events > 9 {
            return bad("--events must be between 1 and 9");
        }
        if bounds.attempts == 0 {
            return bad("--attempts must be at least 1");
        }
        let attempts = if switches.unbounded_retry { u32::MAX } else { bounds.attempts };
        let retry = RetryPolicy::new(attempts, RETRY_CAP, RETRY_CAP)
            .map_err(|e| ConfigError::Bound(e.to_string()))?;
        let events = (0..bounds.events)
            .map(|i| {
                let key = i % bounds.keys;
                EventSpec { seq: Seq(i64::from(i) + 1), key, partition: key % bounds.partitions }
            })
            .collect();
        Ok(Config { bounds, switches, events, retry })
    }
}

/// One state of the model: the world, the workers' actors, the faults left, and what the
/// checker found on the path so far. The path's history rides along unfingerprinted.
#[derive(Clone, Debug)]
pub struct State {
    /// The store, the producer, the endpoints, the clock.
    pub world: World,
    /// Per worker, per partition: the actor holding its lease.
    pub workers: Vec<Vec<Option<Actor>>>,
    /// Faults left.
    pub budget: Budget,
    /// Violations `keyorder::check` found in the path's history, sorted.
    pub violated: Vec<Kind>,
    /// A drain refused an input (a driver bug).
    pub refused: bool,
    /// The last step was a fault, or the path just began: the progress property is judged here.
    pub after_fault: bool,
    /// The path's history (not part of the fingerprint).
    pub trace: Trace,
}

impl std::hash::Hash for State {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (&self.world, &self.workers, &self.budget, &self.violated, self.refused, self.after_fault)
            .hash(h);
    }
}

impl PartialEq for State {
    fn eq(&self, o: &Self) -> bool {
        self.world == o.world
            && self.workers == o.workers
            && self.budget == o.budget
            && self.violated == o.violated
            && self.refused == o.refused
            && self.after_fault == o.after_fault
    }
}

/// One step of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// The producer's next event commits.
    Commit,
    /// The producer's next event takes its seq in a transaction that commits late.
    BeginLate(u8),
    /// A late transaction commits.
    Land(u8),
    /// A worker takes a free partition's lock.
    Acquire(u8, u8),
    /// A worker's partition task carries out its drain's next action.
    Act(u8, u8),
    /// A worker's drain timer fires.
    Fire(u8, u8),
    /// The clock moves to the next deadline.
    Tick(Time),
    /// A delivery reaches its endpoint, which answers.
    Arrive(usize, Answer),
    /// A delivery's answer reaches its worker.
    Answer(usize),
    /// A delivery times out at its worker.
    Timeout(usize),
    /// A worker crashes and restarts.
    Crash(u8),
    /// The server ends a lease's session.
    LoseLease(u8, u8),
}

impl Step {
    /// Whether the step is a fault.
    pub fn is_fault(&self) -> bool {
        matches!(
            self,
            Step::BeginLate(_)
                | Step::Crash(_)
                | Step::LoseLease(..)
                | Step::Arrive(_, Answer::Refuse | Answer::Silent)
        )
    }
}

/// The model stateright checks.
#[derive(Clone, Debug)]
pub struct KeyorderModel {
    /// Its configuration.
    pub config: Config,
}

impl KeyorderModel {
    /// The initial state.
    pub fn initial(&self) -> State {
        let b = self.config.bounds;
        State {
            world: World::new(b.partitions, b.events),
            workers: vec![vec![None; usize::from(b.partitions)]; usize::from(b.workers)],
            budget: b.budget(),
            violated: Vec::new(),
            refused: false,
            after_fault: true,
            trace: Trace::default(),
        }
    }

    /// The steps enabled in `s`; the clock stops at `horizon` (none: it never stops).
    pub fn enabled(&self, s: &State, horizon: Option<Time>, out: &mut Vec<Step>) {
        let cfg = &self.config;
        if faults::may_commit(cfg, s) {
            out.push(Step::Commit);
            if s.budget.late_commits > 0 {
                out.push(Step::BeginLate(s.world.producer.next));
            }
        }
        for &e in &s.world.producer.open {
            out.push(Step::Land(e));
        }
        for (w, parts) in s.workers.iter().enumerate() {
            let w8 = w as u8;
            for (p, slot) in parts.iter().enumerate() {
                let p8 = p as u8;
                match slot {
                    None => {
                        let part = &s.world.partitions[p];
                        if part.holders.is_empty() || cfg.switches.shared_locks {
                            out.push(Step::Acquire(w8, p8));
                        }
                    }
                    Some(a) => {
                        if !a.queue.is_empty() && !a.delivering {
                            out.push(Step::Act(w8, p8));
                        }
                        if a.idle() && a.drain.poll_timeout().is_some_and(|t| t <= s.world.clock) {
                            out.push(Step::Fire(w8, p8));
                        }
                        let held = s.world.partitions[p].holders.contains(&a.epoch);
                        if s.budget.lease_losses > 0 && held {
                            out.push(Step::LoseLease(w8, p8));
                        }
                    }
                }
            }
            if s.budget.crashes > 0 && parts.iter().any(Option::is_some) {
                out.push(Step::Crash(w8));
            }
        }
        self.request_steps(s, out);
        // A delivery's timeout is exact (the deliverer's own timer cancels the call): time
        // does not pass a due one.
        let timeout_due = out.iter().any(|st| matches!(st, Step::Timeout(_)));
        if timeout_due {
            return;
        }
        if let Some(t) = self.next_deadline(s).filter(|t| horizon.is_none_or(|h| *t <= h)) {
            out.push(Step::Tick(t));
        }
    }

    fn request_steps(&self, s: &State, out: &mut Vec<Step>) {
        for (i, r) in s.world.requests.iter().enumerate() {
            let deadline = r.sent.saturating_add(DELIVERY_TIMEOUT);
            match r.answer {
                None if r.unbounded || s.world.clock < deadline => {
                    out.push(Step::Arrive(i, Answer::Accept));
                    if s.budget.refusals > 0 {
                        out.push(Step::Arrive(i, Answer::Refuse));
                    }
                    if s.budget.silences > 0 && !r.orphan {
                        out.push(Step::Arrive(i, Answer::Silent));
                    }
                }
                // An answer counts only if it reaches the worker before its timeout.
                Some(Answer::Accept | Answer::Refuse)
                    if worker::waits_on(s, r) && s.world.clock < deadline =>
                {
                    out.push(Step::Answer(i));
                }
                _ => {}
            }
            if worker::waits_on(s, r) && s.world.clock >= deadline {
                out.push(Step::Timeout(i));
            }
        }
    }

    /// The earliest deadline after now that something waits for.
    fn next_deadline(&self, s: &State) -> Option<Time> {
        let now = s.world.clock;
        let timers = s
            .workers
            .iter()
            .flatten()
            .flatten()
            .filter(|a| a.idle())
            .filter_map(|a| a.drain.poll_timeout());
        let requests = s
            .world
            .requests
            .iter()
            .filter(|r| !r.unbounded)
            .map(|r| r.sent.saturating_add(DELIVERY_TIMEOUT));
        timers.chain(requests).filter(|t| *t > now).min()
    }

    /// The state after `step`.
    pub fn after(&self, s: &State, step: &Step) -> State {
        let cfg = &self.config;
        let mut n = s.clone();
        n.trace.steps += 1;
        n.after_fault = step.is_fault();
        let judged = matches!(
            step,
            Step::Commit
                | Step::Land(_)
                | Step::Act(..)
                | Step::Arrive(..)
                | Step::Answer(_)
                | Step::Timeout(_)
                | Step::Crash(_)
        );
        match *step {
            Step::Commit => faults::produce(cfg, &mut n, false),
            Step::BeginLate(_) => faults::produce(cfg, &mut n, true),
            Step::Land(e) => faults::land(cfg, &mut n, e),
            Step::Acquire(w, p) => worker::acquire(cfg, &mut n, w, p),
            Step::Act(w, p) => worker::act(cfg, &mut n, w, p),
            Step::Fire(w, p) => worker::fire(&mut n, w, p),
            Step::Tick(t) => {
                n.world.clock = t;
                // A delivery nobody waits for can no longer arrive once its timeout passed.
                n.world.requests.retain(|r| {
                    !(r.orphan
                        && !r.unbounded
                        && r.answer.is_none()
                        && r.sent.saturating_add(DELIVERY_TIMEOUT) <= t)
                });
            }
            Step::Arrive(i, answer) => faults::arrive(cfg, &mut n, i, answer),
            Step::Answer(i) => worker::answer(cfg, &mut n, i),
            Step::Timeout(i) => worker::timeout(cfg, &mut n, i),
            Step::Crash(w) => faults::crash(&mut n, w),
            Step::LoseLease(w, p) => faults::lose_lease(&mut n, w, p),
        }
        if judged {
            properties::judge(cfg, &mut n);
        }
        n
    }

    /// A step as a line of a counterexample.
    pub fn describe(&self, s: &State, step: &Step) -> String {
        let cfg = &self.config;
        let ev = |e: u8| {
            let spec = cfg.events[usize::from(e)];
            format!("{} ({}, seq {}, p{})", spec.id(), spec.key_name(), spec.seq.0, spec.partition)
        };
        let clock = s.world.clock;
        let what = match step {
            Step::Commit => format!("producer commits {}", ev(s.world.producer.next)),
            Step::BeginLate(e) => {
                format!("producer begins {} in a transaction that commits late", ev(*e))
            }
            Step::Land(e) => format!("the late transaction of {} commits", ev(*e)),
            Step::Acquire(w, p) => format!("w{w} takes the lock of p{p}"),
            Step::Act(w, p) => {
                let a = s.workers[usize::from(*w)][usize::from(*p)].as_ref();
                let action = a.and_then(|a| a.queue.front()).map(describe_action);
                format!("w{w} on p{p}: {}", action.unwrap_or_default())
            }
            Step::Fire(w, p) => format!("w{w} on p{p}: a drain timer fires"),
            Step::Tick(t) => format!("the clock moves to {} ms", t.as_millis()),
            Step::Arrive(i, a) => format!(
                "{} reaches the endpoint, which {}",
                worker::describe_request(cfg, &s.world.requests[*i]),
                match a {
                    Answer::Accept => "accepts it",
                    Answer::Refuse => "refuses it (503, Retry-After)",
                    Answer::Silent => "never answers",
                }
            ),
            Step::Answer(i) => {
                format!(
                    "the answer to {} reaches its worker",
                    worker::describe_request(cfg, &s.world.requests[*i])
                )
            }
            Step::Timeout(i) => {
                format!(
                    "{} times out at its worker",
                    worker::describe_request(cfg, &s.world.requests[*i])
                )
            }
            Step::Crash(w) => format!("w{w} crashes and restarts (its sessions end)"),
            Step::LoseLease(w, p) => {
                format!("the server ends w{w}'s session of p{p} (its lock goes)")
            }
        };
        format!("[{:>4} ms] {what}", clock.as_millis())
    }
}

fn describe_action(a: &keyorder::drain::Action) -> String {
    use keyorder::drain::Action as A;
    match a {
        A::FetchHead { epoch, skip, .. } if skip.is_empty() => {
            format!("reads the head (epoch {})", epoch.0)
        }
        A::FetchHead { epoch, skip, .. } => {
            format!("reads the head passing over {:?} (epoch {})", skip.as_slice(), epoch.0)
        }
        A::Deliver { head, attempt, .. } => {
            format!("sends {} (seq {}), attempt {attempt}", head.event_id, head.seq.0)
        }
        A::Acknowledge { seq, .. } => format!("acknowledges seq {}", seq.0),
        A::ScheduleRetry { seq, not_before, .. } => {
            format!("records a retry of seq {} not before {} ms", seq.0, not_before.as_millis())
        }
        A::DeadLetter { seq, .. } => format!("dead-letters seq {}", seq.0),
        A::Release { .. } => "gives the lease back".to_owned(),
    }
}

impl Model for KeyorderModel {
    type State = State;
    type Action = Step;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Step>) {
        // A violation ends the path: its shortest counterexample is what is reported.
        if !s.violated.is_empty() || s.refused {
            return;
        }
        self.enabled(s, Some(Time(self.config.bounds.horizon)), actions);
    }

    fn next_state(&self, s: &State, step: Step) -> Option<State> {
        Some(self.after(s, &step))
    }

    fn format_step(&self, s: &State, step: Step) -> Option<String> {
        Some(self.describe(s, &step))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}
