//! `keyorder-sim replay SEED`: one run, its verdict and trace hash.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context;
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
    /// Also write the run as one self-contained HTML timeline (swim lanes per partition and
    /// worker, the checker's counterexamples highlighted) to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<std::path::PathBuf>,
}

pub fn run(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let loaded = args.source.load()?;
    let scenario = args.source.for_seed(&loaded, args.seed);
    let keep_trace = args.trace || args.html.is_some();
    let outcome = keyorder_sim::run(&scenario, args.seed, keep_trace)?;
    if let Some(path) = &args.html {
        let history = outcome.history.as_ref().expect("kept with the trace");
        let title = format!("keyorder-sim replay {}", args.seed);
        let page = keyorder::html::timeline::render(&title, history, &outcome.verdict);
        std::fs::write(path, page)
            .with_context(|| format!("cannot write the timeline to {}", path.display()))?;
        eprintln!("timeline written to {}", path.display());
    }
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
        super::emit(&format!("{}\n", serde_json::to_string_pretty(&json)?))?;
    } else {
        if let Some(trace) = outcome.trace.as_ref().filter(|_| args.trace) {
            super::emit(trace)?;
        }
        // One write for the summary too: `replay … | head` must not panic on a closed pipe.
        let mut text = format!("seed {}  trace hash {}\n", outcome.seed, outcome.trace_hash);
        let _ =
            writeln!(text, "simulated {} ms, quiesced: {}", outcome.simulated_ms, outcome.quiesced);
        let faults: Vec<String> = outcome.faults.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            text,
            "faults: {}",
            if faults.is_empty() { "none".into() } else { faults.join(" ") }
        );
        for s in &outcome.switches {
            let _ = writeln!(
                text,
                "switch {} -> {}: {} (write pause {} ms, drain {} ms)",
                s.from,
                s.to,
                if s.switched { "switched" } else { "refused" },
                s.write_pause_ms,
                s.drain_ms
            );
        }
        let _ = write!(text, "{}", outcome.verdict);
        super::emit(&text)?;
    }
    Ok(if outcome.verdict.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
