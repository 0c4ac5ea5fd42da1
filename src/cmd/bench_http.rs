//! The delivery benchmark: drain a store's queued events through the worker with a no-op
//! deliverer, or the HTTP deliverer to a loopback [`Receiver`] over plain HTTP or HTTPS, and
//! report deliveries per second. Generic over the store, so every store can be measured alike.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use keyorder::clock::{Clock, TokioClock};
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::http::{HttpDeliverer, HttpOptions, Target};
use keyorder::store::Store;
use keyorder::worker::{self, WorkerConfig};
use keyorder::{PartitionId, Time};

use super::receiver::Receiver;

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

/// Counts successful deliveries of the deliverer it wraps.
#[derive(Clone)]
struct Counted<D> {
    inner: D,
    delivered: Rc<Cell<u64>>,
}

impl<D: Deliver> Deliver for Counted<D> {
    async fn deliver(
        &mut self,
        p: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        self.inner.deliver(p, head, attempt).await?;
        self.delivered.set(self.delivered.get() + 1);
        Ok(())
    }
}

/// Runs one worker over `store`, which holds `events` queued events, until all of them were
/// delivered with `delivery`; returns deliveries per second between the 10% and 90% marks (so
/// lease start-up and the last partitions' tails do not count).
pub(crate) async fn bench_delivery<S: Store>(
    store: S,
    events: u64,
    delivery: Delivery,
    config: WorkerConfig,
) -> anyhow::Result<f64> {
    match delivery {
        Delivery::Noop => drain(store, events, Noop, config).await,
        Delivery::Http | Delivery::Https => {
            let tls = delivery == Delivery::Https;
            let receiver = Receiver::start(tls)?;
            let tls = if tls { Some(Receiver::client_tls()?) } else { None };
            let options = HttpOptions { tls, ..HttpOptions::default() };
            let http = HttpDeliverer::with_options(Target::parse(&receiver.url())?, options);
            let rate = drain(store, events, http, config).await?;
            anyhow::ensure!(
                receiver.requests() >= events,
                "the receiver answered {} requests for {events} deliveries",
                receiver.requests()
            );
            Ok(rate)
        }
    }
}

async fn drain<S: Store, D: Deliver>(
    store: S,
    events: u64,
    deliver: D,
    config: WorkerConfig,
) -> anyhow::Result<f64> {
    let clock = TokioClock::start();
    let delivered = Rc::new(Cell::new(0u64));
    let deliver = Counted { inner: deliver, delivered: delivered.clone() };
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let stop = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let worker = tokio::task::spawn_local(worker::run(store, deliver, clock, config, stop));
    let (low, high) = (events / 10, events - events / 10);
    let (mut t_low, mut t_high): (Option<Time>, Option<Time>) = (None, None);
    let (mut last, mut last_at) = (0, clock.now());
    while delivered.get() < events {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let (d, now) = (delivered.get(), clock.now());
        if t_low.is_none() && d >= low {
            t_low = Some(now);
        }
        if t_high.is_none() && d >= high {
            t_high = Some(now);
        }
        if d != last {
            (last, last_at) = (d, now);
        }
        if now.saturating_since(last_at) > STALL {
            let _ = tx.send(true);
            anyhow::bail!("stalled: {d} of {events} delivered, none in the last {STALL:?}");
        }
    }
    let _ = tx.send(true);
    worker.await?;
    let (Some(a), Some(b)) = (t_low, t_high) else {
        unreachable!("both marks are passed before every event is delivered")
    };
    Ok((high - low) as f64 / b.saturating_since(a).as_secs_f64().max(1e-6))
}
