//! The simulation as a property: proptest generates whole scenarios (keys, events, endpoint
//! behaviour, crashes, lease losses, store restarts, modulus changes) and the correct design
//! must show no violation. A failure is shrunk to a small scenario, saved under
//! `testdata/regressions/` (where `cargo test` replays it from then on) and printed with the
//! command that replays it.
//!
//! Cases: 64 by default; `KEYORDER_PROPTEST_CASES=500 cargo test --test prop_sim` for more.

use keyorder_sim::regression::Regression;
use keyorder_sim::shrink::{search, size};

fn cases() -> u32 {
    std::env::var("KEYORDER_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

#[test]
fn the_correct_design_has_no_violation_in_random_scenarios() {
    let cases = cases();
    let found = search(None, None, cases, 20261202).expect("the search runs");
    let Some(found) = found else { return };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/regressions");
    let path = dir.join(format!("proptest-failure-{}.json", found.seed));
    let case = Regression {
        name: "proptest-failure".into(),
        why: "Found and shrunk by proptests/sim.rs: the correct design violated the contract."
            .into(),
        seed: found.seed,
        expect: found.violated.clone(),
        scenario: found.scenario.clone(),
    };
    let saved = serde_json::to_string_pretty(&case).map(|t| std::fs::write(&path, t + "\n"));
    let (keys, events, faults) = size(&found.scenario);
    panic!(
        "violation {:?} in a scenario shrunk to {keys} keys, {events} events, {faults} faults\n\
         saved: {} ({saved:?})\nreplay: keyorder-sim replay {} --scenario {}",
        found.violated,
        path.display(),
        found.seed,
        path.display()
    );
}
