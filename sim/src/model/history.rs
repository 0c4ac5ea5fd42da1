//! The history of one path, recorded as the checker's [`History`], and its export as the JSON
//! lines `keyorder check` reads.
//!
//! Times: a path's records are stamped with the model's clock in whole milliseconds plus the
//! step's index in microseconds, so that records at one clock value keep the path's order (the
//! checker's one-in-flight rule compares times).

use std::time::Duration;

use keyorder::check::jsonl::{Record, RecordOutcome};
use keyorder::check::{
    Acked, DeadLettered, Delivery, Enqueued, History, LeaseChange, LeaseEvent, Outcome,
};
use keyorder::{Epoch, PartitionId, Seq, Time};

use super::world::{EventSpec, World};

/// A path's history, carried beside the state (not part of its fingerprint: two paths to one
/// state agree on everything the properties judge, see `properties`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// What the checker judges.
    pub history: History,
    /// Steps taken so far.
    pub steps: u32,
    /// When each delivery still out was sent, by (partition, epoch, seq, attempt).
    sends: Vec<(SendId, Time)>,
}

/// A delivery's identity on its path: partition, lease epoch, row, attempt.
pub type SendId = (u8, Epoch, Seq, u32);

impl Trace {
    /// The stamp of the current step at `clock`.
    pub fn at(&self, clock: Time) -> Time {
        Time(clock.0 + Duration::from_micros(u64::from(self.steps.min(999))))
    }

    /// A delivery was sent: its stamp is kept for its arrival and its end.
    pub fn sent(&mut self, id: SendId, clock: Time) {
        let at = self.at(clock);
        self.sends.retain(|(s, _)| *s != id);
        self.sends.push((id, at));
    }

    /// When the delivery `id` was sent (its clock value if the path lost the stamp).
    pub fn sent_at(&self, id: SendId, clock: Time) -> Time {
        self.sends.iter().find(|(s, _)| *s == id).map_or(clock, |(_, t)| *t)
    }

    /// An event committed.
    pub fn enqueued(&mut self, spec: EventSpec, clock: Time) {
        let at = self.at(clock);
        self.history.enqueued.push(Enqueued {
            event_id: spec.id(),
            key: spec.key_name(),
            seq: spec.seq,
            partition: PartitionId(u16::from(spec.partition)),
            layout: 0,
            at,
        });
    }

    /// A delivery reached its endpoint.
    pub fn arrived(
        &mut self,
        spec: EventSpec,
        worker: u8,
        attempt: u32,
        sent: Time,
        clock: Time,
        outcome: Outcome,
    ) {
        let arrived_at = self.at(clock);
        self.history.deliveries.push(Delivery {
            event_id: spec.id(),
            key: spec.key_name(),
            seq: spec.seq,
            partition: PartitionId(u16::from(spec.partition)),
            attempt,
            worker: format!("w{worker}"),
            sent_at: sent,
            arrived_at,
            finished_at: None,
            outcome,
        });
    }

    /// The worker stopped waiting for the delivery sent at `sent` (an answer or its timeout).
    pub fn finished(&mut self, spec: EventSpec, worker: u8, sent: Time, clock: Time) {
        let at = self.at(clock);
        let name = format!("w{worker}");
        if let Some(d) = self
            .history
            .deliveries
            .iter_mut()
            .rev()
            .find(|d| d.seq == spec.seq && d.worker == name && d.sent_at == sent)
        {
            d.finished_at = Some(at);
        }
    }

    /// A row was deleted after its delivery.
    pub fn acked(&mut self, seq: Seq, clock: Time) {
        let at = self.at(clock);
        self.history.acks.push(Acked { seq, at });
    }

    /// A row moved to the dead-letter table.
    pub fn dead_lettered(&mut self, seq: Seq, reason: &str, clock: Time) {
        let at = self.at(clock);
        self.history.dead_letters.push(DeadLettered { seq, reason: reason.to_owned(), at });
    }

    /// A lease changed hands.
    pub fn lease(
        &mut self,
        partition: u8,
        worker: u8,
        epoch: Epoch,
        change: LeaseEvent,
        clock: Time,
    ) {
        let at = self.at(clock);
        self.history.leases.push(LeaseChange {
            partition: PartitionId(u16::from(partition)),
            worker: format!("w{worker}"),
            epoch,
            change,
            at,
        });
    }

    /// The history as it stands in `world`: what is still queued, and the end now.
    pub fn closed(&self, world: &World, events: &[EventSpec]) -> History {
        let mut h = self.history.clone();
        h.queued_at_end = world
            .partitions
            .iter()
            .flat_map(|p| p.rows.iter().filter(|r| r.committed))
            .map(|r| events[usize::from(r.event)].seq)
            .collect();
        h.queued_at_end.sort();
        h.end = self.at(world.clock);
        h
    }
}

fn ms(t: Time) -> f64 {
    t.0.as_micros() as f64 / 1000.0
}

/// `history` as the JSON lines `keyorder check` reads, one record a line.
pub fn to_jsonl(history: &History) -> String {
    let id_of = |seq: Seq| format!("e{}", seq.0);
    let mut records = Vec::new();
    for e in &history.enqueued {
        records.push(Record::Enqueued {
            event_id: e.event_id.clone(),
            key: e.key.clone(),
            seq: Some(e.seq.0),
            order: None,
            partition: Some(e.partition.0),
            layout: Some(e.layout),
            at_ms: ms(e.at),
        });
    }
    for d in &history.deliveries {
        let (outcome, reason) = match &d.outcome {
            Outcome::Accepted => (RecordOutcome::Accepted, None),
            Outcome::Rejected(why) => (RecordOutcome::Rejected, Some(why.clone())),
        };
        records.push(Record::Delivery {
            event_id: d.event_id.clone(),
            key: d.key.clone(),
            seq: Some(d.seq.0),
            order: None,
            partition: Some(d.partition.0),
            worker: Some(d.worker.clone()),
            attempt: Some(d.attempt),
            sent_ms: Some(ms(d.sent_at)),
            arrived_ms: Some(ms(d.arrived_at)),
            answered_ms: d.finished_at.map(ms),
            outcome,
            reason,
        });
    }
    for x in &history.dead_letters {
        records.push(Record::DeadLetter {
            event_id: id_of(x.seq),
            reason: Some(x.reason.clone()),
            at_ms: ms(x.at),
        });
    }
    for a in &history.acks {
        records.push(Record::Ack { event_id: id_of(a.seq), at_ms: ms(a.at) });
    }
    records.push(Record::End {
        at_ms: ms(history.end),
        queued: history.queued_at_end.iter().map(|s| id_of(*s)).collect(),
    });
    let mut text = String::new();
    for r in &records {
        text.push_str(&serde_json::to_string(r).expect("a record serialises"));
        text.push('\n');
    }
    text
}
