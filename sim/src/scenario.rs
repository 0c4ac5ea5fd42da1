//! A scenario is data: topology, keys and their events, endpoint behaviour, lease model, retry
//! policy, faults and limits. It serialises to JSON, so a failing case can be saved and
//! replayed; [`Scenario::generate`] draws one from a seed.

use std::time::Duration;

use keyorder::liveness::LivenessConfig;
use keyorder::retry::RetryPolicy;
use keyorder::store::postgres::admin::takeover_delay;
use keyorder::store::session_drain::SessionDrainOptions;
use keyorder::worker::WorkerConfig;
use keyorder::PartitionCount;
use serde::{Deserialize, Serialize};

use crate::breaks::{Break, Switches};

/// The repartition procedure a scenario uses.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Procedure {
    /// Freeze, pause producers, drain to zero, flip, verify, resume.
    #[default]
    DrainAndSwitch,
    /// Switch producers at once; a per-key barrier holds new rows of a key until its old rows
    /// are gone; workers lease both layouts meanwhile. No write pause.
    Online,
    /// Flip at once with events queued (the `flip-without-drain` broken design).
    FlipWithoutDrain,
}

fn is_default(p: &Procedure) -> bool {
    *p == Procedure::default()
}

/// Errors of scenario validation, each naming the field and the rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// A field is out of range.
    #[error("scenario field {field}: {rule}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What it must satisfy.
        rule: String,
    },
    /// The scenario file is not valid JSON for a scenario.
    #[error("scenario is not valid: {0}")]
    Json(#[from] serde_json::Error),
}

/// Preset scenario sizes for sweeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Size {
    /// 4 partitions, 2 workers, about 100 events.
    Small,
    /// 16 partitions, 4 workers, about 2,400 events.
    Medium,
    /// 64 partitions, 8 workers, about 12,000 events.
    Large,
}

/// How one key's endpoint behaves. Decisions depend only on the event and its arrival count,
/// so they are deterministic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSpec {
    /// Time to answer a normal request, in ms.
    pub latency_ms: u64,
    /// The first this-many arrivals of every event answer 503 (with a `Retry-After` of
    /// `retry_after_ms` when set).
    pub fail_first: u32,
    /// A `Retry-After` hint sent with those 503s.
    pub retry_after_ms: Option<u64>,
    /// The first this-many arrivals of every event take longer than the delivery timeout.
    pub slow_first: u32,
    /// Event numbers (0-based, per key) that always fail with 500: poison events.
    pub poison: Vec<u32>,
    /// Percent of arrivals that fail with 503, decided by a hash of the event id and the
    /// arrival count (deterministic, but uneven across events: a flaky endpoint).
    #[serde(default)]
    pub flaky_percent: u32,
    /// The first this-many arrivals of every event (after the failing and slow ones) get the
    /// reply's head and half its body, then the connection closes.
    #[serde(default)]
    pub cut_reply_first: u32,
    /// The first this-many requests of every event that come on a reused connection find it
    /// closed by the server as they arrive (an idle timeout racing the reuse): not processed.
    #[serde(default)]
    pub close_on_reuse_first: u32,
    /// The first this-many arrivals of every event (after the cut ones) meet a peer that goes
    /// silent with the connection open: no answer, no close (half-open).
    #[serde(default)]
    pub silent_first: u32,
    /// The first this-many arrivals of every event (after the silent ones) are answered 200
    /// at once, but the body's end comes only after the slow delay (a slow reply body).
    #[serde(default)]
    pub slow_body_first: u32,
}

/// One key, its event count and its endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySpec {
    /// The partition key (a subscription id).
    pub key: String,
    /// How many events the key gets.
    pub events: u32,
    /// Its endpoint's behaviour.
    pub endpoint: EndpointSpec,
}

/// A fault, at a time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// When, in ms of simulated time.
    pub at_ms: u64,
    /// What.
    pub kind: FaultKind,
}

/// The faults a scenario can schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FaultKind {
    /// Crash worker `worker` and restart it `down_ms` later with nothing but its config.
    CrashWorker {
        /// Worker index.
        worker: usize,
        /// Downtime.
        down_ms: u64,
    },
    /// Cut worker `worker` off from the store (not from endpoints) for `for_ms`.
    LeaseLoss {
        /// Worker index.
        worker: usize,
        /// Duration of the cut; longer than the store's detection delay to lose the lease.
        for_ms: u64,
    },
    /// Crash the store and restart it `down_ms` later: sessions and locks are gone,
    /// committed rows stay.
    StoreRestart {
        /// Downtime.
        down_ms: u64,
    },
    /// Change the partition count to `to` by drain-and-switch.
    Repartition {
        /// The new count.
        to: u16,
    },
    /// Stop worker `worker`'s process for `for_ms` (SIGSTOP, a VM freeze): not a crash. It keeps
    /// its state and its connections and resumes where it stood; while stopped it sends nothing.
    /// With session locks the store ends its silent sessions after `detection_ms`; with expiry
    /// leases its leases expire (see [`LeaseModel`]).
    Pause {
        /// Worker index.
        worker: usize,
        /// How long it stays stopped.
        for_ms: u64,
    },
    /// For `for_ms`, every lease renewal of worker `worker` reaches the store `extra_ms` late
    /// (a starved renewal thread). Expiry leases only.
    LateRenewals {
        /// Worker index.
        worker: usize,
        /// How late each renewal arrives.
        extra_ms: u64,
        /// How long renewals stay late.
        for_ms: u64,
    },
    /// For `for_ms`, every transaction of producer `producer` stays open `extra_ms` longer
    /// before it commits (a slow application transaction around the enqueue). Its rows take
    /// their seqs at the insert on PostgreSQL, so other producers' later rows can commit and be
    /// delivered first; never generated, for scenarios that ask for it.
    SlowCommits {
        /// Producer index.
        producer: usize,
        /// How much longer each transaction stays open.
        extra_ms: u64,
        /// How long transactions stay slow.
        for_ms: u64,
    },
    /// An operator pins `key` (a whale tenant) to `partition`, or unpins it (`None`: it routes
    /// by the hash again), while producers run: a new layout epoch with the count unchanged.
    Pin {
        /// The key.
        key: String,
        /// Its partition from now on; below every count the scenario uses.
        partition: Option<u16>,
    },
}

impl FaultKind {
    /// Whether the fault is aimed at expiry leases (and refused with session locks).
    pub fn needs_expiry(&self) -> bool {
        matches!(self, FaultKind::LateRenewals { .. })
    }

    /// The fault's name in summaries.
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::CrashWorker { .. } => "crash",
            FaultKind::LeaseLoss { .. } => "lease_loss",
            FaultKind::StoreRestart { .. } => "store_restart",
            FaultKind::Repartition { .. } => "repartition",
            FaultKind::Pause { .. } => "pause",
            FaultKind::LateRenewals { .. } => "late_renewal",
            FaultKind::SlowCommits { .. } => "slow_commit",
            FaultKind::Pin { .. } => "pin",
        }
    }
}

/// How partitions are leased.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "model")]
pub enum LeaseModel {
    /// PostgreSQL's session advisory lock: held while the session lives, fenced by the session.
    #[default]
    SessionLock,
    /// SQLite's lease row: holder, epoch and expiry, renewed by the holder, every statement of
    /// the partition fenced by epoch in the store.
    Expiry(ExpirySpec),
}

impl LeaseModel {
    /// The expiry lease's parameters, if this is one.
    pub fn expiry(&self) -> Option<&ExpirySpec> {
        match self {
            LeaseModel::SessionLock => None,
            LeaseModel::Expiry(spec) => Some(spec),
        }
    }
}

/// An expiry lease and the clocks that judge it.
///
/// The store's clock decides expiry: a lease is free once the store's time passes its expiry,
/// and every fenced statement renews it to the store's time plus `expiry_ms`. A worker's clock
/// is the store's plus its offset in `skew_ms`, within `skew_bound_ms` either way (the stated
/// bound). A worker delivers only while, by its own clock, the expiry the store last told it
/// lies at least the delivery timeout plus `skew_bound_ms` ahead: so whatever its skew within
/// the bound, its delivery ends (answered or timed out) before the store can hand the lease on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpirySpec {
    /// How long a lease lasts without renewal, by the store's clock; the holder renews it every
    /// third of it (and every fenced statement renews it).
    pub expiry_ms: u64,
    /// The bound on any worker's clock offset from the store's: the margin of the delivery
    /// check.
    pub skew_bound_ms: u64,
    /// Each worker's clock offset from the store's, in ms (missing: 0).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skew_ms: Vec<i64>,
}

impl ExpirySpec {
    /// The expiry every generated scenario uses: 2 s, skew bound 150 ms, no skew.
    pub fn standard() -> Self {
        Self { expiry_ms: 2_000, skew_bound_ms: 150, skew_ms: Vec::new() }
    }

    /// Worker `i`'s clock offset, in ms.
    pub fn skew(&self, i: usize) -> i64 {
        self.skew_ms.get(i).copied().unwrap_or(0)
    }
}

fn is_session_lock(l: &LeaseModel) -> bool {
    *l == LeaseModel::SessionLock
}

/// A whole simulated deployment and what happens to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scenario {
    /// The partition count at the start.
    pub partitions: u16,
    /// Worker hosts.
    pub workers: usize,
    /// Producer hosts; key `i` is produced by producer `i % producers`.
    pub producers: usize,
    /// Keys and their endpoints.
    pub keys: Vec<KeySpec>,
    /// Events are enqueued over this window, in ms.
    pub load_ms: u64,
    /// A producer's transaction stays open this long before it commits, in ms.
    pub commit_latency_ms: u64,
    /// Network latency bounds between hosts, in ms (jitter when they differ).
    pub min_latency_ms: u64,
    /// See `min_latency_ms`.
    pub max_latency_ms: u64,
    /// How long the store waits on a silent session before declaring it dead and releasing its
    /// locks (PostgreSQL's keepalive detection), in ms.
    pub detection_ms: u64,
    /// How long a client waits for a store answer before dropping the connection, in ms.
    pub request_timeout_ms: u64,
    /// How long one delivery may take, in ms.
    pub delivery_timeout_ms: u64,
    /// How long a new lease waits before its first read, in ms; absent means the delivery
    /// timeout (safe). Shorter lets a restarted store's new lease holders overlap deliveries
    /// still in flight from the old ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover_delay_ms: Option<u64>,
    /// Retry policy at the head.
    pub retry: RetryPolicy,
    /// Empty-partition poll interval, in ms.
    pub idle_poll_ms: u64,
    /// Worker rebalance interval, in ms.
    pub rebalance_ms: u64,
    /// Scheduled faults.
    pub faults: Vec<Fault>,
    /// Quiet time after the queue drained, to catch stragglers, in ms.
    pub tail_ms: u64,
    /// Hard limit of simulated time, in ms.
    pub duration_ms: u64,
    /// How modulus changes are carried out.
    #[serde(default, skip_serializing_if = "is_default")]
    pub procedure: Procedure,
    /// Known-bad designs switched on (empty: the correct design).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub breaks: Vec<Break>,
    /// Partition FIFO: a failing head blocks its whole partition, as before parking (absent:
    /// a failing key is parked and blocks only itself).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strict_partition_order: bool,
    /// How partitions are leased (absent: session locks).
    #[serde(default, skip_serializing_if = "is_session_lock")]
    pub lease: LeaseModel,
}

impl Scenario {
    /// Parses and validates a scenario from JSON.
    pub fn from_json(text: &str) -> Result<Self, ScenarioError> {
        let scenario: Scenario = serde_json::from_str(text)?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Total events across keys.
    pub fn total_events(&self) -> u64 {
        self.keys.iter().map(|k| u64::from(k.events)).sum()
    }

    /// Checks the scenario's rules; the first broken one is the error.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let invalid =
            |field, rule: &str| Err(ScenarioError::Invalid { field, rule: rule.to_owned() });
        if PartitionCount::new(i64::from(self.partitions)).is_err() {
            return invalid("partitions", "must be between 1 and 32767");
        }
        if self.workers == 0 || self.workers > 64 {
            return invalid("workers", "must be between 1 and 64");
        }
        if self.producers == 0 || self.producers > 64 {
            return invalid("producers", "must be between 1 and 64");
        }
        if self.keys.is_empty() {
            return invalid("keys", "must name at least one key");
        }
        if self.keys.iter().any(|k| k.key.is_empty()) {
            return invalid("keys", "a key must not be empty");
        }
        if self.min_latency_ms > self.max_latency_ms {
            return invalid("min_latency_ms", "must not exceed max_latency_ms");
        }
        // The fencing argument and the healthy-session rule, defined once for the simulation
        // and for `keyorder work` alike.
        if let Err(e) = self.liveness().validate() {
            return Err(ScenarioError::Invalid { field: "detection_ms", rule: e.to_string() });
        }
        self.validate_expiry()?;
        for f in &self.faults {
            match f.kind {
                FaultKind::CrashWorker { worker, .. }
                | FaultKind::LeaseLoss { worker, .. }
                | FaultKind::Pause { worker, .. }
                | FaultKind::LateRenewals { worker, .. }
                    if worker >= self.workers =>
                {
                    return invalid("faults", "a fault names a worker that does not exist")
                }
                // A stopped process's session locks end by the store's detection (PostgreSQL's
                // idle_session_timeout, which `keyorder work` sets), so pauses apply to both
                // lease models; late renewals are about expiry leases only.
                FaultKind::LateRenewals { .. } if self.lease.expiry().is_none() => {
                    return invalid("faults", "late renewals need an expiry lease")
                }
                FaultKind::SlowCommits { producer, .. } if producer >= self.producers => {
                    return invalid("faults", "a fault names a producer that does not exist")
                }
                FaultKind::Repartition { to } if PartitionCount::new(i64::from(to)).is_err() => {
                    return invalid("faults", "a repartition target must be between 1 and 32767")
                }
                _ => {}
            }
        }
        self.validate_pins()?;
        if self.duration_ms <= self.load_ms {
            return invalid("duration_ms", "must exceed load_ms");
        }
        Ok(())
    }

    /// Pins name keys of the scenario and partitions that exist under every count it uses
    /// (the first and each repartition target), so a change of count never strands a pin.
    fn validate_pins(&self) -> Result<(), ScenarioError> {
        let smallest = self.smallest_count();
        for f in &self.faults {
            let FaultKind::Pin { key, partition } = &f.kind else { continue };
            if !self.keys.iter().any(|k| k.key == *key) {
                return Err(ScenarioError::Invalid {
                    field: "faults",
                    rule: format!("a pin names key {key:?}, which the scenario does not have"),
                });
            }
            if partition.is_some_and(|p| p >= smallest) {
                return Err(ScenarioError::Invalid {
                    field: "faults",
                    rule: format!("a pin must be below every partition count used ({smallest})"),
                });
            }
        }
        Ok(())
    }

    /// The smallest partition count the scenario uses: the first or a repartition target.
    pub fn smallest_count(&self) -> u16 {
        self.faults
            .iter()
            .filter_map(|f| match f.kind {
                FaultKind::Repartition { to } => Some(to),
                _ => None,
            })
            .fold(self.partitions, u16::min)
    }

    /// The configuration of worker `index` (all but its RNG seed, which the run draws): the
    /// same type, defaults and timeouts `keyorder work` runs with, set from the scenario.
    pub fn worker_config(&self, index: usize) -> WorkerConfig {
        let ms = Duration::from_millis;
        let mut config = WorkerConfig::new(worker_name(index));
        config.retry = if self.switches().unbounded_retry {
            RetryPolicy::new(u32::MAX, ms(50), self.retry.cap()).unwrap_or(self.retry)
        } else {
            self.retry
        };
        config.idle_poll = ms(self.idle_poll_ms);
        config.rebalance_every = ms(self.rebalance_ms);
        config.delivery_timeout = ms(self.delivery_timeout_ms);
        config.reconnect_after = ms(200);
        // The shared wrapper applies the request timeout to every store call, and the
        // store's detection is the session bound the worker keeps its sessions inside.
        config.request_timeout = ms(self.request_timeout_ms);
        config.session_timeout = Some(ms(self.detection_ms));
        // A session lease serves rows read ahead up to `ack_delay` after the store last answered,
        // so its record of last contact may be that stale (production PostgreSQL's margin); an
        // expiry lease's is exact.
        if self.lease.expiry().is_none() {
            config.session_margin = SessionDrainOptions::default().ack_delay;
        }
        // Unset, a session lease waits what production PostgreSQL's does (a delivery plus the
        // read-ahead's `ack_delay`); an expiry lease, a delivery (production SQLite).
        config.takeover_delay = match (self.takeover_delay_ms, self.lease.expiry()) {
            (Some(wait), _) => Some(ms(wait)),
            (None, None) => Some(takeover_delay(config.delivery_timeout)),
            (None, Some(_)) => None,
        };
        config.strict_partition_order = self.strict_partition_order;
        config.start_offset = (index * usize::from(self.partitions) / self.workers) as u16;
        config
    }

    /// The session liveness bound this scenario runs under: the store's detection as the
    /// session timeout, derived from the workers' configuration by the same code and checked
    /// by the same rules as `keyorder work --session-timeout-ms`.
    pub fn liveness(&self) -> LivenessConfig {
        let config = self.worker_config(0);
        config.liveness(Duration::from_millis(self.detection_ms), config.session_margin)
    }

    /// The expiry lease's rules: the stated skew bound covers every worker's offset, and a
    /// head read answered within the request timeout leaves the lease a delivery (plus the
    /// skew margin) to run.
    fn validate_expiry(&self) -> Result<(), ScenarioError> {
        let Some(e) = self.lease.expiry() else { return Ok(()) };
        let invalid =
            |field, rule: &str| Err(ScenarioError::Invalid { field, rule: rule.to_owned() });
        if e.skew_ms.len() > self.workers {
            return invalid("lease.skew_ms", "names more workers than there are");
        }
        if e.skew_ms.iter().any(|s| s.unsigned_abs() > e.skew_bound_ms) {
            return invalid("lease.skew_ms", "every offset must lie within skew_bound_ms");
        }
        if e.expiry_ms <= self.delivery_timeout_ms + self.request_timeout_ms + e.skew_bound_ms {
            return invalid(
                "lease.expiry_ms",
                "must exceed delivery_timeout_ms + request_timeout_ms + skew_bound_ms (else a freshly renewed lease may not last a delivery)",
            );
        }
        Ok(())
    }

    /// A scenario with the lease model, retry policy and timing every generated size uses
    /// (detection 3 s, request timeout 800 ms, delivery timeout 400 ms, 4 attempts with
    /// backoff 50–400 ms), no faults, and a two-minute limit.
    pub fn new(
        partitions: u16,
        workers: usize,
        producers: usize,
        keys: Vec<KeySpec>,
        load_ms: u64,
    ) -> Scenario {
        Scenario {
            partitions,
            workers,
            producers,
            keys,
            load_ms,
            commit_latency_ms: 2,
            min_latency_ms: 1,
            max_latency_ms: 3,
            detection_ms: 3_000,
            request_timeout_ms: 800,
            delivery_timeout_ms: 400,
            takeover_delay_ms: None,
            retry: RetryPolicy::new(4, Duration::from_millis(50), Duration::from_millis(400))
                .expect("valid policy"),
            idle_poll_ms: 100,
            rebalance_ms: 300,
            faults: Vec::new(),
            tail_ms: 1_500,
            duration_ms: 120_000,
            procedure: Procedure::DrainAndSwitch,
            breaks: Vec::new(),
            strict_partition_order: false,
            lease: LeaseModel::SessionLock,
        }
    }

    /// Whether `b` is switched on.
    pub fn has(&self, b: Break) -> bool {
        self.breaks.contains(&b)
    }

    /// The switches this scenario's broken designs turn on.
    pub fn switches(&self) -> Switches {
        Switches::of(&self.breaks, self.delivery_timeout_ms)
    }
}

/// A worker host's name: `worker-INDEX`.
pub fn worker_name(i: usize) -> String {
    format!("worker-{i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_must_name_a_key_and_exist_under_every_count() {
        let mut s = Scenario::generate_without_pins(Size::Small, 1);
        s.faults = vec![Fault { at_ms: 10, kind: FaultKind::Repartition { to: 2 } }];
        let key = s.keys[0].key.clone();
        let pin =
            |partition| Fault { at_ms: 20, kind: FaultKind::Pin { key: key.clone(), partition } };
        s.faults.push(pin(Some(1)));
        s.validate().expect("partition 1 exists under 4 and 2");
        s.faults.push(pin(None));
        s.validate().expect("an unpin is always valid");
        s.faults.push(pin(Some(3)));
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("below every partition count used (2)"), "{err}");
        s.faults.pop();
        s.faults.push(Fault {
            at_ms: 30,
            kind: FaultKind::Pin { key: "nobody".into(), partition: None },
        });
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("\"nobody\""), "{err}");
    }

    #[test]
    fn an_unsafe_lease_model_is_refused() {
        let mut s = Scenario::generate(Size::Small, 1);
        s.detection_ms = s.delivery_timeout_ms;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("detection_ms"), "{err}");
    }
}
