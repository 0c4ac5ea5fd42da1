//! Tests that need a tool this machine lacks (PostgreSQL, PgBouncer, libfaketime, Chromium)
//! are reported as not run, where a person reads it, instead of passing in silence.
//!
//! libtest captures what a passing test prints, so [`skip`] writes its line to the process's
//! stderr itself (libtest captures only the `print!` family), and, when `KEYORDER_SKIP_DIR`
//! names a folder (`.ci/test`, the README's test command, sets it), records the test there for
//! the summary printed after the run. When the tool's `KEYORDER_REQUIRE_*` variable is set
//! (`.ci/run` sets them all), a missing tool fails the test instead.
//!
//! `KEYORDER_TEST_WITHOUT=postgresql,pgbouncer,libfaketime,chromium` hides tools that are
//! installed, to see (or test) what a machine without them reports.

use std::io::Write;

/// Whether `tool` is hidden by `KEYORDER_TEST_WITHOUT` (a comma-separated list of names).
pub fn hidden(tool: &str) -> bool {
    std::env::var("KEYORDER_TEST_WITHOUT").is_ok_and(|v| v.split(',').any(|t| t.trim() == tool))
}

/// Whether the environment variable `require` makes a missing tool a failure.
pub fn required(require: &str) -> bool {
    std::env::var_os(require).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Reports that the running test does not run here because it `needs` something missing:
/// panics when `require` is set, and otherwise says so on stderr and records it. The caller
/// returns at once.
pub fn skip(needs: &str, require: &str) {
    assert!(!required(require), "this test needs {needs}, and {require} is set: it must run");
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| s.rsplit_once('-').map_or(s.clone(), |(name, _hash)| name.to_string()))
        .unwrap_or_default();
    let line = format!("{binary} {test}: needs {needs} ({require}=1 makes this a failure)");
    // One write each, so parallel tests do not interleave within a line.
    let _ = std::io::stderr().write_all(format!("\nSKIPPING {line}\n").as_bytes());
    if let Some(dir) = std::env::var_os("KEYORDER_SKIP_DIR") {
        let dir = std::path::PathBuf::from(dir);
        let file = std::fs::create_dir_all(&dir).and_then(|()| {
            std::fs::OpenOptions::new().create(true).append(true).open(dir.join(&binary))
        });
        let recorded = file.and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        recorded.expect("the skip record is written to KEYORDER_SKIP_DIR");
    }
}
