//! The `keyorder` command line: argument parsing and dispatch. Library errors get context
//! here (anyhow); bad input exits 2, anything else 1.

use clap::{Parser, Subcommand};

mod bench;
mod bench_http;
mod chunks;
pub(crate) mod db;
mod delivery;
mod endpoints;
mod plan;
mod receiver;
mod route;
mod workers;

/// Operate a per-key ordered, partitioned webhook queue.
#[derive(Debug, Parser)]
#[command(name = "keyorder", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the partition of each key (one UTF-8 key per line), as the reference routing does.
    Route(route::RouteArgs),
    /// Plan a change of partition count: keys and load that move, skew, whales, the
    /// drain-and-switch checklist.
    Plan(plan::PlanArgs),
    /// Create or upgrade the queue schema (idempotent, versioned).
    Migrate(db::MigrateArgs),
    /// Enqueue events from JSON lines, in batches of one round trip each.
    Enqueue(db::EnqueueArgs),
    /// Deliver: lease partitions (a fair share), drain each one event at a time over HTTP.
    Work(db::WorkArgs),
    /// Per-partition depth, oldest wait, keys affected, head attempts; heaviest keys.
    Lag(db::LagArgs),
    /// List, show and redrive dead-lettered events.
    Dlq(db::DlqArgs),
    /// Measure the store (PostgreSQL, or SQLite with --database sqlite:PATH): batch enqueue,
    /// drain with 1..8 workers, churn (PostgreSQL).
    Bench(bench::BenchArgs),
    /// Change the partition count online (no write pause): a new layout with a per-key barrier.
    Switch(db::SwitchArgs),
    /// Set, list and remove per-key endpoints (the keyorder_endpoint table), each row checked
    /// before it is written.
    Endpoints(endpoints::EndpointsArgs),
}

/// Input the user can fix: reported with exit code 2, like a usage error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Route(args) => route::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Migrate(args) => db::migrate(args),
        Command::Enqueue(args) => db::enqueue(args),
        Command::Work(args) => db::work(args),
        Command::Lag(args) => db::lag(args),
        Command::Dlq(args) => db::dlq(args),
        Command::Bench(args) => bench::run(args),
        Command::Switch(args) => db::switch(args),
        Command::Endpoints(args) => endpoints::run(args),
    }
}

/// 2 for input the user can fix, 1 for everything else.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.chain().any(|e| e.is::<BadInput>()) {
        2
    } else {
        1
    }
}
