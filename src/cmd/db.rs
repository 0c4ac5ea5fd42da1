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
use super::BadInput;
use keyorder::endpoints::EndpointRow;
use keyorder::http::{EndpointDirectory, RoutedDeliverer};

/// Runs `fut` on a current-thread runtime inside a `LocalSet`.
pub fn block_on<F: Future>(fut: F) -> anyhow::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let local = tokio::task::LocalSet::new();
    Ok(local.block_on(&rt, fut))
}

/// The database to use.
#[derive(Debug, Clone, Args)]
pub struct Database {
    /// Where the queue lives: sqlite:PATH (a file, created on first `enqueue`, `migrate` or
    /// `work`) or a PostgreSQL URL, postgres://user@host/db. Default: sqlite:keyorder.db in the
    /// working directory, unless DATABASE_URL is set.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE)]
    pub database: String,
}

/// The database when neither --database nor DATABASE_URL says otherwise.
pub const DEFAULT_DATABASE: &str = "sqlite:keyorder.db";

/// A parsed --database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbTarget {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL URL or key=value connection string.
    Postgres(String),
}

/// The store's queue operations, on either database. The SQLite calls block: these are
/// one-shot commands with nothing else on their runtime.
pub enum Queue {
    /// PostgreSQL.
    Pg(Client),
    /// SQLite.
    Sqlite(rusqlite::Connection),
}

/// A refusal to open a SQLite file is input the user can fix (the file or the flag).
fn sqlite_refusal(path: &std::path::Path, e: StoreError) -> anyhow::Error {
    use rusqlite::ErrorCode as C;
    let user_fixable = match &e {
        StoreError::Refused { .. } => true,
        StoreError::Sqlite(s) => matches!(
            s.sqlite_error_code(),
            Some(C::CannotOpen | C::ReadOnly | C::NotADatabase | C::PermissionDenied)
        ),
        _ => false,
    };
    if user_fixable {
        let detail = match &e {
            StoreError::Refused { reason, .. } => reason.clone(),
            other => format!("cannot open {}: {}", path.display(), keyorder::worker::chain(other)),
        };
        BadInput(format!("--database sqlite:{}: {detail}", path.display())).into()
    } else {
        anyhow::Error::new(e).context(format!("opening {}", path.display()))
    }
}

impl Database {
    /// Which database --database names.
    pub fn target(&self) -> Result<DbTarget, BadInput> {
        let text = self.database.trim();
        if let Some(rest) = text.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(BadInput(
                    "--database sqlite: needs a path, e.g. sqlite:keyorder.db".into(),
                ));
            }
            return Ok(DbTarget::Sqlite(PathBuf::from(path)));
        }
        Ok(DbTarget::Postgres(text.to_owned()))
    }

    /// A connected PostgreSQL client; the error names what failed. A SQLite --database is bad
    /// input here (the caller needs PostgreSQL).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let DbTarget::Postgres(url) = self.target()? else {
            return Err(BadInput(format!(
                "this needs PostgreSQL (--database postgres://...), not {}",
                self.database
            ))
            .into());
        };
        let store = PgStore::new(&url, PartitionCount::new(1)?, PgOptions::default())
            .map_err(|e| BadInput(format!("bad --database URL: {e}")))?;
        postgres::connect(store.config())
            .await
            .context("cannot connect to the database (check --database)")
    }

    /// The queue, opened as `mode` says (on PostgreSQL: connected, and unless migrating,
    /// checked to be at the current schema version).
    pub async fn queue(&self, mode: OpenMode) -> anyhow::Result<Queue> {
        match self.target()? {
            DbTarget::Sqlite(path) => sqlite::schema::open(&path, mode)
                .map(Queue::Sqlite)
                .map_err(|e| sqlite_refusal(&path, e)),
            DbTarget::Postgres(_) => {
                let client = self.client().await?;
                if mode != OpenMode::Migrate {
                    schema::require_current(&client).await?;
                }
                Ok(Queue::Pg(client))
            }
        }
    }
}

impl Queue {
    async fn enqueue(
        &mut self,
        router: &Router,
        events: &[Event],
        serialise_keys: bool,
    ) -> Result<queue::EnqueueReport, StoreError> {
        match self {
            Queue::Pg(c) => queue::enqueue(c, router, events, serialise_keys).await,
            // One writer at a time: rows of one key always commit in seq order.
            Queue::Sqlite(c) => sqlite::queue::enqueue(c, router, events),
        }
    }

    async fn lag(&self) -> Result<(Vec<queue::PartitionLag>, Vec<queue::KeyDepth>), StoreError> {
        match self {
            Queue::Pg(c) => Ok((queue::lag(c).await?, queue::heaviest_keys(c, 10).await?)),
            Queue::Sqlite(c) => Ok((sqlite::queue::lag(c)?, sqlite::queue::heaviest_keys(c, 10)?)),
        }
    }

    async fn dead_letters(
        &self,
        id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<queue::DeadRow>, StoreError> {
        match self {
            Queue::Pg(c) => queue::dead_letters(c, id, limit).await,
            Queue::Sqlite(c) => sqlite::queue::dead_letters(c, id, limit),
        }
    }

    async fn redrive(&mut self, router: &Router, id: i64) -> Result<Option<i64>, StoreError> {
        match self {
            Queue::Pg(c) => queue::redrive(c, router, id).await,
            Queue::Sqlite(c) => sqlite::queue::redrive(c, router, id),
        }
    }

    async fn switch(
        &mut self,
        from: PartitionCount,
        to: PartitionCount,
    ) -> Result<queue::Layout, StoreError> {
        match self {
            Queue::Pg(c) => queue::switch_online(c, from, to).await,
            Queue::Sqlite(c) => sqlite::queue::switch_online(c, from, to),
        }
    }
}

fn parse_count(text: &str) -> Result<PartitionCount, String> {
    text.parse::<PartitionCount>().map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    db: Database,
}

pub fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    block_on(async {
        let applied = match args.db.queue(OpenMode::Migrate).await? {
            Queue::Pg(mut client) => schema::migrate(&mut client).await.context("migrating")?,
            // Opening for migration applied what was missing; this reports it.
            Queue::Sqlite(mut c) => sqlite::schema::migrate(&mut c).context("migrating")?,
        };
        if applied.is_empty() {
            println!("schema is current (version {})", schema::SCHEMA_VERSION);
        } else {
            println!("applied migrations {applied:?}; schema version {}", schema::SCHEMA_VERSION);
        }
        Ok(())
    })?
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    db: Database,
    /// The partition count producers route with.
    #[arg(long, value_parser = parse_count, default_value = "16")]
    partitions: PartitionCount,
    /// Events per insert statement (one round trip each).
    #[arg(long, default_value_t = 5000)]
    batch: usize,
    /// Take a per-key advisory lock in each transaction, so that concurrent producers of one
    /// key commit in seq order.
    #[arg(long)]
    serialise_keys: bool,
    /// JSON lines of events ({"event_id", "subscription_id", "tenant_id", "resource_id",
    /// "payload"}); standard input when absent or `-`.
    file: Option<PathBuf>,
}

pub fn enqueue(args: EnqueueArgs) -> anyhow::Result<()> {
    let input: Box<dyn BufRead> = match &args.file {
        Some(p) if p.as_os_str() != "-" => Box::new(BufReader::new(
            std::fs::File::open(p)
                .map_err(|e| BadInput(format!("cannot open {}: {e}", p.display())))?,
        )),
        _ => Box::new(BufReader::new(io::stdin().lock())),
    };
    let router = Router::new(args.partitions);
    block_on(async move {
        let mut client = args.db.queue(OpenMode::Create).await?;
        let (mut total, mut dups, mut batch, mut first_line) = (0u64, 0usize, Vec::new(), 1u64);
        for (i, line) in input.lines().enumerate() {
            let no = i as u64 + 1;
            let line = line.map_err(|e| BadInput(format!("line {no}: {e}")))?;
            if line.trim().is_empty() {
                continue;
            }
            let event: Event = match serde_json::from_str(&line).map_err(|e| e.to_string()).and_then(|e: Event| e.validate().map(|()| e).map_err(|e| e.to_string())) {
                Ok(e) => e,
                Err(e) => {
                    return Err(BadInput(format!(
                        "line {no}: {e}; enqueued {total} events from lines before {first_line}, nothing from line {first_line} on"
                    ))
                    .into())
                }
            };
            batch.push(event);
            if batch.len() >= args.batch.max(1) {
                let (n, d) = insert(&mut client, &router, &mut batch, args.serialise_keys).await?;
                (total, dups, first_line) = (total + n, dups + d, no + 1);
            }
        }
        let (n, d) = insert(&mut client, &router, &mut batch, args.serialise_keys).await?;
        (total, dups) = (total + n, dups + d);
        println!("enqueued {total} events ({dups} duplicates skipped)");
        Ok(())
    })?
}

/// Inserts and empties `batch`; returns (inserted, duplicates), naming each duplicate.
async fn insert(
    client: &mut Queue,
    router: &Router,
    batch: &mut Vec<Event>,
    serialise_keys: bool,
) -> anyhow::Result<(u64, usize)> {
    if batch.is_empty() {
        return Ok((0, 0));
    }
    let report = client.enqueue(router, batch, serialise_keys).await?;
    report.duplicates.iter().for_each(|d| eprintln!("duplicate event id (already queued): {d}"));
    batch.clear();
    Ok((report.inserted, report.duplicates.len()))
}

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
    /// Keys of one partition parked at once while they back off (the partition delivers other
    /// keys meanwhile); past it a failing key blocks its partition. 0 turns parking off.
    #[arg(long, default_value_t = keyorder::drain::DEFAULT_MAX_PARKED_KEYS)]
    max_parked_keys: usize,
    /// Partition FIFO: a failing event blocks every key of its partition until it is delivered
    /// or dead-lettered (by default it blocks only its own key).
    #[arg(long)]
    strict_partition_order: bool,
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
        max_parked_keys: args.max_parked_keys,
        strict_partition_order: args.strict_partition_order,
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
    max_parked_keys: usize,
    strict_partition_order: bool,
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
        config.max_parked_keys = settings.max_parked_keys;
        config.strict_partition_order = settings.strict_partition_order;
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

/// Completes on SIGINT, SIGTERM, or after `after` seconds.
pub(crate) async fn shutdown(after: Option<u64>) {
    let timer = async {
        match after {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return timer.await,
        };
        tokio::select! {
            biased;
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            _ = timer => {}
        }
    }
    #[cfg(not(unix))]
    tokio::select! {
        biased;
        _ = tokio::signal::ctrl_c() => {}
        _ = timer => {}
    }
}

#[derive(Debug, Args)]
pub struct SwitchArgs {
    #[command(flatten)]
    db: Database,
    /// The partition count in force.
    #[arg(long, value_parser = parse_count)]
    from: PartitionCount,
    /// The partition count to switch to.
    #[arg(long, value_parser = parse_count)]
    to: PartitionCount,
    /// Confirm that every producer enqueues through `keyorder enqueue` (or writes the layout
    /// column from `keyorder_layout`): one that keeps routing with the old count splits keys.
    #[arg(long)]
    producers_follow: bool,
}

pub fn switch(args: SwitchArgs) -> anyhow::Result<()> {
    if !args.producers_follow {
        return Err(BadInput(
            "an online switch is safe only if every producer routes with the new layout at once: \
             confirm with --producers-follow that all of them enqueue through keyorder"
                .into(),
        )
        .into());
    }
    block_on(async {
        let mut client = args.db.queue(OpenMode::Existing).await?;
        let layout = client
            .switch(args.from, args.to)
            .await
            .map_err(|e| BadInput(format!("switch refused: {e}")))?;
        println!(
            "layout {} in force: producers route with {} partitions now; workers lease {} until the \
             rows of the old layout are gone; each moving key waits for its old partition (no write pause)",
            layout.epoch,
            args.to,
            args.from.max(args.to)
        );
        Ok(())
    })?
}

#[derive(Debug, Args)]
pub struct LagArgs {
    #[command(flatten)]
    db: Database,
    /// One JSON object.
    #[arg(long, conflicts_with = "prom")]
    json: bool,
    /// Prometheus text exposition format.
    #[arg(long)]
    prom: bool,
}

pub fn lag(args: LagArgs) -> anyhow::Result<()> {
    block_on(async {
        let client = args.db.queue(OpenMode::Existing).await?;
        let (lag, heavy) = client.lag().await?;
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"partitions": lag, "heaviest_keys": heavy})
                )?
            );
        } else if args.prom {
            for (name, help) in [
                ("keyorder_partition_depth", "Rows queued in the partition."),
                (
                    "keyorder_partition_oldest_wait_seconds",
                    "Age of the oldest queued row; alert on this.",
                ),
                ("keyorder_partition_keys", "Distinct keys queued in the partition."),
                (
                    "keyorder_partition_head_attempts",
                    "Failed attempts recorded at the partition's head.",
                ),
            ] {
                println!("# HELP {name} {help}\n# TYPE {name} gauge");
                for l in &lag {
                    let v = match name {
                        "keyorder_partition_depth" => l.depth as f64,
                        "keyorder_partition_oldest_wait_seconds" => l.oldest_wait_seconds,
                        "keyorder_partition_keys" => l.keys_affected as f64,
                        _ => f64::from(l.head_attempts),
                    };
                    println!("{name}{{partition=\"{}\"}} {v}", l.partition);
                }
            }
        } else {
            println!(
                "{:>9} {:>9} {:>14} {:>9} {:>13}",
                "partition", "depth", "oldest wait s", "keys", "head attempts"
            );
            for l in &lag {
                println!(
                    "{:>9} {:>9} {:>14.1} {:>9} {:>13}",
                    l.partition, l.depth, l.oldest_wait_seconds, l.keys_affected, l.head_attempts
                );
            }
            if lag.is_empty() {
                println!("queue is empty");
            }
            for k in &heavy {
                println!("heavy key {:?}: {} queued", k.key, k.depth);
            }
        }
        Ok(())
    })?
}

#[derive(Debug, Args)]
pub struct DlqArgs {
    #[command(flatten)]
    db: Database,
    #[command(subcommand)]
    action: DlqAction,
}

#[derive(Debug, Subcommand)]
enum DlqAction {
    /// Dead-lettered events, newest first.
    List {
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// One dead-lettered event with its payload.
    Show {
        /// Its dead-letter id.
        id: i64,
    },
    /// Re-enqueue one at the tail. Its key's later events were delivered before it: this is an
    /// ordering gap, which --accept-gap acknowledges.
    Redrive {
        /// Its dead-letter id.
        id: i64,
        /// The partition count producers route with.
        #[arg(long, value_parser = parse_count, default_value = "16")]
        partitions: PartitionCount,
        /// Confirm that delivering it after later events of its key is acceptable.
        #[arg(long)]
        accept_gap: bool,
    },
}

pub fn dlq(args: DlqArgs) -> anyhow::Result<()> {
    block_on(async {
        let mut client = args.db.queue(OpenMode::Existing).await?;
        match args.action {
            DlqAction::List { limit, json } => {
                for r in client.dead_letters(None, limit).await? {
                    if json {
                        println!("{}", serde_json::to_string(&r)?);
                    } else {
                        println!(
                            "{:>6}  p{:<4} {:<24} {:<24} {}  {}",
                            r.id, r.partition, r.key, r.event_id, r.dead_lettered_at, r.reason
                        );
                    }
                }
            }
            DlqAction::Show { id } => match client.dead_letters(Some(id), 1).await?.pop() {
                Some(r) => println!("{}", serde_json::to_string_pretty(&r)?),
                None => return Err(BadInput(format!("no dead-lettered event with id {id}")).into()),
            },
            DlqAction::Redrive { id, partitions, accept_gap } => {
                if !accept_gap {
                    return Err(BadInput(
                        "redrive puts the event at the tail, after later events of its key: an ordering gap. Re-run with --accept-gap to do it".into(),
                    )
                    .into());
                }
                match client.redrive(&Router::new(partitions), id).await? {
                    Some(seq) => println!("redriven as seq {seq} at the tail: it is delivered after later events of its key (an ordering gap)"),
                    None => return Err(BadInput(format!("no dead-lettered event with id {id}")).into()),
                }
            }
        }
        Ok(())
    })?
}
