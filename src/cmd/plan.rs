//! `keyorder plan`: what a change of partition count does to a key sample, and whether the
//! live queue is safe to switch.

use std::fs::File;
use std::io::{self, Read};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use keyorder::plan::{parse_sample_line, DrainInput, Plan, Planner};
use keyorder::routing::digest_many;
use keyorder::store::admin::Admin;
use keyorder::store::open::{AdminConn, OpenMode};
use keyorder::{Overrides, PartitionCount};

use super::bad_input::BadInput;
use super::chunks;

/// Keys per batch of the queued-keys sample (`--database` without `--keys`).
const BATCH: usize = 8192;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The partition count in force (with --database: read from it, and this must agree).
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true, required_unless_present = "database")]
    from: Option<PartitionCount>,
    /// The partition count you want.
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
    to: PartitionCount,
    /// A key sample: CSV lines `key[,weight]` or JSON lines `{"key": .., "weight": ..}`;
    /// `-` reads standard input. Weight defaults to 1 (use events/s for load figures). Without
    /// it, --database uses the queued keys, weighted by their queued events.
    #[arg(long)]
    keys: Option<PathBuf>,
    /// Workers, for the over-provisioned alternative (keep the count, assign partitions).
    #[arg(long)]
    workers: Option<usize>,
    /// Deliveries per second one partition drains, for the drain prediction.
    #[arg(long, default_value_t = 1000.0, value_parser = parse_rate)]
    drain_rate: f64,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    json: bool,
    /// Read the live queue too: depth and oldest wait per partition, split keys, and the
    /// verdict (SAFE TO SWITCH only when the queue is empty and no key is split; exit 1
    /// otherwise).
    #[arg(long)]
    database: Option<String>,
    /// With --database: first wait up to this many seconds for the queue to drain (producers
    /// paused), printing the depth as it falls.
    #[arg(long, requires = "database")]
    wait_drained: Option<u64>,
    /// Try a pin, KEY=PARTITION, under the target count (repeatable); with --database the
    /// pins in force are counted too, before and after.
    #[arg(long = "pin", value_name = "KEY=PARTITION", value_parser = parse_pin)]
    pins: Vec<(String, u16)>,
    /// Also write the plan as one self-contained HTML page (load per partition before and
    /// after as bar charts, moved fraction, whales, checklist, verdict) to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

/// Whether the live queue may be switched, and why not.
#[derive(Debug, serde::Serialize)]
struct Verdict {
    safe: bool,
    reasons: Vec<String>,
    depth: i64,
    oldest_wait_seconds: f64,
    split_keys: Vec<keyorder::store::admin::SplitKey>,
    partitions: Vec<keyorder::store::admin::PartitionLag>,
}

fn parse_count(text: &str) -> Result<PartitionCount, String> {
    text.parse::<PartitionCount>().map_err(|e| e.to_string())
}

/// A drain rate: a finite number of deliveries per second above zero.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        Ok(_) => Err(format!("{text} is not a rate: give deliveries per second above 0")),
        Err(e) => Err(format!("{text:?} is not a number: {e}")),
    }
}

/// A `--pin KEY=PARTITION`.
fn parse_pin(text: &str) -> Result<(String, u16), String> {
    let (key, p) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?} is not KEY=PARTITION (e.g. --pin sub_42=15)"))?;
    if key.is_empty() {
        return Err(format!("{text:?} has no key before the ="));
    }
    let p = p
        .parse::<u16>()
        .map_err(|_| format!("{text:?}: the partition {p:?} is not a whole number from 0"))?;
    Ok((key.to_owned(), p))
}

/// The count in force and its pins: from the database when given (checked against `--from`),
/// else `--from` with no pins.
fn routing_of(args: &PlanArgs) -> anyhow::Result<(PartitionCount, Overrides)> {
    let Some(url) = &args.database else {
        let from =
            args.from.ok_or_else(|| BadInput("--from is needed without --database".into()))?;
        return Ok((from, Overrides::new()));
    };
    let state = super::runtime::block_on(async {
        anyhow::Ok(postgres_admin(url).await?.routing_state().await?)
    })??;
    let Some(layout) = state.current() else {
        return Err(BadInput(
            "the database records no partition count yet: run `keyorder migrate --partitions N`"
                .into(),
        )
        .into());
    };
    if let Some(from) = args.from.filter(|f| *f != layout.partitions) {
        return Err(BadInput(format!(
            "--from {from} disagrees with the database: it records {} partitions",
            layout.partitions
        ))
        .into());
    }
    Ok((layout.partitions, state.current_pins()))
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let (from, pins_from) = routing_of(&args)?;
    let mut pins_to = Overrides::new();
    for (key, partition) in pins_from.iter() {
        // Pins carry into the new layout (a switch refuses one the new count lacks).
        pins_to.pin(key.clone(), partition);
    }
    for (key, p) in &args.pins {
        pins_to.pin(key.clone(), keyorder::PartitionId(*p));
    }
    let mut planner =
        Planner::new(from, args.to, pins_from, pins_to).map_err(|e| BadInput(format!("{e}")))?;
    if let Some(path) = &args.keys {
        read_sample(path, &mut planner)?;
    }
    let live = match &args.database {
        Some(url) => Some(super::runtime::block_on(live_queue(
            url,
            from,
            args.drain_rate,
            args.wait_drained,
        ))??),
        None => None,
    };
    if let (None, Some(url)) = (&args.keys, &args.database) {
        // No sample given: the queued keys are the sample, weighted by their queued events.
        let keys = super::runtime::block_on(queued_keys(url))??;
        let (k, w): (Vec<String>, Vec<f64>) = keys.into_iter().unzip();
        for (ks, ws) in k.chunks(BATCH).zip(w.chunks(BATCH)) {
            planner.add_batch(ks, ws)?;
        }
    }
    let drain = live.as_ref().map(|(d, _)| d);
    let plan = planner.finish(args.workers, drain);
    let verdict = live.map(|(_, v)| v);
    print(&plan, verdict.as_ref(), args.json)?;
    if let Some(path) = &args.html {
        let live = verdict.as_ref().map(|v| keyorder::html::plan_page::LiveVerdict {
            safe: v.safe,
            reasons: v.reasons.clone(),
        });
        std::fs::write(path, keyorder::html::plan_page::render(&plan, live.as_ref()))
            .with_context(|| format!("cannot write the plan page to {}", path.display()))?;
        tracing::info!(path = %path.display(), "plan page written");
    }
    match verdict {
        Some(v) if !v.safe => Err(NotSafe.into()),
        _ => Ok(()),
    }
}

/// The keys queued now, each weighted by its queued events.
async fn queued_keys(url: &str) -> anyhow::Result<Vec<(String, f64)>> {
    Ok(postgres_admin(url).await?.queued_keys().await?)
}

/// The admin connection of the live queue, which must be PostgreSQL: SQLite is refused as
/// input the user can fix. Checked to be at the current schema version.
async fn postgres_admin(url: &str) -> anyhow::Result<AdminConn> {
    let db = super::runtime::Database { database: url.to_owned() };
    if db.location()?.file().is_some() {
        return Err(BadInput(format!(
            "this needs PostgreSQL (--database postgres://...), not {url}"
        ))
        .into());
    }
    db.admin(OpenMode::Existing).await
}

/// The plan is fine but the live queue is not safe to switch: exit 1, the report said why.
#[derive(Debug, thiserror::Error)]
#[error("NOT SAFE to switch now (see the reasons above)")]
struct NotSafe;

async fn live_queue(
    url: &str,
    from: PartitionCount,
    rate: f64,
    wait: Option<u64>,
) -> anyhow::Result<(DrainInput, Verdict)> {
    let client = postgres_admin(url).await?;
    if let Some(secs) = wait {
        let clock = keyorder::clock::TokioClock::start();
        let drained = keyorder::store::admin::wait_until_drained(
            &client,
            &clock,
            std::time::Duration::from_secs(secs),
            std::time::Duration::from_secs(1),
            |d| tracing::info!(queued = d, "waiting to drain: {d} event(s) still queued"),
        )
        .await?;
        if !drained {
            tracing::warn!(waited_s = secs, "not drained after {secs} s: do NOT switch");
        }
    }
    let lag = client.lag().await?;
    let split_keys = client.split_keys(20).await?;
    let mut depth = vec![0u64; usize::from(from.get())];
    let mut reasons = Vec::new();
    for l in &lag {
        match depth.get_mut(l.partition as usize) {
            Some(d) => *d = l.depth as u64,
            None => reasons.push(format!(
                "partition {} has {} rows but the count is {from}",
                l.partition, l.depth
            )),
        }
    }
    let total: i64 = lag.iter().map(|l| l.depth).sum();
    let oldest = lag.iter().map(|l| l.oldest_wait_seconds).fold(0.0, f64::max);
    if total > 0 {
        let busy = lag.iter().filter(|l| l.depth > 0).count();
        reasons.push(format!(
            "queue not drained: depth {total} in {busy} partitions, oldest wait {oldest:.1} s"
        ));
    }
    for s in &split_keys {
        reasons.push(format!("key {:?} is queued on partitions {:?}", s.key, s.partitions));
    }
    let verdict = Verdict {
        safe: reasons.is_empty(),
        reasons,
        depth: total,
        oldest_wait_seconds: oldest,
        split_keys,
        partitions: lag,
    };
    Ok((DrainInput { depth, rate_per_partition: rate }, verdict))
}

fn print(plan: &Plan, verdict: Option<&Verdict>, json: bool) -> anyhow::Result<()> {
    if json {
        let mut value = serde_json::to_value(plan)?;
        if let Some(v) = verdict {
            value["verdict"] = serde_json::to_value(v)?;
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    print!("{}", plan.report());
    if let Some(v) = verdict {
        for l in &v.partitions {
            println!(
                "live p{:<5} depth {:>8}  oldest wait {:>8.1} s  keys {:>6}  head attempts {}",
                l.partition, l.depth, l.oldest_wait_seconds, l.keys_affected, l.head_attempts
            );
        }
        if v.safe {
            println!("verdict: SAFE TO SWITCH (queue empty, no split keys)");
        } else {
            println!("verdict: NOT SAFE: {}", v.reasons.join("; "));
        }
    }
    Ok(())
}

/// Streams the sample into the planner a chunk of lines at a time: each chunk's lines are
/// parsed and digested (the batch router) in parts on every core, then added in input order.
fn read_sample(path: &std::path::Path, planner: &mut Planner) -> anyhow::Result<()> {
    let input: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(io::stdin().lock())
    } else {
        Box::new(
            File::open(path)
                .map_err(|e| BadInput(format!("cannot open {}: {e}", path.display())))?,
        )
    };
    let mut states: Vec<SamplePart> = Vec::new();
    chunks::for_each_chunk(input, |chunk, first_line| {
        let parts = chunks::split_lines(chunk, first_line, chunks::parts_for(chunk.len()));
        states.resize_with(parts.len(), SamplePart::default);
        chunks::run_parts(&parts, &mut states[..parts.len()], |lines, part| part.parse(lines));
        for (lines, part) in parts.iter().zip(&states) {
            if let Some((line_no, e)) = &part.error {
                return Err(BadInput(format!("{}: line {line_no}: {e}", path.display())).into());
            }
            let newlines = lines.bytes.iter().filter(|&&b| b == b'\n').count() as u64;
            let last = lines.first_line + newlines.saturating_sub(1);
            planner.add_digested(&part.keys, &part.digests, &part.weights).map_err(|e| {
                BadInput(format!("{}: in the lines up to {last}: {e}", path.display()))
            })?;
        }
        Ok(())
    })
}

/// One part of a chunk of sample lines: its keys, weights and routing digests, or the first
/// line that does not parse.
#[derive(Default)]
struct SamplePart {
    keys: Vec<String>,
    weights: Vec<f64>,
    digests: Vec<u64>,
    error: Option<(u64, String)>,
}

impl SamplePart {
    fn parse(&mut self, lines: &chunks::LinesPart<'_>) {
        self.keys.clear();
        self.weights.clear();
        self.error = None;
        let text = match chunks::utf8(lines.bytes, lines.first_line) {
            Ok(text) => text,
            Err((line_no, e)) => {
                self.error = Some((line_no, format!("not valid UTF-8 ({e})")));
                return;
            }
        };
        for (line_no, text) in (lines.first_line..).zip(chunks::lines(text)) {
            if text.is_empty() || (line_no == 1 && (text == "key" || text == "key,weight")) {
                continue;
            }
            match parse_sample_line(text) {
                Ok((key, weight)) => {
                    self.keys.push(key);
                    self.weights.push(weight);
                }
                Err(e) => {
                    self.error = Some((line_no, e));
                    return;
                }
            }
        }
        digest_many(&self.keys, &mut self.digests);
    }
}
