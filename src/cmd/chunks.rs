//! Line input in large chunks, split across cores: what `route` and `plan --keys` share.
//!
//! The input is read a chunk of whole lines at a time (about [`CHUNK_BYTES`], more only for a
//! line longer than that), so memory stays flat however long the input is; each chunk is cut
//! into contiguous parts, one per core, processed side by side, and the parts' results are
//! consumed in input order, so output order never depends on the threads.

use std::io::{self, Read};
use std::ops::Range;

use anyhow::Context;

/// Bytes read per chunk: about 40,000 realistic keys, enough to keep two cores busy for a
/// couple of milliseconds (far more than a thread spawn), small enough to stay in cache.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Below this many lines a chunk is processed on the calling thread alone.
pub const PARALLEL_MIN_LINES: usize = 8192;

/// Calls `f(chunk, first_line_number)` for consecutive chunks of whole lines of `input` (the
/// last line may lack its `\n`). Line numbers count from 1.
pub fn for_each_chunk<R: Read>(
    mut input: R,
    mut f: impl FnMut(&[u8], u64) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    let mut filled = 0;
    let mut line = 1u64;
    let mut eof = false;
    loop {
        while !eof && filled < buf.len() {
            match input.read(&mut buf[filled..]) {
                Ok(0) => eof = true,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading keys"),
            }
        }
        let end = if eof {
            filled
        } else {
            match buf[..filled].iter().rposition(|&b| b == b'\n') {
                Some(i) => i + 1,
                None => {
                    // One line longer than the buffer: grow it and read on.
                    buf.resize(buf.len() * 2, 0);
                    continue;
                }
            }
        };
        if end > 0 {
            f(&buf[..end], line)?;
            line += buf[..end].iter().filter(|&&b| b == b'\n').count() as u64;
        }
        buf.copy_within(end..filled, 0);
        filled -= end;
        if eof {
            return Ok(());
        }
    }
}

/// The lines of `chunk` without their terminators: `\n`, or `\r\n` (a `\r` is stripped only
/// before a `\n`, as `BufRead::read_until` callers did before).
pub fn lines(chunk: &str) -> impl Iterator<Item = &str> {
    chunk.split_inclusive('\n').map(|l| match l.strip_suffix('\n') {
        Some(l) => l.strip_suffix('\r').unwrap_or(l),
        None => l,
    })
}

/// The UTF-8 text of `chunk`, or the number of its first line that is not UTF-8 and why.
pub fn utf8(chunk: &[u8], first_line: u64) -> Result<&str, (u64, std::str::Utf8Error)> {
    std::str::from_utf8(chunk).map_err(|e| {
        let start = chunk[..e.valid_up_to()].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let before = chunk[..start].iter().filter(|&&b| b == b'\n').count() as u64;
        let end =
            chunk[start..].iter().position(|&b| b == b'\n').map_or(chunk.len(), |i| start + i);
        // Re-validate the line alone, so the error's byte index is within the line.
        let line_err = std::str::from_utf8(&chunk[start..end]).err().unwrap_or(e);
        (first_line + before, line_err)
    })
}

/// How many parts to cut a chunk of `n` lines into: one per core for large chunks.
pub fn parts_for(n: usize) -> usize {
    if n < PARALLEL_MIN_LINES {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |p| p.get()).clamp(1, 16)
}

/// `0..n` cut into `parts` contiguous ranges of nearly equal length, in order.
pub fn split(n: usize, parts: usize) -> impl Iterator<Item = Range<usize>> {
    let parts = parts.max(1);
    (0..parts).map(move |i| (n * i / parts)..(n * (i + 1) / parts))
}

/// Runs `work(i, part_input, part_state)` for every part, the first on the calling thread and
/// the others on scoped threads, and returns when all are done. A panic in a part propagates.
pub fn run_parts<I: Sync, S: Send>(
    inputs: &[I],
    states: &mut [S],
    work: impl Fn(&I, &mut S) + Sync,
) {
    debug_assert_eq!(inputs.len(), states.len());
    let work = &work;
    std::thread::scope(|scope| {
        let mut pairs = inputs.iter().zip(states.iter_mut());
        let first = pairs.next();
        for (input, state) in pairs {
            scope.spawn(move || work(input, state));
        }
        if let Some((input, state)) = first {
            work(input, state);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_whole_lines_with_their_numbers() {
        let mut text = Vec::new();
        for i in 0..300_000 {
            text.extend_from_slice(format!("sub_{i}\n").as_bytes());
        }
        text.extend_from_slice(b"last");
        let mut seen = Vec::new();
        for_each_chunk(&text[..], |chunk, first| {
            let s = std::str::from_utf8(chunk).expect("utf-8");
            let ls: Vec<&str> = lines(s).collect();
            let expected =
                if first == 300_001 { "last".to_owned() } else { format!("sub_{}", first - 1) };
            assert_eq!(ls[0], expected, "the chunk starts at line {first}");
            seen.extend(ls.into_iter().map(str::to_owned));
            Ok(())
        })
        .expect("reads");
        assert_eq!(seen.len(), 300_001);
        assert_eq!(seen[299_999], "sub_299999");
        assert_eq!(seen[300_000], "last");
    }

    #[test]
    fn crlf_empty_lines_and_bad_utf8() {
        assert_eq!(lines("a\r\n\nb\r").collect::<Vec<_>>(), ["a", "", "b\r"]);
        let (line, _) = utf8(b"ok\nfine\n\xff\xfe\n", 10).unwrap_err();
        assert_eq!(line, 12);
        assert_eq!(split(10, 3).collect::<Vec<_>>(), [0..3, 3..6, 6..10]);
    }
}
