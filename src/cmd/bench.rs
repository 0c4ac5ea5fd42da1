//! `keyorder bench`: throughput of the store (PostgreSQL, or SQLite for `sqlite:PATH`) with a no-op deliverer: batch enqueue,
//! drain with 1, 2, 4, 8 workers over 16 partitions, and drain after a million events have
//! churned through the table compared with a fresh (truncated) one, best of three each. Durable commits (the server's default
//! `synchronous_commit = on`). Use a throwaway database: it empties the queue tables.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use keyorder::clock::{Clock, TokioClock};
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::key::Event;
use keyorder::store::postgres::{queue, schema, PgOptions, PgStore};
use keyorder::store::sqlite::{self, schema::OpenMode, SqliteOptions, SqliteStore};
use keyorder::store::Store;
use keyorder::worker::{self, WorkerConfig};
use keyorder::{PartitionCount, PartitionId, Router, Time};
use tokio_postgres::Client;

use super::bench_http::{self, Delivery};
use super::db::{block_on, Database, DbTarget};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    db: Database,
    /// Events per drain measurement.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Worker counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    workers: Vec<usize>,
    /// Events to churn through the table before the second fresh-versus-churned measurement.
    #[arg(long, default_value_t = 1_000_000)]
    churn: u64,
    /// Events in the fresh-versus-churned measurements.
    #[arg(long, default_value_t = 50_000)]
    sample: u64,
    /// Distinct keys the events spread over.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Deliverers to drain with first, one worker each: noop, http (a loopback receiver),
    /// https (the same over TLS).
    #[arg(long, value_delimiter = ',', default_value = "noop")]
    deliver: Vec<Delivery>,
    /// Partition counts of the deliverer drains.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    partitions: Vec<i64>,
    /// Worker loops of the deliverer drains, each on its own thread (as `keyorder work
    /// --threads`). Default: the machine's cores.
    #[arg(long, default_value_t = super::workers::default_threads())]
    loops: usize,
    /// Only the deliverer drains: skip the worker-count and churn measurements.
    #[arg(long)]
    only_delivery: bool,
    /// Confirm that the database's queue tables may be emptied.
    #[arg(long)]
    yes: bool,
    /// Drain the deliverer drains with partition FIFO (a failing event blocks its partition),
    /// as before parking, to compare the two.
    #[arg(long)]
    strict_partition_order: bool,
}

/// Accepts everything at once, counting deliveries.
#[derive(Clone)]
struct Noop {
    delivered: Rc<Cell<u64>>,
}

impl Deliver for Noop {
    async fn deliver(&mut self, _: PartitionId, _: &Head, _: u32) -> Result<(), DeliverError> {
        self.delivered.set(self.delivered.get() + 1);
        Ok(())
    }
}

const PARTITIONS: i64 = 16;
const BATCH: u64 = 5_000;

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let DbTarget::Sqlite(path) = args.db.target()? {
        return run_sqlite(args, path);
    }
    anyhow::ensure!(args.yes, "keyorder bench empties delivery_queue and delivery_dlq: re-run with --yes on a throwaway database");
    block_on(async move {
        let mut c = args.db.client().await?;
        schema::migrate(&mut c).await?;
        c.batch_execute("TRUNCATE delivery_queue, delivery_dlq").await?;
        let mut next = 0u64;
        deliveries(&args, &mut c, &mut next).await?;
        if args.only_delivery {
            return Ok(());
        }
        let clock = TokioClock::start();
        let t0 = clock.now();
        enqueue(&mut c, &mut next, args.events, args.keys).await?;
        let secs = clock.now().saturating_since(t0).as_secs_f64();
        println!(
            "batch enqueue: {} events in {secs:.2} s = {:.0} events/s (batches of {BATCH})",
            args.events,
            args.events as f64 / secs
        );
        for (i, &w) in args.workers.iter().enumerate() {
            if i > 0 {
                enqueue(&mut c, &mut next, args.events, args.keys).await?;
            }
            let rate = drain(|| pg_store(&args.db.database), Probe::Pg(&c), w, args.events).await?;
            println!("drain, {w} worker(s), {PARTITIONS} partitions: {rate:.0} deliveries/s");
        }
        let w = args.workers.iter().copied().max().unwrap_or(4);
        c.batch_execute("TRUNCATE delivery_queue").await?;
        let fresh = best_of(3, &mut c, &mut next, &args, w).await?;
        let mut churned = 0;
        while churned < args.churn {
            let n = (args.churn - churned).min(200_000);
            enqueue(&mut c, &mut next, n, args.keys).await?;
            drain(|| pg_store(&args.db.database), Probe::Pg(&c), w, n).await?;
            churned += n;
            eprintln!("churned {churned} of {}", args.churn);
        }
        let after = best_of(3, &mut c, &mut next, &args, w).await?;
        println!(
            "drain of {} events (best of 3), {w} workers: fresh {fresh:.0}/s, after {} churned {after:.0}/s ({:+.1}%)",
            args.sample,
            args.churn,
            (after / fresh - 1.0) * 100.0
        );
        Ok(())
    })?
}

/// The best of `n` drains of `args.sample` events: short runs are noisy on a shared machine.
async fn best_of(
    n: usize,
    c: &mut Client,
    next: &mut u64,
    args: &BenchArgs,
    workers: usize,
) -> anyhow::Result<f64> {
    let mut best = 0.0f64;
    for _ in 0..n {
        enqueue(c, next, args.sample, args.keys).await?;
        best = best
            .max(drain(|| pg_store(&args.db.database), Probe::Pg(c), workers, args.sample).await?);
    }
    Ok(best)
}

async fn enqueue(c: &mut Client, next: &mut u64, n: u64, keys: u64) -> anyhow::Result<()> {
    enqueue_routed(c, next, n, keys, PartitionCount::new(PARTITIONS)?).await
}

/// The drain rate of each `--deliver` at each `--partitions`, one worker, the events enqueued
/// afresh each time; leaves the queue empty.
async fn deliveries(args: &BenchArgs, c: &mut Client, next: &mut u64) -> anyhow::Result<()> {
    for &p in &args.partitions {
        let count = PartitionCount::new(p)?;
        let mut noop = None;
        for &d in &args.deliver {
            c.batch_execute("TRUNCATE delivery_queue").await?;
            enqueue_routed(c, next, args.events, args.keys, count).await?;
            let store = PgStore::new(&args.db.database, count, PgOptions::default())?;
            let rate = bench_http::bench_delivery(
                move || Ok(store.clone()),
                args.events,
                d,
                bench_config(d, p, args.strict_partition_order),
                args.loops,
            )?;
            print_rate(args.loops, p, d, rate, &mut noop);
        }
    }
    c.batch_execute("TRUNCATE delivery_queue").await?;
    Ok(())
}

async fn enqueue_routed(
    c: &mut Client,
    next: &mut u64,
    n: u64,
    keys: u64,
    count: PartitionCount,
) -> anyhow::Result<()> {
    let router = Router::new(count);
    let mut left = n;
    while left > 0 {
        let size = left.min(BATCH);
        let events = batch(*next, size, keys);
        queue::enqueue(c, &router, &events, false).await.context("enqueue")?;
        *next += size;
        left -= size;
    }
    Ok(())
}

fn pg_store(url: &str) -> anyhow::Result<PgStore> {
    Ok(PgStore::new(url, PartitionCount::new(PARTITIONS)?, PgOptions::default())?)
}

/// Where the drain looks for the queue's depth.
enum Probe<'a> {
    Pg(&'a Client),
    Sqlite(&'a rusqlite::Connection),
}

impl Probe<'_> {
    async fn depth(&self) -> anyhow::Result<i64> {
        Ok(match self {
            Probe::Pg(c) => c.query_one("SELECT count(*) FROM delivery_queue", &[]).await?.get(0),
            // A count on an indexed table: short enough to run on the bench's runtime.
            Probe::Sqlite(c) => sqlite::queue::depth(c)?,
        })
    }
}

/// The SQLite bench: batch enqueue, then drain with each worker count (in-process workers on
/// one file). No churn measurement: SQLite reuses deleted pages, there is no bloat to show.
fn run_sqlite(args: BenchArgs, path: std::path::PathBuf) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.yes || !path.exists(),
        "keyorder bench empties the queue tables of {}: re-run with --yes, or name a new file",
        path.display()
    );
    let mut c = sqlite::schema::open(&path, OpenMode::Create)
        .with_context(|| format!("opening {}", path.display()))?;
    c.execute_batch(
        "DELETE FROM delivery_queue; DELETE FROM delivery_dlq; DELETE FROM keyorder_lease;",
    )?;
    println!(
        "SQLite store {}: journal_mode=WAL, synchronous=NORMAL, {PARTITIONS} partitions, no-op deliverer",
        path.display()
    );
    let router = Router::new(PartitionCount::new(PARTITIONS)?);
    let clock = TokioClock::start();
    let mut next = 0u64;
    let enqueue = |c: &mut rusqlite::Connection, next: &mut u64, n: u64| -> anyhow::Result<()> {
        let mut left = n;
        while left > 0 {
            let size = left.min(BATCH);
            let events = batch(*next, size, args.keys);
            sqlite::queue::enqueue(c, &router, &events).context("enqueue")?;
            *next += size;
            left -= size;
        }
        Ok(())
    };
    for &p in &args.partitions {
        let count = PartitionCount::new(p)?;
        let router = Router::new(count);
        let mut noop = None;
        for &d in &args.deliver {
            c.execute_batch("DELETE FROM delivery_queue; DELETE FROM keyorder_lease;")?;
            let mut left = args.events;
            while left > 0 {
                let size = left.min(BATCH);
                sqlite::queue::enqueue(&mut c, &router, &batch(next, size, args.keys))
                    .context("enqueue")?;
                next += size;
                left -= size;
            }
            let options = SqliteOptions::for_delivery_timeout(Duration::from_millis(1000));
            let file = path.clone();
            let rate = bench_http::bench_delivery(
                move || Ok(SqliteStore::new(&file, count, options, TokioClock::start())?),
                args.events,
                d,
                bench_config(d, p, args.strict_partition_order),
                args.loops,
            )?;
            print_rate(args.loops, p, d, rate, &mut noop);
        }
    }
    c.execute_batch("DELETE FROM delivery_queue; DELETE FROM keyorder_lease;")?;
    if args.only_delivery {
        return Ok(());
    }
    let t0 = clock.now();
    enqueue(&mut c, &mut next, args.events)?;
    let secs = clock.now().saturating_since(t0).as_secs_f64();
    println!(
        "batch enqueue: {} events in {secs:.2} s = {:.0} events/s (batches of {BATCH}, one transaction each)",
        args.events,
        args.events as f64 / secs
    );
    for (i, &w) in args.workers.iter().enumerate() {
        if i > 0 {
            enqueue(&mut c, &mut next, args.events)?;
        }
        let store = || {
            let options = SqliteOptions::for_delivery_timeout(BENCH_DELIVERY_TIMEOUT);
            Ok(SqliteStore::new(&path, PartitionCount::new(PARTITIONS)?, options, clock)?)
        };
        let rate = block_on(drain(store, Probe::Sqlite(&c), w, args.events))??;
        println!("drain, {w} worker(s), {PARTITIONS} partitions: {rate:.0} deliveries/s");
    }
    Ok(())
}

/// The workers' delivery timeout in the drains (the no-op deliverer answers at once).
const BENCH_DELIVERY_TIMEOUT: Duration = Duration::from_millis(100);

/// Events `first..first + size`, spread over `keys` keys.
fn batch(first: u64, size: u64, keys: u64) -> Vec<Event> {
    (0..size)
        .map(|i| {
            let id = first + i;
            Event {
                event_id: format!("bench-{id}"),
                tenant_id: String::new(),
                subscription_id: format!("sub_{:06}", id % keys.max(1)),
                resource_id: String::new(),
                payload: serde_json::json!({"n": id}),
            }
        })
        .collect()
}

/// Deliveries per second in the steady state: between the 10% and 90% marks of `n`, so that
/// lease start-up and the last partitions' tails do not count. Returns once the queue is empty.
async fn drain<S: Store>(
    store: impl Fn() -> anyhow::Result<S>,
    probe: Probe<'_>,
    workers: usize,
    n: u64,
) -> anyhow::Result<f64> {
    let clock = TokioClock::start();
    let delivered = Rc::new(Cell::new(0u64));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    for i in 0..workers {
        let store = store()?;
        let mut cfg = WorkerConfig::new(format!("bench-{i}"));
        cfg.delivery_timeout = BENCH_DELIVERY_TIMEOUT;
        cfg.rebalance_every = Duration::from_millis(100);
        cfg.idle_poll = Duration::from_millis(10);
        cfg.start_offset = (i * PARTITIONS as usize / workers) as u16;
        let mut rx = rx.clone();
        let stop = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let noop = Noop { delivered: delivered.clone() };
        handles.push(tokio::task::spawn_local(worker::run(store, noop, clock, cfg, stop)));
    }
    let (low, high) = (n / 10, n - n / 10);
    let (mut t_low, mut t_high): (Option<Time>, Option<Time>) = (None, None);
    while t_high.is_none() {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let d = delivered.get();
        if t_low.is_none() && d >= low {
            t_low = Some(clock.now());
        }
        if d >= high {
            t_high = Some(clock.now());
        }
    }
    loop {
        if probe.depth().await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = tx.send(true);
    for h in handles {
        h.await?;
    }
    let (Some(a), Some(b)) = (t_low, t_high) else {
        unreachable!("both marks are set before the loop ends")
    };
    Ok((high - low) as f64 / b.saturating_since(a).as_secs_f64().max(1e-6))
}

/// The configuration of loop `i` of a deliverer drain.
fn bench_config(
    d: Delivery,
    partitions: i64,
    strict_partition_order: bool,
) -> impl Fn(usize) -> WorkerConfig + Send + Sync {
    move |i| {
        let mut cfg = WorkerConfig::new(format!("bench-{d:?}-{partitions}-{i}"));
        cfg.delivery_timeout = Duration::from_millis(1000);
        cfg.rebalance_every = Duration::from_millis(100);
        cfg.idle_poll = Duration::from_millis(10);
        cfg.start_offset = i as u16;
        cfg.strict_partition_order = strict_partition_order;
        cfg
    }
}

/// One deliverer drain's line, with its share of the no-op rate of the same partition count.
fn print_rate(
    loops: usize,
    partitions: i64,
    d: Delivery,
    rate: bench_http::DrainRate,
    noop: &mut Option<f64>,
) {
    let per_second = rate.per_second;
    *noop = noop.or((d == Delivery::Noop).then_some(per_second));
    let ratio = noop.map(|n| format!(" ({:.0}% of noop)", per_second / n * 100.0));
    let cpu = rate
        .cpu_per_delivery
        .map(|c| format!(", {:.1} µs CPU per delivery", c.as_secs_f64() * 1e6));
    println!(
        "drain, {loops} worker loop(s), {partitions} partitions, deliver {d:?}: {per_second:.0} deliveries/s{}{}",
        ratio.unwrap_or_default(),
        cpu.unwrap_or_default()
    );
}
