//! `keyorder route`: stream keys through the batch router in bounded memory, whole chunks of
//! lines on every core ([`super::pipeline`]) while this thread reads ahead and writes the
//! finished chunks in input order.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use keyorder::routing::route_into;
use keyorder::{PartitionCount, PartitionId};

use super::bad_input::BadInput;
use super::{chunks, pipeline};

/// Distinct keys tracked for `--stats` heaviest keys (space-saving counters).
const HEAVY_SLOTS: usize = 1024;
/// Heaviest keys and partitions printed by `--stats`.
const TOP: usize = 10;

#[derive(Debug, Args)]
pub struct RouteArgs {
    /// The partition count (1..=32767): the modulus.
    #[arg(long, short = 'p', value_parser = parse_count, allow_negative_numbers = true)]
    partitions: PartitionCount,
    /// Output: the partition alone, or `key<TAB>partition`.
    #[arg(long, value_enum, default_value_t = Format::Plain)]
    format: Format,
    /// Print per-partition key counts, the skew (max/mean) and the heaviest keys instead.
    #[arg(long)]
    stats: bool,
    /// A file of keys, one per line; standard input when absent.
    file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// One partition per line.
    Plain,
    /// `key<TAB>partition` per line.
    Tsv,
}

fn parse_count(text: &str) -> Result<PartitionCount, String> {
    text.parse::<PartitionCount>().map_err(|e| e.to_string())
}

pub fn run(args: RouteArgs) -> anyhow::Result<()> {
    let input: Box<dyn Read> = match &args.file {
        Some(path) => Box::new(
            File::open(path)
                .map_err(|e| BadInput(format!("cannot open {}: {e}", path.display())))?,
        ),
        None => Box::new(io::stdin().lock()),
    };
    let mut stdout = io::stdout().lock();
    let mut stats = args.stats.then(|| Stats::new(args.partitions, io::stdout()));
    // Workers route (and, unless --stats, format) whole chunks; this thread reads ahead and
    // consumes the chunks in input order. Line numbers are counted here, from each chunk's
    // key count, so no pass over the bytes is serial.
    let format = (!args.stats).then(|| Formatter::new(args.partitions, args.format));
    let mut lines_before = 0u64;
    pipeline::run(
        input,
        |lines, chunk: &mut Routed| chunk.route(lines, args.partitions, format.as_ref()),
        |lines, chunk| {
            if let Some((line, e)) = &chunk.bad_utf8 {
                let line = lines_before + line;
                return Err(BadInput(format!("line {line}: key is not valid UTF-8 ({e})")).into());
            }
            lines_before += chunk.partitions.len() as u64;
            match &mut stats {
                Some(stats) => {
                    let text = std::str::from_utf8(lines).context("validated by the worker")?;
                    for (key, p) in chunks::lines(text).zip(&chunk.partitions) {
                        stats.take(key, *p)?;
                    }
                    Ok(())
                }
                None => stdout.write_all(&chunk.out).context("writing output"),
            }
        },
    )?;
    match &mut stats {
        Some(stats) => stats.finish(),
        None => stdout.flush().context("writing output"),
    }
}

/// One chunk routed: its partitions and, when printing, its formatted output; or the first
/// line that is not UTF-8 (numbered from 1 within the chunk).
#[derive(Default)]
struct Routed {
    partitions: Vec<PartitionId>,
    out: Vec<u8>,
    bad_utf8: Option<(u64, std::str::Utf8Error)>,
    /// The allocation of the chunk's key slices, kept empty between chunks.
    keys: Vec<&'static str>,
}

impl Routed {
    fn route(&mut self, lines: &[u8], count: PartitionCount, format: Option<&Formatter>) {
        self.out.clear();
        self.partitions.clear();
        self.bad_utf8 = None;
        let text = match chunks::utf8(lines, 1) {
            Ok(text) => text,
            Err(bad) => {
                self.bad_utf8 = Some(bad);
                return;
            }
        };
        let mut keys = recycle(std::mem::take(&mut self.keys));
        chunks::split_keys(text, &mut keys);
        self.partitions.resize(keys.len(), PartitionId(0));
        route_into(&keys, count, &mut self.partitions);
        if let Some(format) = format {
            format.write(&keys, &self.partitions, &mut self.out);
        }
        self.keys = recycle(keys);
    }
}

/// An empty vector of slices with `keys`' allocation, for slices of another lifetime: the
/// in-place `collect` of an empty vector keeps its buffer, so no chunk allocates its keys.
fn recycle<'b>(mut keys: Vec<&'_ str>) -> Vec<&'b str> {
    keys.clear();
    keys.into_iter().map(|_| "").collect()
}

/// Output lines from a table of every partition's decimal text and line end, built once: a
/// line is one 8-byte copy, not a conversion.
struct Formatter {
    /// `digits` then `\n`, zero-padded to 8 bytes, and the used length, per partition.
    table: Vec<([u8; 8], usize)>,
    format: Format,
}

impl Formatter {
    fn new(count: PartitionCount, format: Format) -> Self {
        let table = (0..count.get())
            .map(|p| {
                let text = format!("{p}\n");
                let mut padded = [0u8; 8];
                padded[..text.len()].copy_from_slice(text.as_bytes());
                (padded, text.len())
            })
            .collect();
        Self { table, format }
    }

    /// Appends the lines of `keys` routed to `partitions` to `out`.
    fn write(&self, keys: &[&str], partitions: &[PartitionId], out: &mut Vec<u8>) {
        if self.format == Format::Tsv {
            for (key, p) in keys.iter().zip(partitions) {
                let (text, len) = &self.table[usize::from(p.0)];
                out.extend_from_slice(key.as_bytes());
                out.push(b'\t');
                out.extend_from_slice(&text[..*len]);
            }
            return;
        }
        // Plain: every line is at most 6 bytes ("32766\n"), so with 2 bytes of slack each
        // 8-byte copy fits; the slack and unused bytes are cut off at the end.
        let start = out.len();
        out.resize(start + partitions.len() * 6 + 2, 0);
        let mut at = start;
        for p in partitions {
            let (text, len) = &self.table[usize::from(p.0)];
            out[at..at + 8].copy_from_slice(text);
            at += len;
        }
        out.truncate(at);
    }
}

trait Sink {
    fn take(&mut self, key: &str, partition: PartitionId) -> anyhow::Result<()>;
    fn finish(&mut self) -> anyhow::Result<()>;
}

/// Per-partition counts plus space-saving heavy hitters: exact while there are at most
/// `HEAVY_SLOTS` distinct keys, an upper bound with a known error beyond.
struct Stats<W: Write> {
    per_partition: Vec<u64>,
    heavy: BTreeMap<String, (u64, PartitionId, u64)>,
    /// `(count, key)` of every tracked key, so the lightest is found in O(log n).
    by_count: BTreeSet<(u64, String)>,
    out: W,
}

impl<W: Write> Stats<W> {
    fn new(count: PartitionCount, out: W) -> Self {
        Self {
            per_partition: vec![0; usize::from(count.get())],
            heavy: BTreeMap::new(),
            by_count: BTreeSet::new(),
            out,
        }
    }
}

impl<W: Write> Sink for Stats<W> {
    fn take(&mut self, key: &str, partition: PartitionId) -> anyhow::Result<()> {
        self.per_partition[usize::from(partition.0)] += 1;
        let full = self.heavy.len() >= HEAVY_SLOTS;
        let count = match self.heavy.get_mut(key) {
            Some(slot) => {
                self.by_count.remove(&(slot.0, key.to_owned()));
                slot.0 += 1;
                slot.0
            }
            None if !full => {
                self.heavy.insert(key.to_owned(), (1, partition, 0));
                1
            }
            None => {
                // Space-saving: the new key replaces the lightest, inheriting its count.
                let (n, lightest) =
                    self.by_count.pop_first().expect("the table is full, so not empty");
                self.heavy.remove(&lightest);
                self.heavy.insert(key.to_owned(), (n + 1, partition, n));
                n + 1
            }
        };
        self.by_count.insert((count, key.to_owned()));
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        let total: u64 = self.per_partition.iter().sum();
        let n = self.per_partition.len() as f64;
        let max = self.per_partition.iter().copied().max().unwrap_or(0);
        let mean = total as f64 / n;
        let skew = if total == 0 { 0.0 } else { max as f64 / mean };
        let out = &mut self.out;
        writeln!(
            out,
            "keys {total}, partitions {}, mean {mean:.1}, max {max}, skew (max/mean) {skew:.3}",
            self.per_partition.len()
        )?;
        writeln!(out, "partition\tkeys")?;
        for (p, c) in self.per_partition.iter().enumerate() {
            writeln!(out, "{p}\t{c}")?;
        }
        let mut heavy: Vec<_> = self.heavy.iter().collect();
        heavy.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then_with(|| a.0.cmp(b.0)));
        // With more distinct keys than counters the counts are upper bounds; `at least`
        // subtracts the count a key inherited when it took over a counter.
        writeln!(out, "heaviest keys (at least, at most, partition, key):")?;
        for (key, (count, p, error)) in heavy.into_iter().take(TOP) {
            writeln!(out, "{}\t{count}\t{p}\t{key}", count - error)?;
        }
        out.flush().context("writing output")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycled_key_vectors_keep_their_allocation() {
        let text = String::from("a\nb\nc\n");
        let mut keys: Vec<&str> = Vec::with_capacity(1000);
        chunks::split_keys(&text, &mut keys);
        let ptr = keys.as_ptr() as usize;
        let again: Vec<&'static str> = recycle(keys);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), 1000, "the buffer is kept, not reallocated");
        assert_eq!(again.as_ptr() as usize, ptr);
    }

    #[test]
    fn the_table_prints_what_display_prints() {
        let count = PartitionCount::new(32767).expect("valid");
        let ps: Vec<PartitionId> =
            [0, 7, 9, 10, 99, 100, 999, 1000, 9999, 10000, 32766].map(PartitionId).to_vec();
        let keys: Vec<&str> = ps.iter().map(|_| "k").collect();
        let expected: String = ps.iter().map(|p| format!("{}\n", p.0)).collect();
        let mut out = b"kept ".to_vec();
        Formatter::new(count, Format::Plain).write(&keys, &ps, &mut out);
        assert_eq!(String::from_utf8(out).expect("ascii"), format!("kept {expected}"));
        let mut out = Vec::new();
        Formatter::new(count, Format::Tsv).write(&keys, &ps, &mut out);
        let expected: String = ps.iter().map(|p| format!("k\t{}\n", p.0)).collect();
        assert_eq!(String::from_utf8(out).expect("ascii"), expected);
    }
}
