//! The HTML timeline, opened in a real browser: headless Chromium loads the page of a saved
//! broken-design case, runs its script, and the events the page highlights for each finding
//! must be the events the checker's verdict names. Reported as not run ([`crate::skip`])
//! without Chromium, unless `KEYORDER_REQUIRE_BROWSER=1` (set by `.ci/run`, which installs it).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use keyorder_sim::regression::Regression;

fn chromium() -> Option<&'static str> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .filter(|_| !crate::skip::hidden("chromium"))
        .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()));
    if found.is_none() {
        crate::skip::skip(
            "Chromium (Debian: apt-get install chromium)",
            "KEYORDER_REQUIRE_BROWSER",
        );
    }
    found
}

/// The DOM after the page's script ran.
fn dump_dom(browser: &str, page: &Path) -> String {
    let profile = tempdir("profile");
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 DOM")
}

fn tempdir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("keyorder-html-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Reads `data-highlighted='JSON'` off the body the page's script wrote.
fn highlighted(dom: &str) -> BTreeMap<String, Vec<String>> {
    let start = dom.find("data-highlighted=\"").expect("the script ran and marked the body")
        + "data-highlighted=\"".len();
    let end = start + dom[start..].find('"').expect("closed attribute");
    let json = dom[start..end]
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&json).expect("highlight JSON")
}

#[test]
fn the_browser_highlights_the_events_the_checker_names() {
    let Some(browser) = chromium() else { return };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/regressions/break-two-readers.json");
    let case = Regression::from_json(&std::fs::read_to_string(&path).expect("saved case"))
        .expect("valid case");
    let outcome = keyorder_sim::run(&case.scenario, case.seed, true).expect("runs");
    assert!(!outcome.verdict.is_ok(), "the saved broken case must fail");
    let history = outcome.history.as_ref().expect("kept with the trace");
    let dir = tempdir("page");
    let page = dir.join("timeline.html");
    std::fs::write(&page, keyorder::html::timeline::render(&case.name, history, &outcome.verdict))
        .expect("written");
    let shown = highlighted(&dump_dom(browser, &page));
    let _ = std::fs::remove_dir_all(&dir);
    let mut expected = BTreeMap::new();
    for f in &outcome.verdict.findings {
        if let Some(c) = &f.first {
            let mut ids = c.event_ids.clone();
            ids.sort();
            ids.dedup();
            expected.insert(f.kind.name().to_owned(), ids);
        }
    }
    assert!(
        expected.keys().any(|k| outcome.verdict.violated().iter().any(|v| v.name() == k)),
        "a violation has a counterexample"
    );
    assert_eq!(shown, expected, "the page highlights other events than the verdict names");
}
