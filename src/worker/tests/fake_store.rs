//! The fake store: a fourth `Store`, in memory, whose failures the tests script.

use super::*;

#[derive(Debug)]
pub(super) struct Row {
    pub(super) event_id: String,
    pub(super) key: String,
    pub(super) attempts: u32,
    pub(super) not_before: Option<Time>,
    pub(super) last_error: Option<String>,
    /// When it was queued: the lag report's oldest wait counts from here.
    pub(super) enqueued_at: Time,
}

#[derive(Debug, Default)]
pub(super) struct Db {
    pub(super) count: i64,
    /// Live workers besides the open membership sessions.
    pub(super) others: usize,
    pub(super) members: usize,
    pub(super) next_seq: i64,
    pub(super) queues: BTreeMap<PartitionId, BTreeMap<Seq, Row>>,
    /// The epoch of each held lease.
    pub(super) held: BTreeMap<PartitionId, Epoch>,
    pub(super) epochs: BTreeMap<PartitionId, u64>,
    pub(super) unclean: BTreeSet<PartitionId>,
    /// Held by a session outside the test: never granted.
    pub(super) foreign: BTreeSet<PartitionId>,
    /// How long each worker's `connect` takes.
    pub(super) connect_delay: BTreeMap<String, Duration>,
    /// Fail this many of the next connects.
    pub(super) fail_connects: usize,
    /// Fail this many of the next membership reads.
    pub(super) fail_control: usize,
    /// Fail every hand-back.
    pub(super) fail_release: bool,
    /// Refuse this many delivery checks per partition.
    pub(super) refuse_lasts: BTreeMap<PartitionId, usize>,
    /// Head reads of these partitions never answer (a blackholed session).
    pub(super) hang_fetch: BTreeSet<PartitionId>,
    /// How long every head read takes.
    pub(super) fetch_delay: Duration,
    pub(super) keep_alives: Vec<(PartitionId, Time)>,
    // What happened, when.
    pub(super) connects: Vec<(String, Time)>,
    pub(super) control_reads: Vec<Time>,
    pub(super) acquired: Vec<(PartitionId, Epoch, Handover, Time)>,
    pub(super) fetches: Vec<(PartitionId, Epoch, Time)>,
    pub(super) acks: Vec<(PartitionId, Seq, Time)>,
    pub(super) retries: Vec<(PartitionId, Seq, u32, Duration, String)>,
    pub(super) dead: Vec<(PartitionId, Seq, u32, String)>,
    /// The dead-lettered rows themselves, as the dead-letter table keeps them.
    pub(super) buried: BTreeMap<Seq, Row>,
    pub(super) releases: Vec<(PartitionId, Epoch, Handover, Time)>,
}

pub(super) type SharedDb = Rc<RefCell<Db>>;

#[derive(Clone)]
pub(super) struct FakeStore {
    pub(super) db: SharedDb,
    pub(super) clock: TokioClock,
}

pub(super) struct FakeControl {
    pub(super) db: SharedDb,
    pub(super) clock: TokioClock,
}

pub(super) struct FakeLease {
    pub(super) db: SharedDb,
    pub(super) clock: TokioClock,
    pub(super) partition: PartitionId,
    pub(super) epoch: Epoch,
    pub(super) handover: Handover,
}

pub(super) fn io(text: &str) -> StoreError {
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
    pub(super) async fn read(&mut self) -> Result<std::cell::RefMut<'_, Db>, StoreError> {
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
    pub(super) async fn fenced(&mut self) -> Result<std::cell::RefMut<'_, Db>, StoreError> {
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
        let row =
            row.unwrap_or_else(|| panic!("dead letter of p{partition} seq {seq}, not queued"));
        db.buried.insert(seq, row);
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
