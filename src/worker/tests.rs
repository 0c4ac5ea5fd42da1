//! The worker loop against an in-memory store and endpoint, on tokio's paused clock: every
//! wait is a timer, so each test runs in microseconds and the same way every time.
//!
//! The fake store keeps the semantics the loop relies on: a lease is held by one session at a
//! time and every queue statement is fenced by it (a statement of a session that no longer
//! holds the lease is refused); a session that ends (is dropped) gives its lease up; each
//! acquisition gets a larger epoch; a lease is recorded unclean while held and cleaned only by
//! a hand-back that says clean; the membership count is the open membership sessions plus
//! `others` (workers the test pretends exist).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;
use crate::clock::TokioClock;
use crate::deliver::DeliverError;
use crate::drain::{Head, ParkedKeys};
use crate::ids::{Epoch, Seq, Time};
use crate::routing::PartitionCount;
use crate::store::StoredHead;

// ---------------------------------------------------------------------------------------------
// The fake store.

#[derive(Debug)]
struct Row {
    event_id: String,
    key: String,
    attempts: u32,
    not_before: Option<Time>,
    last_error: Option<String>,
}

#[derive(Debug, Default)]
struct Db {
    count: i64,
    /// Live workers besides the open membership sessions.
    others: usize,
    members: usize,
    next_seq: i64,
    queues: BTreeMap<PartitionId, BTreeMap<Seq, Row>>,
    /// The epoch of each held lease.
    held: BTreeMap<PartitionId, Epoch>,
    epochs: BTreeMap<PartitionId, u64>,
    unclean: BTreeSet<PartitionId>,
    /// Held by a session outside the test: never granted.
    foreign: BTreeSet<PartitionId>,
    /// How long each worker's `connect` takes.
    connect_delay: BTreeMap<String, Duration>,
    /// Fail this many of the next connects.
    fail_connects: usize,
    /// Fail this many of the next membership reads.
    fail_control: usize,
    /// Fail every hand-back.
    fail_release: bool,
    /// Refuse this many delivery checks per partition.
    refuse_lasts: BTreeMap<PartitionId, usize>,
    /// Head reads of these partitions never answer (a blackholed session).
    hang_fetch: BTreeSet<PartitionId>,
    /// How long every head read takes.
    fetch_delay: Duration,
    keep_alives: Vec<(PartitionId, Time)>,
    // What happened, when.
    connects: Vec<(String, Time)>,
    control_reads: Vec<Time>,
    acquired: Vec<(PartitionId, Epoch, Handover, Time)>,
    fetches: Vec<(PartitionId, Epoch, Time)>,
    acks: Vec<(PartitionId, Seq, Time)>,
    retries: Vec<(PartitionId, Seq, u32, Duration, String)>,
    dead: Vec<(PartitionId, Seq, u32, String)>,
    releases: Vec<(PartitionId, Epoch, Handover, Time)>,
}

type SharedDb = Rc<RefCell<Db>>;

#[derive(Clone)]
struct FakeStore {
    db: SharedDb,
    clock: TokioClock,
}

struct FakeControl {
    db: SharedDb,
    clock: TokioClock,
}

struct FakeLease {
    db: SharedDb,
    clock: TokioClock,
    partition: PartitionId,
    epoch: Epoch,
    handover: Handover,
}

fn io(text: &str) -> StoreError {
    StoreError::Io(std::io::Error::other(text.to_owned()))
}

impl Store for FakeStore {
    type Membership = FakeControl;
    type Lease = FakeLease;

    async fn connect(&self, worker: &str) -> Result<FakeControl, StoreError> {
        let delay = self.db.borrow().connect_delay.get(worker).copied();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        tokio::task::yield_now().await;
        let mut db = self.db.borrow_mut();
        db.connects.push((worker.to_owned(), self.clock.now()));
        if db.fail_connects > 0 {
            db.fail_connects -= 1;
            return Err(io("connection refused"));
        }
        db.members += 1;
        Ok(FakeControl { db: self.db.clone(), clock: self.clock })
    }

    async fn acquire(&self, partition: PartitionId) -> Result<Option<FakeLease>, StoreError> {
        tokio::task::yield_now().await;
        let mut db = self.db.borrow_mut();
        if db.foreign.contains(&partition) || db.held.contains_key(&partition) {
            return Ok(None);
        }
        let epoch = {
            let e = db.epochs.entry(partition).or_default();
            *e += 1;
            Epoch(*e)
        };
        let handover =
            if db.unclean.contains(&partition) { Handover::Unclean } else { Handover::Clean };
        // Unclean until a hand-back says otherwise: a lease lost with its session stays so.
        db.unclean.insert(partition);
        db.held.insert(partition, epoch);
        db.acquired.push((partition, epoch, handover, self.clock.now()));
        Ok(Some(FakeLease { db: self.db.clone(), clock: self.clock, partition, epoch, handover }))
    }
}

impl Drop for FakeControl {
    fn drop(&mut self) {
        self.db.borrow_mut().members -= 1;
    }
}

impl FakeControl {
    async fn read(&mut self) -> Result<std::cell::RefMut<'_, Db>, StoreError> {
        tokio::task::yield_now().await;
        let mut db = self.db.borrow_mut();
        db.control_reads.push(self.clock.now());
        if db.fail_control > 0 {
            db.fail_control -= 1;
            return Err(io("membership read failed"));
        }
        Ok(db)
    }
}

impl MembershipSession for FakeControl {
    async fn live_workers(&mut self) -> Result<usize, StoreError> {
        let db = self.read().await?;
        Ok(db.members + db.others)
    }

    async fn partition_count(&mut self) -> Result<PartitionCount, StoreError> {
        let db = self.read().await?;
        Ok(PartitionCount::new(db.count).expect("a valid count"))
    }
}

impl Drop for FakeLease {
    fn drop(&mut self) {
        // The session ends: so does its lock, if it still holds it.
        let mut db = self.db.borrow_mut();
        if db.held.get(&self.partition) == Some(&self.epoch) {
            db.held.remove(&self.partition);
        }
    }
}

impl FakeLease {
    /// The store, if this session still holds the lease; the fence of every statement.
    async fn fenced(&mut self) -> Result<std::cell::RefMut<'_, Db>, StoreError> {
        tokio::task::yield_now().await;
        let db = self.db.borrow_mut();
        if db.held.get(&self.partition) != Some(&self.epoch) {
            return Err(StoreError::LeaseNotHeld { partition: self.partition, epoch: self.epoch });
        }
        Ok(db)
    }
}

impl LeaseSession for FakeLease {
    fn partition(&self) -> PartitionId {
        self.partition
    }

    fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn handover(&self) -> Handover {
        self.handover
    }

    async fn ensure_lasts(&mut self, needed: Duration) -> Result<(), StoreError> {
        let (partition, epoch) = (self.partition, self.epoch);
        let mut db = self.fenced().await?;
        if let Some(n) = db.refuse_lasts.get_mut(&partition).filter(|n| **n > 0) {
            *n -= 1;
            return Err(StoreError::LeaseEnding { partition, epoch, needed });
        }
        Ok(())
    }

    async fn keep_alive(&mut self) -> Result<(), StoreError> {
        let (partition, now) = (self.partition, self.clock.now());
        self.fenced().await?.keep_alives.push((partition, now));
        Ok(())
    }

    async fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, StoreError> {
        let (hang, delay) = {
            let db = self.db.borrow();
            (db.hang_fetch.contains(&self.partition), db.fetch_delay)
        };
        if hang {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(delay).await;
        let (partition, epoch, now) = (self.partition, self.epoch, self.clock.now());
        let mut db = self.fenced().await?;
        db.fetches.push((partition, epoch, now));
        let head = db
            .queues
            .get(&partition)
            .and_then(|q| q.iter().find(|(_, row)| !skip.contains(&row.key)))
            .map(|(seq, row)| StoredHead {
                seq: *seq,
                event_id: row.event_id.clone(),
                key: row.key.clone(),
                payload: "{}".into(),
                attempts: row.attempts,
                wait: row.not_before.filter(|t| *t > now).map(|t| t.saturating_since(now)),
                last_error: row.last_error.clone(),
            });
        Ok(head)
    }

    async fn ack(&mut self, seq: Seq) -> Result<(), StoreError> {
        let (partition, now) = (self.partition, self.clock.now());
        let mut db = self.fenced().await?;
        let row = db.queues.get_mut(&partition).and_then(|q| q.remove(&seq));
        assert!(row.is_some(), "ack of p{partition} seq {seq}, which is not queued");
        db.acks.push((partition, seq, now));
        Ok(())
    }

    async fn schedule_retry(
        &mut self,
        seq: Seq,
        attempts: u32,
        retry_in: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let (partition, now) = (self.partition, self.clock.now());
        let mut db = self.fenced().await?;
        let row = db.queues.get_mut(&partition).and_then(|q| q.get_mut(&seq)).expect("queued");
        row.attempts = attempts;
        row.not_before = Some(now.saturating_add(retry_in));
        row.last_error = Some(error.to_owned());
        db.retries.push((partition, seq, attempts, retry_in, error.to_owned()));
        Ok(())
    }

    async fn dead_letter(
        &mut self,
        seq: Seq,
        attempts: u32,
        reason: &str,
    ) -> Result<(), StoreError> {
        let partition = self.partition;
        let mut db = self.fenced().await?;
        let row = db.queues.get_mut(&partition).and_then(|q| q.remove(&seq));
        assert!(row.is_some(), "dead letter of p{partition} seq {seq}, which is not queued");
        db.dead.push((partition, seq, attempts, reason.to_owned()));
        Ok(())
    }

    async fn release(mut self, handover: Handover) -> Result<(), StoreError> {
        let (partition, epoch, now) = (self.partition, self.epoch, self.clock.now());
        if self.db.borrow().fail_release {
            tokio::task::yield_now().await;
            return Err(io("release failed"));
        }
        let mut db = self.fenced().await?;
        db.held.remove(&partition);
        if handover == Handover::Clean {
            db.unclean.remove(&partition);
        }
        db.releases.push((partition, epoch, handover, now));
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The fake endpoint.

/// What the endpoint does with one delivery attempt.
#[derive(Clone, Copy, Debug)]
enum Reply {
    Accept,
    Status(u16, Option<Duration>),
    /// Never answers.
    Hang,
    /// Accepts after this long.
    Slow(Duration),
    Panic,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Delivered {
    partition: PartitionId,
    seq: Seq,
    attempt: u32,
    at: Time,
}

#[derive(Default)]
struct EndpointState {
    /// Per event id, the replies to its attempts in order; then it accepts.
    script: BTreeMap<String, VecDeque<Reply>>,
    /// Per event id, the reply to every attempt once the script is used up.
    always: BTreeMap<String, Reply>,
    latency: Duration,
    log: Vec<Delivered>,
    in_flight: BTreeMap<PartitionId, usize>,
    most_per_partition: usize,
    most_overall: usize,
}

#[derive(Clone)]
struct Endpoint {
    state: Rc<RefCell<EndpointState>>,
    clock: TokioClock,
}

/// Counts a delivery in flight until dropped (a timed-out delivery is dropped, not finished).
struct InFlight(Rc<RefCell<EndpointState>>, PartitionId);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.borrow_mut().in_flight.get_mut(&self.1).expect("counted") -= 1;
    }
}

impl Deliver for Endpoint {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let (reply, latency) = {
            let mut s = self.state.borrow_mut();
            s.log.push(Delivered { partition, seq: head.seq, attempt, at: self.clock.now() });
            *s.in_flight.entry(partition).or_default() += 1;
            let here = s.in_flight[&partition];
            let overall = s.in_flight.values().sum();
            s.most_per_partition = s.most_per_partition.max(here);
            s.most_overall = s.most_overall.max(overall);
            let scripted = s.script.get_mut(&head.event_id).and_then(VecDeque::pop_front);
            let reply =
                scripted.or_else(|| s.always.get(&head.event_id).copied()).unwrap_or(Reply::Accept);
            (reply, s.latency)
        };
        let _counted = InFlight(self.state.clone(), partition);
        match reply {
            Reply::Accept => {
                tokio::time::sleep(latency).await;
                Ok(())
            }
            Reply::Status(status, retry_after) => {
                tokio::time::sleep(latency).await;
                Err(DeliverError::Status { status, retry_after })
            }
            Reply::Hang => std::future::pending().await,
            Reply::Slow(after) => {
                tokio::time::sleep(after).await;
                Ok(())
            }
            Reply::Panic => panic!("endpoint exploded"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The harness.

struct Harness {
    db: SharedDb,
    endpoint: Endpoint,
    clock: TokioClock,
    events: Rc<RefCell<Vec<(u64, WorkerEvent)>>>,
}

/// A running worker loop: stop it to get its report.
struct Running {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<WorkerReport>,
}

impl Running {
    async fn stop(self) -> WorkerReport {
        let _ = self.stop.send(());
        self.handle.await.expect("the worker loop panicked")
    }
}

fn ms(t: Time) -> u64 {
    t.as_millis()
}

fn p(n: u16) -> PartitionId {
    PartitionId(n)
}

impl Harness {
    fn new(count: i64) -> Self {
        let clock = TokioClock::start();
        let db = Rc::new(RefCell::new(Db { count, ..Db::default() }));
        let endpoint = Endpoint { state: Rc::default(), clock };
        Self { db, endpoint, clock, events: Rc::default() }
    }

    /// The tests' defaults: short periods, three attempts with a short backoff.
    fn config(&self, name: &str) -> WorkerConfig {
        let events = self.events.clone();
        let clock = self.clock;
        let observer = Observer(Rc::new(move |e: &WorkerEvent| {
            events.borrow_mut().push((ms(clock.now()), e.clone()));
        }));
        WorkerConfig {
            retry: RetryPolicy::new(3, Duration::from_millis(100), Duration::from_secs(1))
                .expect("valid"),
            idle_poll: Duration::from_millis(200),
            rebalance_every: Duration::from_secs(1),
            delivery_timeout: Duration::from_secs(2),
            reconnect_after: Duration::from_millis(500),
            observer: Some(observer),
            ..WorkerConfig::new(name)
        }
    }

    fn start(&self, config: WorkerConfig) -> Running {
        let store = FakeStore { db: self.db.clone(), clock: self.clock };
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let run = run(store, self.endpoint.clone(), self.clock, config, shutdown);
        Running { stop, handle: tokio::task::spawn_local(run) }
    }

    /// Queues an event on `partition`; its id is `e<seq>`.
    fn enqueue(&self, partition: u16) -> Seq {
        self.enqueue_key(partition, &format!("k{partition}"))
    }

    /// Queues an event of `key` on `partition`; its id is `e<seq>`.
    fn enqueue_key(&self, partition: u16, key: &str) -> Seq {
        let mut db = self.db.borrow_mut();
        db.next_seq += 1;
        let seq = Seq(db.next_seq);
        let row = Row {
            event_id: format!("e{}", seq.0),
            key: key.to_owned(),
            attempts: 0,
            not_before: None,
            last_error: None,
        };
        db.queues.entry(PartitionId(partition)).or_default().insert(seq, row);
        seq
    }

    fn script(&self, seq: Seq, replies: &[Reply]) {
        let mut s = self.endpoint.state.borrow_mut();
        s.script.insert(format!("e{}", seq.0), replies.iter().copied().collect());
    }

    fn always(&self, seq: Seq, reply: Reply) {
        self.endpoint.state.borrow_mut().always.insert(format!("e{}", seq.0), reply);
    }

    /// Sleeps until `ms` milliseconds after the harness started.
    async fn at(&self, ms: u64) {
        let now = self.clock.now().0;
        tokio::time::sleep(Duration::from_millis(ms).saturating_sub(now)).await;
    }

    fn delivered(&self) -> Vec<Delivered> {
        self.endpoint.state.borrow().log.clone()
    }

    /// `(partition, seq, attempt)` of every delivery, in order.
    fn attempts(&self) -> Vec<(u16, i64, u32)> {
        self.delivered().iter().map(|d| (d.partition.0, d.seq.0, d.attempt)).collect()
    }

    fn held(&self) -> BTreeSet<u16> {
        self.db.borrow().held.keys().map(|p| p.0).collect()
    }

    fn events(&self) -> Vec<(u64, WorkerEvent)> {
        self.events.borrow().clone()
    }

    fn queued(&self, partition: u16) -> usize {
        self.db.borrow().queues.get(&p(partition)).map_or(0, BTreeMap::len)
    }

    /// The store drops `partition`'s lock (a store restart, an operator's
    /// `pg_terminate_backend`): its holder's next statement is refused.
    fn break_lease(&self, partition: u16) {
        self.db.borrow_mut().held.remove(&p(partition));
    }
}

/// Runs `f` inside a `LocalSet`, as the loop requires.
async fn local<F: Future>(f: F) -> F::Output {
    tokio::task::LocalSet::new().run_until(f).await
}

fn released(partition: u16, epoch: u64) -> WorkerEvent {
    WorkerEvent::Released { partition: p(partition), epoch: Epoch(epoch) }
}

fn acquired(partition: u16, epoch: u64) -> WorkerEvent {
    WorkerEvent::Acquired { partition: p(partition), epoch: Epoch(epoch) }
}

// ---------------------------------------------------------------------------------------------
// Formatting.

#[derive(Debug)]
struct Layer(&'static str, Option<Box<Layer>>);

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Layer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1.as_deref().map(|l| l as _)
    }
}

#[test]
fn chain_puts_an_error_and_every_cause_on_one_line() {
    let root = Layer("connection reset", None);
    let middle = Layer("reading the reply", Some(Box::new(root)));
    let top = Layer("fetching the head", Some(Box::new(middle)));
    assert_eq!(chain(&top), "fetching the head: reading the reply: connection reset");
    assert_eq!(chain(&Layer("alone", None)), "alone");
    assert_eq!(chain(&io("refused")), "store connection failed: refused");
}

#[test]
fn a_config_prints_its_hooks_by_name() {
    let mut config = WorkerConfig::new("w1");
    config.observer = Some(Observer(Rc::new(|_: &WorkerEvent| {})));
    config.start_together = Some(StartTogether::new(2));
    let text = format!("{config:?}");
    assert!(text.contains("observer: Some(Observer)"), "{text}");
    assert!(text.contains("start_together: Some(StartTogether)"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Delivery.

#[tokio::test(start_paused = true)]
async fn every_queued_event_is_delivered_once_in_seq_order_and_acknowledged() {
    let h = Harness::new(2);
    local(async {
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(10);
        let mut want: BTreeMap<u16, Vec<i64>> = BTreeMap::new();
        for i in 0..12 {
            let partition = [0, 1, 1][i % 3];
            want.entry(partition).or_default().push(h.enqueue(partition).0);
        }
        let worker = h.start(h.config("w1"));
        h.at(1500).await;
        for (partition, seqs) in &want {
            let got: Vec<(i64, u32)> = h
                .delivered()
                .iter()
                .filter(|d| d.partition.0 == *partition)
                .map(|d| (d.seq.0, d.attempt))
                .collect();
            let once: Vec<(i64, u32)> = seqs.iter().map(|s| (*s, 1)).collect();
            assert_eq!(got, once, "p{partition}: each event once, in seq order, first attempt");
            let acked: Vec<i64> =
                h.db.borrow()
                    .acks
                    .iter()
                    .filter(|(q, _, _)| q.0 == *partition)
                    .map(|(_, s, _)| s.0)
                    .collect();
            assert_eq!(&acked, seqs, "p{partition}: acknowledged in order");
            assert_eq!(h.queued(*partition), 0);
        }
        {
            let s = h.endpoint.state.borrow();
            assert_eq!(s.most_per_partition, 1, "one delivery at a time per partition");
            assert_eq!(s.most_overall, 2, "the partitions progress in parallel");
        }
        assert_eq!(h.held(), BTreeSet::from([0, 1]));

        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 2, lost: 0 });
        assert!(h.held().is_empty(), "shutdown gives every lease back");
        let events = h.events();
        assert_eq!(events.len(), 4, "{events:?}");
        for event in [
            (0, acquired(0, 1)),
            (0, acquired(1, 1)),
            (1500, released(0, 1)),
            (1500, released(1, 1)),
        ] {
            assert!(events.contains(&event), "{event:?} missing from {events:?}");
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_empty_partition_looks_again_every_idle_poll() {
    let h = Harness::new(1);
    local(async {
        let worker = h.start(h.config("w1"));
        h.at(1050).await;
        let seq = h.enqueue(0);
        h.at(1500).await;
        let fetches: Vec<u64> = h.db.borrow().fetches.iter().map(|f| ms(f.2)).collect();
        // Found at the poll of 1200, delivered, and the partition read again after the ack.
        assert_eq!(fetches, [0, 200, 400, 600, 800, 1000, 1200, 1200, 1400]);
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 1200), "found at the next poll");
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_head_is_retried_per_the_policy_then_dead_lettered_and_the_next_follows() {
    let h = Harness::new(1);
    local(async {
        let first = h.enqueue(0);
        let second = h.enqueue(0);
        h.always(first, Reply::Status(503, None));
        let worker = h.start(h.config("w1"));
        h.at(3000).await;
        assert_eq!(
            h.attempts(),
            [(0, first.0, 1), (0, first.0, 2), (0, first.0, 3), (0, second.0, 1)],
            "three attempts (the policy's maximum), then the next event"
        );
        {
            let db = h.db.borrow();
            let retries: Vec<_> = db.retries.iter().map(|r| (r.1, r.2, r.4.as_str())).collect();
            assert_eq!(retries, [(first, 1, "HTTP 503"), (first, 2, "HTTP 503")]);
            // Each retry waits its recorded backoff, which stays under the policy's ceiling.
            let d = h.delivered();
            for (i, retry) in db.retries.iter().enumerate() {
                let ceiling = Duration::from_millis(100 << i);
                assert!(retry.3 <= ceiling, "backoff {:?} above {ceiling:?}", retry.3);
                let waited = d[i + 1].at.saturating_since(d[i].at);
                assert!(
                    waited >= retry.3,
                    "attempt {} came after {waited:?} < {:?}",
                    i + 2,
                    retry.3
                );
            }
            assert_eq!(db.dead, [(p(0), first, 3, "exhausted after 3 attempts: HTTP 503".into())]);
            let acked: Vec<Seq> = db.acks.iter().map(|a| a.1).collect();
            assert_eq!(acked, [second], "the dead-lettered head is not acknowledged");
        }
        worker.stop().await;
    })
    .await;
}

/// Every change in a partition's parked keys is reported, in order, and only a change: what
/// `--metrics-addr` exports as `keyorder_partition_parked_keys`.
#[tokio::test(start_paused = true)]
async fn each_change_in_the_parked_keys_is_reported() {
    let h = Harness::new(1);
    local(async {
        let failing = h.enqueue_key(0, "a");
        let other = h.enqueue_key(0, "b");
        h.always(failing, Reply::Status(503, None));
        let worker = h.start(h.config("w1"));
        h.at(3000).await;
        let parked: Vec<(u64, usize)> = h
            .events()
            .into_iter()
            .filter_map(|(at, e)| match e {
                WorkerEvent::Parked { partition, keys } if partition == p(0) => Some((at, keys)),
                _ => None,
            })
            .collect();
        let counts: Vec<usize> = parked.iter().map(|(_, k)| *k).collect();
        // Parked at each of its first two failures, due again before each retry; the third
        // failure dead-letters it without parking.
        assert_eq!(counts, [1, 0, 1, 0], "{parked:?}");
        let b = h.delivered().into_iter().find(|d| d.seq == other).expect("b delivered");
        assert!(
            parked[0].0 <= ms(b.at) && ms(b.at) < parked[1].0,
            "b went out while a was parked: {parked:?}, b at {}",
            ms(b.at)
        );
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_endpoints_retry_after_is_the_least_wait() {
    let h = Harness::new(1);
    local(async {
        let seq = h.enqueue(0);
        h.script(seq, &[Reply::Status(429, Some(Duration::from_millis(700)))]);
        let worker = h.start(h.config("w1"));
        h.at(2000).await;
        let retry_in = h.db.borrow().retries[0].3;
        assert!(retry_in >= Duration::from_millis(700), "{retry_in:?}");
        let d = h.delivered();
        assert_eq!(d.len(), 2);
        assert!(d[1].at.saturating_since(d[0].at) >= Duration::from_millis(700));
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_delivery_that_outlasts_the_timeout_is_a_failed_attempt() {
    let h = Harness::new(1);
    local(async {
        let seq = h.enqueue(0);
        h.script(seq, &[Reply::Hang]);
        let worker = h.start(h.config("w1"));
        h.at(1999).await;
        assert!(h.db.borrow().retries.is_empty(), "still waiting for the endpoint");
        h.at(2001).await;
        let retries = h.db.borrow().retries.clone();
        assert_eq!(retries.len(), 1);
        assert_eq!((retries[0].1, retries[0].2), (seq, 1));
        assert_eq!(retries[0].4, "timed out after 2s");
        h.at(4000).await;
        assert_eq!(h.attempts(), [(0, seq.0, 1), (0, seq.0, 2)]);
        assert_eq!(h.db.borrow().acks.len(), 1, "the second attempt was accepted");
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_hand_back_is_unclean_only_when_a_delivery_may_still_be_out() {
    let h = Harness::new(4);
    local(async {
        let hangs = h.enqueue(0);
        h.always(hangs, Reply::Hang);
        let refused = h.enqueue(1);
        h.always(refused, Reply::Status(503, None));
        h.enqueue(2);
        let hung_once = h.enqueue(3);
        h.script(hung_once, &[Reply::Hang]);
        let worker = h.start(h.config("w1"));
        h.at(5000).await;
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 4, released: 4, lost: 0 });
        let handovers: BTreeMap<u16, Handover> =
            h.db.borrow().releases.iter().map(|r| (r.0 .0, r.2)).collect();
        assert_eq!(
            handovers,
            BTreeMap::from([
                (0, Handover::Unclean), // its last delivery never answered
                (1, Handover::Clean),   // an error status is an answer
                (2, Handover::Clean),
                (3, Handover::Clean), // timed out once, then answered
            ])
        );
        // The partition whose delivery was out was handed back only once it had timed out.
        let release_0 = h.db.borrow().releases.iter().find(|r| r.0 == p(0)).map(|r| ms(r.3));
        let last_0 = h.delivered().iter().rfind(|d| d.partition == p(0)).map(|d| ms(d.at));
        assert_eq!(release_0, last_0.map(|t| t + 2000));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_the_delivery_in_flight_then_gives_every_lease_back() {
    let h = Harness::new(2);
    local(async {
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(1500);
        let first = h.enqueue(0);
        let second = h.enqueue(0);
        let worker = h.start(h.config("w1"));
        h.at(1000).await;
        let report = worker.stop().await;
        assert_eq!(ms(h.clock.now()), 1500, "the loop ended when the delivery had");
        assert_eq!(report, WorkerReport { acquired: 2, released: 2, lost: 0 });
        assert_eq!(h.attempts(), [(0, first.0, 1)], "nothing new starts after shutdown");
        let db = h.db.borrow();
        assert_eq!(db.acks.iter().map(|a| a.1).collect::<Vec<_>>(), [first]);
        assert!(db.queues[&p(0)].contains_key(&second));
        let releases: BTreeMap<u16, (Handover, u64)> =
            db.releases.iter().map(|r| (r.0 .0, (r.2, ms(r.3)))).collect();
        assert_eq!(
            releases,
            BTreeMap::from([(0, (Handover::Clean, 1500)), (1, (Handover::Clean, 1000))])
        );
        assert!(db.held.is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_partition_task_whose_worker_is_gone_gives_its_lease_back_after_the_delivery() {
    let h = Harness::new(1);
    local(async {
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(1500);
        let first = h.enqueue(0);
        h.enqueue(0);
        let store = FakeStore { db: h.db.clone(), clock: h.clock };
        let limits = WorkerConfig::new("w").limits();
        let store = crate::store::timed::TimedStore::new(store, h.clock, limits);
        let lease = store.acquire(p(0)).await.unwrap().expect("free");
        let task = partition::PartitionTask {
            deliver: h.endpoint.clone(),
            clock: h.clock,
            drain: crate::drain::DrainConfig::new(p(0), 0),
            delivery_timeout: Duration::from_secs(2),
            observer: None,
            parked: 0,
            unsettled: false,
            inherited: false,
            repeat_results: false,
        };
        let (tx, rx) = oneshot::channel();
        let handle = tokio::task::spawn_local(task.run(lease, rx));
        h.at(1000).await;
        // The sender goes without a word (its worker dropped it): that is a release request.
        drop(tx);
        let exit = handle.await.expect("no panic");
        assert!(matches!(exit, PartitionExit::Released(q) if q == p(0)), "{exit:?}");
        assert_eq!(ms(h.clock.now()), 1500);
        assert_eq!(h.attempts(), [(0, first.0, 1)]);
        assert_eq!(h.db.borrow().releases.len(), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_busy_partition_gives_its_lease_back_promptly() {
    let h = Harness::new(2);
    local(async {
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(10);
        let seqs: Vec<Seq> = (0..400).map(|_| h.enqueue(1)).collect();
        let worker = h.start(h.config("w1"));
        h.at(1500).await;
        h.db.borrow_mut().others = 1;
        h.at(3000).await;
        let acked: Vec<Seq> = {
            let db = h.db.borrow();
            let release = db.releases.iter().find(|r| r.0 == p(1)).expect("p1 given back");
            // Asked at the rebalance of 2000, mid-delivery: given back once that one is acked.
            assert!((2000..=2010).contains(&ms(release.3)), "released at {}", ms(release.3));
            db.acks.iter().map(|a| a.1).collect()
        };
        assert!(acked.len() < seqs.len(), "given back before the partition was drained");
        assert_eq!(acked, seqs[..acked.len()], "a prefix, in order");
        let delivered: Vec<Seq> = h.delivered().iter().map(|d| d.seq).collect();
        assert_eq!(delivered, acked, "the delivery in flight at the request was acknowledged");
        assert_eq!(h.held(), BTreeSet::from([0]));
        worker.stop().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Takeover.

#[tokio::test(start_paused = true)]
async fn an_unclean_lease_waits_out_the_delivery_timeout_before_its_first_read() {
    let h = Harness::new(2);
    local(async {
        h.db.borrow_mut().unclean.insert(p(0));
        h.enqueue(0);
        h.enqueue(1);
        let worker = h.start(h.config("w1"));
        h.at(2500).await;
        {
            let db = h.db.borrow();
            let handovers: Vec<_> = db.acquired.iter().map(|a| (a.0 .0, a.2)).collect();
            assert_eq!(handovers, [(0, Handover::Unclean), (1, Handover::Clean)]);
            let first_read = |q: u16| db.fetches.iter().find(|f| f.0 == p(q)).map(|f| ms(f.2));
            assert_eq!(first_read(0), Some(2000), "after the delivery timeout");
            assert_eq!(first_read(1), Some(0), "a clean hand-back needs no wait");
        }
        let at: Vec<(u16, u64)> = h.delivered().iter().map(|d| (d.partition.0, ms(d.at))).collect();
        assert_eq!(at, [(1, 0), (0, 2000)]);
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_configured_takeover_delay_replaces_the_delivery_timeout() {
    let h = Harness::new(1);
    local(async {
        h.db.borrow_mut().unclean.insert(p(0));
        let mut config = h.config("w1");
        config.takeover_delay = Some(Duration::from_millis(700));
        let worker = h.start(config);
        h.at(1000).await;
        let first_read = h.db.borrow().fetches.first().map(|f| ms(f.2));
        assert_eq!(first_read, Some(700));
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_given_back_before_its_first_read_after_an_unclean_takeover_stays_unclean() {
    let h = Harness::new(2);
    local(async {
        h.db.borrow_mut().unclean.insert(p(0));
        let mut config = h.config("w1");
        config.takeover_delay = Some(Duration::from_secs(5));
        let worker = h.start(config);
        h.at(1000).await;
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 2, lost: 0 });
        let db = h.db.borrow();
        assert!(db.fetches.iter().all(|f| f.0 != p(0)), "p0 never read");
        let handovers: BTreeMap<u16, Handover> =
            db.releases.iter().map(|r| (r.0 .0, r.2)).collect();
        // The previous holder of p0 may still have a delivery out: the next holder must wait.
        assert_eq!(handovers, BTreeMap::from([(0, Handover::Unclean), (1, Handover::Clean)]));
        assert!(db.unclean.contains(&p(0)) && !db.unclean.contains(&p(1)));
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Leases and membership.

#[tokio::test(start_paused = true)]
async fn partitions_are_leased_up_to_the_fair_share_from_the_start_offset() {
    let h = Harness::new(6);
    local(async {
        {
            let mut db = h.db.borrow_mut();
            db.others = 1; // two live workers: a share of 3
            db.foreign.insert(p(5));
        }
        let mut config = h.config("w1");
        config.start_offset = 4;
        let worker = h.start(config);
        h.at(2500).await;
        let order: Vec<u16> = h.db.borrow().acquired.iter().map(|a| a.0 .0).collect();
        assert_eq!(order, [4, 0, 1], "from the offset, wrapping, past the one held elsewhere");
        assert_eq!(h.held(), BTreeSet::from([0, 1, 4]));
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 3, released: 3, lost: 0 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn the_excess_is_given_back_when_more_workers_are_live_and_taken_again_when_they_leave() {
    let h = Harness::new(4);
    local(async {
        let worker = h.start(h.config("w1"));
        h.at(500).await;
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3]), "alone: every partition");
        h.db.borrow_mut().others = 1;
        h.at(1500).await;
        assert_eq!(h.held(), BTreeSet::from([0, 1]), "half, the highest given back");
        let given: BTreeSet<_> = h.db.borrow().releases.iter().map(|r| (r.0 .0, ms(r.3))).collect();
        assert_eq!(given, BTreeSet::from([(2, 1000), (3, 1000)]));
        h.db.borrow_mut().others = 0;
        let seq = h.enqueue(3);
        h.at(2500).await;
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3]));
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 2000), "at once: handed back clean");
        let reads: BTreeSet<u64> = h.db.borrow().control_reads.iter().map(|t| ms(*t)).collect();
        assert_eq!(reads, BTreeSet::from([0, 1000, 2000]), "membership read every second");
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 6, released: 6, lost: 0 });
        let events = h.events();
        let at_1000: Vec<_> = events.iter().filter(|e| e.0 == 1000).map(|e| &e.1).collect();
        assert_eq!(at_1000.len(), 2);
        assert!(at_1000.contains(&&released(2, 1)) && at_1000.contains(&&released(3, 1)));
        let at_2000: Vec<_> = events.iter().filter(|e| e.0 == 2000).map(|e| &e.1).collect();
        assert_eq!(at_2000, [&acquired(2, 2), &acquired(3, 2)]);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_second_worker_gets_its_share_once_the_first_gives_back_the_excess() {
    let h = Harness::new(4);
    local(async {
        let a = h.start(h.config("a"));
        h.at(500).await;
        let b = h.start(h.config("b"));
        h.at(2700).await;
        {
            let db = h.db.borrow();
            let by: Vec<(u16, u64)> = db.acquired.iter().map(|a| (a.0 .0, ms(a.3))).collect();
            // a takes all at 0 and gives back 2 and 3 at its rebalance at 1000 (b counted since
            // 500); b, rebalancing at 500 and 1500, takes them at 1500.
            assert_eq!(by, [(0, 0), (1, 0), (2, 0), (3, 0), (2, 1500), (3, 1500)]);
        }
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3]));
        let ra = a.stop().await;
        let rb = b.stop().await;
        assert_eq!(ra, WorkerReport { acquired: 4, released: 4, lost: 0 });
        assert_eq!(rb, WorkerReport { acquired: 2, released: 2, lost: 0 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_shrinking_partition_count_gives_back_what_is_beyond_it_and_fills_the_share_below() {
    let h = Harness::new(8);
    local(async {
        {
            let mut db = h.db.borrow_mut();
            db.others = 1;
            db.foreign.extend([1, 2, 3, 4, 6, 7].map(p));
        }
        // p5 is mid-delivery from 0 to 1500, so its hand-back completes only then.
        let slow = h.enqueue(5);
        h.script(slow, &[Reply::Slow(Duration::from_millis(1500))]);
        let worker = h.start(h.config("w1"));
        h.at(500).await;
        assert_eq!(h.held(), BTreeSet::from([0, 5]), "a share of 4, only two free");
        {
            let mut db = h.db.borrow_mut();
            db.count = 4;
            db.others = 0;
            db.foreign.clear();
        }
        h.at(1200).await;
        // The rebalance at 1000 counts only 0 as kept: it fills the share at once, while 5
        // finishes its delivery before it is given back.
        let taken: Vec<(u16, u64)> =
            h.db.borrow().acquired.iter().map(|a| (a.0 .0, ms(a.3))).collect();
        assert_eq!(taken, [(0, 0), (5, 0), (1, 1000), (2, 1000), (3, 1000)]);
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3, 5]));
        h.at(1700).await;
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3]), "5 is gone, the share is 4");
        let released: Vec<(u16, u64)> =
            h.db.borrow().releases.iter().map(|r| (r.0 .0, ms(r.3))).collect();
        assert_eq!(released, [(5, 1500)]);
        assert_eq!(h.db.borrow().acks.iter().map(|a| a.1).collect::<Vec<_>>(), [slow]);
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 5, released: 5, lost: 0 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn loops_started_together_share_the_partitions_from_their_first_rebalance() {
    let h = Harness::new(4);
    local(async {
        h.db.borrow_mut().connect_delay.insert("b".into(), Duration::from_millis(300));
        let meet = StartTogether::new(2);
        let mut config_a = h.config("a");
        config_a.start_together = Some(meet.clone());
        let mut config_b = h.config("b");
        config_b.start_together = Some(meet);
        let a = h.start(config_a);
        let b = h.start(config_b);
        h.at(2500).await;
        {
            let db = h.db.borrow();
            assert!(db.acquired.iter().all(|a| ms(a.3) == 300), "none before b registered");
            assert_eq!(db.acquired.len(), 4);
            assert!(db.releases.is_empty(), "nothing taken only to be given back");
        }
        let ra = a.stop().await;
        let rb = b.stop().await;
        assert_eq!((ra.acquired, rb.acquired), (2, 2));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_loop_waits_for_the_others_no_longer_than_the_start_together_wait() {
    let h = Harness::new(2);
    local(async {
        let mut config = h.config("alone");
        config.start_together = Some(StartTogether::new(2));
        let worker = h.start(config);
        h.at(3500).await;
        {
            let db = h.db.borrow();
            assert_eq!(db.connects.iter().map(|c| ms(c.1)).collect::<Vec<_>>(), [0]);
            let at: Vec<u64> = db.acquired.iter().map(|a| ms(a.3)).collect();
            assert_eq!(at, [2000, 2000], "StartTogether::WAIT after registering");
            // It waits once: the next rebalance follows a period later.
            let reads: Vec<u64> = db.control_reads.iter().map(|t| ms(*t)).collect();
            assert_eq!(reads, [2000, 2000, 3000, 3000]);
        }
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_reaped_at_once_reported_and_taken_again_after_the_takeover_wait() {
    let h = Harness::new(1);
    local(async {
        let worker = h.start(h.config("w1"));
        h.at(1100).await;
        h.break_lease(0);
        h.at(1500).await;
        let seq = h.enqueue(0);
        h.at(4000).await;
        let events = h.events();
        assert_eq!(
            events,
            [
                (0, acquired(0, 1)),
                (
                    1200,
                    WorkerEvent::Lost {
                        partition: p(0),
                        epoch: Epoch(1),
                        error: "partition 0: lease with epoch 1 is not held by this session".into()
                    }
                ),
                (1200, acquired(0, 2)),
            ],
            "lost at the next read, taken again at once"
        );
        {
            let db = h.db.borrow();
            assert_eq!(db.acquired[1].2, Handover::Unclean, "its holder did not hand it back");
            let reads: Vec<(u64, u64)> = db.fetches.iter().map(|f| (f.1 .0, ms(f.2))).collect();
            assert_eq!(reads.iter().find(|r| r.0 == 2), Some(&(2, 3200)));
        }
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 3200));
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 1, lost: 1 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_may_not_last_the_delivery_is_lost_without_delivering() {
    let h = Harness::new(1);
    local(async {
        h.db.borrow_mut().refuse_lasts.insert(p(0), 1);
        let seq = h.enqueue(0);
        let worker = h.start(h.config("w1"));
        h.at(1000).await;
        assert!(h.delivered().is_empty(), "refused before delivering");
        assert_eq!(
            h.events()[1],
            (
                0,
                WorkerEvent::Lost {
                    partition: p(0),
                    epoch: Epoch(1),
                    error: "partition 0: lease with epoch 1 may expire within 2s".into()
                }
            )
        );
        h.at(2500).await;
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 2000), "by the next holder");
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 1, lost: 1 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_hand_back_counts_as_a_lost_lease() {
    let h = Harness::new(1);
    local(async {
        h.db.borrow_mut().fail_release = true;
        let worker = h.start(h.config("w1"));
        h.at(500).await;
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 1, released: 0, lost: 1 });
        assert_eq!(
            h.events().last(),
            Some(&(
                500,
                WorkerEvent::Lost {
                    partition: p(0),
                    epoch: Epoch(1),
                    error: "store connection failed: release failed".into()
                }
            ))
        );
        assert!(h.held().is_empty(), "the session ended, and its lock with it");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_store_failure_is_reported_and_the_worker_reconnects_after_the_pause() {
    let h = Harness::new(2);
    local(async {
        h.db.borrow_mut().fail_connects = 2;
        let worker = h.start(h.config("w1"));
        h.at(1500).await;
        h.db.borrow_mut().fail_control = 1;
        let seq = h.enqueue(1);
        h.at(3200).await;
        let connects: Vec<u64> = h.db.borrow().connects.iter().map(|c| ms(c.1)).collect();
        assert_eq!(connects, [0, 500, 1000, 2500], "reconnect_after after each failure");
        let unavailable = |error: &str| WorkerEvent::StoreUnavailable { error: error.into() };
        let refused = "store connection failed: connection refused";
        assert_eq!(
            h.events(),
            [
                (0, unavailable(refused)),
                (500, unavailable(refused)),
                (1000, acquired(0, 1)),
                (1000, acquired(1, 1)),
                (2000, unavailable("store connection failed: membership read failed")),
            ]
        );
        // The partitions kept their leases and went on delivering meanwhile.
        assert_eq!(h.held(), BTreeSet::from([0, 1]));
        assert_eq!(h.delivered().iter().map(|d| d.seq).collect::<Vec<_>>(), [seq]);
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 2, lost: 0 });
        assert_eq!(h.db.borrow().members, 0, "the membership session is closed");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_partition_task_takes_the_loop_down() {
    let h = Harness::new(1);
    local(async {
        let seq = h.enqueue(0);
        h.script(seq, &[Reply::Panic]);
        let worker = h.start(h.config("w1"));
        h.at(1500).await;
        let _ = worker.stop.send(());
        let err = worker.handle.await.expect_err("the panic is surfaced, not hidden");
        let payload = err.into_panic();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"endpoint exploded"));
    })
    .await;
}

/// The first backoff of partitions 0 and 1 under worker seed `rng_seed` (jitter up to 1s).
async fn first_backoffs(rng_seed: u64) -> [Duration; 2] {
    let h = Harness::new(2);
    for partition in [0, 1] {
        let seq = h.enqueue(partition);
        h.script(seq, &[Reply::Status(503, None)]);
    }
    let mut config = h.config("w1");
    config.rng_seed = rng_seed;
    config.retry = RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(30)).unwrap();
    let worker = h.start(config);
    h.at(10).await;
    worker.stop().await;
    let db = h.db.borrow();
    let of = |q: u16| db.retries.iter().find(|r| r.0 == p(q)).expect("a retry").3;
    [of(0), of(1)]
}

#[tokio::test(start_paused = true)]
async fn jitter_differs_between_worker_seeds_and_between_partitions() {
    local(async {
        let seeds = [0, 1, 2, 3, 1 << 32, 1 << 33, 3 << 32];
        let mut draws = Vec::new();
        for seed in seeds {
            let [a, b] = first_backoffs(seed).await;
            assert_ne!(a, b, "seed {seed}: partitions 0 and 1 drew the same backoff");
            draws.push([a, b]);
        }
        for partition in 0..2 {
            let distinct: BTreeSet<Duration> = draws.iter().map(|d| d[partition]).collect();
            assert_eq!(distinct.len(), seeds.len(), "p{partition}: a seed repeated another's");
        }
        assert_eq!(first_backoffs(1 << 32).await, draws[4], "the same seed draws the same");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn each_lease_of_a_partition_draws_its_own_jitter() {
    let h = Harness::new(1);
    local(async {
        let under_first = h.enqueue(0);
        h.script(under_first, &[Reply::Status(503, None)]);
        let mut config = h.config("w1");
        config.retry =
            RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(30)).unwrap();
        let worker = h.start(config);
        h.at(2500).await;
        h.break_lease(0);
        let under_second = h.enqueue(0);
        h.script(under_second, &[Reply::Status(503, None)]);
        h.at(6000).await;
        {
            let db = h.db.borrow();
            let epochs: Vec<u64> = db.acquired.iter().map(|a| a.1 .0).collect();
            assert_eq!(epochs, [1, 2]);
            // Both first failures of an event, so both drew the first backoff of their lease.
            let retries: Vec<(Seq, u32)> = db.retries.iter().map(|r| (r.1, r.2)).collect();
            assert_eq!(retries, [(under_first, 1), (under_second, 1)]);
            let (first, second) = (db.retries[0].3, db.retries[1].3);
            assert_ne!(first, second, "the new lease replayed the old one's jitter");
        }
        worker.stop().await;
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// A refused input.

#[tokio::test(start_paused = true)]
async fn a_refused_input_is_reported_and_the_lease_given_back_unclean() {
    let h = Harness::new(1);
    local(async {
        let seq = h.enqueue(0);
        let worker = h.start(WorkerConfig { repeat_results: true, ..h.config("w1") });
        h.at(500).await;
        assert_eq!(h.attempts(), vec![(0, seq.0, 1)], "delivered once before the refusal");
        let refused: Vec<u16> = h
            .events()
            .iter()
            .filter_map(|(_, e)| match e {
                WorkerEvent::DrainRefused { partition, error } => {
                    assert!(error.contains("nothing is in flight"), "{error}");
                    Some(partition.0)
                }
                _ => None,
            })
            .collect();
        assert_eq!(refused, vec![0], "the refusal is a worker event: {:?}", h.events());
        let releases: Vec<(u16, u64, Handover)> =
            h.db.borrow().releases.iter().map(|(q, e, how, _)| (q.0, e.0, *how)).collect();
        assert_eq!(releases, vec![(0, 1, Handover::Unclean)], "given back at once, unclean");
        // Taken again afresh: the next lease waits out the takeover before it reads.
        let acquired: Vec<(u64, Handover)> =
            h.db.borrow().acquired.iter().map(|(_, e, how, _)| (e.0, *how)).collect();
        assert_eq!(acquired[1..], [(2, Handover::Unclean)], "{acquired:?}");
        assert_eq!(h.queued(0), 1, "nothing acknowledged after the refusal: redelivered later");
        let report = worker.stop().await;
        assert_eq!(report.lost, 1, "the refused lease counts as lost: {report:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_store_call_that_never_answers_times_out_and_ends_the_lease() {
    let h = Harness::new(1);
    local(async {
        h.db.borrow_mut().hang_fetch.insert(p(0));
        let config = WorkerConfig { request_timeout: Duration::from_millis(700), ..h.config("w1") };
        let worker = h.start(config);
        h.at(699).await;
        assert_eq!(h.held(), BTreeSet::from([0]), "still waiting for the store");
        h.at(700).await;
        tokio::task::yield_now().await;
        let lost = WorkerEvent::Lost {
            partition: p(0),
            epoch: Epoch(1),
            error: "store did not answer fetch_head within 700ms".into(),
        };
        assert_eq!(h.events()[1], (700, lost), "lost when the request timeout ran out");
        h.db.borrow_mut().hang_fetch.clear();
        let report = worker.stop().await;
        assert_eq!(report.lost, 1);
        assert_eq!(h.db.borrow().acquired[0].1, Epoch(1));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_quiet_lease_is_kept_alive_every_third_of_the_session_timeout() {
    let h = Harness::new(1);
    local(async {
        let config = WorkerConfig {
            session_timeout: Some(Duration::from_millis(4500)),
            delivery_timeout: Duration::from_secs(3),
            idle_poll: Duration::from_secs(5),
            ..h.config("w1")
        };
        let worker = h.start(config);
        h.at(4400).await;
        let times: Vec<u64> = h.db.borrow().keep_alives.iter().map(|k| ms(k.1)).collect();
        assert_eq!(times, [1500, 3000], "idle: heard every 1.5 s");
        // A delivery of 2.5 s (5 000 to 7 500) is kept heard as well.
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(2500);
        let seq = h.enqueue(0);
        h.at(8000).await;
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 5000));
        let times: Vec<u64> = h.db.borrow().keep_alives.iter().map(|k| ms(k.1)).collect();
        assert_eq!(times, [1500, 3000, 4500, 6500], "during the delivery too");
        assert_eq!(worker.stop().await.lost, 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_store_that_ends_no_silent_session_is_not_kept_alive() {
    let h = Harness::new(1);
    local(async {
        let config = WorkerConfig { idle_poll: Duration::from_secs(5), ..h.config("w1") };
        let worker = h.start(config);
        h.at(4500).await;
        assert!(h.db.borrow().keep_alives.is_empty());
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_session_may_end_before_the_delivery_does_not_deliver() {
    for (delay_ms, delivers) in [(3_500, true), (4_500, false)] {
        let h = Harness::new(1);
        local(async {
            h.db.borrow_mut().fetch_delay = Duration::from_millis(delay_ms);
            h.enqueue(0);
            let config = WorkerConfig {
                session_timeout: Some(Duration::from_secs(6)),
                request_timeout: Duration::from_secs(5),
                ..h.config("w1")
            };
            let worker = h.start(config);
            // The head read started at 0 and answered after the delay; the delivery of up to
            // 2 s must end before 6 s after the read started.
            h.at(delay_ms + 10).await;
            assert_eq!(h.delivered().len(), usize::from(delivers), "fetch delay {delay_ms} ms");
            if !delivers {
                let (at, event) = h.events()[1].clone();
                assert_eq!(at, delay_ms);
                assert!(
                    matches!(&event, WorkerEvent::Lost { error, .. } if error.contains("may expire within 6.5s")),
                    "{event:?}"
                );
            }
            worker.stop().await;
        })
        .await;
    }
}
