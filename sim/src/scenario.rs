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
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::breaks::Break;

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
        config.retry = if crate::breaks::Switches::of(self).unbounded_retry {
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

    /// A random scenario of `size`, drawn from `seed`.
    pub fn generate(size: Size, seed: u64) -> Scenario {
        let mut scenario = Scenario::generate_without_pins(size, seed);
        // Pin changes come from a generator of their own, drawn last: a seed
        // without one is the scenario it was before pins existed.
        let mut pin_rng = StdRng::seed_from_u64(seed ^ PIN_STREAM);
        if pin_rng.random_bool(PIN_SHARE) {
            pin_changes(&mut pin_rng, &mut scenario, false);
        }
        scenario
    }

    /// [`Scenario::generate`] before its pin changes are drawn.
    pub(crate) fn generate_without_pins(size: Size, seed: u64) -> Scenario {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5C3A_A10E);
        let (partitions, workers, producers, keys, events, load_ms) = match size {
            Size::Small => (4u16, 2usize, 1usize, 8usize, 12u32, 1_000u64),
            Size::Medium => (16, 4, 2, 96, 25, 3_000),
            Size::Large => (64, 8, 4, 480, 25, 8_000),
        };
        let keys = (0..keys).map(|i| key_spec(&mut rng, i, events)).collect();
        let mut scenario = Scenario::new(partitions, workers, producers, keys, load_ms);
        scenario.max_latency_ms = rng.random_range(1..=4);
        scenario.faults = faults(&mut rng, &scenario);
        // The lease model comes from a generator of its own, so a session-lock scenario is the
        // same as before expiry leases existed, and an expiry one differs only by its lease and
        // the faults aimed at it.
        let mut lease_rng = StdRng::seed_from_u64(seed ^ 0x1EA5_E0E0);
        if lease_rng.random_bool(0.5) {
            expiry_lease(&mut lease_rng, &mut scenario);
        } else {
            // Pauses of session-lock workers come from a generator of their own as well.
            session_pauses(&mut StdRng::seed_from_u64(seed ^ 0x5E55_1011), &mut scenario);
        }
        scenario
    }

    /// Whether `b` is switched on.
    pub fn has(&self, b: Break) -> bool {
        self.breaks.contains(&b)
    }

    /// The scenario of `size` and `seed` with `b` switched on, plus the trigger that design
    /// needs to show (a lease loss for an unfenced lease, a modulus change for a flip, a
    /// poison event for unbounded retry, two producers where keys must share them, a store
    /// restart with slow deliveries out for an always-clean hand-back, an expiry lease and
    /// pauses past its expiry for an unfenced expiry lease, a slow whale pinned early for a pin
    /// without barrier). Without the switch the same
    /// scenario is the correct design under the same faults.
    pub fn generate_broken(size: Size, seed: u64, b: Break) -> Scenario {
        // Without the pin changes (and their whale): each design runs on the scenario it was
        // made for; `pin-without-barrier` adds its own.
        let mut s = Scenario::generate_without_pins(size, seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0xB7EA_C0DE);
        // Every other design is about session locks (or about no lease at all): it runs on the
        // session-lock scenario of its seed, as it did before expiry leases existed.
        s.lease = LeaseModel::SessionLock;
        // Without the pauses of the session-lock scenarios: each design runs on the faults it
        // was made for.
        s.faults.retain(|f| !f.kind.needs_expiry() && !matches!(f.kind, FaultKind::Pause { .. }));
        crate::triggers::add(b, &mut rng, &mut s);
        s.faults.sort_by_key(|f| f.at_ms);
        s.breaks = vec![b];
        s
    }
}

/// Switches `s` to an expiry lease with random clock offsets within the bound, and adds the
/// faults aimed at it: up to two pauses (some shorter, some longer than the expiry) and up to
/// one spell of late renewals.
fn expiry_lease(rng: &mut StdRng, s: &mut Scenario) {
    let mut spec = ExpirySpec::standard();
    let bound = spec.skew_bound_ms as i64;
    spec.skew_ms = (0..s.workers).map(|_| rng.random_range(-bound..=bound)).collect();
    let e = spec.expiry_ms;
    s.lease = LeaseModel::Expiry(spec);
    let at = |rng: &mut StdRng| rng.random_range(100..s.load_ms + 1_000);
    for _ in 0..rng.random_range(0..=2) {
        let worker = rng.random_range(0..s.workers);
        let kind = FaultKind::Pause { worker, for_ms: rng.random_range(e / 2..=e * 2) };
        s.faults.push(Fault { at_ms: at(rng), kind });
    }
    if rng.random_bool(0.5) {
        let worker = rng.random_range(0..s.workers);
        let extra_ms = rng.random_range(e / 3..=e);
        let kind =
            FaultKind::LateRenewals { worker, extra_ms, for_ms: rng.random_range(1_000..=4_000) };
        s.faults.push(Fault { at_ms: at(rng), kind });
    }
    s.faults.sort_by_key(|f| f.at_ms);
}

/// Up to two pauses of session-lock workers (a frozen process: its connections open and
/// silent), some shorter and some longer than the store's detection: the store ends a stopped
/// worker's sessions and their locks after `detection_ms`, the others take its partitions, and
/// on waking it must not deliver or acknowledge with the leases it lost.
fn session_pauses(rng: &mut StdRng, s: &mut Scenario) {
    let d = s.detection_ms;
    let at = |rng: &mut StdRng| rng.random_range(100..s.load_ms + 1_000);
    for _ in 0..rng.random_range(0..=2) {
        let worker = rng.random_range(0..s.workers);
        let kind = FaultKind::Pause { worker, for_ms: rng.random_range(d / 2..=d * 2) };
        s.faults.push(Fault { at_ms: at(rng), kind });
    }
    s.faults.sort_by_key(|f| f.at_ms);
}

/// `unfenced-expiry`'s trigger: an expiry lease, and one worker (never crashed) stopped three
/// times, each time past its expiry and the takeover by another worker, while events keep
/// coming: its partitions fill up while it is stopped, the new holder drains them, and the
/// stopped worker wakes in the middle of a statement of its old lease.
pub(crate) fn unfenced_expiry_trigger(rng: &mut StdRng, s: &mut Scenario) {
    let mut spec = ExpirySpec::standard();
    let bound = spec.skew_bound_ms as i64;
    spec.skew_ms = (0..s.workers).map(|_| rng.random_range(-bound..=bound)).collect();
    let e = spec.expiry_ms;
    s.lease = LeaseModel::Expiry(spec);
    let worker = rng.random_range(0..s.workers);
    s.faults.retain(|f| !matches!(f.kind, FaultKind::CrashWorker { worker: w, .. } if w == worker));
    let mut at_ms = rng.random_range(300..600);
    for _ in 0..3 {
        // Past the expiry, the rebalance that notices it and the new holder's takeover wait.
        let for_ms = e + rng.random_range(700..=1_500);
        s.faults.push(Fault { at_ms, kind: FaultKind::Pause { worker, for_ms } });
        at_ms += for_ms + rng.random_range(1_000..=2_000);
    }
    s.load_ms = s.load_ms.max(at_ms + 1_000);
    s.duration_ms = s.load_ms + 30_000;
}

/// The seed of the pin-change generator is the scenario's seed XOR this.
const PIN_STREAM: u64 = 0x0091_4E5C_4A4E;
/// The share of generated scenarios with a pin change.
const PIN_SHARE: f64 = 0.4;

/// A pin change under load: the heaviest key becomes a whale (three times its
/// events, an endpoint slow enough that it often carries a backlog: each answer takes one to
/// two of its mean gaps between events) and is pinned to another partition in the middle of the
/// load; half the time it is unpinned or pinned elsewhere later. `forced` (the
/// `pin-without-barrier` trigger) pins it once, early, with an endpoint that answers in half the
/// delivery timeout, several gaps at every size: its backlog grows from the start, so rows of it
/// are always queued on the old partition when the new one gets its first.
pub(crate) fn pin_changes(rng: &mut StdRng, s: &mut Scenario, forced: bool) {
    let smallest = s.smallest_count();
    let Some(i) = (0..s.keys.len()).max_by_key(|i| (s.keys[*i].events, std::cmp::Reverse(*i)))
    else {
        return;
    };
    if smallest < 2 {
        return;
    }
    let whale = &mut s.keys[i];
    whale.events *= 3;
    let gap = (s.load_ms / u64::from(whale.events)).max(1);
    // Well below the delivery timeout, or answers would time out.
    let cap = s.delivery_timeout_ms / 2;
    whale.endpoint.latency_ms =
        if forced { cap } else { rng.random_range(gap.min(cap)..=(2 * gap).min(cap)) };
    let key = whale.key.clone();
    let home = PartitionCount::new(i64::from(s.partitions))
        .map_or(0, |count| keyorder::partition_for(&key, count).0);
    let elsewhere = |rng: &mut StdRng, from: u16| {
        let p = rng.random_range(0..smallest);
        if p == from {
            (p + 1) % smallest
        } else {
            p
        }
    };
    let first = elsewhere(rng, home);
    let at_ms = if forced {
        rng.random_range(s.load_ms / 4..s.load_ms / 2)
    } else {
        rng.random_range(s.load_ms / 4..s.load_ms * 3 / 4)
    };
    s.faults
        .push(Fault { at_ms, kind: FaultKind::Pin { key: key.clone(), partition: Some(first) } });
    if !forced && rng.random_bool(0.5) {
        let later = at_ms + rng.random_range(s.load_ms / 8..=s.load_ms / 2);
        let partition = rng.random_bool(0.5).then(|| elsewhere(rng, first));
        s.faults.push(Fault { at_ms: later, kind: FaultKind::Pin { key, partition } });
    }
    s.faults.sort_by_key(|f| f.at_ms);
}

pub(crate) fn key_spec(rng: &mut StdRng, i: usize, events: u32) -> KeySpec {
    let mut endpoint = EndpointSpec { latency_ms: rng.random_range(0..=3), ..Default::default() };
    match rng.random_range(0..100) {
        0..=5 => endpoint.fail_first = rng.random_range(1..=2),
        6..=8 => {
            endpoint.fail_first = 1;
            endpoint.retry_after_ms = Some(rng.random_range(50..=300));
        }
        9..=12 => endpoint.slow_first = 1,
        13..=15 => endpoint.poison = vec![rng.random_range(0..events)],
        16..=19 => endpoint.flaky_percent = rng.random_range(10..=40),
        20 => endpoint.cut_reply_first = 1,
        21..=23 => endpoint.close_on_reuse_first = 1,
        24 => endpoint.silent_first = 1,
        25 => endpoint.slow_body_first = 1,
        _ => {}
    }
    let n = events + rng.random_range(0..=events / 5);
    KeySpec { key: format!("sub_{i:04}_{:08x}", rng.random::<u32>()), events: n, endpoint }
}

fn faults(rng: &mut StdRng, s: &Scenario) -> Vec<Fault> {
    let mut out = Vec::new();
    let at = |rng: &mut StdRng| rng.random_range(100..s.load_ms + 1_000);
    for _ in 0..rng.random_range(0..=2) {
        let worker = rng.random_range(0..s.workers);
        let kind = FaultKind::CrashWorker { worker, down_ms: rng.random_range(100..=1_500) };
        out.push(Fault { at_ms: at(rng), kind });
    }
    for _ in 0..rng.random_range(0..=2) {
        let worker = rng.random_range(0..s.workers);
        let kind =
            FaultKind::LeaseLoss { worker, for_ms: s.detection_ms + rng.random_range(200..=2_000) };
        out.push(Fault { at_ms: at(rng), kind });
    }
    if rng.random_bool(0.3) {
        out.push(Fault {
            at_ms: at(rng),
            kind: FaultKind::StoreRestart { down_ms: rng.random_range(50..=800) },
        });
    }
    if rng.random_bool(0.3) {
        let to = match rng.random_range(0..3) {
            0 => s.partitions * 2,
            1 => s.partitions + 1,
            _ => (s.partitions / 2).max(1),
        };
        out.push(Fault {
            at_ms: rng.random_range(s.load_ms / 4..s.load_ms),
            kind: FaultKind::Repartition { to },
        });
    }
    out.sort_by_key(|f| f.at_ms);
    out
}

/// A worker host's name: `worker-INDEX`.
pub fn worker_name(i: usize) -> String {
    format!("worker-{i}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_scenarios_are_valid_and_round_trip() {
        for size in [Size::Small, Size::Medium, Size::Large] {
            for seed in 0..20 {
                let s = Scenario::generate(size, seed);
                s.validate().expect("generated scenarios are valid");
                let back = Scenario::from_json(&serde_json::to_string(&s).unwrap()).unwrap();
                assert_eq!(back, s);
            }
        }
        assert!(Scenario::generate(Size::Medium, 1).total_events() >= 2_000);
    }

    #[test]
    fn session_lock_scenarios_get_pauses_and_the_detection_rule_is_the_shared_one() {
        let paused = (0..20)
            .map(|seed| Scenario::generate(Size::Small, seed))
            .filter(|s| s.lease == LeaseModel::SessionLock)
            .filter(|s| s.faults.iter().any(|f| matches!(f.kind, FaultKind::Pause { .. })))
            .count();
        assert!(paused > 0, "no session-lock scenario of 20 pauses a worker");
        let mut s = Scenario::generate(Size::Small, 1);
        s.lease = LeaseModel::SessionLock;
        s.faults = vec![Fault { at_ms: 10, kind: FaultKind::Pause { worker: 0, for_ms: 9_000 } }];
        s.validate().expect("a session-lock worker may be paused");
        // Rebalancing every 2.3 s leaves 2.3 + 0.8 > 3 s of silence on a healthy membership.
        s.rebalance_ms = 2_300;
        let err = s.validate().unwrap_err().to_string();
        assert!(err.contains("longest quiet period"), "{err}");
    }

    #[test]
    fn some_seeds_pin_their_heaviest_key_and_the_others_are_unchanged() {
        let mut pinned = 0;
        for seed in 0..20 {
            let s = Scenario::generate(Size::Small, seed);
            let plain = Scenario::generate_without_pins(Size::Small, seed);
            let pins: Vec<_> =
                s.faults.iter().filter(|f| matches!(f.kind, FaultKind::Pin { .. })).collect();
            if pins.is_empty() {
                assert_eq!(s, plain, "seed {seed}: no pin, so the scenario of before pins");
                continue;
            }
            pinned += 1;
            assert!(pins.len() <= 2, "seed {seed}: a pin and at most one change of it");
            let FaultKind::Pin { key, .. } = &pins[0].kind else { unreachable!() };
            let whale = s.keys.iter().find(|k| k.key == *key).expect("a key of the scenario");
            assert!(s.keys.iter().all(|k| k.events <= whale.events), "seed {seed}: the heaviest");
        }
        assert!(pinned > 0, "no small seed of 20 pins a key");
        // A broken design runs as it did before pins, except the one about pins.
        let b = Scenario::generate_broken(Size::Small, 1, Break::PinWithoutBarrier);
        assert_eq!(b.faults.iter().filter(|f| matches!(f.kind, FaultKind::Pin { .. })).count(), 1);
        let other = Scenario::generate_broken(Size::Small, 1, Break::TwoReaders);
        assert!(other.faults.iter().all(|f| !matches!(f.kind, FaultKind::Pin { .. })));
    }

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
