//! The exhaustive model check (`keyorder-sim model`): the correct design holds at a small
//! bound, and broken designs are found there, each with a counterexample `keyorder check`
//! agrees with.

use keyorder::check::Kind;
use keyorder_sim::model::{self, Bounds, Config, Outcome, Switches};
use keyorder_sim::Break;

/// Two workers, one partition, two keys, three events, one late commit, one lease loss.
fn small() -> Bounds {
    Bounds { events: 3, late_commits: 1, lease_losses: 1, ..Bounds::default() }
}

fn run(bounds: Bounds, design: Option<Break>) -> Outcome {
    let switches = Switches::of(design).expect("the model expresses it");
    model::check(Config::new(bounds, switches).expect("valid bounds"), 1, false).outcome
}

#[test]
fn the_correct_design_holds_without_faults() {
    let bounds = Bounds { events: 3, ..Bounds::default() };
    assert!(matches!(run(bounds, None), Outcome::Holds));
}

#[test]
fn broken_designs_are_found_with_a_violation_the_checker_names() {
    for (design, kind) in [
        (Break::TwoReaders, Kind::Concurrent),
        (Break::HandoverAlwaysClean, Kind::Concurrent),
        (Break::UnfencedLease, Kind::Concurrent),
        (Break::CursorPastLateCommit, Kind::Skip),
    ] {
        let Outcome::Broken(found) = run(small(), Some(design)) else {
            panic!("{} not found", design.name());
        };
        assert!(found.verdict.violated().contains(&kind), "{}: {:?}", design.name(), found.verdict);
    }
}

#[test]
fn designs_the_model_cannot_express_are_refused_with_why() {
    for u in model::UNSUPPORTED {
        assert_eq!(Switches::of(Some(u.design)), Err(u));
    }
}
