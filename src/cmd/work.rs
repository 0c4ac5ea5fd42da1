//! `keyorder work`: lease partitions (a fair share), drain each one event at a time over
//! HTTP, with `--threads` worker loops in one process; per-key endpoints re-read every
//! [`ENDPOINT_RELOAD`].

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use keyorder::endpoints::EndpointRow;
use keyorder::http::{EndpointDirectory, RoutedDeliverer};
use keyorder::retry::RetryPolicy;
use keyorder::store::admin::Admin;
use keyorder::store::open::{Location, OpenMode, SessionBounding, StoreFactory, StoreOptions};
use keyorder::worker::WorkerConfig;
use keyorder::PartitionCount;

use super::bad_input::BadInput;
use super::delivery::DeliveryArgs;
use super::runtime::{block_on, open_error, parse_count, Database};

#[derive(Debug, Args)]
pub struct WorkArgs {
    #[command(flatten)]
    db: Database,
    #[command(flatten)]
    delivery: DeliveryArgs,
    /// The partition count you expect: work leases the count recorded in the database and
    /// refuses to start when this disagrees. On a database with no count recorded yet, this
    /// count (default 16) is recorded.
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
    partitions: Option<PartitionCount>,
    /// This worker's name.
    #[arg(long, default_value = "worker")]
    name: String,
    /// Deliveries of one event before it is dead-lettered.
    #[arg(long, default_value_t = 5)]
    max_attempts: u32,
    /// Backoff base, in ms (doubles per failure, full jitter).
    #[arg(long, default_value = "200", value_parser = parse_ms)]
    backoff_base_ms: Duration,
    /// Backoff cap, in ms.
    #[arg(long, default_value = "30000", value_parser = parse_ms)]
    backoff_cap_ms: Duration,
    /// How long one delivery may take, in ms (after a lost lease, the next holder waits this long
    /// before its first read; after a clean hand-back it starts at once).
    #[arg(long, default_value = "10000", value_parser = parse_ms)]
    delivery_timeout_ms: Duration,
    /// How often an empty partition is polled, in ms.
    #[arg(long, default_value = "200", value_parser = parse_ms)]
    idle_poll_ms: Duration,
    /// Stop after this many seconds (for tests and benchmarks); runs until a signal otherwise.
    #[arg(long)]
    stop_after: Option<u64>,
    /// Drain, then exit once the queue is empty (every partition, nothing in flight): for batch
    /// jobs, CI and tests. Exits 0 when it drained with no dead letter written during the run,
    /// 1 when dead letters were written (see `keyorder dlq list`) or a signal or --stop-after
    /// stopped it first.
    #[arg(long)]
    until_empty: bool,
    /// Worker loops in this process, each on its own thread and counted as its own member
    /// (named NAME-0, NAME-1, ... when more than one). Default: the number of cores.
    #[arg(long, value_parser = parse_threads)]
    threads: Option<usize>,
    /// How long any store call may take, in ms; a lease whose call takes longer is given up
    /// (its connection dropped) and reported lost. Opening a connection may take twice it.
    #[arg(long, default_value = "5000", value_parser = parse_positive_ms)]
    request_timeout_ms: Duration,
    /// PostgreSQL only: the server ends a session (and frees its leases and membership) that
    /// stays silent this long, in ms, so a frozen or cut-off worker's partitions move; a healthy
    /// worker keeps every session heard every third of it. Must exceed the delivery timeout +
    /// the request timeout, and the longest quiet period + the request timeout. Default three
    /// times the larger of the delivery and request timeouts.
    #[arg(long, value_parser = parse_ms)]
    session_timeout_ms: Option<Duration>,
    /// SQLite only: how long a partition's lease lasts unrenewed, in ms (renewed every third of
    /// it). Must exceed the delivery timeout; default three times it.
    #[arg(long, value_parser = parse_ms)]
    lease_expiry_ms: Option<Duration>,
    /// Keys of one partition parked at once while they back off (the partition delivers other
    /// keys meanwhile); past it a failing key blocks its partition. 0 turns parking off.
    #[arg(long, default_value_t = keyorder::drain::DEFAULT_MAX_PARKED_KEYS)]
    max_parked_keys: usize,
    /// Partition FIFO: a failing event blocks every key of its partition until it is delivered
    /// or dead-lettered (by default it blocks only its own key).
    #[arg(long)]
    strict_partition_order: bool,
    /// Serve Prometheus metrics on http://HOST:PORT/metrics and a health check on /healthz
    /// (200 once a partition is leased and the store answers; 503 otherwise).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,
    /// Write this worker's view of the run to FILE as JSON lines (each event at first sight,
    /// each attempt's send and answer, dead-letters), for `keyorder check FILE`.
    #[arg(long, value_name = "FILE")]
    history: Option<std::path::PathBuf>,
}

/// Milliseconds, as a [`Duration`].
fn parse_ms(text: &str) -> Result<Duration, String> {
    text.parse::<u64>().map(Duration::from_millis).map_err(|e| e.to_string())
}

/// Milliseconds above zero, as a [`Duration`].
fn parse_positive_ms(text: &str) -> Result<Duration, String> {
    match parse_ms(text)? {
        Duration::ZERO => Err("must be greater than zero".into()),
        d => Ok(d),
    }
}

/// A number of worker loops: at least 1.
fn parse_threads(text: &str) -> Result<usize, String> {
    match text.parse::<usize>().map_err(|e| e.to_string())? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// What `keyorder work` is built from: its arguments, each checked by its value parser and
/// their combinations by [`WorkPlan::new`], before anything is opened, created or started.
struct WorkPlan {
    location: Location,
    /// `--partitions`: the count the database must record (or records, when it has none).
    expected: Option<PartitionCount>,
    /// The worker stores, their options checked; they lease under the count read from the
    /// database ([`StoreFactory::with_count`]).
    stores: StoreFactory,
    settings: LoopSettings,
    metrics_addr: Option<String>,
    history: Option<std::path::PathBuf>,
    threads: usize,
    when: super::workers::StopWhen,
}

impl WorkPlan {
    fn new(args: WorkArgs) -> anyhow::Result<WorkPlan> {
        // Built once here so that a mistake is reported before anything starts; each worker
        // thread builds its own from the same options.
        args.delivery.deliverer()?;
        let retry = RetryPolicy::new(args.max_attempts, args.backoff_base_ms, args.backoff_cap_ms)
            .map_err(|e| BadInput(e.to_string()))?;
        let location = args.db.location()?;
        if args.session_timeout_ms.is_some() && location.file().is_some() {
            return Err(BadInput(
                "--session-timeout-ms is for PostgreSQL; a SQLite lease is bounded by --lease-expiry-ms"
                    .into(),
            )
            .into());
        }
        let options = StoreOptions {
            delivery_timeout: args.delivery_timeout_ms,
            lease_expiry: args.lease_expiry_ms,
            session_timeout: args.session_timeout_ms,
            request_timeout: args.request_timeout_ms,
            read_ahead: None,
        };
        let count = args.partitions.map_or_else(|| PartitionCount::new(1), Ok)?;
        let stores = location.stores(count, options).map_err(open_error)?;
        let settings = LoopSettings {
            name: args.name,
            retry,
            delivery_timeout: args.delivery_timeout_ms,
            idle_poll: args.idle_poll_ms,
            delivery: args.delivery,
            takeover_delay: stores.takeover_delay(),
            request_timeout: args.request_timeout_ms,
            session_bound: stores.session_bound(),
            max_parked_keys: args.max_parked_keys,
            strict_partition_order: args.strict_partition_order,
            metrics: None,
            history: None,
        };
        // The rule the simulation proves under.
        if let Some((session_timeout, margin)) = settings.session_bound {
            settings
                .config()
                .liveness(session_timeout, margin)
                .validate()
                .map_err(|e| BadInput(format!("--session-timeout-ms: {e}")))?;
        }
        let until_empty = args.until_empty.then(|| location.clone());
        Ok(WorkPlan {
            location,
            expected: args.partitions,
            stores,
            settings,
            metrics_addr: args.metrics_addr,
            history: args.history,
            threads: args.threads.unwrap_or_else(super::workers::default_threads),
            when: super::workers::StopWhen { after: args.stop_after, until_empty },
        })
    }
}

pub fn work(args: WorkArgs) -> anyhow::Result<()> {
    let WorkPlan { location, expected, stores, mut settings, metrics_addr, history, threads, when } =
        WorkPlan::new(args)?;
    if let Some(addr) = &metrics_addr {
        settings.metrics = Some(super::metrics::start(addr, location.clone())?);
    }
    if let Some(path) = &history {
        let log = super::history::HistoryLog::create(path)
            .map_err(|e| BadInput(format!("--history: {e:#}")))?;
        settings.history = Some(log);
    }
    // Before anything is locked or written: a pooler in transaction mode would hand a lease's
    // server connection (and its advisory lock) to other clients between transactions.
    block_on(super::runtime::require_own_sessions(&location, "work"))??;
    // Creates a SQLite file (with its schema) on first use; checks the schema otherwise. The
    // count comes from the database; the queue's misplaced rows are reported before anything
    // starts, then every AUDIT_PERIOD.
    let partitions = block_on(async {
        let mut admin = location.open_admin(OpenMode::Create).await.map_err(open_error)?;
        let resolved = super::layout::resolve(&mut admin, expected).await?;
        if let super::layout::Resolved::RecordedNow(l) = resolved {
            tracing::info!(partitions = l.partitions.get(), "recorded the partition count in the database (every command uses it now; `keyorder switch` changes it)");
        }
        anyhow::Ok(resolved.layout().partitions)
    })??;
    let mut stores = stores.with_count(partitions);
    block_on(async {
        match location.open_admin(OpenMode::Existing).await {
            Ok(admin) => report_audit(&admin, settings.metrics.as_ref()).await,
            Err(e) => audit_failed(&e),
        }
    })?;
    start_auditor(location.clone(), settings.metrics.clone())?;
    match block_on(stores.bound_sessions())?.context("bounding the store's sessions")? {
        SessionBounding::ServerEnds(after) => tracing::info!(
            session_timeout_ms = after.as_millis() as u64,
            "the server ends a session silent this long; a frozen or cut-off worker's partitions move after it"
        ),
        SessionBounding::Partial(what) => tracing::warn!("{what}"),
        _ => {}
    }
    let load = move || {
        block_on(async {
            let admin = location.open_admin(OpenMode::Existing).await.map_err(open_error)?;
            anyhow::Ok(admin.endpoints().await?)
        })?
    };
    run_threads(stores, load, settings, Threads { count: threads, partitions, when })
}

/// How `keyorder work` runs its loops: how many, under which count, until when.
struct Threads {
    count: usize,
    partitions: PartitionCount,
    when: super::workers::StopWhen,
}

/// What every worker loop of `keyorder work` is configured from (all of it `Send`).
struct LoopSettings {
    name: String,
    retry: RetryPolicy,
    delivery_timeout: Duration,
    idle_poll: Duration,
    delivery: DeliveryArgs,
    /// The wait of a lease taken after an unclean hand-back; `None`: the delivery timeout.
    takeover_delay: Option<Duration>,
    request_timeout: Duration,
    /// The server's bound on a silent session and how stale "last heard" may be (PostgreSQL);
    /// `None` for expiry leases (SQLite).
    session_bound: Option<(Duration, Duration)>,
    max_parked_keys: usize,
    strict_partition_order: bool,
    /// `--metrics-addr`: what every loop's observer counts into.
    metrics: Option<super::metrics::MetricsHandle>,
    /// `--history`: where every loop writes its attempts.
    history: Option<super::history::HistoryLog>,
}

impl LoopSettings {
    /// The configuration of a worker loop (without its name's loop index and its observer).
    fn config(&self) -> WorkerConfig {
        let mut config = WorkerConfig::new(self.name.clone());
        config.retry = self.retry;
        config.delivery_timeout = self.delivery_timeout;
        config.idle_poll = self.idle_poll;
        config.takeover_delay = self.takeover_delay;
        config.request_timeout = self.request_timeout;
        config.max_parked_keys = self.max_parked_keys;
        config.strict_partition_order = self.strict_partition_order;
        if let Some((timeout, margin)) = self.session_bound {
            config.session_timeout = Some(timeout);
            config.session_margin = margin;
        }
        config.rng_seed = std::process::id().into();
        config
    }
}

/// How often `keyorder work` looks for rows no worker will deliver or that were misrouted.
const AUDIT_PERIOD: Duration = Duration::from_secs(60);

/// Prints what the queue's placement audit found, when it found anything (a failed audit is
/// said too: it must not stop the worker).
async fn report_audit(admin: &impl Admin, metrics: Option<&super::metrics::MetricsHandle>) {
    match super::layout::audit_queue(admin).await {
        Ok(audit) => {
            if let Some(m) = metrics {
                m.set_audit(&audit);
            }
            if let Some(text) = audit.summary() {
                tracing::warn!("{text} (see `keyorder lag`)");
            }
        }
        Err(e) => audit_failed(&e),
    }
}

/// Logs a failed routing audit (it must not stop the worker).
fn audit_failed(error: &dyn std::fmt::Display) {
    tracing::warn!(error = format!("{error:#}").as_str(), "could not audit the queue's routing");
}

/// Audits the queue every [`AUDIT_PERIOD`] on a thread of its own.
fn start_auditor(
    location: keyorder::store::open::Location,
    metrics: Option<super::metrics::MetricsHandle>,
) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("audit".into())
        .spawn(move || loop {
            std::thread::sleep(AUDIT_PERIOD);
            let run = block_on(async {
                match location.open_admin(OpenMode::Existing).await {
                    Ok(admin) => report_audit(&admin, metrics.as_ref()).await,
                    Err(e) => audit_failed(&e),
                }
            });
            if let Err(e) = run {
                audit_failed(&e);
            }
        })
        .context("starting the routing auditor")?;
    Ok(())
}

/// How often `keyorder work` re-reads the per-key endpoint table.
const ENDPOINT_RELOAD: Duration = Duration::from_secs(10);

/// Runs `--threads` worker loops, each on a store of its own from `stores`, until a signal (or
/// --stop-after), with the banner and the summary.
fn run_threads(
    stores: StoreFactory,
    load_endpoints: impl Fn() -> anyhow::Result<Vec<EndpointRow>> + Send + 'static,
    settings: LoopSettings,
    threads: Threads,
) -> anyhow::Result<()> {
    // Per-key endpoints: read now, then every ENDPOINT_RELOAD; a failed reload keeps the table.
    let directory = EndpointDirectory::default();
    let rows = load_endpoints().context("reading the keyorder_endpoint table")?;
    if !rows.is_empty() {
        tracing::info!(keys = rows.len(), "keys with endpoints of their own");
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
                    Err(e) => tracing::warn!(
                        error = format!("{e:#}").as_str(),
                        "could not re-read the endpoint table; keeping the one in use"
                    ),
                }
            })
            .context("starting the endpoint reloader")?;
    }
    tracing::info!(
        worker = settings.name.as_str(),
        partitions = threads.partitions.get(),
        deliver = settings.delivery.deliver.as_str(),
        threads = threads.count,
        "delivering; SIGINT or SIGTERM stops after the in-flight deliveries"
    );
    let Threads { count: threads, when, .. } = threads;
    let history = settings.history.clone();
    let report = super::workers::run(threads, when, move |index| {
        let mut config = settings.config();
        let name = super::workers::loop_name(&settings.name, index, threads);
        config.observer = Some(match &settings.metrics {
            Some(m) => m.wrap(name.clone(), super::worker_log::observer(name.clone())),
            None => super::worker_log::observer(name.clone()),
        });
        let deliverer = RoutedDeliverer::new(settings.delivery.deliverer()?, directory.clone());
        let deliverer =
            super::worker_log::Logging::new(deliverer, &name, settings.retry.max_attempts());
        let deliverer = super::metrics::Counting::new(
            deliverer,
            settings.metrics.as_ref(),
            &name,
            settings.retry.max_attempts(),
        );
        let deliverer = super::history::Recording::new(
            deliverer,
            settings.history.clone(),
            &name,
            settings.retry.max_attempts(),
        );
        Ok((stores.make()?, deliverer, config))
    })?;
    if let Some(e) = history.as_ref().and_then(super::history::HistoryLog::error) {
        anyhow::bail!("the history file is incomplete: writing it failed: {e}");
    }
    let workers = &report.workers;
    tracing::info!(
        taken = workers.acquired,
        given_back = workers.released,
        lost = workers.lost,
        "stopped; leases taken, given back and lost"
    );
    match report.drained {
        None => Ok(()),
        Some(d) => until_empty_outcome(d),
    }
}

/// The exit of `--until-empty`: 0 (`Ok`) when the queue drained with no dead letter written,
/// an error (exit 1) saying what happened otherwise.
fn until_empty_outcome(d: super::workers::Drained) -> anyhow::Result<()> {
    if d.depth_after > 0 {
        tracing::info!(
            rows = d.depth_after,
            "rows were enqueued after the queue was seen empty; they wait for the next run"
        );
    }
    if !d.empty {
        anyhow::bail!(
            "stopped before the queue was empty ({} row(s) queued, {} dead letter(s) written during the run)",
            d.depth_after,
            d.dead_letters
        );
    }
    if d.dead_letters > 0 {
        anyhow::bail!(
            "the queue is empty, but {} dead letter(s) were written during the run (see `keyorder dlq list`)",
            d.dead_letters
        );
    }
    tracing::info!("the queue is empty; no dead letters written during the run");
    Ok(())
}
