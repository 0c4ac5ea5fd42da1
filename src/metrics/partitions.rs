//! The per-partition figures of one lag query, exported for every partition of the layout in
//! force (0 when a partition is empty) and for any other partition that holds rows (stranded, or
//! of an older layout), in partition order.

use std::collections::BTreeMap;
use std::sync::RwLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::routing::PartitionCount;
use crate::store::admin::PartitionLag;

/// One partition's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Figures {
    depth: i64,
    oldest_wait_seconds: f64,
    keys: i64,
    head_attempts: i64,
}

/// The per-partition gauges, replaced whole by each lag query ([`PartitionSeries::set`]).
#[derive(Debug, Default)]
pub(super) struct PartitionSeries {
    figures: RwLock<BTreeMap<i64, Figures>>,
}

/// Each family: its name, its help, and the figure it exports.
type Field = (&'static str, &'static str, fn(&Figures) -> Gauged);

/// A figure as a gauge value.
enum Gauged {
    Int(i64),
    Float(f64),
}

const FAMILIES: [Field; 4] = [
    ("keyorder_partition_depth", "Rows queued in the partition (0 when empty)", |f| {
        Gauged::Int(f.depth)
    }),
    (
        "keyorder_partition_oldest_wait_seconds",
        "Age of the oldest queued row of the partition (0 when empty); alert on this",
        |f| Gauged::Float(f.oldest_wait_seconds),
    ),
    ("keyorder_partition_keys", "Distinct keys queued in the partition", |f| Gauged::Int(f.keys)),
    ("keyorder_partition_head_attempts", "Failed attempts recorded at the partition's head", |f| {
        Gauged::Int(f.head_attempts)
    }),
];

impl PartitionSeries {
    /// Replaces every series: 0 for each partition below `layout` (the layout in force, if
    /// one is recorded), then `lag`'s figures for the partitions that hold rows.
    pub(super) fn set(&self, layout: Option<PartitionCount>, lag: &[PartitionLag]) {
        let mut figures = BTreeMap::new();
        for p in 0..layout.map_or(0, |c| c.get()) {
            figures.insert(i64::from(p), Figures::default());
        }
        for l in lag {
            figures.insert(
                i64::from(l.partition),
                Figures {
                    depth: l.depth,
                    oldest_wait_seconds: l.oldest_wait_seconds,
                    keys: l.keys_affected,
                    head_attempts: i64::from(l.head_attempts),
                },
            );
        }
        // Plain data: still usable after a panic elsewhere.
        *self.figures.write().unwrap_or_else(|e| e.into_inner()) = figures;
    }
}

impl Collector for PartitionSeries {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let figures = self.figures.read().unwrap_or_else(|e| e.into_inner());
        for (name, help, field) in FAMILIES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (partition, f) in figures.iter() {
                let labels = [("partition", partition.to_string())];
                let series = family.encode_family(&labels)?;
                match field(f) {
                    Gauged::Int(v) => ConstGauge::new(v).encode(series)?,
                    Gauged::Float(v) => ConstGauge::new(v).encode(series)?,
                }
            }
        }
        Ok(())
    }
}
