//! Line input in large chunks, split across cores: what `route` and `plan --keys` share.
//! (`route` runs whole chunks through [`super::pipeline`] and uses the line helpers here;
//! `plan --keys` uses [`for_each_chunk`], [`split_lines`] and [`run_parts`].)
//!
//! The input is read a chunk of whole lines at a time (about [`CHUNK_BYTES`], more only for a
//! line longer than that), so memory stays flat however long the input is; each chunk is cut
//! into contiguous parts, one per core, processed side by side, and the parts' results are
//! consumed in input order, so output order never depends on the threads.

use std::io::{self, Read};

use anyhow::Context;

/// Bytes read per chunk: about 40,000 realistic keys, enough to keep two cores busy for a
/// couple of milliseconds (far more than a thread spawn), small enough to stay in cache.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Below this many bytes (about 10,000 realistic keys) a chunk is processed on the calling
/// thread alone.
pub const PARALLEL_MIN_BYTES: usize = 256 << 10;

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

/// Appends the lines of `text` to `keys`, the same lines as [`lines`] yields: one vectorised
/// scan for `\n` (memchr) instead of a character search per line.
pub fn split_keys<'a>(text: &'a str, keys: &mut Vec<&'a str>) {
    let bytes = text.as_bytes();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', bytes) {
        let key_end = if end > start && bytes[end - 1] == b'\r' { end - 1 } else { end };
        keys.push(&text[start..key_end]);
        start = end + 1;
    }
    if start < bytes.len() {
        keys.push(&text[start..]);
    }
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

/// How many parts to cut a chunk of `len` bytes into: one per core for large chunks.
pub fn parts_for(len: usize) -> usize {
    if len < PARALLEL_MIN_BYTES {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |p| p.get()).clamp(1, 16)
}

/// A part of a chunk: whole lines, and the number of its first line.
pub struct LinesPart<'a> {
    /// The bytes of the part's lines, terminators included.
    pub bytes: &'a [u8],
    /// The line number (from 1) of its first line.
    pub first_line: u64,
}

/// `chunk` (whole lines, numbered from `first_line`) cut at line ends into `parts` parts of
/// nearly equal size, in order. Cutting and numbering are a vectorised scan for `\n`, so the
/// serial share of a chunk stays small.
pub fn split_lines(chunk: &[u8], first_line: u64, parts: usize) -> Vec<LinesPart<'_>> {
    let parts = parts.max(1);
    let mut out = Vec::with_capacity(parts);
    let (mut start, mut line) = (0, first_line);
    for i in 1..=parts {
        let end = if i == parts {
            chunk.len()
        } else {
            let target = (chunk.len() * i / parts).max(start);
            chunk[target..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(chunk.len(), |at| target + at + 1)
        };
        let bytes = &chunk[start..end];
        out.push(LinesPart { bytes, first_line: line });
        line += bytes.iter().filter(|&&b| b == b'\n').count() as u64;
        start = end;
    }
    out
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
        for text in ["a\r\n\nb\r", "", "\n", "\r\n", "\r", "x", "\r\r\n\n\n", "é\r\nü"] {
            let mut keys = Vec::new();
            split_keys(text, &mut keys);
            assert_eq!(keys, lines(text).collect::<Vec<_>>(), "{text:?}");
        }
        let (line, _) = utf8(b"ok\nfine\n\xff\xfe\n", 10).unwrap_err();
        assert_eq!(line, 12);
        let parts = split_lines(b"a\nbb\nccc\ndddd\ne", 5, 3);
        let got: Vec<(&[u8], u64)> = parts.iter().map(|p| (p.bytes, p.first_line)).collect();
        assert_eq!(got, [(&b"a\nbb\nccc\n"[..], 5), (&b"dddd\n"[..], 8), (&b"e"[..], 9)]);
        let one = split_lines(b"x\ny\n", 1, 4);
        assert_eq!(one.iter().map(|p| p.bytes.len()).sum::<usize>(), 4);
    }
}
