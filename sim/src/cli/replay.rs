//! `keyorder-sim replay SEED`: one run, its verdict and trace hash.

use std::process::ExitCode;

use clap::Args;

use super::ScenarioSource;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The seed to rerun.
    seed: u64,
    #[command(flatten)]
    source: ScenarioSource,
    /// Print the full event trace (time in µs, host, event).
    #[arg(long)]
    trace: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let loaded = args.source.load()?;
    let scenario = args.source.for_seed(&loaded, args.seed);
    let outcome = keyorder_sim::run(&scenario, args.seed, args.trace)?;
    if args.json {
        let json = serde_json::json!({
            "seed": outcome.seed,
            "trace_hash": outcome.trace_hash,
            "verdict": outcome.verdict,
            "quiesced": outcome.quiesced,
            "simulated_ms": outcome.simulated_ms,
            "faults": outcome.faults,
            "switches": outcome.switches,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        if let Some(trace) = &outcome.trace {
            super::emit(trace)?;
        }
        println!("seed {}  trace hash {}", outcome.seed, outcome.trace_hash);
        println!("simulated {} ms, quiesced: {}", outcome.simulated_ms, outcome.quiesced);
        let faults: Vec<String> = outcome.faults.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("faults: {}", if faults.is_empty() { "none".into() } else { faults.join(" ") });
        for s in &outcome.switches {
            println!(
                "switch {} -> {}: {} (write pause {} ms, drain {} ms)",
                s.from,
                s.to,
                if s.switched { "switched" } else { "refused" },
                s.write_pause_ms,
                s.drain_ms
            );
        }
        print!("{}", outcome.verdict);
    }
    Ok(if outcome.verdict.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
