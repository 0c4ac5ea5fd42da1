//! `keyorder route`: stream keys through the routing function in bounded memory.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use keyorder::{route_many, PartitionCount, PartitionId};

use super::BadInput;

/// Keys routed per batch: large enough to amortise, small enough to keep memory flat.
const BATCH: usize = 4096;
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
    let input: Box<dyn BufRead> = match &args.file {
        Some(path) => Box::new(BufReader::new(
            File::open(path)
                .map_err(|e| BadInput(format!("cannot open {}: {e}", path.display())))?,
        )),
        None => Box::new(BufReader::new(io::stdin().lock())),
    };
    let stdout = io::stdout().lock();
    let mut sink: Box<dyn Sink> = if args.stats {
        Box::new(Stats::new(args.partitions, stdout))
    } else {
        Box::new(Printer { out: BufWriter::new(stdout), format: args.format })
    };
    let mut keys = KeyBatch::default();
    let mut parts = Vec::with_capacity(BATCH);
    let mut line = Vec::new();
    let mut line_no = 0u64;
    let mut reader = input;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).context("reading keys")?;
        if n == 0 {
            break;
        }
        line_no += 1;
        strip_newline(&mut line);
        let key = std::str::from_utf8(&line)
            .map_err(|e| BadInput(format!("line {line_no}: key is not valid UTF-8 ({e})")))?;
        keys.push(key);
        if keys.len == BATCH {
            flush(&mut keys, &mut parts, args.partitions, sink.as_mut())?;
        }
    }
    flush(&mut keys, &mut parts, args.partitions, sink.as_mut())?;
    sink.finish()
}

fn strip_newline(line: &mut Vec<u8>) {
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
}

/// A batch of keys whose string buffers are reused from batch to batch.
#[derive(Default)]
struct KeyBatch {
    buffers: Vec<String>,
    len: usize,
}

impl KeyBatch {
    fn push(&mut self, key: &str) {
        if self.len == self.buffers.len() {
            self.buffers.push(String::new());
        }
        let slot = &mut self.buffers[self.len];
        slot.clear();
        slot.push_str(key);
        self.len += 1;
    }

    fn keys(&self) -> &[String] {
        &self.buffers[..self.len]
    }
}

fn flush(
    keys: &mut KeyBatch,
    parts: &mut Vec<PartitionId>,
    count: PartitionCount,
    sink: &mut dyn Sink,
) -> anyhow::Result<()> {
    route_many(keys.keys(), count, parts);
    for (key, p) in keys.keys().iter().zip(parts.iter()) {
        sink.take(key, *p)?;
    }
    keys.len = 0;
    Ok(())
}

trait Sink {
    fn take(&mut self, key: &str, partition: PartitionId) -> anyhow::Result<()>;
    fn finish(&mut self) -> anyhow::Result<()>;
}

struct Printer<W: Write> {
    out: BufWriter<W>,
    format: Format,
}

impl<W: Write> Sink for Printer<W> {
    fn take(&mut self, key: &str, partition: PartitionId) -> anyhow::Result<()> {
        match self.format {
            Format::Plain => writeln!(self.out, "{partition}"),
            Format::Tsv => writeln!(self.out, "{key}\t{partition}"),
        }
        .context("writing output")
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        self.out.flush().context("writing output")
    }
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
