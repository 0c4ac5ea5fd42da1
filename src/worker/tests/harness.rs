//! The harness: a worker against the fake store and endpoint, on the paused clock.

use super::*;

pub(super) struct Harness {
    pub(super) db: SharedDb,
    pub(super) endpoint: Endpoint,
    pub(super) clock: TokioClock,
    pub(super) events: Rc<RefCell<Vec<(u64, WorkerEvent)>>>,
}

/// A running worker loop: stop it to get its report.
pub(super) struct Running {
    pub(super) stop: oneshot::Sender<()>,
    pub(super) handle: JoinHandle<WorkerReport>,
}

impl Running {
    pub(super) async fn stop(self) -> WorkerReport {
        let _ = self.stop.send(());
        self.handle.await.expect("the worker loop panicked")
    }
}

pub(super) fn ms(t: Time) -> u64 {
    t.as_millis()
}

pub(super) fn p(n: u16) -> PartitionId {
    PartitionId(n)
}

impl Harness {
    pub(super) fn new(count: i64) -> Self {
        let clock = TokioClock::start();
        let db = Rc::new(RefCell::new(Db { count, ..Db::default() }));
        let endpoint = Endpoint { state: Rc::default(), clock };
        Self { db, endpoint, clock, events: Rc::default() }
    }

    /// The tests' defaults: short periods, three attempts with a short backoff.
    pub(super) fn config(&self, name: &str) -> WorkerConfig {
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

    pub(super) fn start(&self, config: WorkerConfig) -> Running {
        let store = FakeStore { db: self.db.clone(), clock: self.clock };
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let run = run(store, self.endpoint.clone(), self.clock, config, shutdown);
        Running { stop, handle: tokio::task::spawn_local(run) }
    }

    /// Queues an event on `partition`; its id is `e<seq>`.
    pub(super) fn enqueue(&self, partition: u16) -> Seq {
        self.enqueue_key(partition, &format!("k{partition}"))
    }

    /// Queues an event of `key` on `partition`; its id is `e<seq>`.
    pub(super) fn enqueue_key(&self, partition: u16, key: &str) -> Seq {
        let mut db = self.db.borrow_mut();
        db.next_seq += 1;
        let seq = Seq(db.next_seq);
        let row = Row {
            event_id: format!("e{}", seq.0),
            key: key.to_owned(),
            attempts: 0,
            not_before: None,
            last_error: None,
            enqueued_at: self.clock.now(),
        };
        db.queues.entry(PartitionId(partition)).or_default().insert(seq, row);
        seq
    }

    pub(super) fn script(&self, seq: Seq, replies: &[Reply]) {
        let mut s = self.endpoint.state.borrow_mut();
        s.script.insert(format!("e{}", seq.0), replies.iter().copied().collect());
    }

    pub(super) fn always(&self, seq: Seq, reply: Reply) {
        self.endpoint.state.borrow_mut().always.insert(format!("e{}", seq.0), reply);
    }

    /// Sleeps until `ms` milliseconds after the harness started.
    pub(super) async fn at(&self, ms: u64) {
        let now = self.clock.now().0;
        tokio::time::sleep(Duration::from_millis(ms).saturating_sub(now)).await;
    }

    pub(super) fn delivered(&self) -> Vec<Delivered> {
        self.endpoint.state.borrow().log.clone()
    }

    /// `(partition, seq, attempt)` of every delivery, in order.
    pub(super) fn attempts(&self) -> Vec<(u16, i64, u32)> {
        self.delivered().iter().map(|d| (d.partition.0, d.seq.0, d.attempt)).collect()
    }

    pub(super) fn held(&self) -> BTreeSet<u16> {
        self.db.borrow().held.keys().map(|p| p.0).collect()
    }

    pub(super) fn events(&self) -> Vec<(u64, WorkerEvent)> {
        self.events.borrow().clone()
    }

    pub(super) fn queued(&self, partition: u16) -> usize {
        self.db.borrow().queues.get(&p(partition)).map_or(0, BTreeMap::len)
    }

    /// The store drops `partition`'s lock (a store restart, an operator's
    /// `pg_terminate_backend`): its holder's next statement is refused.
    pub(super) fn break_lease(&self, partition: u16) {
        self.db.borrow_mut().held.remove(&p(partition));
    }
}

/// Runs `f` inside a `LocalSet`, as the loop requires.
pub(super) async fn local<F: Future>(f: F) -> F::Output {
    tokio::task::LocalSet::new().run_until(f).await
}

pub(super) fn released(partition: u16, epoch: u64) -> WorkerEvent {
    WorkerEvent::Released { partition: p(partition), epoch: Epoch(epoch) }
}

pub(super) fn acquired(partition: u16, epoch: u64) -> WorkerEvent {
    WorkerEvent::Acquired { partition: p(partition), epoch: Epoch(epoch) }
}
