//! `keyorder-sim plan`: run a repartition plan in the simulation with the operator's own key
//! distribution: drain-and-switch, the online procedure and the unsafe flip, side by side.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use keyorder::PartitionCount;
use keyorder_sim::rehearsal::{compare, plan_scenario, KeySample};

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The partition count in force.
    #[arg(long, value_parser = parse_count)]
    from: PartitionCount,
    /// The partition count you want.
    #[arg(long, value_parser = parse_count)]
    to: PartitionCount,
    /// Your key sample (CSV `key[,weight]` or JSON lines); 96 keys are drawn by weight.
    #[arg(long)]
    keys: Option<PathBuf>,
    /// Seeds to run (each runs all three procedures).
    #[arg(long, default_value_t = 20)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Save the scenario of every run with a violation into this folder, to replay.
    #[arg(long)]
    save: Option<PathBuf>,
}

fn parse_count(text: &str) -> Result<PartitionCount, String> {
    text.parse::<PartitionCount>().map_err(|e| e.to_string())
}

pub fn run(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let keys = match &args.keys {
        Some(path) => {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let sample = KeySample::read(BufReader::new(file), 1)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("in {}", path.display()))?;
            anyhow::ensure!(
                !sample.keys().is_empty(),
                "{} has no key with a positive weight",
                path.display()
            );
            Some(sample.keys())
        }
        None => None,
    };
    let mut rows = Vec::new();
    for seed in args.start..args.start.saturating_add(args.seeds) {
        let runs = compare(args.from, args.to, keys.as_deref(), seed)?;
        if let Some(dir) = &args.save {
            for r in runs.iter().filter(|r| !r.violations.is_empty()) {
                let scenario =
                    plan_scenario(args.from, args.to, keys.as_deref(), seed, r.procedure);
                let path = dir.join(format!(
                    "plan-{}-{}-seed{seed}-{}.json",
                    args.from,
                    args.to,
                    r.procedure_name()
                ));
                std::fs::write(&path, serde_json::to_string_pretty(&scenario)? + "\n")
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("saved: keyorder-sim replay {seed} --scenario {}", path.display());
            }
        }
        rows.push((seed, runs));
    }
    let failed = |name: &str| {
        rows.iter()
            .filter(|(_, r)| {
                r.iter().any(|p| p.procedure_name() == name && !p.violations.is_empty())
            })
            .count()
    };
    let (safe_dns, safe_online, caught_flip) =
        (failed("drain-and-switch"), failed("online"), failed("flip-without-drain"));
    if args.json {
        let json = serde_json::json!({
            "from": args.from.get(), "to": args.to.get(),
            "seeds": rows.iter().map(|(seed, runs)| serde_json::json!({"seed": seed, "runs": runs})).collect::<Vec<_>>(),
            "seeds_with_violations": {"drain-and-switch": safe_dns, "online": safe_online, "flip-without-drain": caught_flip},
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!(
            "plan {} -> {} in the simulation{}",
            args.from,
            args.to,
            keys.as_ref().map_or(String::new(), |k| format!(" with {} sampled keys", k.len()))
        );
        println!(
            "{:>6}  {:<20} {:<32} {:>6} {:>12} {:>12}",
            "seed", "procedure", "violations", "dups", "pause (ms)", "drain (ms)"
        );
        for (seed, runs) in &rows {
            for r in runs {
                let v = if r.violations.is_empty() {
                    "none".to_owned()
                } else {
                    format!("{:?}", r.violations)
                };
                println!(
                    "{seed:>6}  {:<20} {v:<32} {:>6} {:>12} {:>12}",
                    r.procedure_name(),
                    r.duplicates,
                    r.write_pause_ms,
                    r.drain_ms
                );
            }
        }
        println!("seeds with violations: drain-and-switch {safe_dns}, online {safe_online}, flip-without-drain {caught_flip} (of {})", rows.len());
    }
    Ok(if safe_dns == 0 && safe_online == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

trait Named {
    fn procedure_name(&self) -> &'static str;
}

impl Named for keyorder_sim::rehearsal::ProcedureRun {
    fn procedure_name(&self) -> &'static str {
        use keyorder_sim::scenario::Procedure;
        match self.procedure {
            Procedure::DrainAndSwitch => "drain-and-switch",
            Procedure::Online => "online",
            Procedure::FlipWithoutDrain => "flip-without-drain",
        }
    }
}
