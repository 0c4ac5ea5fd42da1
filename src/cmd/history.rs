//! `keyorder work --history FILE`: the worker's own view of a run, written as the JSON lines
//! that `keyorder check` reads, so that a real run is judged by the rules a simulated one is.
//!
//! What a worker sees: each event when it first sends it (the `enqueued` record's time is that
//! first sight, not the producer's commit), each attempt's send and answer (the endpoint's
//! arrival is not seen: the checker takes the send), and a dead-letter when the last allowed
//! attempt fails (written at that answer; the move commits just after). Times are Unix time in
//! milliseconds.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use keyorder::check::jsonl::{Record, RecordOutcome};
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::PartitionId;

/// The history file shared by every worker loop of the process; each record is flushed as a
/// whole line, so a run stopped by a signal leaves whole records behind.
#[derive(Clone)]
pub(crate) struct HistoryLog {
    inner: Arc<Mutex<Log>>,
}

struct Log {
    out: BufWriter<File>,
    seen: BTreeSet<String>,
    failed: Option<String>,
}

impl HistoryLog {
    /// Creates (or truncates) `path`.
    pub(crate) fn create(path: &Path) -> anyhow::Result<Self> {
        let file = File::create(path)
            .with_context(|| format!("cannot create the history file {}", path.display()))?;
        let log = Log { out: BufWriter::new(file), seen: BTreeSet::new(), failed: None };
        Ok(Self { inner: Arc::new(Mutex::new(log)) })
    }

    /// The first write error, if any (a full disk must not stop deliveries, but is reported).
    pub(crate) fn error(&self) -> Option<String> {
        self.inner.lock().map_or_else(|_| Some("a writer panicked".into()), |l| l.failed.clone())
    }

    fn write(&self, records: &[Record]) {
        let Ok(mut log) = self.inner.lock() else { return };
        let mut text = String::new();
        for r in records {
            match serde_json::to_string(r) {
                Ok(line) => {
                    text.push_str(&line);
                    text.push('\n');
                }
                Err(e) => {
                    log.failed.get_or_insert_with(|| e.to_string());
                }
            }
        }
        let result = log.out.write_all(text.as_bytes()).and_then(|()| log.out.flush());
        if let Err(e) = result {
            log.failed.get_or_insert_with(|| e.to_string());
        }
    }

    /// Whether `event_id` is seen for the first time (and marks it seen).
    fn first_sight(&self, event_id: &str) -> bool {
        self.inner.lock().is_ok_and(|mut l| l.seen.insert(event_id.to_owned()))
    }
}

/// Unix time in milliseconds, to the microsecond.
#[allow(clippy::disallowed_methods)] // not simulated: the history of a real run, in real time
fn now_ms() -> f64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (since.as_micros() as f64) / 1000.0
}

/// A deliverer that writes each attempt to the history, then hands it to the inner one.
#[derive(Clone)]
pub(crate) struct Recording<D> {
    inner: D,
    log: Option<HistoryLog>,
    worker: String,
    max_attempts: u32,
}

impl<D> Recording<D> {
    /// Wraps `inner` for the loop `worker`; with no log, it only passes attempts through.
    pub(crate) fn new(inner: D, log: Option<HistoryLog>, worker: &str, max_attempts: u32) -> Self {
        Self { inner, log, worker: worker.to_owned(), max_attempts }
    }
}

/// One attempt in flight: written when answered, or on drop (abandoned at the timeout).
struct Pending<'a> {
    log: &'a HistoryLog,
    record: Option<Record>,
    last: bool,
    event_id: String,
}

impl Pending<'_> {
    fn finish(&mut self, outcome: RecordOutcome, reason: Option<String>) {
        let Some(mut record) = self.record.take() else { return };
        let at = now_ms();
        if let Record::Delivery { answered_ms, outcome: o, reason: r, .. } = &mut record {
            *answered_ms = Some(at);
            *o = outcome;
            *r = reason.clone();
        }
        let mut records = vec![record];
        if outcome == RecordOutcome::Rejected && self.last {
            records.push(Record::DeadLetter { event_id: self.event_id.clone(), reason, at_ms: at });
        }
        self.log.write(&records);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.finish(RecordOutcome::Rejected, Some("abandoned at the delivery timeout".into()));
    }
}

impl<D: Deliver> Deliver for Recording<D> {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let Some(log) = self.log.clone() else {
            return self.inner.deliver(partition, head, attempt).await;
        };
        let sent = now_ms();
        if log.first_sight(&head.event_id) {
            log.write(&[Record::Enqueued {
                event_id: head.event_id.clone(),
                key: head.key.clone(),
                seq: Some(head.seq.0),
                order: None,
                partition: Some(partition.0),
                layout: None,
                at_ms: sent,
            }]);
        }
        let mut pending = Pending {
            log: &log,
            record: Some(Record::Delivery {
                event_id: head.event_id.clone(),
                key: head.key.clone(),
                seq: Some(head.seq.0),
                order: None,
                partition: Some(partition.0),
                worker: Some(self.worker.clone()),
                attempt: Some(attempt),
                sent_ms: Some(sent),
                arrived_ms: None,
                answered_ms: None,
                outcome: RecordOutcome::Rejected,
                reason: None,
            }),
            last: attempt >= self.max_attempts,
            event_id: head.event_id.clone(),
        };
        let result = self.inner.deliver(partition, head, attempt).await;
        match &result {
            Ok(()) => pending.finish(RecordOutcome::Accepted, None),
            Err(e) => pending.finish(RecordOutcome::Rejected, Some(keyorder::worker::chain(e))),
        }
        result
    }
}
