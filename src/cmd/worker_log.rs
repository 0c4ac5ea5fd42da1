//! What `keyorder work` logs while it runs: each worker loop's lease changes and store failures
//! (from its [`Observer`]) and each delivery attempt's outcome (a [`Deliver`] wrapper), as
//! `tracing` events whose fields name the worker loop, the partition, the lease's epoch, the
//! event and the error.
//!
//! Levels: `info` for a lease taken or given back, `warn` for a lease lost, the store
//! unreachable or a failed attempt that will be retried, `error` for a failed last attempt
//! (the event is dead-lettered) and a refused drain input (a bug), `debug` for each delivered
//! event and each change of the parked keys.

use std::rc::Rc;

use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::worker::{Observer, WorkerEvent};
use keyorder::PartitionId;

/// An observer that logs the events of the worker loop `worker` (`--name`, or `NAME-INDEX`
/// with several threads).
pub(crate) fn observer(worker: String) -> Observer {
    Observer(Rc::new(move |e: &WorkerEvent| log_event(&worker, e)))
}

/// Logs one worker event.
fn log_event(worker: &str, event: &WorkerEvent) {
    match event {
        WorkerEvent::Acquired { partition, epoch } => {
            tracing::info!(worker, partition = partition.0, epoch = epoch.0, "leased partition")
        }
        WorkerEvent::Released { partition, epoch } => {
            tracing::info!(worker, partition = partition.0, epoch = epoch.0, "gave back partition")
        }
        WorkerEvent::Lost { partition, epoch, error } => tracing::warn!(
            worker,
            partition = partition.0,
            epoch = epoch.0,
            error = error.as_str(),
            "LOST partition: another worker may take it"
        ),
        WorkerEvent::DrainRefused { partition, error } => tracing::error!(
            worker,
            partition = partition.0,
            error = error.as_str(),
            "BUG: the partition's drain refused an input; gave the partition back"
        ),
        WorkerEvent::Parked { partition, keys } => {
            tracing::debug!(worker, partition = partition.0, keys, "parked keys changed")
        }
        WorkerEvent::StoreUnavailable { error } => {
            tracing::warn!(worker, error = error.as_str(), "store unavailable, reconnecting")
        }
        // A kind added later is logged once this match names it.
        _ => {}
    }
}

/// A deliverer that logs each attempt of `inner`: delivered (`debug`), failed (`warn`, or
/// `error` on the last attempt, which dead-letters the event), and abandoned at the worker's
/// delivery timeout (the future dropped unanswered, logged as the timeout it is).
#[derive(Clone)]
pub(crate) struct Logging<D> {
    inner: D,
    worker: Rc<str>,
    max_attempts: u32,
}

impl<D> Logging<D> {
    /// Wraps `inner` for the loop `worker` under a retry policy of `max_attempts`.
    pub(crate) fn new(inner: D, worker: &str, max_attempts: u32) -> Self {
        Logging { inner, worker: Rc::from(worker), max_attempts }
    }
}

/// One attempt in flight: logged when it finishes, or on drop (abandoned at the timeout).
struct Attempt<'a> {
    worker: &'a str,
    partition: PartitionId,
    head: &'a Head,
    attempt: u32,
    last: bool,
    done: bool,
}

impl Attempt<'_> {
    fn finish(&mut self, result: &Result<(), DeliverError>) {
        self.done = true;
        match result {
            Ok(()) => tracing::debug!(
                worker = self.worker,
                partition = self.partition.0,
                event_id = self.head.event_id.as_str(),
                seq = self.head.seq.0,
                attempt = self.attempt,
                "delivered"
            ),
            Err(err) => self.failed(&keyorder::worker::chain(err)),
        }
    }

    fn failed(&self, error: &str) {
        let (worker, partition, attempt) = (self.worker, self.partition.0, self.attempt);
        let (event_id, seq) = (self.head.event_id.as_str(), self.head.seq.0);
        if self.last {
            tracing::error!(
                worker,
                partition,
                event_id,
                seq,
                attempt,
                error,
                "delivery failed on its last attempt: dead-lettering the event"
            );
        } else {
            tracing::warn!(
                worker,
                partition,
                event_id,
                seq,
                attempt,
                error,
                "delivery failed: retrying after a backoff"
            );
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.failed("no answer within the delivery timeout");
        }
    }
}

impl<D: Deliver> Deliver for Logging<D> {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let worker = self.worker.clone();
        let mut pending = Attempt {
            worker: &worker,
            partition,
            head,
            attempt,
            last: attempt >= self.max_attempts,
            done: false,
        };
        let result = self.inner.deliver(partition, head, attempt).await;
        pending.finish(&result);
        result
    }
}
