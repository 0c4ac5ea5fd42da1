//! `keyorder route` as a user runs it: answers, errors and exit codes.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn route(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .arg("route")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the keyorder binary runs");
    // Feed stdin from another thread: a large input's output fills the stdout pipe before the
    // input is written, and both sides would wait on each other.
    let mut pipe = child.stdin.take().expect("piped");
    let input = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        // A child that exits early (bad arguments) closes its stdin: not our failure.
        let _ = pipe.write_all(&input);
    });
    let out = child.wait_with_output().expect("it exits");
    feeder.join().expect("the feeder thread");
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 output")
}

#[test]
fn a_reader_that_leaves_early_ends_it_quietly() {
    // `keyorder route ... | head -1`: the pipe closes after one line; no error, no panic.
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyorder"))
        .args(["route", "--partitions", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the keyorder binary runs");
    let mut pipe = child.stdin.take().expect("piped");
    let feeder = std::thread::spawn(move || {
        let keys: String = (0..400_000).map(|i| format!("sub_{i}\n")).collect();
        let _ = pipe.write_all(keys.as_bytes());
    });
    let mut out = child.stdout.take().expect("piped");
    let mut first = [0u8; 2];
    std::io::Read::read_exact(&mut out, &mut first).expect("a first line");
    drop(out);
    let done = child.wait_with_output().expect("it exits");
    feeder.join().expect("the feeder thread");
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(141), "{stderr}");
    assert!(stderr.is_empty(), "nothing to report: {stderr}");
}

#[test]
fn routes_like_the_python_formula() {
    // python3 -c 'import hashlib; [print(int.from_bytes(hashlib.blake2b(k, digest_size=8).digest(), "big") % 16) for k in (b"sub_42", b"sub_7")]'
    let out = route(&["--partitions", "16"], b"sub_42\nsub_7\n");
    assert!(out.status.success());
    assert_eq!(stdout(&out), "2\n10\n");
}

#[test]
fn tsv_and_crlf_lines() {
    let out = route(&["--partitions", "16", "--format", "tsv"], b"sub_42\r\nsub_7");
    assert_eq!(stdout(&out), "sub_42\t2\nsub_7\t10\n");
}

#[test]
fn bad_counts_exit_2_naming_the_range() {
    for bad in ["0", "40000", "-3", "many"] {
        let out = route(&["--partitions", bad], b"");
        assert_eq!(out.status.code(), Some(2), "--partitions {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("between 1 and 32767"), "--partitions {bad}: {err}");
    }
}

#[test]
fn invalid_utf8_exits_2_naming_the_line() {
    let out = route(&["--partitions", "4"], b"ok\nfine\n\xff\xfe\n");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3"), "{err}");
}

#[test]
fn a_missing_file_exits_2() {
    let out = route(&["--partitions", "4", "/nonexistent/keys.txt"], b"");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open"));
}

#[test]
fn stats_count_per_partition_and_find_heavy_keys() {
    let mut keys = Vec::new();
    for i in 0..2000 {
        keys.extend_from_slice(format!("sub_{i}\n").as_bytes());
    }
    for _ in 0..50 {
        keys.extend_from_slice(b"whale\n");
    }
    let out = route(&["--partitions", "8", "--stats"], &keys);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.starts_with("keys 2050, partitions 8"), "{text}");
    let per: u64 = text
        .lines()
        .skip(2)
        .take(8)
        .map(|l| l.split('\t').nth(1).expect("two columns").parse::<u64>().expect("a count"))
        .sum();
    assert_eq!(per, 2050);
    let heavy =
        text.lines().skip_while(|l| !l.starts_with("heaviest")).nth(1).expect("a heavy key");
    // 2,000 distinct keys overflow the 1,024 counters, so the count is a range that holds 50.
    let cols: Vec<&str> = heavy.split('\t').collect();
    assert_eq!(cols[3], "whale", "{heavy}");
    let (low, high): (u64, u64) = (cols[0].parse().unwrap(), cols[1].parse().unwrap());
    assert!(low <= 50 && 50 <= high && high - low <= 2, "{heavy}");
}

/// Several chunks, each split across the cores: the output keeps input order and equals the
/// single-key routing, and a bad line deep inside is named by its number.
#[test]
fn large_inputs_keep_order_across_chunks_and_threads() {
    let count = keyorder::PartitionCount::new(1000).expect("valid");
    let keys: Vec<String> = (0..150_000).map(|i| format!("sub_{i:0>20}")).collect();
    let mut input = keys.join("\n").into_bytes();
    input.push(b'\n');
    assert!(input.len() > 3 << 20, "more than three 1 MiB chunks");
    let out = route(&["--partitions", "1000"], &input);
    assert!(out.status.success());
    let expected: String =
        keys.iter().map(|k| format!("{}\n", keyorder::partition_for(k, count).0)).collect();
    assert!(stdout(&out) == expected, "output differs from partition_for, in order");

    let mut bad = input.clone();
    let at = bad.len() - 20 * 27 - 3;
    let line = bad[..at].iter().filter(|&&b| b == b'\n').count() + 1;
    bad[at] = 0xff;
    let out = route(&["--partitions", "4"], &bad);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("line {line}:")), "line {line}: {err}");
}

/// CRLF and LF lines, empty lines, non-ASCII keys and a last line without its newline, over
/// several chunks (so some `\r\n` falls across a chunk's end), in both formats: every line is
/// the single-key routing of its key, in order.
#[test]
fn crlf_empty_and_unicode_lines_across_chunks() {
    let count = keyorder::PartitionCount::new(32767).expect("valid");
    let keys: Vec<String> = (0..200_000)
        .map(|i| match i % 11 {
            0 => String::new(),
            1 => format!("clé-{i}-ü"),
            _ => format!("sub_{i:0>19}"),
        })
        .collect();
    let mut input = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        input.extend_from_slice(key.as_bytes());
        if i + 1 < keys.len() {
            input.extend_from_slice(if i % 3 == 0 { b"\r\n" } else { b"\n" });
        }
    }
    assert!(input.len() > 4 << 20, "more than four 1 MiB chunks");
    let plain = route(&["--partitions", "32767"], &input);
    assert!(plain.status.success());
    let expected: String =
        keys.iter().map(|k| format!("{}\n", keyorder::partition_for(k, count).0)).collect();
    assert!(stdout(&plain) == expected, "plain output differs from partition_for, in order");
    let tsv = route(&["--partitions", "32767", "--format", "tsv"], &input);
    let expected: String =
        keys.iter().map(|k| format!("{k}\t{}\n", keyorder::partition_for(k, count).0)).collect();
    assert!(stdout(&tsv) == expected, "tsv output differs from partition_for, in order");
}
