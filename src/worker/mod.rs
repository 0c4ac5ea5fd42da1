//! The async worker loop, written once and generic over a [`Store`] and a [`Deliver`]:
//! production runs it against PostgreSQL or SQLite (through `store::any::AnyStore`) and HTTP,
//! the simulation inside simulated hosts against its simulated store.
//!
//! One membership session keeps the worker counted as live; every `rebalance_every` the worker
//! reads the partition count and the live workers, gives back what exceeds its fair share
//! ([`crate::lease::rebalance`]) and tries to lease more up to it. Each leased partition runs
//! in its own task with its own session and drain machine, so partitions progress in parallel
//! while each one delivers strictly one event at a time.
//!
//! A drain machine that refuses an input (a bug of this loop) stops its partition task, which
//! gives the lease back unclean and reports [`WorkerEvent::DrainRefused`].
//!
//! Must run inside a tokio `LocalSet` (simulated hosts do): partition tasks are `spawn_local`ed.
//! Every `select!` is `biased`, so no unseeded tokio randomness decides anything.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::deliver::Deliver;
use crate::drain::{DrainConfig, DEFAULT_IDLE_POLL, DEFAULT_MAX_PARKED_KEYS};
use crate::ids::PartitionId;
use crate::lease::rebalance;
use crate::liveness::LivenessConfig;
use crate::retry::RetryPolicy;
use crate::store::timed::{Limits, TimedControl, TimedStore};
use crate::store::{Handover, LeaseSession, MembershipSession, Store, StoreError};

mod partition;

pub use partition::PartitionExit;

use partition::PartitionTask;

/// A worker's configuration: everything a restarted worker starts from.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The worker's name, as registered with the store.
    pub name: String,
    /// Attempts and backoff at a partition's head.
    pub retry: RetryPolicy,
    /// How long an empty partition waits before looking again.
    pub idle_poll: Duration,
    /// How often the worker re-reads membership and rebalances.
    pub rebalance_every: Duration,
    /// How long one delivery may take before it counts as failed. Must be shorter than the
    /// store's detection of a dead session, or a partitioned worker's delivery could overlap
    /// its successor's.
    pub delivery_timeout: Duration,
    /// The pause before reconnecting after the store failed.
    pub reconnect_after: Duration,
    /// The longest any store call may take; a lease call that takes longer ends the lease
    /// (its session is dropped). Opening a session may take twice it. See [`crate::store::timed`].
    pub request_timeout: Duration,
    /// How long the store lets a session stay silent before it ends it and frees its locks
    /// (PostgreSQL's `idle_session_timeout`, the simulation's detection); `None` for a store that
    /// ends no silent session. With it, every lease session is kept heard every third of it and a
    /// holder does not deliver once its session may end before the delivery does. Validate it
    /// with [`crate::liveness::LivenessConfig`].
    pub session_timeout: Option<Duration>,
    /// How stale the worker's record of when a session was last heard may be (see
    /// [`crate::liveness::LivenessConfig::margin`]).
    pub session_margin: Duration,
    /// Seed of every jitter draw this worker makes.
    pub rng_seed: u64,
    /// Where this worker starts looking for free partitions, to spread contention.
    pub start_offset: u16,
    /// How long a new lease waits before its first read; `None` means the delivery timeout,
    /// the least that is safe (see [`DrainConfig::takeover_delay`]).
    pub takeover_delay: Option<Duration>,
    /// The most keys of one partition parked at once (see [`DrainConfig::max_parked_keys`]).
    pub max_parked_keys: usize,
    /// Partition FIFO: a failing head blocks its whole partition (see
    /// [`DrainConfig::strict_partition_order`]).
    pub strict_partition_order: bool,
    /// Where lease changes and store failures are reported, if anywhere.
    pub observer: Option<Observer>,
    /// Loops of one process started together (`keyorder work --threads N`): each waits here
    /// once, after its membership is registered and before its first rebalance, so the
    /// first loop up does not lease every partition only to hand most of them back.
    pub start_together: Option<StartTogether>,
    /// Test only: every partition task feeds each delivery result twice (a worker bug the
    /// drain machine refuses), so that a test can drive the refusal path.
    #[cfg(test)]
    pub(crate) repeat_results: bool,
}

/// A meeting point of worker loops that start together; see
/// [`WorkerConfig::start_together`]. A loop that does not arrive within
/// [`StartTogether::WAIT`] (its store is unreachable) is not waited for any longer.
#[derive(Clone)]
pub struct StartTogether(std::sync::Arc<tokio::sync::Barrier>);

impl StartTogether {
    /// The longest a loop waits for the others.
    pub const WAIT: Duration = Duration::from_secs(2);

    /// A meeting point of `loops` loops.
    pub fn new(loops: usize) -> Self {
        Self(std::sync::Arc::new(tokio::sync::Barrier::new(loops.max(1))))
    }
}

impl std::fmt::Debug for StartTogether {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StartTogether")
    }
}

impl WorkerConfig {
    /// Defaults for a worker called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            retry: RetryPolicy::default(),
            idle_poll: DEFAULT_IDLE_POLL,
            rebalance_every: Duration::from_secs(1),
            delivery_timeout: Duration::from_secs(10),
            reconnect_after: Duration::from_millis(500),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            session_timeout: None,
            session_margin: Duration::ZERO,
            rng_seed: 0,
            start_offset: 0,
            takeover_delay: None,
            max_parked_keys: DEFAULT_MAX_PARKED_KEYS,
            strict_partition_order: false,
            observer: None,
            start_together: None,
            #[cfg(test)]
            repeat_results: false,
        }
    }
}

/// The default [`WorkerConfig::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl WorkerConfig {
    /// The liveness configuration this worker runs under, with its store ending sessions
    /// silent for `session_timeout` and the record of last contact stale by up to `margin`:
    /// what [`LivenessConfig::validate`] judges at start.
    pub fn liveness(&self, session_timeout: Duration, margin: Duration) -> LivenessConfig {
        LivenessConfig {
            delivery_timeout: self.delivery_timeout,
            request_timeout: self.request_timeout,
            session_timeout,
            rebalance_every: self.rebalance_every,
            lease_quiet: self.idle_poll.max(self.retry.cap()),
            margin,
        }
    }

    /// The bounds the store wrapper enforces, from this configuration.
    pub fn limits(&self) -> Limits {
        Limits {
            request_timeout: self.request_timeout,
            session_timeout: self.session_timeout,
            margin: self.session_margin,
        }
    }
}

/// What a worker did, returned when it shuts down.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Leases taken.
    pub acquired: u64,
    /// Leases given back on request.
    pub released: u64,
    /// Leases lost to store errors.
    pub lost: u64,
}

/// Something an operator wants to see, reported as it happens.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// A partition's lease was taken.
    Acquired {
        /// The partition.
        partition: PartitionId,
        /// The lease's epoch.
        epoch: crate::ids::Epoch,
    },
    /// A partition was given back (rebalancing or shutdown).
    Released {
        /// The partition.
        partition: PartitionId,
        /// The epoch of the lease given back.
        epoch: crate::ids::Epoch,
    },
    /// A partition's lease was lost to a store error; another worker may take it.
    Lost {
        /// The partition.
        partition: PartitionId,
        /// The epoch of the lease lost.
        epoch: crate::ids::Epoch,
        /// What failed, with its causes.
        error: String,
    },
    /// A partition's drain machine refused an input (a bug in the worker loop): the partition
    /// task stopped and gave the lease back as unclean; another holder, or this worker's next
    /// lease of it, starts afresh after the takeover wait. Counted as a lost lease.
    DrainRefused {
        /// The partition.
        partition: PartitionId,
        /// What the machine refused.
        error: String,
    },
    /// The number of keys parked on a partition this worker holds changed: a failing key was
    /// parked, or a parked key came due again or was dead-lettered. Reported on every change,
    /// `keys: 0` once none is parked; a lease's end (released, lost) clears it.
    Parked {
        /// The partition.
        partition: PartitionId,
        /// Keys parked on it now.
        keys: usize,
    },
    /// The membership session failed; the worker reconnects after a pause.
    StoreUnavailable {
        /// What failed, with its causes.
        error: String,
    },
}

/// Receives [`WorkerEvent`]s (logging, metrics). Called on the worker's thread; must not block.
#[derive(Clone)]
pub struct Observer(pub std::rc::Rc<dyn Fn(&WorkerEvent)>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// An error and its causes on one line, `: `-separated.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A partition task's handle: `Some` while it runs, `None` once a release was requested.
type Owned = BTreeMap<PartitionId, Option<oneshot::Sender<()>>>;

/// Runs a worker until `shutdown` completes, then gives every lease back after its in-flight
/// delivery and returns what it did.
pub async fn run<S, D, C>(
    store: S,
    deliver: D,
    clock: C,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
) -> WorkerReport
where
    S: Store,
    D: Deliver,
    C: Clock + Clone + 'static,
{
    // Every store call goes through the shared timeouts and liveness record.
    let store = TimedStore::new(store, clock.clone(), config.limits());
    let mut worker = Worker {
        store,
        deliver,
        clock,
        config,
        tasks: JoinSet::new(),
        owned: Owned::new(),
        epochs: BTreeMap::new(),
    };
    let mut report = WorkerReport::default();
    let mut control: Option<TimedControl<S::Membership>> = None;
    tokio::pin!(shutdown);
    loop {
        let pause = match worker.turn(&mut control, &mut report).await {
            Ok(()) => worker.config.rebalance_every,
            Err(err) => {
                worker.observe(WorkerEvent::StoreUnavailable { error: chain(&err) });
                control = None;
                worker.config.reconnect_after
            }
        };
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            Some(exit) = worker.tasks.join_next(), if !worker.tasks.is_empty() => {
                worker.reaped(exit, &mut report);
            }
            _ = tokio::time::sleep(pause) => {}
        }
    }
    worker.shutdown(&mut report).await;
    report
}

struct Worker<S, D, C> {
    store: TimedStore<S, C>,
    deliver: D,
    clock: C,
    config: WorkerConfig,
    tasks: JoinSet<PartitionExit>,
    owned: Owned,
    /// The epoch of each partition task's lease, for the observer.
    epochs: BTreeMap<PartitionId, crate::ids::Epoch>,
}

impl<S: Store, D: Deliver, C: Clock + Clone + 'static> Worker<S, D, C> {
    /// One membership turn: connect if needed, then rebalance.
    async fn turn(
        &mut self,
        control: &mut Option<TimedControl<S::Membership>>,
        report: &mut WorkerReport,
    ) -> Result<(), StoreError> {
        while let Some(exit) = self.tasks.try_join_next() {
            self.reaped(exit, report);
        }
        let session = match control {
            Some(session) => session,
            None => control.insert(self.store.connect(&self.config.name).await?),
        };
        if let Some(meet) = self.config.start_together.take() {
            // Registered: wait for the other loops to be, then share the partitions.
            let _ = tokio::time::timeout(StartTogether::WAIT, meet.0.wait()).await;
        }
        let count = session.partition_count().await?;
        let live = session.live_workers().await?;
        let running: std::collections::BTreeSet<PartitionId> =
            self.owned.iter().filter(|(_, h)| h.is_some()).map(|(p, _)| *p).collect();
        let plan = rebalance(&running, count, live, self.config.start_offset);
        for p in &plan.release {
            if let Some(handle) = self.owned.get_mut(p).and_then(Option::take) {
                // The task may have ended already; then there is nothing to release.
                let _ = handle.send(());
            }
        }
        let mut holding = running.len() - plan.release.len();
        for p in plan.candidates {
            if holding >= plan.want {
                break;
            }
            if self.owned.contains_key(&p) {
                continue;
            }
            if let Some(lease) = self.store.acquire(p).await? {
                self.spawn(lease);
                report.acquired += 1;
                holding += 1;
            }
        }
        Ok(())
    }

    fn observe(&self, event: WorkerEvent) {
        if let Some(o) = &self.config.observer {
            (o.0)(&event);
        }
    }

    fn spawn(&mut self, lease: <TimedStore<S, C> as Store>::Lease) {
        let partition = lease.partition();
        self.observe(WorkerEvent::Acquired { partition, epoch: lease.epoch() });
        let (tx, rx) = oneshot::channel();
        let seed = self.config.rng_seed
            ^ (u64::from(partition.0) << 32)
            ^ lease.epoch().0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut drain = DrainConfig::new(partition, seed);
        drain.retry = self.config.retry;
        drain.idle_poll = self.config.idle_poll;
        drain.max_parked_keys = self.config.max_parked_keys;
        drain.strict_partition_order = self.config.strict_partition_order;
        // A previous holder may not know it lost this lease (a store restart drops every lease
        // at once) and may have one delivery out: wait until that delivery has timed out. After
        // a clean hand-back (recorded under the lease) no delivery can be out: start at once.
        drain.takeover_delay = match lease.handover() {
            Handover::Clean => Duration::ZERO,
            Handover::Unclean => self.config.takeover_delay.unwrap_or(self.config.delivery_timeout),
        };
        let task = PartitionTask {
            deliver: self.deliver.clone(),
            clock: self.clock.clone(),
            drain,
            delivery_timeout: self.config.delivery_timeout,
            observer: self.config.observer.clone(),
            parked: 0,
            unsettled: false,
            inherited: lease.handover() == Handover::Unclean,
            #[cfg(test)]
            repeat_results: self.config.repeat_results,
        };
        self.owned.insert(partition, Some(tx));
        self.epochs.insert(partition, lease.epoch());
        self.tasks.spawn_local(task.run(lease, rx));
    }

    fn reaped(
        &mut self,
        exit: Result<PartitionExit, tokio::task::JoinError>,
        report: &mut WorkerReport,
    ) {
        match exit {
            Ok(PartitionExit::Released(p)) => {
                report.released += 1;
                self.owned.remove(&p);
                let epoch = self.epochs.remove(&p).unwrap_or(crate::ids::Epoch(0));
                self.observe(WorkerEvent::Released { partition: p, epoch });
            }
            Ok(PartitionExit::Lost(p, err)) => {
                report.lost += 1;
                self.owned.remove(&p);
                let epoch = self.epochs.remove(&p).unwrap_or(crate::ids::Epoch(0));
                self.observe(WorkerEvent::Lost { partition: p, epoch, error: chain(&err) });
            }
            Ok(PartitionExit::Refused(p, err)) => {
                report.lost += 1;
                self.owned.remove(&p);
                self.observe(WorkerEvent::DrainRefused { partition: p, error: chain(&err) });
            }
            // A partition task panicked: that is a bug; surface it rather than hide it.
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => {}
        }
    }

    async fn shutdown(&mut self, report: &mut WorkerReport) {
        for handle in self.owned.values_mut() {
            if let Some(tx) = handle.take() {
                let _ = tx.send(());
            }
        }
        while let Some(exit) = self.tasks.join_next().await {
            self.reaped(exit, report);
        }
    }
}

#[cfg(test)]
mod tests;
