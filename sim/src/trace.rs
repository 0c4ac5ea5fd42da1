//! The run's recorder: the delivery history the checker judges, plus a text trace whose hash
//! identifies the run. Lives outside every host, so crashes and restarts cannot erase it.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::rc::Rc;

use blake2::digest::consts::U32;
use blake2::{Blake2b, Digest};
use keyorder::check::{Delivery, History, Outcome};
use keyorder::{PartitionId, Seq, Time};

/// The recorder shared by the hosts and the driver of one run.
pub type SharedRecorder = Rc<RefCell<Recorder>>;

/// What the recorder puts in each delivery's body, so that the endpoint's arrival is matched
/// to the worker's delivery.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct DeliveryTag {
    /// The recorder's delivery id.
    pub delivery: u64,
}

/// A delivery the worker sent that has not arrived yet.
#[derive(Clone, Debug)]
struct Pending {
    sent_at: Time,
    worker: String,
    finished_at: Option<Time>,
}

/// History and trace of one run.
#[derive(Debug, Default)]
pub struct Recorder {
    /// What the checker judges.
    pub history: History,
    trace: String,
    next_delivery: u64,
    pending: BTreeMap<u64, Pending>,
    arrived: BTreeMap<u64, usize>,
    /// Fault and behaviour counts by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Enqueue seq of each event, for deliveries of a row that was requeued under a new seq.
    origin: BTreeMap<String, Seq>,
}

/// The current simulated time, inside or outside a host.
pub fn now() -> Time {
    Time(crate::simulator::elapsed())
}

impl Recorder {
    /// Appends a trace line `time host text`.
    pub fn log(&mut self, at: Time, host: &str, text: std::fmt::Arguments<'_>) {
        let _ = writeln!(self.trace, "{:>12} {host:<10} {text}", at.0.as_micros());
    }

    /// Counts one occurrence of a fault or behaviour.
    pub fn fault(&mut self, kind: &'static str) {
        *self.faults.entry(kind).or_default() += 1;
    }

    /// An event committed.
    pub fn enqueued(&mut self, e: keyorder::check::Enqueued) {
        self.origin.insert(e.event_id.clone(), e.seq);
        self.history.enqueued.push(e);
    }

    /// A worker starts a delivery: returns its id.
    pub fn start_delivery(&mut self, worker: &str) -> u64 {
        self.next_delivery += 1;
        let id = self.next_delivery;
        let pending = Pending { sent_at: now(), worker: worker.to_owned(), finished_at: None };
        self.pending.insert(id, pending);
        id
    }

    /// The worker stopped waiting for delivery `id` (answer, timeout or crash).
    pub fn finish_delivery(&mut self, id: u64) {
        let at = now();
        if let Some(&i) = self.arrived.get(&id) {
            let d = &mut self.history.deliveries[i];
            d.finished_at.get_or_insert(at);
        } else if let Some(p) = self.pending.get_mut(&id) {
            p.finished_at.get_or_insert(at);
        }
    }

    /// The endpoint received delivery `id` and will answer with `outcome`.
    #[allow(clippy::too_many_arguments)]
    pub fn arrived(
        &mut self,
        id: u64,
        partition: PartitionId,
        seq: Seq,
        event_id: &str,
        key: &str,
        attempt: u32,
        outcome: Outcome,
    ) {
        let at = now();
        let Some(p) = self.pending.remove(&id) else { return };
        let seq = self.origin.get(event_id).copied().unwrap_or(seq);
        self.log(
            at,
            "endpoint",
            format_args!("arrive p{partition} seq={seq} {event_id} key={key} attempt={attempt} from={} -> {outcome:?}", p.worker),
        );
        self.arrived.insert(id, self.history.deliveries.len());
        self.history.deliveries.push(Delivery {
            event_id: event_id.to_owned(),
            key: key.to_owned(),
            seq,
            partition,
            attempt,
            worker: p.worker,
            sent_at: p.sent_at,
            arrived_at: at,
            finished_at: p.finished_at,
            outcome,
        });
    }

    /// The full text trace.
    pub fn trace(&self) -> &str {
        &self.trace
    }

    /// BLAKE2b-256 of the trace, in hex: the run's identity.
    pub fn trace_hash(&self) -> String {
        let digest = Blake2b::<U32>::digest(self.trace.as_bytes());
        digest.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}
