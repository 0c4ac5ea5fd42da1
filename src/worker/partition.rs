//! Drives one leased partition: the drain machine's actions carried out against the lease
//! session and the deliverer, one at a time.

use std::time::Duration;

use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::clock::Clock;
use crate::deliver::{Deliver, DeliverError};
use crate::drain::{Action, Drain, DrainConfig, DrainError, Head, Input};
use crate::ids::PartitionId;
use crate::store::timed::TimedLease;
use crate::store::{Handover, LeaseSession, StoreError};

use super::{Observer, WorkerEvent};

/// How a partition task ended.
#[derive(Debug)]
pub enum PartitionExit {
    /// The lease was given back on request.
    Released(PartitionId),
    /// The lease was lost (a store error); the session is dropped.
    Lost(PartitionId, StoreError),
    /// The drain machine refused an input (a worker bug): the task stopped at once and gave
    /// the lease back as unclean, since a delivery of it may still be out. The session ends
    /// either way, even if the hand-back failed.
    Refused(PartitionId, DrainError),
}

/// Why carrying out actions stopped early.
enum Stop {
    /// A store call failed: the lease is gone.
    Store(StoreError),
    /// The drain machine refused an input: the partition's state is no longer trusted.
    Refused(DrainError),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Stop::Store(e)
    }
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
    /// Told of each change in the number of parked keys.
    pub(super) observer: Option<Observer>,
    /// The number of parked keys last reported.
    pub(super) parked: usize,
    /// Whether this holder's last delivery ended without an answer (timed out or broke off):
    /// the endpoint may still be working on it, so the hand-back is not clean.
    pub(super) unsettled: bool,
    /// Whether the previous holder's hand-back was unclean and this holder has not read yet
    /// (its first read comes only after the takeover wait): until then a delivery of the
    /// previous holder may still be out, so giving the lease back is not clean either.
    pub(super) inherited: bool,
    /// Test only: feed every delivery's result twice, the kind of bug a refusal reports.
    #[cfg(test)]
    pub(super) repeat_results: bool,
}

impl<D: Deliver, C: Clock> PartitionTask<D, C> {
    /// Drains the partition of `lease` until the lease is lost or a release is requested.
    pub(super) async fn run<L: LeaseSession>(
        mut self,
        mut lease: TimedLease<L, C>,
        mut release: oneshot::Receiver<()>,
    ) -> PartitionExit {
        let partition = lease.partition();
        let mut drain = Drain::new(self.drain.clone());
        let acquired = Input::LeaseAcquired { epoch: lease.epoch() };
        if let Err(err) = self.feed(&mut drain, acquired) {
            return Self::refused(lease, err).await;
        }
        loop {
            match self.carry_out(&mut drain, &mut lease, &mut release).await {
                Err(Stop::Store(err)) => {
                    // The lease is gone; a refusal of this last input changes nothing.
                    let _ = self.feed(&mut drain, Input::LeaseLost);
                    return PartitionExit::Lost(partition, err);
                }
                Err(Stop::Refused(err)) => return Self::refused(lease, err).await,
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
                    // A quiet session (idle, in a long backoff) is kept heard, so the store does
                    // not take the healthy holder for a dead one.
                    let keep_alive = lease.keep_alive_in();
                    let fed = tokio::select! {
                        biased;
                        _ = &mut release => self.feed(&mut drain, Input::ReleaseRequested),
                        _ = sleep_for(wait) => {
                            drain.handle_timeout(self.clock.now());
                            Ok(())
                        }
                        _ = sleep_for(keep_alive) => {
                            if let Err(err) = lease.keep_alive().await {
                                // The lease is gone; a refusal of this last input changes nothing.
                                let _ = self.feed(&mut drain, Input::LeaseLost);
                                return PartitionExit::Lost(partition, err);
                            }
                            Ok(())
                        }
                    };
                    if let Err(err) = fed {
                        return Self::refused(lease, err).await;
                    }
                    self.report_parked(&drain);
                }
            }
        }
    }

    /// Inputs come from this task only, so a refusal is a worker bug. In a release build it
    /// must not pass silently, nor may the task go on with a machine whose state it no longer
    /// knows: the caller stops and gives the lease back ([`Self::refused`]).
    fn feed(&self, drain: &mut Drain, input: Input) -> Result<(), DrainError> {
        drain.handle(input, self.clock.now())
    }

    /// Tells the observer when the number of parked keys changed since it was last told.
    fn report_parked(&mut self, drain: &Drain) {
        let keys = drain.parked_count();
        if keys != self.parked {
            self.parked = keys;
            if let Some(o) = &self.observer {
                (o.0)(&WorkerEvent::Parked { partition: drain.partition(), keys });
            }
        }
    }

    /// Gives the lease back after a refusal: unclean, since a delivery may still be out.
    async fn refused<L: LeaseSession>(lease: L, err: DrainError) -> PartitionExit {
        let partition = lease.partition();
        // A failed hand-back ends the session too, and with it the lease.
        let _ = lease.release(Handover::Unclean).await;
        PartitionExit::Refused(partition, err)
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
        lease: &mut TimedLease<L, C>,
        release: &mut oneshot::Receiver<()>,
    ) -> Result<Turn, Stop> {
        while let Some(action) = drain.poll_action() {
            // Paired with the drain's: every action carries the lease it was decided under, and
            // the store carries it out under that lease only.
            debug_assert_eq!(
                action.partition(),
                lease.partition(),
                "an action for another partition"
            );
            debug_assert_eq!(
                action.epoch(),
                lease.epoch(),
                "an action decided under another lease"
            );
            match action {
                Action::FetchHead { skip, .. } => {
                    // The takeover wait is over: no earlier holder's delivery is still out.
                    self.inherited = false;
                    let head = lease.fetch_head(&skip).await?;
                    let now = self.clock.now();
                    debug_assert_eq!(
                        drain.epoch(),
                        Some(lease.epoch()),
                        "a head read under another lease"
                    );
                    self.feed(drain, Input::HeadFetched(head.map(|h| h.into_head(now))))
                        .map_err(Stop::Refused)?;
                }
                Action::Deliver { partition, head, attempt, .. } => {
                    // An expiry lease must outlast the delivery; no await comes between this
                    // check and the delivery's own timeout.
                    lease.ensure_lasts(self.delivery_timeout).await?;
                    // Paired with the drain's "two deliveries in flight": this is the one.
                    debug_assert_eq!(
                        drain.in_flight(),
                        Some((head.seq, attempt)),
                        "a delivery the drain does not hold in flight"
                    );
                    let input = self.deliver_alive(partition, &head, attempt, lease).await?;
                    debug_assert_eq!(
                        drain.epoch(),
                        Some(lease.epoch()),
                        "a result for another lease"
                    );
                    #[cfg(test)]
                    if self.repeat_results {
                        self.feed(drain, input.clone()).map_err(Stop::Refused)?;
                    }
                    self.feed(drain, input).map_err(Stop::Refused)?;
                    debug_assert!(
                        drain.in_flight().is_none_or(|(seq, _)| seq != head.seq),
                        "a delivery still outstanding after its result was applied"
                    );
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
            self.report_parked(drain);
            // A dropped sender asks for the lease back too, as it does in the idle `select!`.
            if !matches!(release.try_recv(), Err(TryRecvError::Empty)) {
                self.feed(drain, Input::ReleaseRequested).map_err(Stop::Refused)?;
            }
        }
        Ok(Turn::Idle)
    }

    /// Delivers while keeping the lease's session heard (a delivery may be longer than a third
    /// of the session bound). The deliverer does not touch the lease, so the keep-alive goes out
    /// on the lease's own session beside it; it runs to completion inside its branch, so no
    /// statement is ever abandoned half-answered. A failed keep-alive ends the lease once the
    /// delivery in flight is resolved (its outcome is not recorded: the next holder redelivers).
    async fn deliver_alive<L: LeaseSession>(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
        lease: &mut TimedLease<L, C>,
    ) -> Result<Input, StoreError> {
        let mut failed = None;
        let delivery = self.deliver(partition, head, attempt);
        tokio::pin!(delivery);
        let input = loop {
            let keep_alive = if failed.is_none() { lease.keep_alive_in() } else { None };
            tokio::select! {
                biased;
                input = &mut delivery => break input,
                _ = sleep_for(keep_alive) => {
                    if let Err(err) = lease.keep_alive().await {
                        failed = Some(err);
                    }
                }
            }
        };
        match failed {
            Some(err) => Err(err),
            None => Ok(input),
        }
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
                error: super::chain(&err),
            },
        }
    }
}

async fn sleep_for(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
