//! The `keyorder` command line: argument parsing and dispatch, one file per command;
//! `runtime.rs` holds what the database commands share (the runtime, the shutdown signal, the
//! `--database` argument). Commands reach a store only through `keyorder::store::open` and the
//! store traits, never a backend. Library errors get context here (anyhow); bad input
//! ([`BadInput`]) exits 2, anything else 1.

use clap::{Parser, Subcommand};

use bad_input::BadInput;

mod bad_input;
mod bench;
mod bench_http;
mod check;
mod chunks;
mod delivery;
mod dlq;
mod endpoints;
mod enqueue;
mod history;
mod lag;
mod layout;
pub(crate) mod logging;
mod metrics;
mod migrate;
mod pin;
mod pipeline;
mod plan;
mod receiver;
mod route;
pub(crate) mod runtime;
mod switch;
mod work;
mod worker_log;
mod workers;

/// Operate a per-key ordered, partitioned webhook queue.
#[derive(Debug, Parser)]
#[command(name = "keyorder", version, about, long_about = None)]
pub struct Cli {
    /// The logging flags, global to every command.
    #[command(flatten)]
    pub log: logging::LogArgs,
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
    Migrate(migrate::MigrateArgs),
    /// Enqueue events from JSON lines, in batches of one round trip each.
    Enqueue(enqueue::EnqueueArgs),
    /// Deliver: lease partitions (a fair share), drain each one event at a time over HTTP.
    Work(Box<work::WorkArgs>),
    /// Per-partition depth, oldest wait, keys affected, head attempts; heaviest keys.
    Lag(lag::LagArgs),
    /// List, show and redrive dead-lettered events.
    Dlq(dlq::DlqArgs),
    /// Measure the store (PostgreSQL, or SQLite with --database sqlite:PATH): batch enqueue,
    /// drain with 1..8 workers, churn (PostgreSQL).
    Bench(bench::BenchArgs),
    /// Change the partition count online (no write pause): a new layout with a per-key barrier.
    Switch(switch::SwitchArgs),
    /// Pin a key to a partition of its own (a whale tenant), instead of its hash. A key with
    /// queued rows moves without a split: its new rows wait for its old ones.
    Pin(pin::PinArgs),
    /// Route a pinned key by its hash again (moves it as `pin` does).
    Unpin(pin::UnpinArgs),
    /// List the pinned keys.
    Pins(pin::PinsArgs),
    /// Judge a delivery history from any system (JSON lines): reorder, skip, split key, lost,
    /// concurrent, stall; gaps and duplicates counted. Exit 0 clean, 1 violated, 2 bad input.
    Check(check::CheckArgs),
    /// Set, list and remove per-key endpoints (the keyorder_endpoint table), each row checked
    /// before it is written.
    Endpoints(endpoints::EndpointsArgs),
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Route(args) => route::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Migrate(args) => migrate::migrate(args),
        Command::Enqueue(args) => enqueue::enqueue(args),
        Command::Work(args) => work::work(*args),
        Command::Lag(args) => lag::lag(args),
        Command::Dlq(args) => dlq::dlq(args),
        Command::Bench(args) => bench::run(args),
        Command::Switch(args) => switch::switch(args),
        Command::Endpoints(args) => endpoints::run(args),
        Command::Check(args) => check::run(args),
        Command::Pin(args) => pin::pin(args),
        Command::Unpin(args) => pin::unpin(args),
        Command::Pins(args) => pin::pins(args),
    }
}

/// 2 for input the user can fix (a bad flag, a `--database` that leads through a pooler in
/// transaction mode or to a read-only server), 1 for everything else.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    use keyorder::store::StoreError;
    let wrong_database = |e: &(dyn std::error::Error + 'static)| {
        matches!(
            e.downcast_ref::<StoreError>(),
            Some(StoreError::SessionsPooled { .. } | StoreError::ReadOnly { .. })
        )
    };
    if err.chain().any(|e| e.is::<BadInput>() || wrong_database(e)) {
        2
    } else {
        1
    }
}
