//! The faults the model injects, each within its budget: a worker crash, a session ended by
//! the server, an endpoint that refuses or never answers, a producer commit that lands late.

use keyorder::check::{LeaseEvent, Outcome};

use super::world::Answer;
use super::{Config, State};

/// What is left of each fault's budget on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Budget {
    /// Worker crashes.
    pub crashes: u8,
    /// Sessions the server ends (the advisory lock goes with them).
    pub lease_losses: u8,
    /// Endpoint refusals (a 503 with `Retry-After`).
    pub refusals: u8,
    /// Deliveries the endpoint never answers (the worker's timeout ends them).
    pub silences: u8,
    /// Producer transactions that take their seq and commit after later ones.
    pub late_commits: u8,
}

impl Budget {
    /// Whether every fault budget is spent: from here on, the path has no fault left.
    pub fn spent(&self) -> bool {
        *self == Budget::default()
    }
}

/// Worker `w` crashes and restarts: its sessions end (the server frees their locks), its
/// deliveries still out may arrive within their timeout, and nobody waits for their answers.
pub fn crash(s: &mut State, w: u8) {
    s.budget.crashes -= 1;
    let now = s.world.clock;
    for p in 0..s.world.partitions.len() {
        if let Some(a) = s.workers[usize::from(w)][p].take() {
            let part = &mut s.world.partitions[p];
            part.holders.retain(|e| *e != a.epoch);
            part.clean = false;
            s.trace.lease(p as u8, w, a.epoch, LeaseEvent::Lost, now);
        }
    }
    for r in s.world.requests.iter_mut().filter(|r| r.worker == w) {
        r.orphan = true;
    }
}

/// The server ends the session of worker `w`'s lease of `p`: the lock is free; the worker learns
/// it at its next statement.
pub fn lose_lease(s: &mut State, w: u8, p: u8) {
    s.budget.lease_losses -= 1;
    let now = s.world.clock;
    let Some(a) = s.workers[usize::from(w)][usize::from(p)].as_ref() else { return };
    let epoch = a.epoch;
    let part = &mut s.world.partitions[usize::from(p)];
    part.holders.retain(|e| *e != epoch);
    part.clean = false;
    s.trace.lease(p, w, epoch, LeaseEvent::Lost, now);
}

/// Request `i` reaches its endpoint, which answers `answer`.
pub fn arrive(cfg: &Config, s: &mut State, i: usize, answer: Answer) {
    match answer {
        Answer::Accept => {}
        Answer::Refuse => s.budget.refusals -= 1,
        Answer::Silent => s.budget.silences -= 1,
    }
    let now = s.world.clock;
    let req = s.world.requests[i].clone();
    let spec = cfg.events[usize::from(req.event)];
    let outcome = match answer {
        Answer::Accept => Outcome::Accepted,
        Answer::Refuse => Outcome::Rejected("HTTP 503".into()),
        Answer::Silent => Outcome::Rejected("no answer".into()),
    };
    if answer == Answer::Accept {
        s.world.accepted[usize::from(req.event)] = true;
    }
    let sent = s.trace.sent_at((req.partition, req.epoch, req.seq, req.attempt), now);
    s.trace.arrived(spec, req.worker, req.attempt, sent, now, outcome);
    if req.orphan {
        s.world.requests.remove(i);
    } else {
        s.world.requests[i].answer = Some(answer);
    }
}

/// The producer's next event commits, or (`late`) begins a transaction that stays open.
pub fn produce(cfg: &Config, s: &mut State, late: bool) {
    let e = s.world.producer.next;
    s.world.producer.next += 1;
    let spec = cfg.events[usize::from(e)];
    let row = super::world::Row {
        event: e,
        seq: spec.seq,
        attempts: 0,
        not_before: None,
        last_error: None,
        committed: !late,
    };
    let part = &mut s.world.partitions[usize::from(spec.partition)];
    part.rows.push(row);
    part.rows.sort_by_key(|r| r.seq);
    if late {
        s.budget.late_commits -= 1;
        s.world.producer.open.push(e);
    } else {
        s.trace.enqueued(spec, s.world.clock);
    }
}

/// The open transaction of event `e` commits.
pub fn land(cfg: &Config, s: &mut State, e: u8) {
    s.world.producer.open.retain(|&o| o != e);
    let spec = cfg.events[usize::from(e)];
    let part = &mut s.world.partitions[usize::from(spec.partition)];
    if let Some(r) = part.rows.iter_mut().find(|r| r.event == e) {
        r.committed = true;
    }
    s.trace.enqueued(spec, s.world.clock);
}

/// Whether the producer's next event may commit now: its key has no open transaction of an
/// earlier event (one producer per key waits for its commit), unless producers are
/// unserialised.
pub fn may_commit(cfg: &Config, s: &State) -> bool {
    let next = s.world.producer.next;
    if usize::from(next) >= cfg.events.len() {
        return false;
    }
    let key = cfg.events[usize::from(next)].key;
    cfg.switches.unserialised_producers
        || !s.world.producer.open.iter().any(|&o| cfg.events[usize::from(o)].key == key)
}
