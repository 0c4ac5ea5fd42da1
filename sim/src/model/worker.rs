//! The model's worker: one actor per leased partition, each production's [`Drain`] with a
//! [`SessionDrain`] lease, carrying out one drain action per step as the partition task of
//! `keyorder::worker` does (`src/worker/partition.rs`): the same action-to-statement mapping,
//! the same clean/unclean hand-back rule, the same takeover wait after an unclean one.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};

use keyorder::check::LeaseEvent;
use keyorder::drain::{self, Drain, DrainConfig, Head, Input};
use keyorder::store::session_drain::{SessionDrain, SessionDrainOptions};
use keyorder::{Epoch, PartitionId, Time};

use super::lease::{Lease, Lost};
use super::world::Request;
use super::{Config, State};

/// One leased partition of one worker.
#[derive(Clone, Debug)]
pub struct Actor {
    /// The lease's epoch.
    pub epoch: Epoch,
    /// Production's drain machine.
    pub drain: Drain,
    /// Production's session-lease read/ack composition.
    pub session: SessionDrain,
    /// Actions polled from the drain, not yet carried out (the partition task's loop).
    pub queue: VecDeque<drain::Action>,
    /// The last delivery ended without an answer: a hand-back would be unclean.
    pub unsettled: bool,
    /// The previous holder's hand-back was unclean and no read happened yet.
    pub inherited: bool,
    /// A delivery is out and the task waits for it.
    pub delivering: bool,
}

impl Actor {
    /// Everything that decides what the actor does next, as text: the drain and session
    /// drain expose no more than `Debug` of their state.
    fn fingerprint(&self) -> String {
        let mut s = String::with_capacity(1024);
        let _ = write!(
            s,
            "{:?}{}{}{}|{:?}|{:?}|{:?}",
            self.epoch,
            self.unsettled,
            self.inherited,
            self.delivering,
            self.queue,
            self.drain,
            self.session
        );
        s
    }

    /// Feeds `input` at `now` and moves the drain's actions to the queue. `false` when the
    /// drain refused the input (a driver bug the properties report).
    fn feed(&mut self, input: Input, now: Time) -> bool {
        let ok = self.drain.handle(input, now).is_ok();
        self.refill();
        ok
    }

    fn refill(&mut self) {
        while let Some(a) = self.drain.poll_action() {
            self.queue.push_back(a);
        }
    }

    /// Whether the task waits on a timer: nothing queued, nothing out.
    pub fn idle(&self) -> bool {
        self.queue.is_empty() && !self.delivering
    }
}

impl Hash for Actor {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.fingerprint().hash(state);
    }
}

impl PartialEq for Actor {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint() == other.fingerprint()
    }
}

impl Eq for Actor {}

/// The event index a head's id names (`e{seq}`, seq = index + 1).
fn event_of(head: &Head) -> u8 {
    head.event_id[1..].parse::<u8>().map_or(0, |n| n.saturating_sub(1))
}

/// Worker `w` takes partition `p`'s lock: a new epoch, the takeover wait after an unclean
/// hand-back (as `Worker::spawn` decides it).
pub fn acquire(cfg: &Config, s: &mut State, w: u8, p: u8) {
    let now = s.world.clock;
    let part = &mut s.world.partitions[usize::from(p)];
    let epoch = Epoch(part.epoch.0 + 1);
    part.epoch = epoch;
    part.holders.push(epoch);
    let clean = part.clean || cfg.switches.always_clean;
    part.clean = false;
    let mut config = DrainConfig::new(PartitionId(u16::from(p)), 0);
    config.retry = cfg.retry;
    config.idle_poll = super::IDLE_POLL;
    config.takeover_delay = if clean { std::time::Duration::ZERO } else { super::TAKEOVER };
    if cfg.switches.skip_waiting {
        config.max_parked_keys = 0;
    }
    let mut session = SessionDrain::new(SessionDrainOptions::default(), now);
    if cfg.switches.cursor_past_parked {
        session = session.keeping_the_cursor_on_unpark();
    }
    if cfg.switches.cursor_past_late_commit {
        session = session.trusting_the_cursor();
    }
    let mut actor = Actor {
        epoch,
        drain: Drain::new(config),
        session,
        queue: VecDeque::new(),
        unsettled: false,
        inherited: !clean,
        delivering: false,
    };
    s.refused |= !actor.feed(Input::LeaseAcquired { epoch }, now);
    s.trace.lease(p, w, epoch, LeaseEvent::Acquired, now);
    s.workers[usize::from(w)][usize::from(p)] = Some(actor);
}

/// Worker `w`'s actor of `p` fires its due timers.
pub fn fire(s: &mut State, w: u8, p: u8) {
    let now = s.world.clock;
    if let Some(a) = s.workers[usize::from(w)][usize::from(p)].as_mut() {
        a.drain.handle_timeout(now);
        a.refill();
    }
}

/// What carrying out one action asks of the actor afterwards.
enum After {
    /// Nothing more.
    Done,
    /// Feed this input.
    Feed(Input),
    /// A delivery went out.
    Sent(Request),
    /// The lease was given back.
    Released,
}

/// Worker `w`'s actor of `p` carries out its next action.
pub fn act(cfg: &Config, s: &mut State, w: u8, p: u8) {
    let now = s.world.clock;
    let Some(actor) = s.workers[usize::from(w)][usize::from(p)].as_mut() else { return };
    let Some(action) = actor.queue.pop_front() else { return };
    let epoch = actor.epoch;
    if matches!(action, drain::Action::FetchHead { .. }) {
        // The takeover wait is over: no earlier holder's delivery is still out.
        actor.inherited = false;
    }
    let mut lease = Lease {
        world: &mut s.world,
        trace: &mut s.trace,
        events: &cfg.events,
        switches: cfg.switches,
        partition: p,
        epoch,
        drain: &mut actor.session,
    };
    let result: Result<After, Lost> = match action {
        drain::Action::FetchHead { skip, .. } => lease
            .fetch_head(&skip)
            .map(|head| After::Feed(Input::HeadFetched(head.map(|h| h.into_head(now))))),
        drain::Action::Deliver { head, attempt, .. } => lease.ensure_lasts().map(|()| {
            After::Sent(Request {
                worker: w,
                partition: p,
                epoch,
                event: event_of(&head),
                seq: head.seq,
                attempt,
                sent: now,
                answer: None,
                orphan: cfg.switches.parallel,
                unbounded: false,
            })
        }),
        drain::Action::Acknowledge { seq, .. } => lease.ack(seq).map(|()| After::Done),
        drain::Action::ScheduleRetry { seq, attempts, not_before, error, .. } => {
            lease.schedule_retry(seq, attempts, not_before, &error).map(|()| After::Done)
        }
        drain::Action::DeadLetter { seq, reason, .. } => {
            lease.dead_letter(seq, &reason).map(|()| After::Done)
        }
        drain::Action::Release { .. } => lease.flush_acks().map(|()| After::Released),
    };
    match result {
        Err(Lost) => lost(s, w, p),
        Ok(After::Done) => {}
        Ok(After::Feed(input)) => s.refused |= !actor.feed(input, now),
        Ok(After::Sent(req)) => {
            let seq = req.seq;
            s.trace.sent((p, epoch, seq, req.attempt), now);
            s.world.requests.push(req);
            if cfg.switches.parallel {
                s.refused |= !actor.feed(Input::DeliverySucceeded { seq }, now);
            } else {
                actor.delivering = true;
            }
        }
        Ok(After::Released) => {
            let clean = !(actor.unsettled || actor.inherited);
            let part = &mut s.world.partitions[usize::from(p)];
            part.holders.retain(|e| *e != epoch);
            part.clean = clean;
            s.trace.lease(p, w, epoch, LeaseEvent::Released, now);
            s.workers[usize::from(w)][usize::from(p)] = None;
        }
    }
}

/// The actor learnt its lease is gone (a refused statement): the task ends.
fn lost(s: &mut State, w: u8, p: u8) {
    let now = s.world.clock;
    if let Some(mut a) = s.workers[usize::from(w)][usize::from(p)].take() {
        // The lease is gone; a refusal of this last input changes nothing.
        let _ = a.feed(Input::LeaseLost, now);
    }
}

/// The answer of request `i` reaches its worker.
pub fn answer(cfg: &Config, s: &mut State, i: usize) {
    let now = s.world.clock;
    let req = s.world.requests.remove(i);
    let spec = cfg.events[usize::from(req.event)];
    let sent = s.trace.sent_at((req.partition, req.epoch, req.seq, req.attempt), now);
    s.trace.finished(spec, req.worker, sent, now);
    let Some(a) = s.workers[usize::from(req.worker)][usize::from(req.partition)].as_mut() else {
        return;
    };
    a.delivering = false;
    a.unsettled = false;
    let input = match req.answer {
        Some(super::world::Answer::Accept) => Input::DeliverySucceeded { seq: req.seq },
        _ => Input::DeliveryFailed {
            seq: req.seq,
            error: "HTTP 503".into(),
            retry_after: Some(cfg.retry.cap()),
        },
    };
    s.refused |= !a.feed(input, now);
}

/// The worker's delivery timeout ends request `i`.
pub fn timeout(cfg: &Config, s: &mut State, i: usize) {
    let now = s.world.clock;
    let outlives = cfg.switches.call_outlives_timeout;
    let req = s.world.requests[i].clone();
    if req.answer.is_some() {
        let spec = cfg.events[usize::from(req.event)];
        let sent = s.trace.sent_at((req.partition, req.epoch, req.seq, req.attempt), now);
        s.trace.finished(spec, req.worker, sent, now);
    }
    if outlives && req.answer.is_none() {
        let r = &mut s.world.requests[i];
        r.orphan = true;
        r.unbounded = true;
    } else {
        s.world.requests.remove(i);
    }
    let Some(a) = s.workers[usize::from(req.worker)][usize::from(req.partition)].as_mut() else {
        return;
    };
    a.delivering = false;
    // An answer of any status settles the attempt; no answer leaves it possibly running, unless
    // the broken deliverer calls it never sent.
    a.unsettled = !outlives;
    let input = Input::DeliveryFailed {
        seq: req.seq,
        error: "timed out".into(),
        retry_after: Some(cfg.retry.cap()),
    };
    s.refused |= !a.feed(input, now);
}

/// Whether the actor of `(w, p)` waits on request `i` (it is its delivery).
pub fn waits_on(s: &State, req: &Request) -> bool {
    s.workers[usize::from(req.worker)][usize::from(req.partition)]
        .as_ref()
        .is_some_and(|a| a.epoch == req.epoch && a.delivering)
}

/// A delivery's id, for messages.
pub fn describe_request(cfg: &Config, r: &Request) -> String {
    let spec = cfg.events[usize::from(r.event)];
    format!(
        "{} (seq {}, attempt {}) from w{} on p{}",
        spec.id(),
        spec.seq.0,
        r.attempt,
        r.worker,
        r.partition
    )
}
