//! Every saved case in `testdata/regressions/` replays to the verdict it records.

use std::path::Path;

use keyorder_sim::regression::Regression;

#[test]
fn every_saved_case_replays_to_its_recorded_verdict() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/regressions");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("testdata/regressions exists")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no saved cases in {}", dir.display());
    for path in files {
        let text = std::fs::read_to_string(&path).expect("readable");
        let case =
            Regression::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let outcome = keyorder_sim::run(&case.scenario, case.seed, false).expect("runs");
        assert_eq!(
            outcome.verdict.violated(),
            case.expect,
            "{} ({}): replay with `keyorder-sim replay {} --scenario {}`\n{}",
            case.name,
            path.display(),
            case.seed,
            path.display(),
            outcome.verdict
        );
    }
}
