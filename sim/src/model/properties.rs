//! What every path must keep, judged by [`keyorder::check`] on the path's history: no reorder,
//! no skip, no concurrent deliveries of one partition, no split key, nothing lost; no drain
//! input refused; and progress: once faults stop, every event is delivered or dead-lettered
//! within a bounded number of steps.
//!
//! The checker runs after every step that changes the history, and the kinds it reports join
//! the state's fingerprint. So two paths merged into one state agree on what was violated, and
//! on everything a later violation depends on (the queue, the deliveries still out, what the
//! endpoints accepted, all in the world).

use keyorder::check::{check, Kind};
use stateright::Property;

use super::{Config, KeyorderModel, State, Step};

/// The most steps the progress property lets a fault-free run take to drain everything.
pub const PROGRESS_STEPS: usize = 400;

/// The violations the checker judges in the model (stall is the progress property's).
pub const JUDGED: [Kind; 5] =
    [Kind::Reorder, Kind::Skip, Kind::Concurrent, Kind::SplitKey, Kind::Lost];

/// Runs the checker on the path's history and records what it found.
pub fn judge(cfg: &Config, s: &mut State) {
    let history = s.trace.closed(&s.world, &cfg.events);
    let verdict = check(&history);
    let mut found: Vec<Kind> =
        verdict.violated().into_iter().filter(|k| JUDGED.contains(k)).collect();
    found.sort();
    s.violated = found;
}

fn holds(s: &State, kind: Kind) -> bool {
    !s.violated.contains(&kind)
}

/// The property names, one per judged kind, and what each kind's name is.
pub fn name_of(kind: Kind) -> &'static str {
    match kind {
        Kind::Reorder => "no reorder",
        Kind::Skip => "no skip",
        Kind::Concurrent => "no concurrent delivery",
        Kind::SplitKey => "no split key",
        Kind::Lost => "nothing lost",
        Kind::Stall => PROGRESS,
        _ => "other",
    }
}

/// The progress property's name.
pub const PROGRESS: &str = "progress once faults stop";
/// The refused-input property's name.
pub const ACCEPTED: &str = "every drain input accepted";

/// Every property the model checks.
pub fn all() -> Vec<Property<KeyorderModel>> {
    vec![
        Property::always("no reorder", |_, s: &State| holds(s, Kind::Reorder)),
        Property::always("no skip", |_, s: &State| holds(s, Kind::Skip)),
        Property::always("no concurrent delivery", |_, s: &State| holds(s, Kind::Concurrent)),
        Property::always("no split key", |_, s: &State| holds(s, Kind::SplitKey)),
        Property::always("nothing lost", |_, s: &State| holds(s, Kind::Lost)),
        Property::always(ACCEPTED, |_, s: &State| !s.refused),
        Property::always(PROGRESS, |m: &KeyorderModel, s: &State| {
            !s.after_fault || completes(m, s)
        }),
    ]
}

/// The order a fault-free, fair run takes enabled steps in: commits first, then answers and
/// arrivals, then the workers' own steps, then time.
fn rank(step: &Step) -> u8 {
    match step {
        Step::Land(_) => 0,
        Step::Commit => 1,
        Step::Answer(_) => 2,
        Step::Arrive(..) => 3,
        Step::Act(..) => 4,
        Step::Fire(..) => 5,
        Step::Acquire(..) => 6,
        Step::Timeout(_) => 7,
        Step::Tick(_) => 8,
        Step::BeginLate(_) | Step::Crash(_) | Step::LoseLease(..) => 9,
    }
}

/// Whether, from `s`, a run with no more faults (every delivery accepted, the clock unbounded)
/// drains every event within [`PROGRESS_STEPS`] steps.
pub fn completes(m: &KeyorderModel, s: &State) -> bool {
    let events = m.config.bounds.events;
    let mut s = s.clone();
    let mut steps = Vec::new();
    for _ in 0..PROGRESS_STEPS {
        if s.world.drained(events) {
            return true;
        }
        steps.clear();
        m.enabled(&s, None, &mut steps);
        let Some(step) = steps.iter().filter(|st| !st.is_fault()).min_by_key(|st| rank(st)) else {
            return false;
        };
        s = m.after(&s, step);
    }
    s.world.drained(events)
}
