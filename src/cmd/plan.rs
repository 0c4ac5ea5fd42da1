//! `keyorder plan`: what a change of partition count does to a key sample, and whether the
//! live queue is safe to switch.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;

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
    /// `-` reads standard input. Weight defaults to 1 (use events/s for load figures).
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
}

fn parse_count(text: &str) -> Result<PartitionCount, String> {
    text.parse::<PartitionCount>().map_err(|e| e.to_string())
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let mut planner = Planner::new(args.from, args.to, Overrides::new(), Overrides::new())?;
    if let Some(path) = &args.keys {
        read_sample(path, &mut planner)?;
    }
    let drain = None::<DrainInput>;
    let plan = planner.finish(args.workers, drain.as_ref());
    print(&plan, args.json)
}

fn print(plan: &Plan, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(plan)?);
    } else {
        print!("{}", plan.report());
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
