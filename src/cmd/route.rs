//! `keyorder route`: stream keys through the batch router in bounded memory, a chunk of
//! lines at a time, each chunk split across the cores, output in input order.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use keyorder::{route_many, PartitionCount, PartitionId};

use super::bad_input::BadInput;
use super::chunks;

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
    // Each part of a chunk routes its keys and, unless --stats, formats its output; the parts
    // are written in order. Buffers are reused from chunk to chunk.
    let format = (!args.stats).then_some(args.format);
    let mut states: Vec<Part> = Vec::new();
    chunks::for_each_chunk(input, |chunk, first_line| {
        // Every part validates, splits, routes and formats its own lines; only the cut at
        // line ends and the writes in order are serial.
        let parts = chunks::split_lines(chunk, first_line, chunks::parts_for(chunk.len()));
        states.resize_with(parts.len(), Part::default);
        chunks::run_parts(&parts, &mut states[..parts.len()], |lines, part| {
            part.route(lines, args.partitions, format)
        });
        for (lines, part) in parts.iter().zip(&states) {
            if let Some((line, e)) = &part.bad_utf8 {
                return Err(BadInput(format!("line {line}: key is not valid UTF-8 ({e})")).into());
            }
            match &mut stats {
                Some(stats) => {
                    let text = std::str::from_utf8(lines.bytes).context("validated above")?;
                    for (key, p) in chunks::lines(text).zip(&part.partitions) {
                        stats.take(key, *p)?;
                    }
                }
                None => stdout.write_all(&part.out).context("writing output")?,
            }
        }
        Ok(())
    })?;
    match &mut stats {
        Some(stats) => stats.finish(),
        None => stdout.flush().context("writing output"),
    }
}

/// One part of a chunk: its partitions and, when printing, its formatted output; or the first
/// line that is not UTF-8.
#[derive(Default)]
struct Part {
    partitions: Vec<PartitionId>,
    out: Vec<u8>,
    bad_utf8: Option<(u64, std::str::Utf8Error)>,
}

impl Part {
    fn route(
        &mut self,
        lines: &chunks::LinesPart<'_>,
        count: PartitionCount,
        format: Option<Format>,
    ) {
        self.out.clear();
        self.partitions.clear();
        self.bad_utf8 = None;
        let text = match chunks::utf8(lines.bytes, lines.first_line) {
            Ok(text) => text,
            Err(bad) => {
                self.bad_utf8 = Some(bad);
                return;
            }
        };
        let keys: Vec<&str> = chunks::lines(text).collect();
        route_many(&keys, count, &mut self.partitions);
        let Some(format) = format else { return };
        for (key, p) in keys.iter().zip(&self.partitions) {
            if format == Format::Tsv {
                self.out.extend_from_slice(key.as_bytes());
                self.out.push(b'\t');
            }
            push_decimal(&mut self.out, p.0);
            self.out.push(b'\n');
        }
    }
}

/// Appends `n` in decimal (what `{}` prints, without the formatting machinery).
fn push_decimal(out: &mut Vec<u8>, mut n: u16) {
    let mut digits = [0u8; 5];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
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
