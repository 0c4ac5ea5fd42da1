//! `keyorder work --log-format json`: every line on stderr is one JSON object with a timestamp, a
//! level, a message and the event's fields (worker, partition, epoch, event id, seq, error), so
//! a log shipper can parse and filter all of it; the text format is not.

use serde_json::{Map, Value};

use super::cli::{events_file, keyorder, TempDir};

/// Every line of `stderr` as a JSON object with the fields every event has; panics naming the
/// first line that is not one.
fn json_lines(stderr: &[u8]) -> Vec<Map<String, Value>> {
    let text = String::from_utf8_lossy(stderr);
    assert!(!text.trim().is_empty(), "no log line at all");
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}\nall:\n{text}"));
            let Value::Object(o) = v else { panic!("not an object: {line}") };
            for (field, is) in [("timestamp", "string"), ("level", "string"), ("message", "string")]
            {
                assert!(o.get(field).is_some_and(Value::is_string), "{field} is no {is}: {line}");
            }
            o
        })
        .collect()
}

/// The first event with `message`, which must carry `fields` (each a string or a number).
fn event<'a>(
    lines: &'a [Map<String, Value>],
    message: &str,
    fields: &[&str],
) -> &'a Map<String, Value> {
    let found = lines.iter().find(|o| o["message"] == message);
    let o = found.unwrap_or_else(|| panic!("no {message:?} event in {lines:#?}"));
    for f in fields {
        let v = o.get(*f);
        assert!(v.is_some_and(|v| v.is_string() || v.is_u64()), "{message:?} lacks {f}: {o:?}");
    }
    o
}

#[test]
fn work_with_json_logs_writes_one_parseable_object_per_line_with_the_fields() {
    let dir = TempDir::new("json-logs");
    #[allow(clippy::disallowed_methods)] // the endpoint's clock
    let receiver = super::endpoint::Endpoint::start(std::time::Instant::now());
    receiver.shared.lock().unwrap().poison.insert("e3".into());
    events_file(&dir.0, 12);
    assert!(keyorder(&dir.0, &["enqueue", "events.jsonl"]).status.success());
    let args = ["work", "--deliver", &receiver.url, "--until-empty", "--threads", "1"];
    let tail = ["--max-attempts", "1", "--name", "w1", "--log-format", "json"];
    let out = keyorder(&dir.0, &[&args[..], &tail, &["--log-level", "debug"]].concat());
    // Drained with the poison event dead-lettered: exit 1, said as a last JSON line.
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty(), "logs stay off stdout");
    let lines = json_lines(&out.stderr);
    let leased = event(&lines, "leased partition", &["worker", "partition", "epoch"]);
    assert_eq!(leased["worker"], "w1");
    assert_eq!(leased["level"], "INFO");
    let delivered = event(&lines, "delivered", &["worker", "partition", "event_id", "seq"]);
    assert_eq!(delivered["level"], "DEBUG");
    let dead = "delivery failed on its last attempt: dead-lettering the event";
    let failed = event(&lines, dead, &["worker", "partition", "event_id", "seq", "error"]);
    assert_eq!((&failed["level"], &failed["event_id"]), (&"ERROR".into(), &"e3".into()));
    assert!(failed["error"].as_str().unwrap().contains("500"), "{failed:?}");
    event(&lines, "gave back partition", &["worker", "partition", "epoch"]);
    let last = lines.last().unwrap();
    assert_eq!((&last["level"], &last["message"]), (&"ERROR".into(), &"failed".into()));
    assert!(last["error"].as_str().unwrap().contains("1 dead letter(s)"), "{last:?}");

    // --log-level filters: at the default (info) no delivered event is written.
    let more: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"event_id": "f{i}", "subscription_id": "sub_{i}"}}"#))
        .collect();
    std::fs::write(dir.path("more.jsonl"), more.join("\n")).unwrap();
    assert!(keyorder(&dir.0, &["enqueue", "more.jsonl"]).status.success());
    let out = keyorder(&dir.0, &[&args[..], &tail].concat());
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = json_lines(&out.stderr);
    assert!(lines.iter().all(|o| o["level"] != "DEBUG"), "{lines:#?}");
    event(&lines, "the queue is empty; no dead letters written during the run", &[]);

    // The check can fail: the text format's lines are not JSON.
    let text = keyorder(&dir.0, &args);
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(stderr.lines().all(|l| serde_json::from_str::<Value>(l).is_err()), "{stderr}");
    assert!(stderr.contains(" INFO leased partition worker=\"worker\" partition="), "{stderr}");
}
