//! An expiry lease (SQLite's lease row, fenced by its epoch) in the simulated client: every
//! decision by production's [`ExpiryDrain`], the composition the SQLite store drives too; this
//! file only turns what it asks for into store requests.
//!
//! As in SQLite, the holder learns its expiry only from the answers of its own fenced
//! statements (each renews the lease at the store); the renewal timer keeps the lease alive at
//! the store on a connection of its own and tells the drain nothing, as SQLite's connection
//! timer renews every lease and tells none of them.

use std::rc::Rc;
use std::time::Duration;

use keyorder::clock::Clock;
use keyorder::drain::ParkedKeys;
use keyorder::store::expiry_drain::{ExpiryDrain, ExpiryDrainOptions, ExpiryHeadPlan};
use keyorder::store::{StoreError, StoredHead};
use keyorder::{Epoch, PartitionId, Seq, Time};

use super::{gate, stored, unexpected, ExpiryClient, LeaseWire, SimStore};
use crate::control::SharedControl;
use crate::protocol::{Conn, LeaseAcks, LeaseId, StoreRequest, StoreResponse, STORE_PORT};

/// An expiry lease's drain, and its renewal task (stopped with the lease).
pub(super) struct ExpiryLease {
    drain: ExpiryDrain<()>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Drop for ExpiryLease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

impl ExpiryLease {
    /// The holder's side of a granted lease, with its renewal task started.
    pub(super) fn new(
        store: &SimStore,
        client: ExpiryClient,
        partition: PartitionId,
        epoch: Epoch,
    ) -> Self {
        let renewer = tokio::task::spawn_local(renew(
            (partition, epoch),
            (store.worker.clone(), store.control.clone()),
            client.renew_every,
            store.request_timeout,
        ));
        let options = ExpiryDrainOptions {
            read_ahead: client.read_ahead,
            ack_batch: client.ack_batch,
            ack_delay: client.ack_delay,
            delivery_timeout: client.delivery_timeout,
            clock_skew: client.margin,
        };
        let mut drain = ExpiryDrain::new(options, (partition.0, epoch.0), (), &store.acks);
        if store.cursor_past_parked {
            drain = drain.keeping_the_cursor_on_unpark();
        }
        Self { drain, renewer }
    }

    /// How long one of its calls may take: the buffered acknowledgements' flush, then the
    /// statement, each a call and on failure a reconnect and the call once more.
    pub(super) fn request_budget(request_timeout: Duration) -> Duration {
        request_timeout.saturating_mul(6)
    }

    /// Fails when a flush, this lease's or another's, found the lease lost (production
    /// SQLite's check before every call).
    fn check_held(&self, wire: &LeaseWire) -> Result<(), StoreError> {
        if self.drain.is_lost() {
            return Err(wire.not_held());
        }
        Ok(())
    }

    /// A fenced statement: refused unless the lease is held at its epoch, and otherwise answered
    /// with the expiry the statement renewed it to, which the drain learns.
    async fn fenced(
        &mut self,
        wire: &mut LeaseWire,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<StoreResponse, StoreError> {
        wire.gate().await;
        match call_anywhere(wire, &req, operation).await? {
            StoreResponse::NotHeld => Err(wire.not_held()),
            StoreResponse::Lasts { until_us, answer } => {
                self.drain.answered(Time(Duration::from_micros(until_us)));
                Ok(*answer)
            }
            other => panic!(
                "invariant: an expiry store answers a fenced {operation} of p{} epoch {} with \
                 the lease's expiry or a refusal, not {other:?}",
                wire.partition, wire.epoch
            ),
        }
    }

    async fn expect_ok(
        &mut self,
        wire: &mut LeaseWire,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<(), StoreError> {
        match self.fenced(wire, req, operation).await? {
            StoreResponse::Ok => Ok(()),
            other => Err(unexpected(operation, other)),
        }
    }

    /// Deletes the worker's buffered acknowledgements, of all its leases, in one statement:
    /// each lease's rows after its own fenced renewal (production SQLite's flush). A lease
    /// refused is marked lost; a flush that fails as a whole puts every row back.
    async fn flush_acks(&mut self, wire: &mut LeaseWire) -> Result<(), StoreError> {
        let Some(flush) = self.drain.acks().take() else { return self.check_held(wire) };
        let leases = flush
            .leases()
            .map(|((p, epoch), (), seqs)| LeaseAcks {
                partition: PartitionId(p),
                epoch: Epoch(epoch),
                seqs: seqs.iter().map(|&s| Seq(s)).collect(),
            })
            .collect();
        wire.gate().await;
        let answer = call_anywhere(wire, &StoreRequest::FlushAcks { leases }, "ack").await;
        match answer {
            Ok(StoreResponse::Lost(lost)) => {
                let lost =
                    lost.into_iter().map(|LeaseId { partition, epoch }| (partition.0, epoch.0));
                self.drain.acks().flushed(lost);
                self.check_held(wire)
            }
            Ok(other) => {
                self.drain.acks().failed(flush, wire.clock.now());
                Err(unexpected("ack", other))
            }
            Err(err) => {
                self.drain.acks().failed(flush, wire.clock.now());
                Err(err)
            }
        }
    }

    /// A keep-alive: a ping (an expiry lease is renewed by its timer, not by its session).
    pub(super) async fn ping(&mut self, wire: &mut LeaseWire) -> Result<(), StoreError> {
        self.expect_ok(wire, StoreRequest::Ping, "ping").await
    }

    /// The delivery rule: the expiry the store last answered must lie `needed` plus the margin
    /// ahead of this holder's clock, which may run up to the margin behind the store's; when it
    /// does not, one fenced renewal answers again (after the buffered acknowledgements, as
    /// production SQLite's renewal is a fenced write that deletes them first).
    pub(super) async fn ensure_lasts(
        &mut self,
        wire: &mut LeaseWire,
        needed: Duration,
    ) -> Result<(), StoreError> {
        wire.gate().await;
        self.check_held(wire)?;
        if self.drain.lasts(wire.clock.now(), needed) {
            return Ok(());
        }
        self.flush_acks(wire).await?;
        let (partition, epoch) = (wire.partition, wire.epoch);
        self.expect_ok(wire, StoreRequest::Renew { partition, epoch }, "renew").await?;
        if self.drain.lasts(wire.clock.now(), needed) {
            Ok(())
        } else {
            Err(StoreError::LeaseEnding { partition, epoch, needed })
        }
    }

    /// The head, by production SQLite's rules.
    pub(super) async fn head(
        &mut self,
        wire: &mut LeaseWire,
        skip: &ParkedKeys,
    ) -> Result<Option<StoredHead>, StoreError> {
        wire.gate().await;
        self.check_held(wire)?;
        let read = match self.drain.plan_head(skip, wire.clock.now()) {
            ExpiryHeadPlan::Serve(head) => return Ok(Some(head)),
            ExpiryHeadPlan::Read(read) => read,
        };
        if read.flush_first {
            self.flush_acks(wire).await?;
        }
        let req = StoreRequest::ReadAfter {
            partition: wire.partition,
            epoch: wire.epoch,
            after: read.after,
            skip: skip.clone(),
            limit: read.limit,
            watched: Vec::new(),
        };
        let rows = match self.fenced(wire, req, "fetch_head").await? {
            StoreResponse::Heads { heads, .. } => heads.into_iter().map(stored).collect(),
            other => return Err(unexpected("fetch_head", other)),
        };
        let filled = self.drain.filled(rows);
        if filled.flush {
            self.flush_acks(wire).await?;
        }
        Ok(filled.head)
    }

    /// Row `seq` was delivered: its delete is buffered with the worker's others, and flushed
    /// when due.
    pub(super) async fn ack(&mut self, wire: &mut LeaseWire, seq: Seq) -> Result<(), StoreError> {
        self.check_held(wire)?;
        if self.drain.acked(seq, wire.clock.now()) {
            self.flush_acks(wire).await?;
        }
        Ok(())
    }

    /// A statement that changes the head's row (a retry, a dead letter): what was read ahead is
    /// read again, and the buffered acknowledgements go first.
    pub(super) async fn change_row(
        &mut self,
        wire: &mut LeaseWire,
        req: StoreRequest,
        operation: &'static str,
    ) -> Result<(), StoreError> {
        self.drain.changing_row();
        self.flush_acks(wire).await?;
        self.expect_ok(wire, req, operation).await
    }

    /// Row `seq` was dead-lettered.
    pub(super) fn dead_lettered(&mut self, seq: Seq) {
        self.drain.dead_lettered(seq);
    }

    /// The hand-back: the last acknowledgements, then the fenced unlock (SQLite's, in one
    /// transaction).
    pub(super) async fn release(
        &mut self,
        wire: &mut LeaseWire,
        unlock: StoreRequest,
    ) -> Result<(), StoreError> {
        self.flush_acks(wire).await?;
        self.expect_ok(wire, unlock, "unlock").await
    }
}

/// An expiry lease's statement: fenced by its epoch in the store, not by the connection, so a
/// failed connection is replaced and the statement sent once more (every fenced statement is
/// idempotent).
async fn call_anywhere(
    wire: &mut LeaseWire,
    req: &StoreRequest,
    operation: &'static str,
) -> Result<StoreResponse, StoreError> {
    let timeout = wire.request_timeout;
    match wire.conn.call(req, operation, timeout).await {
        Ok(answer) => Ok(answer),
        Err(_) => {
            wire.conn = Conn::connect(("store", STORE_PORT), timeout).await?;
            wire.conn.call(req, operation, timeout).await
        }
    }
}

/// The holder's renewal timer: renews the lease every `every` on a connection of its own, so
/// renewal goes on during a long delivery. A refusal ends it (the next statement of the lease
/// reports the loss); a failed connection is replaced at the next tick.
async fn renew(
    lease: (PartitionId, Epoch),
    (worker, control): (Rc<str>, SharedControl),
    every: Duration,
    timeout: Duration,
) {
    let (partition, epoch) = lease;
    let mut conn: Option<Conn> = None;
    loop {
        tokio::time::sleep(every).await;
        gate(&control, &worker).await;
        let late = control.borrow().late_renewals.get(&*worker).copied();
        if let Some(late) = late {
            tokio::time::sleep(late).await;
            gate(&control, &worker).await;
        }
        if conn.is_none() {
            conn = Conn::connect(("store", STORE_PORT), timeout).await.ok();
        }
        let Some(c) = &mut conn else { continue };
        match c.call(&StoreRequest::Renew { partition, epoch }, "renew", timeout).await {
            Ok(StoreResponse::NotHeld) => return,
            Ok(_) => {}
            Err(_) => conn = None,
        }
    }
}
