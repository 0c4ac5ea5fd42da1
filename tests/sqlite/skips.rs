//! A test that cannot run here is reported as not run (`tests/skip`): this binary runs its own
//! lease-clock test with libfaketime hidden, once as a developer would (reported on stderr and
//! recorded for `.ci/test`'s summary) and once as `.ci/run` does (a failure).

use std::process::{Command, Output};

const LEASE_CLOCK: &str =
    "lease_clock::a_worker_whose_wall_clock_is_a_minute_ahead_takes_no_lease_still_held";

fn run_without_libfaketime(records: &std::path::Path, require: bool) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("this test binary"));
    cmd.args([LEASE_CLOCK, "--exact"])
        .env("KEYORDER_TEST_WITHOUT", "libfaketime")
        .env("KEYORDER_SKIP_DIR", records)
        .env_remove("KEYORDER_REQUIRE_FAKETIME");
    if require {
        cmd.env("KEYORDER_REQUIRE_FAKETIME", "1");
    }
    cmd.output().expect("the test binary runs")
}

#[test]
fn a_test_whose_tool_is_missing_is_reported_and_recorded_as_not_run() {
    let dir = super::cli::TempDir::new("skip-records");
    let records = dir.path("skipped");
    let out = run_without_libfaketime(&records, false);
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "the filter ran the one test: {stdout}");
    let said = format!("SKIPPING sqlite {LEASE_CLOCK}: needs libfaketime");
    assert!(stderr.contains(&said), "not reported where a person reads it:\n{stderr}");
    let recorded = std::fs::read_to_string(records.join("sqlite")).expect("a record");
    assert_eq!(recorded.lines().count(), 1, "{recorded}");
    assert!(
        recorded.starts_with(&format!("sqlite {LEASE_CLOCK}: needs libfaketime")),
        "{recorded}"
    );

    // Required, the missing tool fails the test, and nothing is recorded as skipped.
    let records = dir.path("required");
    let out = run_without_libfaketime(&records, true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && stdout.contains("1 failed"), "{stdout}");
    assert!(!records.exists(), "a failure is not a skip");
}
