//! Drives one leased partition: the drain machine's actions carried out against the lease
//! session and the deliverer, one at a time.

use std::time::Duration;

use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::clock::Clock;
use crate::deliver::{Deliver, DeliverError};
use crate::drain::{Action, Drain, DrainConfig, Head, Input};
use crate::ids::{PartitionId, Time};
use crate::store::{Handover, LeaseSession, StoreError, StoredHead};

/// How a partition task ended.
#[derive(Debug)]
pub enum PartitionExit {
    /// The lease was given back on request.
    Released(PartitionId),
    /// The lease was lost (a store error); the session is dropped.
    Lost(PartitionId, StoreError),
}

/// What a turn of carrying out actions ended with.
enum Turn {
    /// No action is left: wait for a timer or a release request.
    Idle,
    /// The machine asked to give the lease back.
    Release,
}

/// Everything a partition task needs besides its lease.
pub(super) struct PartitionTask<D, C> {
    pub(super) deliver: D,
    pub(super) clock: C,
    pub(super) drain: DrainConfig,
    pub(super) delivery_timeout: Duration,
    /// Whether this holder's last delivery ended without an answer (timed out or broke off):
    /// the endpoint may still be working on it, so the hand-back is not clean.
    pub(super) unsettled: bool,
    /// Whether the previous holder's hand-back was unclean and this holder has not read yet
    /// (its first read comes only after the takeover wait): until then a delivery of the
    /// previous holder may still be out, so giving the lease back is not clean either.
    pub(super) inherited: bool,
}

impl<D: Deliver, C: Clock> PartitionTask<D, C> {
    /// Drains the partition of `lease` until the lease is lost or a release is requested.
    pub(super) async fn run<L: LeaseSession>(
        mut self,
        mut lease: L,
        mut release: oneshot::Receiver<()>,
    ) -> PartitionExit {
        let partition = lease.partition();
        let mut drain = Drain::new(self.drain.clone());
        let acquired = Input::LeaseAcquired { epoch: lease.epoch() };
        self.feed(&mut drain, acquired);
        loop {
            match self.carry_out(&mut drain, &mut lease, &mut release).await {
                Err(err) => {
                    self.feed(&mut drain, Input::LeaseLost);
                    return PartitionExit::Lost(partition, err);
                }
                Ok(Turn::Release) => {
                    // A failed unlock still ends the session, and with it the lock.
                    let handover = if self.unsettled || self.inherited {
                        Handover::Unclean
                    } else {
                        Handover::Clean
                    };
                    return match lease.release(handover).await {
                        Ok(()) => PartitionExit::Released(partition),
                        Err(err) => PartitionExit::Lost(partition, err),
                    };
                }
                Ok(Turn::Idle) => {
                    let wait = drain.poll_timeout().map(|t| t.saturating_since(self.clock.now()));
                    tokio::select! {
                        biased;
                        _ = &mut release => self.feed(&mut drain, Input::ReleaseRequested),
                        _ = sleep_for(wait) => drain.handle_timeout(self.clock.now()),
                    }
                }
            }
        }
    }

    fn feed(&self, drain: &mut Drain, input: Input) {
        if let Err(err) = drain.handle(input, self.clock.now()) {
            // Inputs come from this loop only, so this is a worker bug: keep going, loudly.
            debug_assert!(false, "drain refused an input: {err}");
        }
    }

    /// Carries out queued actions until none is left. A store error ends the lease.
    ///
    /// A busy partition never waits on a timer, so the task looks for a release request after
    /// every action: the machine then gives the lease back once the delivery in flight, if any,
    /// is resolved, instead of starting the next one. Once the request is taken here, the
    /// machine gives the lease back without going idle, so the spent receiver is never polled
    /// again (which would panic).
    async fn carry_out<L: LeaseSession>(
        &mut self,
        drain: &mut Drain,
        lease: &mut L,
        release: &mut oneshot::Receiver<()>,
    ) -> Result<Turn, StoreError> {
        while let Some(action) = drain.poll_action() {
            match action {
                Action::FetchHead { skip, .. } => {
                    // The takeover wait is over: no earlier holder's delivery is still out.
                    self.inherited = false;
                    let head = lease.fetch_head(&skip).await?;
                    let now = self.clock.now();
                    self.feed(drain, Input::HeadFetched(head.map(|h| to_head(h, now))));
                }
                Action::Deliver { partition, head, attempt, .. } => {
                    // An expiry lease must outlast the delivery; no await comes between this
                    // check and the delivery's own timeout.
                    lease.ensure_lasts(self.delivery_timeout).await?;
                    let input = self.deliver(partition, &head, attempt).await;
                    self.feed(drain, input);
                }
                Action::Acknowledge { seq, .. } => lease.ack(seq).await?,
                Action::ScheduleRetry { seq, attempts, not_before, error, .. } => {
                    let retry_in = not_before.saturating_since(self.clock.now());
                    lease.schedule_retry(seq, attempts, retry_in, &error).await?;
                }
                Action::DeadLetter { seq, attempts, reason, .. } => {
                    lease.dead_letter(seq, attempts, &reason).await?;
                }
                Action::Release { .. } => return Ok(Turn::Release),
            }
            // A dropped sender asks for the lease back too, as it does in the idle `select!`.
            if !matches!(release.try_recv(), Err(TryRecvError::Empty)) {
                self.feed(drain, Input::ReleaseRequested);
            }
        }
        Ok(Turn::Idle)
    }

    async fn deliver(&mut self, partition: PartitionId, head: &Head, attempt: u32) -> Input {
        let timeout = self.delivery_timeout;
        let outcome = tokio::time::timeout(timeout, self.deliver.deliver(partition, head, attempt))
            .await
            .unwrap_or(Err(DeliverError::Timeout { after: timeout }));
        // An answer of any status settles the attempt; no answer leaves it possibly running.
        self.unsettled = matches!(&outcome, Err(e) if e.may_be_processing());
        match outcome {
            Ok(()) => Input::DeliverySucceeded { seq: head.seq },
            Err(err) => Input::DeliveryFailed {
                seq: head.seq,
                retry_after: err.retry_after(),
                error: err.to_string(),
            },
        }
    }
}

fn to_head(h: StoredHead, now: Time) -> Head {
    Head {
        seq: h.seq,
        event_id: h.event_id,
        key: h.key,
        payload: h.payload,
        attempts: h.attempts,
        not_before: h.wait.map(|w| now.saturating_add(w)),
        last_error: h.last_error,
    }
}

async fn sleep_for(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
