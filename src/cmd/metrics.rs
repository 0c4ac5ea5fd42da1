//! `keyorder work --metrics-addr HOST:PORT`: an HTTP/1.1 server ([`keyorder::http::serve`]) on a
//! thread of its own
//! serving `/metrics` ([`keyorder::metrics::Metrics`], OpenMetrics text) and `/healthz`.
//!
//! The per-partition figures come from one grouped query ([`Admin::lag`]) on this server's own
//! admin connection, run at most once a second whatever the scrape rate; the worker figures
//! come from the worker loops' observers. Not run by the simulation.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::http::serve::{serve_pages, Page};
use keyorder::metrics::{DeliveryOutcome, Metrics, CONTENT_TYPE};
use keyorder::store::admin::{Admin, OpenMode};
use keyorder::store::open::{AdminConn, Location};
use keyorder::store::StoreError;
use keyorder::worker::{Observer, WorkerEvent};
use keyorder::PartitionId;
use tokio::time::error::Elapsed;

use super::bad_input::BadInput;

/// The lag query (for `/metrics`) and the health check's query (for `/healthz`) each run at
/// most this often, however often the pages are asked.
const REFRESH: Duration = Duration::from_secs(1);
/// How long opening the admin connection or the health check's query may take before the store
/// counts as unreachable.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the lag query may take. It reads every queued row on PostgreSQL, so a deep backlog
/// makes it slow without anything being wrong; `/healthz` does not wait for it.
const LAG_TIMEOUT: Duration = Duration::from_secs(30);

/// What the worker loops report into: shared by every loop's observer and the server.
#[derive(Clone, Debug)]
pub(crate) struct MetricsHandle {
    metrics: Arc<Metrics>,
    /// Set by the first lease any loop takes: the loops have registered and taken a share.
    leased: Arc<AtomicBool>,
}

impl MetricsHandle {
    /// Exports the queue's placement audit.
    pub(crate) fn set_audit(&self, audit: &keyorder::layout::Audit) {
        self.metrics.set_audit(audit);
    }

    /// Counts `event` of the loop `worker` (and, for a lease taken, marks the process ready).
    pub(crate) fn observe(&self, worker: &str, event: &WorkerEvent) {
        if matches!(event, WorkerEvent::Acquired { .. }) {
            self.leased.store(true, Ordering::Relaxed);
        }
        self.metrics.observe(worker, event);
    }

    /// `inner` (the logging observer), then the counting.
    pub(crate) fn wrap(&self, worker: String, inner: Observer) -> Observer {
        let handle = self.clone();
        Observer(Rc::new(move |e: &WorkerEvent| {
            (inner.0)(e);
            handle.observe(&worker, e);
        }))
    }
}

/// A deliverer that counts each attempt's outcome and latency into `--metrics-addr`'s
/// registry (nothing without it). An attempt the worker abandons at its delivery timeout (the
/// future dropped unanswered) counts as timed out, or dead-lettered on its last attempt.
#[derive(Clone)]
pub(crate) struct Counting<D> {
    inner: D,
    metrics: Option<(Arc<Metrics>, Arc<str>)>,
    max_attempts: u32,
}

impl<D> Counting<D> {
    /// Wraps `inner` for the loop `worker` under a retry policy of `max_attempts`.
    pub(crate) fn new(
        inner: D,
        handle: Option<&MetricsHandle>,
        worker: &str,
        max_attempts: u32,
    ) -> Self {
        let metrics = handle.map(|h| (h.metrics.clone(), Arc::from(worker)));
        Counting { inner, metrics, max_attempts }
    }
}

/// One attempt in flight; counted when finished, or on drop (abandoned at the timeout).
struct Attempt {
    metrics: Option<(Arc<Metrics>, Arc<str>)>,
    last: bool,
    #[allow(clippy::disallowed_methods)] // not simulated: a latency in real time
    start: Instant,
}

impl Attempt {
    fn finish(&mut self, result: &Result<(), DeliverError>) {
        let outcome = match result {
            Ok(()) => DeliveryOutcome::Accepted,
            Err(_) if self.last => DeliveryOutcome::DeadLettered,
            Err(DeliverError::Timeout { .. }) => DeliveryOutcome::TimedOut,
            Err(_) => DeliveryOutcome::Retried,
        };
        self.count(outcome);
    }

    fn count(&mut self, outcome: DeliveryOutcome) {
        if let Some((metrics, worker)) = self.metrics.take() {
            metrics.delivered(&worker, outcome, self.start.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let outcome =
            if self.last { DeliveryOutcome::DeadLettered } else { DeliveryOutcome::TimedOut };
        self.count(outcome);
    }
}

impl<D: Deliver> Deliver for Counting<D> {
    #[allow(clippy::disallowed_methods)] // not simulated: a latency in real time
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let mut pending = Attempt {
            metrics: self.metrics.clone(),
            last: attempt >= self.max_attempts,
            start: Instant::now(),
        };
        let result = self.inner.deliver(partition, head, attempt).await;
        pending.finish(&result);
        result
    }
}

/// Binds `addr` (bad input if it cannot be bound) and serves on a thread of its own until the
/// process exits; logs the bound address (useful with port 0).
pub(crate) fn start(addr: &str, location: Location) -> anyhow::Result<MetricsHandle> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| BadInput(format!("--metrics-addr {addr}: cannot listen there: {e}")))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let handle = MetricsHandle { metrics: Arc::new(Metrics::new()), leased: Arc::default() };
    let state = State {
        location,
        handle: handle.clone(),
        admin: RefCell::new(None),
        last_lag: Cell::new(None),
        last_check: Cell::new(None),
        reachable: Cell::new(false),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || tokio::task::LocalSet::new().block_on(&rt, serve(listener, Rc::new(state))))
        .context("starting the metrics server")?;
    tracing::info!(
        metrics = format!("http://{bound}/metrics").as_str(),
        health = format!("http://{bound}/healthz").as_str(),
        "serving metrics and the health check"
    );
    Ok(handle)
}

/// The server's side: its own admin connection and when it last asked the store.
struct State {
    location: Location,
    handle: MetricsHandle,
    admin: RefCell<Option<AdminConn>>,
    /// When the lag was last read.
    #[allow(clippy::disallowed_methods)] // not simulated: rate-limits the query in real time
    last_lag: Cell<Option<Instant>>,
    /// When the store was last asked for the health check.
    #[allow(clippy::disallowed_methods)] // not simulated: rate-limits the check in real time
    last_check: Cell<Option<Instant>>,
    /// Whether the store answered the last query asked of it.
    reachable: Cell<bool>,
}

impl State {
    /// Whether `last` was less than [`REFRESH`] ago; if not, sets it to now.
    #[allow(clippy::disallowed_methods)] // not simulated: rate-limits queries in real time
    fn recent(last: &Cell<Option<Instant>>) -> bool {
        if last.get().is_some_and(|t| t.elapsed() < REFRESH) {
            return true;
        }
        last.set(Some(Instant::now()));
        false
    }

    /// The admin connection, opened if there is none; `None` (and the store marked
    /// unreachable) when opening fails or takes longer than [`STORE_TIMEOUT`].
    async fn admin(&self) -> Option<AdminConn> {
        if let Some(a) = self.admin.take() {
            return Some(a);
        }
        match tokio::time::timeout(STORE_TIMEOUT, self.location.open_admin(OpenMode::Existing))
            .await
        {
            Ok(Ok(a)) => Some(a),
            _ => {
                self.reachable.set(false);
                None
            }
        }
    }

    /// Records whether a query answered within its time; a failure drops the connection
    /// (reopened next time) and marks the store unreachable.
    fn answered<T>(
        &self,
        admin: AdminConn,
        result: Result<Result<T, StoreError>, Elapsed>,
    ) -> Option<T> {
        match result {
            Ok(Ok(value)) => {
                self.reachable.set(true);
                self.admin.replace(Some(admin));
                Some(value)
            }
            _ => {
                self.reachable.set(false);
                None
            }
        }
    }

    /// Re-reads the lag unless it was read less than [`REFRESH`] ago.
    async fn refresh_lag(&self) {
        if Self::recent(&self.last_lag) {
            return;
        }
        let Some(admin) = self.admin().await else { return };
        let read = async {
            let layout = admin.routing_state().await?.current().map(|l| l.partitions);
            Ok::<_, StoreError>((layout, admin.lag().await?))
        };
        let read = tokio::time::timeout(LAG_TIMEOUT, read).await;
        if let Some((layout, lag)) = self.answered(admin, read) {
            self.handle.metrics.set_lag(layout, &lag);
        }
    }

    /// Asks the store a light question (the routing records), unless it was asked less than
    /// [`REFRESH`] ago: whether the store is reachable does not depend on how deep the queue is.
    async fn check(&self) {
        if Self::recent(&self.last_check) {
            return;
        }
        let Some(admin) = self.admin().await else { return };
        let routing = tokio::time::timeout(STORE_TIMEOUT, admin.routing_state()).await;
        self.answered(admin, routing);
    }

    async fn answer(&self, path: &str) -> Page {
        match path {
            "/metrics" => {
                self.refresh_lag().await;
                Page { status: 200, content_type: CONTENT_TYPE, body: self.handle.metrics.encode() }
            }
            "/healthz" => {
                self.check().await;
                let leased = self.handle.leased.load(Ordering::Relaxed);
                match (self.reachable.get(), leased) {
                    (true, true) => Page::text(200, "ok\n"),
                    (false, _) => Page::text(503, "store unreachable\n"),
                    (true, false) => Page::text(503, "no partition leased yet\n"),
                }
            }
            _ => Page::text(404, "try /metrics or /healthz\n"),
        }
    }
}

/// Serves the pages until the process exits (see [`serve_pages`]).
async fn serve(listener: std::net::TcpListener, state: Rc<State>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    serve_pages(listener, move |path: String| {
        let state = state.clone();
        async move { state.answer(&path).await }
    })
    .await
}
