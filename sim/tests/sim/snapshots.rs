//! The traces of two small fixed scenarios, snapshotted: any change to simulated behaviour
//! shows up as a reviewed diff in `testdata/snapshots/`.

use super::fixtures;

fn snapshot(name: &str, scenario: &keyorder_sim::Scenario, seed: u64) {
    let outcome = keyorder_sim::run(scenario, seed, true).expect("runs");
    let text = format!(
        "seed {seed}\ntrace hash {}\n{}\n{}",
        outcome.trace_hash,
        outcome.verdict,
        outcome.trace.expect("asked for the trace")
    );
    insta::with_settings!({ snapshot_path => "../../../testdata/snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, text);
    });
}

#[test]
fn clean_trace() {
    snapshot("trace_clean", &fixtures::clean(), 1);
}

#[test]
fn crash_and_lease_loss_trace() {
    snapshot("trace_crash_and_lease_loss", &fixtures::crash_and_lease_loss(), 1);
}
