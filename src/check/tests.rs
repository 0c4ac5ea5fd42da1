//! Each anomaly built by hand must be reported with its kind; a clean history must pass.

use super::*;
use crate::ids::{PartitionId, Seq, Time};

/// Builds histories event by event, with one clock tick per call.
#[derive(Default)]
struct Builder {
    h: History,
    now: u64,
    layout: u64,
}

impl Builder {
    fn tick(&mut self) -> Time {
        self.now += 1;
        Time::from_millis(self.now)
    }

    fn enqueue(&mut self, seq: i64, key: &str, partition: u16) -> &mut Self {
        let at = self.tick();
        self.h.enqueued.push(Enqueued {
            event_id: format!("evt_{seq}"),
            key: key.into(),
            seq: Seq(seq),
            partition: PartitionId(partition),
            layout: self.layout,
            at,
        });
        self
    }

    fn deliver_with(&mut self, seq: i64, outcome: Outcome, span: u64) -> &mut Self {
        let sent = self.tick();
        let e = self.h.enqueued.iter().find(|e| e.seq == Seq(seq)).expect("enqueued").clone();
        self.h.deliveries.push(Delivery {
            event_id: e.event_id,
            key: e.key,
            seq: e.seq,
            partition: e.partition,
            attempt: 1,
            worker: "w1".into(),
            sent_at: sent,
            arrived_at: sent,
            finished_at: Some(Time::from_millis(sent.as_millis() + span)),
            outcome,
        });
        self
    }

    fn deliver(&mut self, seq: i64) -> &mut Self {
        self.deliver_with(seq, Outcome::Accepted, 0)
    }

    fn ack(&mut self, seq: i64) -> &mut Self {
        let at = self.tick();
        self.h.acks.push(Acked { seq: Seq(seq), at });
        self
    }

    fn dead_letter(&mut self, seq: i64) -> &mut Self {
        let at = self.tick();
        self.h.dead_letters.push(DeadLettered {
            seq: Seq(seq),
            reason: "exhausted after 5 attempts: 503".into(),
            at,
        });
        self
    }

    fn verdict(&self) -> Verdict {
        check(&self.h)
    }
}

fn only(verdict: &Verdict) -> Vec<(Kind, u64)> {
    verdict.findings.iter().filter(|f| f.count > 0).map(|f| (f.kind, f.count)).collect()
}

#[test]
fn a_clean_history_passes() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "b", 1).enqueue(3, "a", 0);
    b.deliver(1).ack(1).deliver(2).ack(2).deliver(3).ack(3);
    let v = b.verdict();
    assert!(v.is_ok(), "{v}");
    assert_eq!(only(&v), vec![]);
    assert_eq!(v.events, 3);
}

#[test]
fn reorder_is_reported_with_both_events() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver(2).ack(2).deliver(1).ack(1);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::Reorder, 1)]);
    let c = v.finding(Kind::Reorder).unwrap().first.as_ref().unwrap();
    assert_eq!(c.seqs, vec![Seq(2), Seq(1)]);
    assert_eq!(c.key, "a");
}

#[test]
fn split_key_is_reported_once_per_key() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 5).enqueue(3, "a", 5);
    b.deliver(1).ack(1).deliver(2).ack(2).deliver(3).ack(3);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::SplitKey, 1)]);
    assert_eq!(
        v.finding(Kind::SplitKey).unwrap().first.as_ref().unwrap().partitions,
        vec![PartitionId(0), PartitionId(5)]
    );
}

#[test]
fn a_key_that_moves_after_draining_is_not_split() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).deliver(1).ack(1).enqueue(2, "a", 5).deliver(2).ack(2);
    assert!(b.verdict().is_ok());
}

#[test]
fn lost_is_an_event_neither_delivered_nor_dead_lettered() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "b", 0);
    b.deliver_with(1, Outcome::Rejected("HTTP 500".into()), 0).deliver(2).ack(2);
    assert_eq!(only(&b.verdict()), vec![(Kind::Lost, 1)]);
}

#[test]
fn concurrent_deliveries_in_one_partition_are_reported() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "b", 0);
    b.deliver_with(1, Outcome::Accepted, 10).deliver(2).ack(1).ack(2);
    assert_eq!(only(&b.verdict()), vec![(Kind::Concurrent, 1)]);
    // The same overlap across two partitions is fine.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "b", 1);
    b.deliver_with(1, Outcome::Accepted, 10).deliver(2).ack(1).ack(2);
    assert!(b.verdict().is_ok());
}

#[test]
fn a_gap_after_dead_letter_is_counted_not_a_violation() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).dead_letter(1).deliver(2).ack(2);
    let v = b.verdict();
    assert!(v.is_ok(), "{v}");
    assert_eq!(only(&v), vec![(Kind::Gap, 1)]);
}

#[test]
fn duplicates_and_stale_duplicates_are_counted() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver(1).deliver(1).ack(1).deliver(2).ack(2);
    let v = b.verdict();
    assert!(v.is_ok());
    assert_eq!(only(&v), vec![(Kind::Duplicate, 1)]);

    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver(1).ack(1).deliver(2).ack(2).deliver(1);
    let v = b.verdict();
    assert!(v.is_ok());
    assert_eq!(only(&v), vec![(Kind::Duplicate, 1), (Kind::StaleDuplicate, 1)]);
}

#[test]
fn retries_before_acceptance_are_not_duplicates() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).deliver(1).ack(1);
    assert_eq!(only(&b.verdict()), vec![]);
}

#[test]
fn the_verdict_prints_as_a_table_and_as_json() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0).deliver(2).ack(2).deliver(1).ack(1);
    let v = b.verdict();
    let table = v.to_string();
    assert!(table.starts_with("verdict: VIOLATED (1 violations"), "{table}");
    assert!(table.contains("reorder"), "{table}");
    let json = serde_json::to_value(&v).unwrap();
    assert_eq!(json["findings"][0]["kind"], "reorder");
    assert_eq!(json["findings"][0]["count"], 1);
    let back: Verdict = serde_json::from_value(json).unwrap();
    assert_eq!(back, v);
}

#[test]
fn a_head_stuck_past_the_bound_is_a_stall_not_a_loss() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 2).enqueue(2, "a", 2);
    b.deliver_with(1, Outcome::Rejected("500".into()), 0);
    b.h.queued_at_end = vec![Seq(1), Seq(2)];
    b.h.end = Time::from_millis(20_000);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::Stall, 1)]);
    let c = v.finding(Kind::Stall).unwrap().first.as_ref().unwrap();
    assert_eq!((c.partitions.clone(), c.seqs.clone()), (vec![PartitionId(2)], vec![Seq(1)]));
    // Within the bound it is neither a stall nor a loss: the events are still in the queue.
    b.h.end = Time::from_millis(5_000);
    assert_eq!(only(&b.verdict()), vec![]);
}

#[test]
fn across_layouts_only_a_delivery_past_queued_older_rows_is_a_split() {
    // A key moves from partition 0 (layout 0) to partition 5 (layout 1) while its old row is
    // still queued. Held back until the old row is delivered: no split.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0);
    b.layout = 1;
    b.enqueue(2, "a", 5);
    b.deliver(1).ack(1).deliver(2).ack(2);
    assert_eq!(only(&b.verdict()), vec![]);
    // Delivered while the old row is still queued: a split (and here a reorder too).
    let mut b = Builder::default();
    b.enqueue(1, "a", 0);
    b.layout = 1;
    b.enqueue(2, "a", 5);
    b.deliver(2).ack(2).deliver(1).ack(1);
    assert_eq!(only(&b.verdict()), vec![(Kind::Reorder, 1), (Kind::SplitKey, 1)]);
}
