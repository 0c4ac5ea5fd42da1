//! `keyorder check FILE` judges a history from any system (exit 0 clean, 1 violated, 2 bad
//! input naming the line), and `keyorder work --history FILE` writes a real run's history in
//! that format: a normal drain checks clean, the same file with two events of a key swapped
//! does not.

use std::path::Path;
use std::process::Output;

use super::cli::{events_file, keyorder, TempDir};

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn check(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["check"];
    all.extend_from_slice(args);
    keyorder(dir, &all)
}

/// One key, two events: seq 1 refused at 10 ms and still retrying when seq 2 is delivered and
/// accepted at 20 ms; seq 1 dead-lettered at 30 ms. No reorder, no gap: a skip.
const SKIPPED: &str = r#"{"type":"enqueued","event_id":"e1","key":"a","seq":1,"partition":0,"at_ms":1}
{"type":"enqueued","event_id":"e2","key":"a","seq":2,"partition":0,"at_ms":2}
{"type":"delivery","event_id":"e1","key":"a","partition":0,"worker":"w","sent_ms":10,"arrived_ms":10,"answered_ms":11,"outcome":"rejected","reason":"HTTP 503"}
{"type":"delivery","event_id":"e2","key":"a","partition":0,"worker":"w","sent_ms":20,"arrived_ms":20,"answered_ms":21,"outcome":"accepted"}
{"type":"dead_letter","event_id":"e1","reason":"exhausted","at_ms":30}
"#;

#[test]
fn a_skipped_head_is_a_violation_and_exits_1() {
    let dir = TempDir::new("check-skip");
    std::fs::write(dir.path("h.jsonl"), SKIPPED).unwrap();
    let out = check(&dir.0, &["h.jsonl"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("verdict: VIOLATED (1 violations"), "{stdout}");
    let skip = stdout.lines().find(|l| l.starts_with("skip ")).expect("a skip row");
    assert!(skip.contains("violation") && skip.contains("seq 2 was sent at 20.000ms"), "{skip}");
    assert!(text(&out).contains("h.jsonl breaks the contract: skip"), "{}", text(&out));
    // The same as JSON, and as the timeline page with the counterexample marked.
    let out = check(&dir.0, &["h.jsonl", "--json", "--html", "t.html"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let skip = v["findings"].as_array().unwrap().iter().find(|f| f["kind"] == "skip").unwrap();
    assert_eq!(skip["count"], 1);
    assert_eq!(skip["first"]["event_ids"], serde_json::json!(["e1", "e2"]));
    let page = std::fs::read_to_string(dir.path("t.html")).expect("page written");
    assert!(page.contains(r#"data-cx="skip""#), "the page marks the skip");
}

#[test]
fn a_clean_history_exits_0() {
    let dir = TempDir::new("check-clean");
    let clean = SKIPPED.replace(
        r#""sent_ms":20,"arrived_ms":20,"answered_ms":21"#,
        r#""sent_ms":31,"arrived_ms":31,"answered_ms":32"#,
    );
    std::fs::write(dir.path("h.jsonl"), clean).unwrap();
    let out = check(&dir.0, &["h.jsonl"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).starts_with("verdict: OK (2 events, 2 deliveries, 1 dead-lettered)"));
    assert!(text(&out).contains("gap              counted          1"), "{}", text(&out));
}

#[test]
fn a_malformed_line_exits_2_naming_it() {
    let dir = TempDir::new("check-malformed");
    let mut lines: Vec<&str> = SKIPPED.lines().collect();
    lines[3] = r#"{"type":"delivery","event_id":"e2","key":"a","sent_ms":20,"outcome":"maybe"}"#;
    std::fs::write(dir.path("h.jsonl"), lines.join("\n")).unwrap();
    let out = check(&dir.0, &["h.jsonl"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("h.jsonl: line 4: unknown variant `maybe`"), "{err}");
    assert!(out.stdout.is_empty(), "no verdict on a malformed history");
    let out = check(&dir.0, &["missing.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("cannot open the history missing.jsonl"), "{}", text(&out));
}

#[test]
fn a_receivers_log_says_what_it_cannot_judge() {
    let dir = TempDir::new("check-receiver");
    let log = r#"{"type":"delivery","event_id":"e1","key":"a","seq":1,"arrived_ms":10,"answered_ms":10,"outcome":"rejected"}
{"type":"delivery","event_id":"e2","key":"a","seq":2,"arrived_ms":20,"answered_ms":20,"outcome":"accepted"}
{"type":"delivery","event_id":"e1","key":"a","seq":1,"arrived_ms":25,"answered_ms":25,"outcome":"accepted"}
"#;
    std::fs::write(dir.path("r.jsonl"), log).unwrap();
    let out = check(&dir.0, &["--receiver-only", "r.jsonl"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("lost             not judged       -"), "{stdout}");
    assert!(
        stdout.contains("not judged (the history holds too little for them): split_key, lost"),
        "{stdout}"
    );
    assert!(text(&out).contains("breaks the contract: reorder, skip"), "{}", text(&out));
    // Without the flag, a receiver's log lacks its enqueues: bad input, saying so.
    let out = check(&dir.0, &["r.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("line 1: event \"e1\" is delivered but has no enqueued record"));
}

/// Delivers 30 events with `keyorder work --history` and returns the history's lines.
fn real_run(dir: &TempDir) -> Vec<serde_json::Value> {
    #[allow(clippy::disallowed_methods)] // the endpoint's clock
    let receiver = super::endpoint::Endpoint::start(std::time::Instant::now());
    events_file(&dir.0, 30);
    let out = keyorder(&dir.0, &["enqueue", "events.jsonl", "--partitions", "4"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = keyorder(
        &dir.0,
        &[
            "work",
            "--deliver",
            &receiver.url,
            "--until-empty",
            "--threads",
            "2",
            "--history",
            "h.jsonl",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let history = std::fs::read_to_string(dir.path("h.jsonl")).expect("history written");
    history.lines().map(|l| serde_json::from_str(l).expect("a JSON record")).collect()
}

#[test]
fn a_real_drain_is_judged_clean_and_a_swapped_key_is_not() {
    let dir = TempDir::new("check-real");
    let records = real_run(&dir);
    let deliveries: Vec<&serde_json::Value> =
        records.iter().filter(|r| r["type"] == "delivery").collect();
    assert_eq!(deliveries.len(), 30, "one accepted attempt per event");
    assert!(deliveries.iter().all(|d| d["outcome"] == "accepted" && d["worker"].is_string()));
    let out = check(&dir.0, &["h.jsonl"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).starts_with("verdict: OK (30 events, 30 deliveries, 0 dead-lettered)"));
    // Swap the first two events of sub_0 everywhere in the file: the later one now went first.
    let ids: Vec<String> = records
        .iter()
        .filter(|r| r["type"] == "enqueued" && r["key"] == "sub_0")
        .map(|r| r["event_id"].as_str().unwrap().to_owned())
        .collect();
    let seq_of = |id: &str| {
        records.iter().find(|r| r["type"] == "enqueued" && r["event_id"] == id).unwrap()["seq"]
            .clone()
    };
    let (a, b) = (&ids[0], &ids[1]);
    let (sa, sb) = (seq_of(a), seq_of(b));
    let swapped: Vec<String> = records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if r["event_id"] == a.as_str() {
                r["seq"] = sb.clone();
            } else if r["event_id"] == b.as_str() {
                r["seq"] = sa.clone();
            }
            r.to_string()
        })
        .collect();
    std::fs::write(dir.path("swapped.jsonl"), swapped.join("\n")).unwrap();
    let out = check(&dir.0, &["swapped.jsonl"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("breaks the contract: reorder"), "{}", text(&out));
}

#[test]
fn a_delivery_before_its_enqueue_or_of_an_aborted_event_exits_1_with_premature() {
    let dir = TempDir::new("check-premature");
    // Enqueued (committed) at 100 ms, its delivery sent at 10 ms and accepted.
    let early = r#"{"type":"enqueued","event_id":"e1","key":"a","seq":1,"partition":0,"at_ms":100}
{"type":"delivery","event_id":"e1","key":"a","partition":0,"sent_ms":10,"arrived_ms":10,"answered_ms":11,"outcome":"accepted"}
"#;
    std::fs::write(dir.path("early.jsonl"), early).unwrap();
    let out = check(&dir.0, &["early.jsonl"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("breaks the contract: premature"), "{}", text(&out));
    let out = check(&dir.0, &["--clock-skew-ms", "90", "early.jsonl"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let aborted = r#"{"type":"aborted","event_id":"e1","key":"a","seq":1,"partition":0,"at_ms":5}
{"type":"delivery","event_id":"e1","key":"a","partition":0,"sent_ms":10,"arrived_ms":10,"answered_ms":11,"outcome":"accepted"}
"#;
    std::fs::write(dir.path("aborted.jsonl"), aborted).unwrap();
    let out = check(&dir.0, &["aborted.jsonl"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("its enqueue rolled back"), "{}", text(&out));
}

#[test]
fn a_receivers_log_with_one_key_in_flight_twice_exits_1_with_concurrent_key() {
    let dir = TempDir::new("check-concurrent-key");
    let log = r#"{"type":"delivery","event_id":"e1","key":"a","seq":1,"arrived_ms":10,"answered_ms":20,"outcome":"accepted"}
{"type":"delivery","event_id":"e2","key":"a","seq":2,"arrived_ms":12,"answered_ms":13,"outcome":"accepted"}
"#;
    std::fs::write(dir.path("r.jsonl"), log).unwrap();
    let out = check(&dir.0, &["--receiver-only", "r.jsonl"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("breaks the contract: concurrent_key"), "{}", text(&out));
    assert!(text(&out).contains("2 record(s) name no partition"), "{}", text(&out));
}

#[test]
fn an_arrival_just_before_its_send_passes_with_the_tolerance_and_is_counted() {
    let dir = TempDir::new("check-skew");
    let h = r#"{"type":"enqueued","event_id":"e1","key":"a","seq":1,"partition":0,"at_ms":1}
{"type":"delivery","event_id":"e1","key":"a","partition":0,"sent_ms":10.3,"arrived_ms":10,"answered_ms":11,"outcome":"accepted"}
"#;
    std::fs::write(dir.path("h.jsonl"), h).unwrap();
    let out = check(&dir.0, &["h.jsonl"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("h.jsonl: line 2: arrived_ms is before sent_ms by 0.300 ms"));
    let out = check(&dir.0, &["--clock-skew-ms", "0.5", "--json", "h.jsonl"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["skew_forgiven"], 1, "{v}");
}

#[test]
fn several_files_are_one_history_and_errors_name_the_file_and_its_line() {
    let dir = TempDir::new("check-files");
    let (head, tail): (Vec<&str>, Vec<&str>) = {
        let lines: Vec<&str> = SKIPPED.lines().collect();
        (lines[..2].to_vec(), lines[2..].to_vec())
    };
    std::fs::write(dir.path("a.jsonl"), head.join("\n") + "\n").unwrap();
    std::fs::write(dir.path("b.jsonl"), tail.join("\n") + "\n").unwrap();
    let out = check(&dir.0, &["a.jsonl", "b.jsonl"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("breaks the contract: skip"), "{}", text(&out));
    let bad = tail.join("\n").replace("\"e2\",\"key\":\"a\"", "\"e9\",\"key\":\"a\"");
    std::fs::write(dir.path("c.jsonl"), bad).unwrap();
    let out = check(&dir.0, &["a.jsonl", "c.jsonl"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("c.jsonl: line 2: event \"e9\""), "{}", text(&out));
}

#[test]
fn a_gzipped_history_is_read_like_a_plain_one() {
    let dir = TempDir::new("check-gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, SKIPPED.as_bytes()).unwrap();
    std::fs::write(dir.path("h.jsonl.gz"), gz.finish().unwrap()).unwrap();
    let out = check(&dir.0, &["h.jsonl.gz"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("h.jsonl.gz breaks the contract: skip"), "{}", text(&out));
    std::fs::write(dir.path("bad.gz"), b"not gzip").unwrap();
    let out = check(&dir.0, &["bad.gz"]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("bad.gz"), "{}", text(&out));
}
