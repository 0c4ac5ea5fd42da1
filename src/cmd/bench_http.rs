//! The delivery benchmark: drain a store's queued events through the worker with a no-op
//! deliverer, or the HTTP deliverer to a loopback [`Receiver`] over plain HTTP or HTTPS, and
//! report deliveries per second. Generic over the store, so every store can be measured alike.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keyorder::clock::{Clock, TokioClock};
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::http::{HttpDeliverer, HttpOptions, Target};
use keyorder::store::Store;
use keyorder::worker::{self, WorkerConfig};
use keyorder::{PartitionId, Time};

use super::receiver::Receiver;
use super::runtime::block_on;

/// What the events are delivered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Delivery {
    /// Accept at once, in process: the store's and worker's own cost.
    Noop,
    /// POST to a loopback receiver over HTTP/1.1 keep-alive.
    Http,
    /// The same over TLS.
    Https,
}

/// What a deliverer drain measured.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DrainRate {
    /// Deliveries per second between the 10% and 90% marks.
    pub(crate) per_second: f64,
    /// The process's CPU time (every thread: workers, store connections, the receiver) per
    /// delivery over the same window, where the platform reports it (Linux). Unlike the rate,
    /// it hardly moves when other programs load the machine.
    pub(crate) cpu_per_delivery: Option<Duration>,
}

/// The CPU time this process has used so far, all threads, from `/proc/self/stat` (`utime`
/// and `stime`, in the kernel's clock ticks of 1/100 s on every Linux configuration).
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: the fields of interest follow its closing paren.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ').skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

/// A run with no delivery for this long has stalled (an endpoint or store failure).
const STALL: Duration = Duration::from_secs(20);

/// Accepts everything at once.
#[derive(Clone)]
struct Noop;

impl Deliver for Noop {
    async fn deliver(&mut self, _: PartitionId, _: &Head, _: u32) -> Result<(), DeliverError> {
        Ok(())
    }
}

/// Counts successful deliveries of the deliverer it wraps, across threads.
#[derive(Clone)]
struct Counted<D> {
    inner: D,
    delivered: Arc<AtomicU64>,
}

impl<D: Deliver> Deliver for Counted<D> {
    async fn deliver(
        &mut self,
        p: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        self.inner.deliver(p, head, attempt).await?;
        self.delivered.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Runs `loops` worker loops, each on its own thread with a store from `make_store`, over
/// `events` queued events until all of them were delivered with `delivery`; returns
/// deliveries per second between the 10% and 90% marks (so lease start-up and the last
/// partitions' tails do not count), and the CPU time per delivery over the same window.
pub(crate) fn bench_delivery<S: Store>(
    make_store: impl Fn() -> anyhow::Result<S> + Send + Sync + 'static,
    events: u64,
    delivery: Delivery,
    config: impl Fn(usize) -> WorkerConfig + Send + Sync + 'static,
    loops: usize,
) -> anyhow::Result<DrainRate> {
    match delivery {
        Delivery::Noop => drain(make_store, events, || Ok(Noop), config, loops),
        Delivery::Http | Delivery::Https => {
            let tls = delivery == Delivery::Https;
            let receiver = Receiver::start(tls)?;
            let tls = if tls { Some(Receiver::client_tls()?) } else { None };
            let options = HttpOptions { tls, ..HttpOptions::default() };
            let target = Target::parse(&receiver.url())?;
            let make = move || Ok(HttpDeliverer::with_options(target.clone(), options.clone()));
            let rate = drain(make_store, events, make, config, loops)?;
            anyhow::ensure!(
                receiver.requests() >= events,
                "the receiver answered {} requests for {events} deliveries",
                receiver.requests()
            );
            Ok(rate)
        }
    }
}

fn drain<S: Store, D: Deliver>(
    make_store: impl Fn() -> anyhow::Result<S> + Send + Sync + 'static,
    events: u64,
    make_deliver: impl Fn() -> anyhow::Result<D> + Send + Sync + 'static,
    config: impl Fn(usize) -> WorkerConfig + Send + Sync + 'static,
    loops: usize,
) -> anyhow::Result<DrainRate> {
    let delivered = Arc::new(AtomicU64::new(0));
    let (tx, rx) = tokio::sync::watch::channel(false);
    let shared = Arc::new((make_store, make_deliver, config));
    let meet = worker::StartTogether::new(loops.max(1));
    let mut threads = Vec::new();
    for i in 0..loops.max(1) {
        let (shared, delivered, mut rx) = (shared.clone(), delivered.clone(), rx.clone());
        let meet = meet.clone();
        threads.push(std::thread::spawn(move || -> anyhow::Result<()> {
            let (make_store, make_deliver, config) = &*shared;
            let (store, inner) = (make_store()?, make_deliver()?);
            let deliver = Counted { inner, delivered };
            let stop = async move {
                let _ = rx.wait_for(|s| *s).await;
            };
            let mut config = config(i);
            config.start_together = Some(meet);
            block_on(worker::run(store, deliver, TokioClock::start(), config, stop))?;
            Ok(())
        }));
    }
    // On a thread of its own too: the caller may be inside a runtime already.
    let counter = delivered.clone();
    let measured = std::thread::spawn(move || block_on(watch_progress(&counter, events)))
        .join()
        .map_err(|_| anyhow::anyhow!("the bench's progress watch panicked"))?;
    let _ = tx.send(true);
    for t in threads {
        t.join().map_err(|_| anyhow::anyhow!("a bench worker panicked"))??;
    }
    measured?
}

/// Waits until `events` were delivered; the rate and CPU per delivery between the 10% and 90%
/// marks.
async fn watch_progress(delivered: &AtomicU64, events: u64) -> anyhow::Result<DrainRate> {
    let clock = TokioClock::start();
    let (low, high) = (events / 10, events - events / 10);
    let (mut t_low, mut t_high): (Option<Time>, Option<Time>) = (None, None);
    let (mut cpu_low, mut cpu_high) = (None, None);
    let (mut last, mut last_at) = (0, clock.now());
    loop {
        let (d, now) = (delivered.load(Ordering::Relaxed), clock.now());
        if t_low.is_none() && d >= low {
            (t_low, cpu_low) = (Some(now), process_cpu());
        }
        if t_high.is_none() && d >= high {
            (t_high, cpu_high) = (Some(now), process_cpu());
        }
        if d >= events {
            break;
        }
        if d != last {
            (last, last_at) = (d, now);
        }
        if now.saturating_since(last_at) > STALL {
            anyhow::bail!("stalled: {d} of {events} delivered, none in the last {STALL:?}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (Some(a), Some(b)) = (t_low, t_high) else {
        unreachable!("both marks are passed before every event is delivered")
    };
    let window = (high - low).max(1);
    let cpu_per_delivery = match (cpu_low, cpu_high) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) / u32::try_from(window).unwrap_or(u32::MAX)),
        _ => None,
    };
    let per_second = (high - low) as f64 / b.saturating_since(a).as_secs_f64().max(1e-6);
    Ok(DrainRate { per_second, cpu_per_delivery })
}
