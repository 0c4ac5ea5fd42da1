//! Runs the check: stateright's breadth-first search over the model, a progress line while it
//! runs, and a summary (states, depth, time, the verdict or the shortest counterexample).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keyorder::check::{History, Verdict};
use stateright::report::{ReportData, ReportDiscovery, Reporter};
use stateright::{Checker, HasDiscoveries, Model};

use super::{Config, KeyorderModel};

/// A property the search found broken, with its shortest path.
#[derive(Clone, Debug)]
pub struct Counterexample {
    /// The property's name.
    pub property: &'static str,
    /// The path's steps, one line each.
    pub steps: Vec<String>,
    /// The path's history.
    pub history: History,
    /// `keyorder::check`'s verdict on it.
    pub verdict: Verdict,
}

/// How the check ended.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Every interleaving within the bounds keeps every property.
    Holds,
    /// A property broke.
    Broken(Box<Counterexample>),
}

/// What a check did.
#[derive(Clone, Debug)]
pub struct Summary {
    /// States generated, repeats included.
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// The deepest path explored.
    pub depth: usize,
    /// Wall time of the search.
    pub elapsed: Duration,
    /// The verdict.
    pub outcome: Outcome,
}

impl Summary {
    /// Distinct states per second.
    pub fn rate(&self) -> f64 {
        self.unique as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Prints a progress line to standard error every `every` while the search runs.
struct Progress {
    every: Duration,
    quiet: bool,
    /// When the last line was printed.
    printed: Duration,
}

impl Reporter<KeyorderModel> for Progress {
    fn report_checking(&mut self, data: ReportData) {
        if self.quiet || data.done || data.duration < self.printed + self.every {
            return;
        }
        self.printed = data.duration;
        let rate = data.unique_states as f64 / data.duration.as_secs_f64().max(1e-9);
        eprintln!(
            "model: {} states, {} unique, depth {}, {:.0} s, {:.0} states/s",
            data.total_states,
            data.unique_states,
            data.max_depth,
            data.duration.as_secs_f64(),
            rate
        );
    }

    fn report_discoveries(
        &mut self,
        _: &KeyorderModel,
        _: BTreeMap<&'static str, ReportDiscovery<KeyorderModel>>,
    ) {
    }

    /// How often the search is looked at: also how late its end is noticed.
    fn delay(&self) -> Duration {
        Duration::from_millis(50)
    }
}

/// Checks every interleaving of `config` on `threads` threads, stopping at the first broken
/// property; `progress` prints a line every ten seconds of a long check.
#[allow(clippy::disallowed_methods)] // the search's own wall time, reported, never simulated
pub fn check(config: Config, threads: usize, progress: bool) -> Summary {
    let model = KeyorderModel { config };
    let started = Instant::now();
    let checker = model
        .clone()
        .checker()
        .threads(threads.max(1))
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join_and_report(&mut Progress {
            every: Duration::from_secs(10),
            quiet: !progress,
            printed: Duration::ZERO,
        });
    let elapsed = started.elapsed();
    let shortest = checker
        .discoveries()
        .into_iter()
        .min_by_key(|(name, path)| (path.last_state().trace.steps, *name));
    let outcome = match shortest {
        None => Outcome::Holds,
        Some((property, path)) => {
            let steps = path
                .clone()
                .into_vec()
                .into_iter()
                .filter_map(|(s, a)| a.map(|a| model.describe(&s, &a)))
                .collect();
            let last = path.last_state();
            let history = last.trace.closed(&last.world, &model.config.events);
            let verdict = keyorder::check::check(&history);
            Outcome::Broken(Box::new(Counterexample { property, steps, history, verdict }))
        }
    };
    Summary {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed,
        outcome,
    }
}
