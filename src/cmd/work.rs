//! The database commands: `migrate`, `enqueue`, `work`, `lag`, `dlq`, and the runtime they
//! share (one current-thread runtime with a `LocalSet`, as the worker loop requires).

use std::future::Future;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use keyorder::key::Event;
use keyorder::retry::RetryPolicy;
use keyorder::store::postgres::{self, queue, schema, PgOptions, PgStore};
use keyorder::store::sqlite::{self, schema::OpenMode, SqliteOptions, SqliteStore};
use keyorder::store::{Store, StoreError};
use keyorder::worker::{self, WorkerConfig};
use keyorder::{PartitionCount, Router};
use tokio_postgres::Client;

use super::delivery::DeliveryArgs;
#[allow(unused_imports)]
use super::runtime::*;
use super::BadInput;
use keyorder::endpoints::EndpointRow;
use keyorder::http::{EndpointDirectory, RoutedDeliverer};

#[derive(Debug, Args)]
pub struct WorkArgs {
    #[command(flatten)]
    db: Database,
    #[command(flatten)]
    delivery: DeliveryArgs,
    /// The partition count (must match the producers').
    #[arg(long, value_parser = parse_count, default_value = "16")]
    partitions: PartitionCount,
    /// This worker's name.
    #[arg(long, default_value = "worker")]
    name: String,
    /// Deliveries of one event before it is dead-lettered.
    #[arg(long, default_value_t = 5)]
    max_attempts: u32,
    /// Backoff base, in ms (doubles per failure, full jitter).
    #[arg(long, default_value_t = 200)]
    backoff_base_ms: u64,
    /// Backoff cap, in ms.
    #[arg(long, default_value_t = 30_000)]
    backoff_cap_ms: u64,
    /// How long one delivery may take, in ms (after a lost lease, the next holder waits this long
    /// before its first read; after a clean hand-back it starts at once).
    #[arg(long, default_value_t = 10_000)]
    delivery_timeout_ms: u64,
    /// How often an empty partition is polled, in ms.
    #[arg(long, default_value_t = 200)]
    idle_poll_ms: u64,
    /// Stop after this many seconds (for tests and benchmarks); runs until a signal otherwise.
    #[arg(long)]
    stop_after: Option<u64>,
    /// Worker loops in this process, each on its own thread and counted as its own member
    /// (named NAME-0, NAME-1, ... when more than one). Default: the machine's cores.
    #[arg(long, default_value_t = super::workers::default_threads())]
    threads: usize,
    /// SQLite only: how long a partition's lease lasts unrenewed, in ms (renewed every third of
    /// it). Must exceed the delivery timeout; default three times it.
    #[arg(long)]
    lease_expiry_ms: Option<u64>,
}

pub fn work(args: WorkArgs) -> anyhow::Result<()> {
    // Built once here so that a mistake is reported before anything starts; each worker
    // thread builds its own from the same options.
    args.delivery.deliverer()?;
    let delivery = args.delivery.clone();
    let retry = RetryPolicy::new(
        args.max_attempts,
        Duration::from_millis(args.backoff_base_ms),
        Duration::from_millis(args.backoff_cap_ms),
    )
    .map_err(|e| BadInput(e.to_string()))?;
    if args.threads == 0 {
        return Err(BadInput("--threads must be at least 1".into()).into());
    }
    let delivery_timeout = Duration::from_millis(args.delivery_timeout_ms);
    let settings = LoopSettings {
        name: args.name.clone(),
        retry,
        delivery_timeout,
        idle_poll: Duration::from_millis(args.idle_poll_ms),
        delivery,
        takeover_delay: None,
    };
    match args.db.target()? {
        DbTarget::Postgres(url) => {
            let store = PgStore::new(&url, args.partitions, PgOptions::default())
                .map_err(|e| BadInput(format!("bad --database URL: {e}")))?;
            block_on(async {
                let client = args.db.client().await?;
                schema::require_current(&client).await?;
                anyhow::Ok(())
            })??;
            // A holder serves rows it read ahead for up to `ack_delay` after the server last
            // answered, so after a lost session the next holder waits that much longer than
            // a delivery can take.
            let settings = LoopSettings {
                takeover_delay: Some(delivery_timeout + PgOptions::default().ack_delay),
                ..settings
            };
            let load = move || {
                block_on(async {
                    let client = postgres::connect(
                        PgStore::new(&url, PartitionCount::new(1)?, PgOptions::default())?.config(),
                    )
                    .await?;
                    anyhow::Ok(queue::endpoints(&client).await?)
                })?
            };
            run_threads(move || Ok(store.clone()), load, settings, &args)
        }
        DbTarget::Sqlite(path) => {
            let mut options = SqliteOptions::for_delivery_timeout(delivery_timeout);
            if let Some(ms) = args.lease_expiry_ms {
                options.lease_expiry = Duration::from_millis(ms);
            }
            options.validate().map_err(|e| {
                BadInput(format!("--lease-expiry-ms: {}", keyorder::worker::chain(&e)))
            })?;
            // Creates the file (with its schema) on first use; checks it otherwise.
            drop(
                sqlite::schema::open(&path, OpenMode::Create)
                    .map_err(|e| sqlite_refusal(&path, e))?,
            );
            // One store handle (and connection thread) per worker loop.
            let count = args.partitions;
            let make = move || {
                SqliteStore::new(path.clone(), count, options, keyorder::clock::TokioClock::start())
                    .map_err(anyhow::Error::from)
            };
            let file = args.db.target()?;
            let load = move || match &file {
                DbTarget::Sqlite(path) => {
                    let c = sqlite::schema::open(path, OpenMode::Existing)?;
                    anyhow::Ok(sqlite::queue::endpoints(&c)?)
                }
                DbTarget::Postgres(_) => unreachable!("a SQLite target"),
            };
            run_threads(make, load, settings, &args)
        }
    }
}

/// What every worker loop of `keyorder work` is configured from (all of it `Send`).
struct LoopSettings {
    name: String,
    retry: RetryPolicy,
    delivery_timeout: Duration,
    idle_poll: Duration,
    delivery: super::delivery::DeliveryArgs,
    /// The wait of a lease taken after an unclean hand-back; `None`: the delivery timeout.
    takeover_delay: Option<Duration>,
}

/// How often `keyorder work` re-reads the per-key endpoint table.
const ENDPOINT_RELOAD: Duration = Duration::from_secs(10);

/// Runs `--threads` worker loops, each on a store from `make_store`, until a signal (or
/// --stop-after), with the banner and the summary.
fn run_threads<S: Store>(
    make_store: impl Fn() -> anyhow::Result<S> + Send + Sync + 'static,
    load_endpoints: impl Fn() -> anyhow::Result<Vec<EndpointRow>> + Send + 'static,
    settings: LoopSettings,
    args: &WorkArgs,
) -> anyhow::Result<()> {
    // Per-key endpoints: read now, then every ENDPOINT_RELOAD; a failed reload keeps the table.
    let directory = EndpointDirectory::default();
    let rows = load_endpoints().context("reading the keyorder_endpoint table")?;
    if !rows.is_empty() {
        eprintln!("keyorder work: {} key(s) with endpoints of their own", rows.len());
    }
    directory.replace(settings.delivery.endpoint_table(&rows));
    {
        let (directory, delivery) = (directory.clone(), settings.delivery.clone());
        std::thread::Builder::new()
            .name("endpoints".into())
            .spawn(move || loop {
                std::thread::sleep(ENDPOINT_RELOAD);
                match load_endpoints() {
                    Ok(rows) => directory.replace(delivery.endpoint_table(&rows)),
                    Err(e) => eprintln!("keyorder work: keeping the endpoint table: {e:#}"),
                }
            })
            .context("starting the endpoint reloader")?;
    }
    eprintln!(
        "keyorder work: {} delivering {} partitions to {} on {} thread(s); SIGINT or SIGTERM stops after the in-flight deliveries",
        args.name, args.partitions, args.delivery.deliver, args.threads
    );
    let report = super::workers::run(args.threads, args.stop_after, move |_| {
        let mut config = WorkerConfig::new(settings.name.clone());
        config.retry = settings.retry;
        config.delivery_timeout = settings.delivery_timeout;
        config.idle_poll = settings.idle_poll;
        config.takeover_delay = settings.takeover_delay;
        config.rng_seed = std::process::id().into();
        config.observer = Some(observer());
        let deliverer = RoutedDeliverer::new(settings.delivery.deliverer()?, directory.clone());
        Ok((make_store()?, deliverer, config))
    })?;
    eprintln!(
        "keyorder work: stopped; leases taken {}, given back {}, lost {}",
        report.acquired, report.released, report.lost
    );
    Ok(())
}

/// Prints lease changes and store failures on stderr, named by the worker loop.
fn observer() -> worker::Observer {
    worker::Observer(std::rc::Rc::new(move |e: &worker::WorkerEvent| {
        use worker::WorkerEvent as E;
        let name = std::thread::current().name().unwrap_or("worker").to_owned();
        match e {
            E::Acquired { partition, epoch } => {
                eprintln!("{name}: leased partition {partition} (epoch {epoch})")
            }
            E::Released { partition } => eprintln!("{name}: gave back partition {partition}"),
            E::Lost { partition, error } => {
                eprintln!("{name}: LOST partition {partition}: {error}")
            }
            E::StoreUnavailable { error } => {
                eprintln!("{name}: store unavailable, reconnecting: {error}")
            }
            _ => {}
        }
    }))
}
