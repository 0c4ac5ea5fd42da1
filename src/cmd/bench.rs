//! `keyorder bench`: throughput of the store (PostgreSQL, or SQLite for `sqlite:PATH`) with a no-op deliverer: batch enqueue,
//! drain with 1, 2, 4, 8 workers over 16 partitions, and drain after a million events have
//! churned through the table compared with a fresh (truncated) one, best of three each. Durable commits (PostgreSQL: the server's default
//! `synchronous_commit = on`; SQLite: the enqueue connection `synchronous = FULL` unless
//! `--durability normal`, the workers' `NORMAL`). Use a throwaway database: it empties the queue tables.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use keyorder::clock::{Clock, TokioClock};
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::key::Event;
use keyorder::store::admin::{Admin, Durability};
use keyorder::store::open::{Location, OpenMode, StoreFactory, StoreOptions};
use keyorder::store::Store;
use keyorder::worker::{self, WorkerConfig};
use keyorder::{PartitionCount, PartitionId, Time};

use super::bad_input::BadInput;
use super::bench_http::{self, Delivery};
use super::runtime::{block_on, open_error, Database};

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
    /// --threads`). Default: the number of cores.
    #[arg(long)]
    loops: Option<usize>,
    /// Only the deliverer drains: skip the worker-count and churn measurements.
    #[arg(long)]
    only_delivery: bool,
    /// Confirm that the database's queue tables may be emptied.
    #[arg(long)]
    yes: bool,
    /// Drain the deliverer drains with partition FIFO (a failing event blocks its partition,
    /// with no parking), to compare the two.
    #[arg(long)]
    strict_partition_order: bool,
    /// The batch enqueue's durability, as `keyorder enqueue --durability` (SQLite only): what
    /// producers get by default is `full`.
    #[arg(long, value_enum, default_value_t = Durability::Full)]
    durability: Durability,
    /// SQLite only: rows each head read reads ahead, one drain per value (1: a statement per
    /// head), from 1 to 4096. Default: the store's, 64.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=4096))]
    read_ahead: Option<Vec<u64>>,
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
    let location = args.db.location()?;
    if args.read_ahead.is_some() && location.file().is_none() {
        return Err(BadInput(
            "--read-ahead is for SQLite; PostgreSQL reads one head per statement".into(),
        )
        .into());
    }
    match location.file() {
        Some(path) => anyhow::ensure!(
            args.yes || !path.exists(),
            "keyorder bench empties the queue tables of {}: re-run with --yes, or name a new file",
            path.display()
        ),
        None => anyhow::ensure!(
            args.yes,
            "keyorder bench empties delivery_queue and delivery_dlq: re-run with --yes on a throwaway database"
        ),
    }
    block_on(async move {
        let mut c = location.open_admin(OpenMode::Migrate).await.map_err(open_error)?;
        c.migrate().await?;
        c.empty_queue(true).await?;
        // The enqueues below run on this connection: they commit as a producer's would.
        c.set_durability(args.durability)?;
        if let Some(path) = location.file() {
            let enqueue = match args.durability {
                Durability::Full => "FULL",
                Durability::Normal => "NORMAL",
            };
            println!(
                "SQLite store {}: journal_mode=WAL, enqueue synchronous={enqueue}, workers synchronous=NORMAL, {PARTITIONS} partitions, no-op deliverer",
                path.display()
            );
        }
        let mut next = 0u64;
        deliveries(&args, &location, &mut c, &mut next).await?;
        if args.only_delivery {
            return Ok(());
        }
        let clock = TokioClock::start();
        let t0 = clock.now();
        enqueue(&mut c, &mut next, args.events, args.keys).await?;
        let secs = clock.now().saturating_since(t0).as_secs_f64();
        println!(
            "batch enqueue: {} events in {secs:.2} s = {:.0} events/s (batches of {BATCH}{})",
            args.events,
            args.events as f64 / secs,
            if location.file().is_some() { ", one transaction each" } else { "" }
        );
        let drains = drain_stores(&location, PartitionCount::new(PARTITIONS)?)?;
        for (i, &w) in args.workers.iter().enumerate() {
            if i > 0 {
                enqueue(&mut c, &mut next, args.events, args.keys).await?;
            }
            let rate = drain(|| Ok(drains.make()?), &c, w, args.events).await?;
            println!("drain, {w} worker(s), {PARTITIONS} partitions: {rate:.0} deliveries/s");
        }
        // A store that reuses deleted pages at once has no bloat to show.
        if !c.deletes_leave_bloat() {
            return Ok(());
        }
        let w = args.workers.iter().copied().max().unwrap_or(4);
        c.empty_queue(false).await?;
        let fresh = best_of(3, &mut c, &mut next, &args, &drains, w).await?;
        let mut churned = 0;
        while churned < args.churn {
            let n = (args.churn - churned).min(200_000);
            enqueue(&mut c, &mut next, n, args.keys).await?;
            drain(|| Ok(drains.make()?), &c, w, n).await?;
            churned += n;
            tracing::info!(churned, of = args.churn, "churning");
        }
        let after = best_of(3, &mut c, &mut next, &args, &drains, w).await?;
        println!(
            "drain of {} events (best of 3), {w} workers: fresh {fresh:.0}/s, after {} churned {after:.0}/s ({:+.1}%)",
            args.sample,
            args.churn,
            (after / fresh - 1.0) * 100.0
        );
        Ok(())
    })?
}

/// The stores of the worker-count and churn drains.
fn drain_stores(location: &Location, count: PartitionCount) -> anyhow::Result<StoreFactory> {
    let options = StoreOptions {
        delivery_timeout: BENCH_DELIVERY_TIMEOUT,
        lease_expiry: None,
        session_timeout: None,
        request_timeout: keyorder::worker::DEFAULT_REQUEST_TIMEOUT,
        read_ahead: None,
    };
    location.stores(count, options).map_err(open_error)
}

/// The best of `n` drains of `args.sample` events: short runs are noisy on a shared machine.
async fn best_of(
    n: usize,
    c: &mut impl Admin,
    next: &mut u64,
    args: &BenchArgs,
    stores: &StoreFactory,
    workers: usize,
) -> anyhow::Result<f64> {
    let mut best = 0.0f64;
    for _ in 0..n {
        enqueue(c, next, args.sample, args.keys).await?;
        best = best.max(drain(|| Ok(stores.make()?), c, workers, args.sample).await?);
    }
    Ok(best)
}

async fn enqueue(c: &mut impl Admin, next: &mut u64, n: u64, keys: u64) -> anyhow::Result<()> {
    enqueue_routed(c, next, n, keys, PartitionCount::new(PARTITIONS)?).await
}

/// The drain rate of each `--deliver` at each `--partitions`, one worker, the events enqueued
/// afresh each time; leaves the queue empty.
async fn deliveries(
    args: &BenchArgs,
    location: &Location,
    c: &mut impl Admin,
    next: &mut u64,
) -> anyhow::Result<()> {
    let read_aheads: Vec<Option<usize>> = match &args.read_ahead {
        // At most 4096: checked by the flag's parser.
        Some(rows) => rows.iter().map(|&n| Some(n as usize)).collect(),
        None => vec![None],
    };
    for &p in &args.partitions {
        let count = PartitionCount::new(p)?;
        for &read_ahead in &read_aheads {
            let mut noop = None;
            for &d in &args.deliver {
                c.empty_queue(false).await?;
                enqueue_routed(c, next, args.events, args.keys, count).await?;
                let options = StoreOptions {
                    delivery_timeout: Duration::from_millis(1000),
                    lease_expiry: None,
                    session_timeout: None,
                    request_timeout: keyorder::worker::DEFAULT_REQUEST_TIMEOUT,
                    read_ahead,
                };
                let stores = location.stores(count, options).map_err(open_error)?;
                let loops = args.loops.unwrap_or_else(super::workers::default_threads);
                let rate = bench_http::bench_delivery(
                    move || Ok(stores.make()?),
                    args.events,
                    d,
                    bench_config(d, p, args.strict_partition_order),
                    loops,
                )?;
                if let Some(rows) = read_ahead {
                    print!("read-ahead {rows:>4}: ");
                }
                print_rate(loops, p, d, rate, &mut noop);
            }
        }
    }
    c.empty_queue(false).await?;
    Ok(())
}

async fn enqueue_routed(
    c: &mut impl Admin,
    next: &mut u64,
    n: u64,
    keys: u64,
    count: PartitionCount,
) -> anyhow::Result<()> {
    let recorded = c.record_layout(count).await?.partitions;
    anyhow::ensure!(
        recorded == count,
        "the bench database records {recorded} partitions, not {count}"
    );
    let mut left = n;
    while left > 0 {
        let size = left.min(BATCH);
        let events = batch(*next, size, keys);
        c.enqueue(&events, false).await.context("enqueue")?;
        *next += size;
        left -= size;
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
    probe: &impl Admin,
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
