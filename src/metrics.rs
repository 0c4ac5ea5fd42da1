//! Prometheus metrics of a store's partitions and of a worker process, encoded with
//! `prometheus-client` (OpenMetrics text): one set of names for `keyorder work --metrics-addr`
//! and `keyorder lag --prom`, so an alert rule written against one holds for the other.
//!
//! Nothing here runs in the simulation: the worker loop reports to it only through its
//! [`crate::worker::Observer`], which the simulation does not trace.

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::routing::PartitionCount;
use crate::store::admin::PartitionLag;

mod partitions;
use crate::worker::WorkerEvent;

/// Label pairs of one series (`partition` or `worker`).
type Labels = Vec<(String, String)>;

/// How one delivery attempt ended, as the worker's retry policy settles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// A 2xx: the event is acknowledged.
    Accepted,
    /// Failed (or timed out) with attempts left: retried after a backoff.
    Retried,
    /// Failed (or timed out) on its last attempt: dead-lettered.
    DeadLettered,
    /// No answer within the delivery timeout, with attempts left (then retried).
    TimedOut,
}

impl DeliveryOutcome {
    /// The `outcome` label value.
    pub fn label(self) -> &'static str {
        match self {
            DeliveryOutcome::Accepted => "accepted",
            DeliveryOutcome::Retried => "retried",
            DeliveryOutcome::DeadLettered => "dead_lettered",
            DeliveryOutcome::TimedOut => "timed_out",
        }
    }
}

fn latency_histogram() -> Histogram {
    // 5 ms to about 41 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry and every family it exports. Cheap to share (`Arc`); every update is atomic.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    partitions: Arc<partitions::PartitionSeries>,
    parked: Family<Labels, Gauge>,
    leases_held: Family<Labels, Gauge>,
    stranded: Gauge,
    misrouted: Gauge,
    acquired: Family<Labels, Counter>,
    released: Family<Labels, Counter>,
    lost: Family<Labels, Counter>,
    store_errors: Family<Labels, Counter>,
    deliveries: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// An empty registry with every keyorder family registered (counters are exported with
    /// the `_total` suffix OpenMetrics gives them).
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            partitions: Arc::default(),
            parked: Family::default(),
            leases_held: Family::default(),
            stranded: Gauge::default(),
            misrouted: Gauge::default(),
            acquired: Family::default(),
            released: Family::default(),
            lost: Family::default(),
            store_errors: Family::default(),
            deliveries: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        };
        // Depth, oldest wait, keys and head attempts, per partition in partition order.
        registry.register_collector(Box::new(m.partitions.clone()));
        registry.register(
            "keyorder_partition_parked_keys",
            "Failing keys parked on a partition this process holds, waiting for their retry time (0 when none)",
            m.parked.clone(),
        );
        registry.register(
            "keyorder_queue_stranded_rows",
            "Rows on a partition no worker leases (never delivered until moved); alert on this",
            m.stranded.clone(),
        );
        registry.register(
            "keyorder_queue_misrouted_rows",
            "Rows not on the partition their key routes to (another count, hash or pin: split keys)",
            m.misrouted.clone(),
        );
        registry.register(
            "keyorder_worker_leases_held",
            "Partition leases the worker loop holds now",
            m.leases_held.clone(),
        );
        registry.register(
            "keyorder_worker_leases_acquired",
            "Partition leases taken",
            m.acquired.clone(),
        );
        registry.register(
            "keyorder_worker_leases_released",
            "Partition leases given back cleanly",
            m.released.clone(),
        );
        registry.register(
            "keyorder_worker_leases_lost",
            "Partition leases lost to a store error or a refused drain input",
            m.lost.clone(),
        );
        registry.register(
            "keyorder_worker_store_errors",
            "Membership session failures (the worker reconnects)",
            m.store_errors.clone(),
        );
        registry.register(
            "keyorder_worker_deliveries",
            "Delivery attempts by outcome (accepted, retried, dead_lettered, timed_out)",
            m.deliveries.clone(),
        );
        registry.register(
            "keyorder_worker_delivery_seconds",
            "Time from sending a delivery to its answer (or to its timeout)",
            m.latency.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Replaces every per-partition series (depth, oldest wait, keys, head attempts): every
    /// partition of `layout` (the layout in force, when one is recorded) exports each, 0 when
    /// `lag` (one grouped query's answer) has no row of it; a partition outside the layout with
    /// rows (stranded, or of an older layout) exports its own. Encoded in partition order.
    pub fn set_lag(&self, layout: Option<PartitionCount>, lag: &[PartitionLag]) {
        self.partitions.set(layout, lag);
    }

    /// Sets the queue's placement audit (see [`crate::layout::audit`]).
    pub fn set_audit(&self, audit: &crate::layout::Audit) {
        self.stranded.set(audit.stranded_rows);
        self.misrouted.set(audit.misrouted_rows);
    }

    /// Counts one worker event of the loop named `worker`.
    pub fn observe(&self, worker: &str, event: &WorkerEvent) {
        let labels = vec![("worker".to_owned(), worker.to_owned())];
        match event {
            WorkerEvent::Acquired { partition, .. } => {
                self.acquired.get_or_create(&labels).inc();
                self.leases_held.get_or_create(&labels).inc();
                // A held partition exports its parked keys, 0 until one is parked.
                self.parked.get_or_create(&partition_labels(partition)).set(0);
            }
            WorkerEvent::Released { partition, .. } => {
                self.released.get_or_create(&labels).inc();
                self.leases_held.get_or_create(&labels).dec();
                self.parked.remove(&partition_labels(partition));
            }
            WorkerEvent::Lost { partition, .. } | WorkerEvent::DrainRefused { partition, .. } => {
                self.lost.get_or_create(&labels).inc();
                self.leases_held.get_or_create(&labels).dec();
                self.parked.remove(&partition_labels(partition));
            }
            WorkerEvent::Parked { partition, keys } => {
                self.parked
                    .get_or_create(&partition_labels(partition))
                    .set(i64::try_from(*keys).unwrap_or(i64::MAX));
            }
            WorkerEvent::StoreUnavailable { .. } => {
                self.store_errors.get_or_create(&labels).inc();
            }
        }
    }

    /// Counts one delivery attempt of the loop `worker` that ended as `outcome` after
    /// `seconds`.
    pub fn delivered(&self, worker: &str, outcome: DeliveryOutcome, seconds: f64) {
        let labels = vec![
            ("worker".to_owned(), worker.to_owned()),
            ("outcome".to_owned(), outcome.label().to_owned()),
        ];
        self.deliveries.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&vec![("worker".to_owned(), worker.to_owned())])
            .observe(seconds);
    }

    /// The registry as OpenMetrics text (what Prometheus scrapes), ending in `# EOF`.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// The label set of a per-partition series.
fn partition_labels(partition: impl std::fmt::Display) -> Labels {
    vec![("partition".to_owned(), partition.to_string())]
}

/// The metric names a text exposition carries: every `# TYPE` line's family, for a counter the
/// `_total` series it exports too, and for a histogram its `_bucket`, `_sum` and `_count`
/// series. Takes the names from what the code encodes, not a copy.
pub fn exported_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                names.push(name.to_owned());
                let suffixes: &[&str] = match kind {
                    "counter" => &["_total"],
                    "histogram" => &["_bucket", "_sum", "_count"],
                    _ => &[],
                };
                names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
            }
        }
    }
    names
}

#[cfg(test)]
mod tests;
