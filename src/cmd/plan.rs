//! `keyorder plan`: what a change of partition count does to a key sample, and whether the
//! live queue is safe to switch.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use keyorder::plan::{parse_sample_line, DrainInput, Plan, Planner};
use keyorder::{Overrides, PartitionCount};

use super::BadInput;

/// Keys routed per batch.
const BATCH: usize = 8192;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The partition count in force.
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
    from: PartitionCount,
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
    #[arg(long, default_value_t = 1000.0)]
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
    split_keys: Vec<keyorder::store::postgres::queue::SplitKey>,
    partitions: Vec<keyorder::store::postgres::queue::PartitionLag>,
}

fn parse_count(text: &str) -> Result<PartitionCount, String> {
    text.parse::<PartitionCount>().map_err(|e| e.to_string())
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let mut planner = Planner::new(args.from, args.to, Overrides::new(), Overrides::new())?;
    if let Some(path) = &args.keys {
        read_sample(path, &mut planner)?;
    }
    let live = match &args.database {
        Some(url) => Some(super::db::block_on(live_queue(
            url,
            args.from,
            args.drain_rate,
            args.wait_drained,
        ))??),
        None => None,
    };
    if let (None, Some(url)) = (&args.keys, &args.database) {
        // No sample given: the queued keys are the sample, weighted by their queued events.
        let keys = super::db::block_on(queued_keys(url))??;
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
        let live = verdict.as_ref().map(|v| keyorder::html::plan::LiveVerdict {
            safe: v.safe,
            reasons: v.reasons.clone(),
        });
        std::fs::write(path, keyorder::html::plan::render(&plan, live.as_ref()))
            .with_context(|| format!("cannot write the plan page to {}", path.display()))?;
        eprintln!("plan page written to {}", path.display());
    }
    match verdict {
        Some(v) if !v.safe => Err(NotSafe.into()),
        _ => Ok(()),
    }
}

/// The keys queued now, each weighted by its queued events.
async fn queued_keys(url: &str) -> anyhow::Result<Vec<(String, f64)>> {
    let client = super::db::Database { database: url.to_owned() }.client().await?;
    let rows = client
        .query(
            "SELECT partition_key, count(*)::float8 FROM delivery_queue GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
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
    let db = super::db::Database { database: url.to_owned() };
    let client = db.client().await?;
    keyorder::store::postgres::schema::require_current(&client).await?;
    if let Some(secs) = wait {
        let clock = keyorder::clock::TokioClock::start();
        let drained = keyorder::store::postgres::queue::wait_until_drained(
            &client,
            &clock,
            std::time::Duration::from_secs(secs),
            std::time::Duration::from_secs(1),
            |d| eprintln!("waiting to drain: {d} event(s) still queued"),
        )
        .await?;
        if !drained {
            eprintln!("not drained after {secs} s: do NOT switch");
        }
    }
    let lag = keyorder::store::postgres::queue::lag(&client).await?;
    let split_keys = keyorder::store::postgres::queue::split_keys(&client, 20).await?;
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

/// Streams the sample into the planner in batches.
fn read_sample(path: &std::path::Path, planner: &mut Planner) -> anyhow::Result<()> {
    let input: Box<dyn BufRead> = if path.as_os_str() == "-" {
        Box::new(BufReader::new(io::stdin().lock()))
    } else {
        let file = File::open(path)
            .map_err(|e| BadInput(format!("cannot open {}: {e}", path.display())))?;
        Box::new(BufReader::with_capacity(1 << 20, file))
    };
    let mut keys: Vec<String> = Vec::with_capacity(BATCH);
    let mut weights: Vec<f64> = Vec::with_capacity(BATCH);
    let mut line = String::new();
    let mut reader = input;
    let mut line_no = 0u64;
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| BadInput(format!("line {}: {e}", line_no + 1)))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let text = line.trim_end_matches(['\n', '\r']);
        if text.is_empty() || (line_no == 1 && (text == "key" || text == "key,weight")) {
            continue;
        }
        let (key, weight) = parse_sample_line(text)
            .map_err(|e| BadInput(format!("{}: line {line_no}: {e}", path.display())))?;
        keys.push(key);
        weights.push(weight);
        if keys.len() == BATCH {
            flush(planner, &mut keys, &mut weights, path, line_no)?;
        }
    }
    flush(planner, &mut keys, &mut weights, path, line_no)
}

fn flush(
    planner: &mut Planner,
    keys: &mut Vec<String>,
    weights: &mut Vec<f64>,
    path: &std::path::Path,
    line_no: u64,
) -> anyhow::Result<()> {
    planner
        .add_batch(keys, weights)
        .map_err(|e| BadInput(format!("{}: in the lines up to {line_no}: {e}", path.display())))?;
    keys.clear();
    weights.clear();
    Ok(())
}
