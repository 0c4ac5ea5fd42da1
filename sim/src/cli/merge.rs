//! `keyorder-sim merge A.json B.json ...`: the `sweep --json` reports of several machines
//! added up into one verdict. Exit 0 when no seed violated, 1 when one did, 2 when the reports
//! cannot be read or do not add up (different scenarios, overlapping seeds).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use keyorder_sim::sweep::{merge, Report};

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The reports, each the standard output of `keyorder-sim sweep --json`.
    #[arg(required = true, value_name = "REPORT")]
    reports: Vec<PathBuf>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: MergeArgs) -> anyhow::Result<ExitCode> {
    let mut reports = Vec::with_capacity(args.reports.len());
    for path in &args.reports {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the report {}", path.display()))?;
        let report: Report = serde_json::from_str(&text).with_context(|| {
            format!("{} is not the output of `keyorder-sim sweep --json`", path.display())
        })?;
        reports.push(report);
    }
    let merged = merge(&reports).context("the reports do not add up")?;
    let s = &merged.summary;
    let replay: Vec<String> = s
        .failed_seeds
        .iter()
        .map(|seed| format!("keyorder-sim replay {seed} {}", merged.source))
        .collect();
    if args.json {
        let mut json = serde_json::to_value(s)?;
        if let Some(object) = json.as_object_mut() {
            object.insert("source".into(), merged.source.clone().into());
            object.insert("reports".into(), reports.len().into());
            object.insert("missing_shards".into(), merged.missing.clone().into());
            object.insert("replay".into(), replay.clone().into());
        }
        super::emit(&(serde_json::to_string_pretty(&json)? + "\n"))?;
    } else {
        let mut out = String::new();
        out.push_str(&format!("reports                   {}\n", reports.len()));
        out.push_str(&format!("scenario                  {}\n", merged.source));
        out.push_str(&format!("runs                      {}\n", s.runs));
        out.push_str(&format!("events                    {}\n", s.events));
        out.push_str(&format!("simulated deliveries      {}\n", s.deliveries));
        out.push_str(&format!(
            "simulated time            {:.1} s\n",
            s.simulated_ms as f64 / 1000.0
        ));
        for (kind, n) in &s.faults {
            out.push_str(&format!("fault {kind:<19} {n}\n"));
        }
        for (kind, n) in &s.counted {
            out.push_str(&format!("counted {kind:<17} {n}\n"));
        }
        for (kind, n) in &s.violations {
            out.push_str(&format!("violation {kind:<15} {n}\n"));
        }
        out.push_str(&format!("violations                {}\n", s.violation_total()));
        out.push_str(&format!("runs not drained in time  {}\n", s.unquiesced_seeds.len()));
        for m in &merged.missing {
            out.push_str(&format!("missing shard             {m} (its seeds are not counted)\n"));
        }
        if s.failed_seeds.is_empty() {
            out.push_str(&format!(
                "result                    OK: no violation in {} runs\n",
                s.runs
            ));
        } else {
            out.push_str(&format!(
                "result                    VIOLATED in seeds {:?}\n",
                s.failed_seeds
            ));
            for r in &replay {
                out.push_str(&format!("replay: {r}\n"));
            }
        }
        super::emit(&out)?;
    }
    if !merged.missing.is_empty() {
        eprintln!(
            "keyorder-sim merge: WARNING: {} shard(s) missing; the verdict covers only the seeds of the reports given",
            merged.missing.len()
        );
    }
    Ok(if s.failed_seeds.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
