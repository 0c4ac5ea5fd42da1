//! `keyorder-sim model`: every interleaving of a small configuration, checked exhaustively.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use keyorder_sim::model::{self, Bounds, Config, Outcome, Summary, Switches};
use keyorder_sim::Break;

use super::emit;

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Workers.
    #[arg(long, default_value_t = 2)]
    workers: u8,
    /// Partitions.
    #[arg(long, default_value_t = 1)]
    partitions: u8,
    /// Keys (event i has key i mod keys; key k lives on partition k mod partitions).
    #[arg(long, default_value_t = 2)]
    keys: u8,
    /// Events (at most 9).
    #[arg(long, default_value_t = 2)]
    events: u8,
    /// Worker crashes per path.
    #[arg(long, default_value_t = 0)]
    crashes: u8,
    /// Lease sessions the server ends per path.
    #[arg(long, default_value_t = 0)]
    lease_losses: u8,
    /// Endpoint refusals (503 with Retry-After) per path.
    #[arg(long, default_value_t = 0)]
    refusals: u8,
    /// Deliveries the endpoint never answers, per path.
    #[arg(long, default_value_t = 0)]
    silences: u8,
    /// Producer commits that land late, per path.
    #[arg(long, default_value_t = 0)]
    late_commits: u8,
    /// Delivery attempts before a dead letter.
    #[arg(long, default_value_t = 2)]
    attempts: u32,
    /// The clock's horizon, in milliseconds of model time.
    #[arg(long, default_value_t = 600)]
    horizon_ms: u64,
    /// Search threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Switch on a known-bad design from the catalogue (the check must find it).
    #[arg(long = "break", value_enum, value_name = "NAME")]
    broken: Option<Break>,
    /// Write the counterexample's history as JSON lines for `keyorder check`.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
}

impl ModelArgs {
    fn bounds(&self) -> Bounds {
        Bounds {
            workers: self.workers,
            partitions: self.partitions,
            keys: self.keys,
            events: self.events,
            crashes: self.crashes,
            lease_losses: self.lease_losses,
            refusals: self.refusals,
            silences: self.silences,
            late_commits: self.late_commits,
            attempts: self.attempts,
            horizon: Duration::from_millis(self.horizon_ms),
        }
    }
}

pub fn run(args: ModelArgs) -> anyhow::Result<ExitCode> {
    let switches = Switches::of(args.broken).map_err(|u| {
        anyhow::anyhow!("the model cannot express --break {}: {}", u.design.name(), u.why)
    })?;
    let bounds = args.bounds();
    let config = Config::new(bounds, switches)?;
    let summary = model::check(config, args.threads, true);
    emit(&report(&bounds, args.broken, &summary))?;
    let Outcome::Broken(found) = &summary.outcome else { return Ok(ExitCode::SUCCESS) };
    if let Some(path) = &args.history {
        std::fs::write(path, model::history::to_jsonl(&found.history))
            .with_context(|| format!("cannot write the history to {}", path.display()))?;
    }
    Ok(ExitCode::FAILURE)
}

/// The summary as printed.
pub fn report(bounds: &Bounds, broken: Option<Break>, s: &Summary) -> String {
    let mut out = format!(
        "states: {} generated, {} unique; depth {}; {:.1} s; {:.0} states/s\n",
        s.states,
        s.unique,
        s.depth,
        s.elapsed.as_secs_f64(),
        s.rate()
    );
    let design = broken.map_or_else(String::new, |b| format!(" with --break {}", b.name()));
    match &s.outcome {
        Outcome::Holds => out.push_str(&format!(
            "every interleaving of {}{design} holds: no reorder, skip, concurrent delivery, \
             split key or loss, every drain input accepted, progress once faults stop\n",
            bounds.flags()
        )),
        Outcome::Broken(c) => {
            out.push_str(&format!(
                "counterexample{design} at {}: \"{}\" breaks in {} steps\n",
                bounds.flags(),
                c.property,
                c.steps.len()
            ));
            for (i, step) in c.steps.iter().enumerate() {
                out.push_str(&format!("{:>3}. {step}\n", i + 1));
            }
            let kinds: Vec<&str> = c.verdict.violated().iter().map(|k| k.name()).collect();
            if !kinds.is_empty() {
                out.push_str(&format!("keyorder check on its history: {}\n", kinds.join(", ")));
            }
        }
    }
    out
}
