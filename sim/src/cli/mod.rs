//! Command-line parsing and dispatch for `keyorder-sim`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use keyorder_sim::{Break, Scenario, Size};

mod catalogue;
mod merge;
mod model;
mod rehearse;
mod replay;
mod shrink;
mod sweep;

/// Deterministic simulation of per-key ordered webhook delivery: crashes, lease loss, slow and
/// failing endpoints, store restarts and modulus changes, every run judged by the checker.
#[derive(Debug, Parser)]
#[command(name = "keyorder-sim", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run many seeds and summarise; exit 1 on any violation.
    Sweep(sweep::SweepArgs),
    /// Add up `sweep --json` reports of one scenario source (shards run on several machines)
    /// into one verdict with each failing seed's replay command; exit 1 on any violation.
    Merge(merge::MergeArgs),
    /// Rerun one seed and print its verdict and trace hash.
    Replay(replay::ReplayArgs),
    /// Print the scenario a seed generates, as JSON (to edit, save and replay with --scenario).
    Scenario(ScenarioArgs),
    /// Search random scenarios for a violation and shrink it to a small saved case.
    Shrink(shrink::ShrinkArgs),
    /// Table of the broken designs: seeds needed to catch each, and shrunk case sizes.
    Catalogue(catalogue::CatalogueArgs),
    /// Run a change of partition count with your key distribution: drain-and-switch, online,
    /// and the unsafe flip, on the same seeds.
    Plan(rehearse::PlanArgs),
    /// Check every interleaving of a small configuration (workers, partitions, keys, events,
    /// faults) exhaustively; exit 1 with the shortest counterexample on a violation.
    Model(model::ModelArgs),
}

#[derive(Debug, Args)]
struct ScenarioArgs {
    /// The seed.
    seed: u64,
    /// The size.
    #[arg(long, value_enum, default_value_t = Size::Medium)]
    size: Size,
    /// The scenario a sweep with this broken design runs (with its trigger).
    #[arg(long = "break", value_enum, value_name = "NAME")]
    broken: Option<Break>,
}

/// Where a run's scenario comes from: a file, or generated from the seed at a size.
#[derive(Debug, Clone, Args)]
pub struct ScenarioSource {
    /// A scenario JSON file (the same scenario for every seed).
    #[arg(long, conflicts_with = "size")]
    scenario: Option<PathBuf>,
    /// Generate a scenario from each seed at this size.
    #[arg(long, value_enum, default_value_t = Size::Medium)]
    size: Size,
    /// Switch on a known-bad design from the catalogue (the checker must catch it).
    #[arg(long = "break", value_enum, value_name = "NAME")]
    broken: Option<Break>,
    /// Partition FIFO, without parking: a failing head blocks its whole partition (by
    /// default a failing key is parked and blocks only itself).
    #[arg(long)]
    strict_partition_order: bool,
}

impl ScenarioSource {
    /// Loads the file once, if any.
    fn load(&self) -> anyhow::Result<Option<Scenario>> {
        let Some(path) = &self.scenario else { return Ok(None) };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let (scenario, _) = keyorder_sim::regression::load_scenario(&text)
            .with_context(|| format!("in {}", path.display()))?;
        Ok(Some(scenario))
    }

    /// The scenario of `seed`.
    fn for_seed(&self, loaded: &Option<Scenario>, seed: u64) -> Scenario {
        let mut scenario = self.scenario_of(loaded, seed);
        scenario.strict_partition_order |= self.strict_partition_order;
        scenario
    }

    fn scenario_of(&self, loaded: &Option<Scenario>, seed: u64) -> Scenario {
        match (loaded, self.broken) {
            (Some(s), None) => s.clone(),
            (Some(s), Some(b)) => {
                let mut s = s.clone();
                s.breaks = vec![b];
                s
            }
            (None, None) => Scenario::generate(self.size, seed),
            (None, Some(b)) => Scenario::generate_broken(self.size, seed, b),
        }
    }

    /// The flags that reproduce this source on the command line.
    pub(crate) fn flags(&self) -> String {
        let mut flags = match &self.scenario {
            Some(path) => format!("--scenario {}", path.display()),
            None => format!("--size {}", value_name(&self.size)),
        };
        if let Some(b) = self.broken {
            flags.push_str(&format!(" --break {}", b.name()));
        }
        if self.strict_partition_order {
            flags.push_str(" --strict-partition-order");
        }
        flags
    }
}

fn value_name(v: &impl clap::ValueEnum) -> String {
    v.to_possible_value().map_or_else(String::new, |p| p.get_name().to_owned())
}

/// Writes `text` to standard output; a reader that went away (`| head`) is not an error.
pub(crate) fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Runs the parsed command; the exit code says whether any run violated the contract.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Sweep(args) => sweep::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Merge(args) => merge::run(args),
        Command::Shrink(args) => shrink::run(args),
        Command::Catalogue(args) => catalogue::run_catalogue(args),
        Command::Plan(args) => rehearse::run(args),
        Command::Model(args) => model::run(args),
        Command::Scenario(args) => {
            let scenario = match args.broken {
                Some(b) => Scenario::generate_broken(args.size, args.seed, b),
                None => Scenario::generate(args.size, args.seed),
            };
            emit(&(serde_json::to_string_pretty(&scenario)? + "\n"))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Reruns `seed` of `scenario` and writes its HTML timeline to `path`.
fn write_timeline(
    scenario: &keyorder_sim::Scenario,
    seed: u64,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let outcome = keyorder_sim::run(scenario, seed, true)?;
    let history = outcome.history.as_ref().context("the run kept no history")?;
    let page = keyorder::html::timeline::render(
        &format!("keyorder-sim seed {seed}"),
        history,
        &outcome.verdict,
    );
    std::fs::write(path, page)
        .with_context(|| format!("cannot write the timeline to {}", path.display()))
}
