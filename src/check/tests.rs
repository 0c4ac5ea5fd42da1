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

/// The findings with a count, leaving out the head-of-line figure (tested on its own).
fn only(verdict: &Verdict) -> Vec<(Kind, u64)> {
    let counted = |f: &&Finding| f.count > 0 && f.kind != Kind::HeadOfLine;
    verdict.findings.iter().filter(counted).map(|f| (f.kind, f.count)).collect()
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
    // Seq 1 was queued when seq 2 went out: a reorder of queued events is a skip as well.
    assert_eq!(only(&v), vec![(Kind::Reorder, 1), (Kind::Skip, 1)]);
    let c = v.finding(Kind::Reorder).unwrap().first.as_ref().unwrap();
    assert_eq!(c.seqs, vec![Seq(2), Seq(1)]);
    assert_eq!(c.key, "a");
    assert!(!v.is_ok(), "a reorder breaks the contract");
    assert_eq!(v.violated(), vec![Kind::Reorder, Kind::Skip]);
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
    assert!(table.starts_with("verdict: VIOLATED (2 violations"), "{table}");
    assert!(
        table.contains("\nskip             violation        1  key \"a\": seq 2 was sent"),
        "{table}"
    );
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
    let found = vec![(Kind::Reorder, 1), (Kind::SplitKey, 1), (Kind::Skip, 1)];
    assert_eq!(only(&b.verdict()), found);
}

// Mutation-testing kills: boundaries and cases the tests above left open.

impl Builder {
    /// A delivery of `seq` sent and arrived at `at` (ms), answered at once.
    fn deliver_at(&mut self, seq: i64, at: u64, outcome: Outcome) -> &mut Self {
        let e = self.h.enqueued.iter().find(|e| e.seq == Seq(seq)).expect("enqueued").clone();
        let at = Time::from_millis(at);
        self.h.deliveries.push(Delivery {
            event_id: e.event_id,
            key: e.key,
            seq: e.seq,
            partition: e.partition,
            attempt: 1,
            worker: "w1".into(),
            sent_at: at,
            arrived_at: at,
            finished_at: Some(at),
            outcome,
        });
        self
    }
}

#[test]
fn the_verdict_counts_and_lists_only_violated_kinds() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0).enqueue(3, "b", 1).enqueue(4, "b", 1);
    b.deliver(2).ack(2).deliver(1).ack(1);
    b.deliver_with(3, Outcome::Rejected("503".into()), 0).dead_letter(3).deliver(4).ack(4);
    let v = b.verdict();
    assert_eq!((v.count(Kind::Reorder), v.count(Kind::Gap), v.count(Kind::Lost)), (1, 1, 0));
    assert_eq!(v.violations(), 2, "the reorder, which is also a skip");
    assert_eq!(v.violated(), vec![Kind::Reorder, Kind::Skip], "a counted gap is not a violation");
    // A verdict with only counted kinds violates nothing.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).dead_letter(1).deliver(2).ack(2);
    assert_eq!(b.verdict().violated(), vec![]);
}

#[test]
fn kinds_print_as_their_json_names() {
    for kind in Kind::ALL {
        let json = serde_json::to_value(kind).unwrap();
        assert_eq!(json.as_str(), Some(kind.to_string().as_str()));
        assert_eq!(kind.to_string(), kind.name());
    }
    assert_eq!(Kind::StaleDuplicate.to_string(), "stale_duplicate");
}

#[test]
fn a_rejected_attempt_of_a_later_event_is_not_a_reorder() {
    // The receiver did not act on the rejected attempt of seq 2, so accepting 1 then 2 is in
    // order. Sending seq 2 while seq 1 was queued is a skip, though (tested below).
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver_with(2, Outcome::Rejected("503".into()), 0).deliver(1).ack(1).deliver(2).ack(2);
    assert_eq!(b.verdict().count(Kind::Reorder), 0);
}

#[test]
fn a_stale_duplicate_names_the_first_arrival_of_the_later_event() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver(1).ack(1).deliver(2).deliver(2).ack(2).deliver(1);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::Duplicate, 2), (Kind::StaleDuplicate, 1)]);
    let c = v.finding(Kind::StaleDuplicate).unwrap().first.as_ref().unwrap();
    let first_of_2 = b.h.deliveries[1].arrived_at;
    assert_eq!(c.seqs, vec![Seq(1), Seq(1), Seq(2)]);
    assert_eq!(c.times[2], first_of_2, "{}", c.note);
}

#[test]
fn only_a_later_event_of_the_same_key_after_a_dead_letter_is_a_gap() {
    // Another key's delivery after the dead-letter is no gap.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "b", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).dead_letter(1).deliver(2).ack(2);
    assert_eq!(only(&b.verdict()), vec![]);
    // Nor is a late arrival of the dead-lettered event itself.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).dead_letter(1);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0);
    assert_eq!(only(&b.verdict()), vec![]);
}

#[test]
fn a_delivery_sent_as_the_previous_one_ends_is_not_concurrent() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "b", 0);
    // Seq 1 is sent at 3 ms and answered at 4 ms; seq 2 is sent at 4 ms.
    b.deliver_with(1, Outcome::Accepted, 1).deliver(2).ack(1).ack(2);
    assert_eq!(b.h.deliveries[0].end(), b.h.deliveries[1].sent_at);
    assert_eq!(only(&b.verdict()), vec![]);
}

#[test]
fn a_stall_is_strictly_past_the_bound_and_names_the_lowest_seq() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 2).enqueue(2, "a", 2);
    // Listed out of order: the head is still the lowest seq.
    b.h.queued_at_end = vec![Seq(2), Seq(1)];
    b.h.end = Time::from_millis(1 + 10_000);
    assert_eq!(only(&b.verdict()), vec![], "waited exactly the bound: not a stall");
    b.h.end = Time::from_millis(1 + 10_001);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::Stall, 1)]);
    assert_eq!(v.finding(Kind::Stall).unwrap().first.as_ref().unwrap().seqs, vec![Seq(1)]);
}

#[test]
fn two_rows_of_a_key_on_one_partition_are_not_split() {
    // Rows 1 and 2 are queued together on partition 0, then the key moves after draining.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver(1).ack(1).deliver(2).ack(2).enqueue(3, "a", 5).deliver(3).ack(3);
    assert_eq!(only(&b.verdict()), vec![]);
}

#[test]
fn a_new_layout_row_delivered_as_the_old_row_leaves_is_not_split() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0);
    b.layout = 1;
    b.enqueue(2, "a", 5);
    b.deliver(1).ack(1);
    let acked_at = b.h.acks[0].at.as_millis();
    b.deliver_at(2, acked_at, Outcome::Accepted).ack(2);
    assert_eq!(only(&b.verdict()), vec![]);
}

#[test]
fn an_old_layout_row_enqueued_as_a_new_layout_row_arrives_is_a_split() {
    // Seq 1 is routed by the new layout (partition 5); seq 2 by a producer still on the old
    // one (partition 0). At the very instant seq 2 is enqueued, seq 1 arrives: the key is on
    // two partitions at once.
    let split = |arrives_at: u64| {
        let mut b = Builder { layout: 1, ..Builder::default() };
        b.enqueue(1, "a", 5);
        b.layout = 0;
        b.enqueue(2, "a", 0);
        b.now = 10;
        b.deliver_at(1, arrives_at, Outcome::Accepted).ack(1).deliver(2).ack(2);
        only(&b.verdict())
    };
    let enqueued_at = 2;
    assert_eq!(split(enqueued_at), vec![(Kind::SplitKey, 1)]);
    // One millisecond earlier the old-layout row was not queued yet.
    assert_eq!(split(enqueued_at - 1), vec![]);
}

#[test]
fn a_key_that_moves_within_a_layout_at_the_instant_it_drains_is_not_split() {
    // One layout: seq 1 is delivered and acknowledged on partition 0 at 5 ms, and seq 2 is
    // enqueued on partition 5 at that same instant. The old row left as the new one came, so
    // the key was never queued twice.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0);
    b.deliver_at(1, 5, Outcome::Accepted);
    b.h.acks.push(Acked { seq: Seq(1), at: Time::from_millis(5) });
    b.now = 4;
    b.enqueue(2, "a", 5);
    assert_eq!(b.h.enqueued[1].at, Time::from_millis(5));
    b.now = 10;
    b.deliver(2).ack(2);
    assert_eq!(only(&b.verdict()), vec![]);
    // The same once the key also has a row of a newer layout, later: the cross-layout rule
    // looks at older layouts only, not at the key's own move within layout 0.
    b.layout = 1;
    b.enqueue(3, "a", 7).deliver(3).ack(3);
    assert_eq!(only(&b.verdict()), vec![]);
}

/// The head-of-line figure: a healthy key waiting while a failing key of its
/// partition backs off is counted; one served during the backoff, or on another partition, is
/// not.
#[test]
fn healthy_keys_waiting_behind_a_failing_key_are_counted_in_ms() {
    let blocked = |wait: u64, healthy_partition: u16| {
        let mut b = Builder::default();
        b.enqueue(1, "k", 0).enqueue(2, "h", healthy_partition);
        // `k` is refused, then backs off for `wait` ms (the builder's clock ticks 1 ms a call).
        b.deliver_with(1, Outcome::Rejected("HTTP 503".into()), 0);
        b.now += wait;
        b.deliver(1).ack(1).deliver(2).ack(2);
        let v = b.verdict();
        assert!(v.is_ok(), "{v}");
        v.count(Kind::HeadOfLine)
    };
    // Behind: `h` is next in line from 2 ms; `k` blocks from its refusal at 3 ms until its
    // retry at 504 ms, and `h` goes out only after that.
    assert_eq!(blocked(500, 0), 501);
    assert_eq!(blocked(500, 1), 0, "another partition is not held up");
    // Parked: `h` goes out during `k`'s backoff.
    let mut b = Builder::default();
    b.enqueue(1, "k", 0).enqueue(2, "h", 0);
    b.deliver_with(1, Outcome::Rejected("HTTP 503".into()), 0);
    b.deliver(2).ack(2);
    b.now += 500;
    b.deliver(1).ack(1);
    assert_eq!(b.verdict().count(Kind::HeadOfLine), 1, "only the one tick before h was sent");
}

/// Jepsen's `poll-skip`: seq 1 is refused at 10 ms and still retrying when seq 2 is delivered
/// and accepted at 20 ms; seq 1 is dead-lettered at 30 ms. Nothing is reordered (seq 1 was
/// never accepted) and nothing is a gap (seq 2 came before the dead-letter), yet the key's head
/// was passed over while it was still queued.
fn skipped_head() -> Builder {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver_at(1, 10, Outcome::Rejected("HTTP 503".into()));
    b.deliver_at(2, 20, Outcome::Accepted);
    b.h.acks.push(Acked { seq: Seq(2), at: Time::from_millis(21) });
    b.h.dead_letters.push(DeadLettered {
        seq: Seq(1),
        reason: "exhausted after 5 attempts: HTTP 503".into(),
        at: Time::from_millis(30),
    });
    b.h.end = Time::from_millis(40);
    b
}

#[test]
fn a_later_event_delivered_while_the_head_is_still_retrying_is_a_skip() {
    let v = skipped_head().verdict();
    assert_eq!(only(&v), vec![(Kind::Skip, 1)], "{v}");
    assert_eq!(v.violated(), vec![Kind::Skip]);
    let c = v.finding(Kind::Skip).unwrap().first.as_ref().unwrap();
    assert_eq!((c.key.as_str(), c.seqs.clone()), ("a", vec![Seq(1), Seq(2)]));
    assert_eq!(c.event_ids, vec!["evt_1".to_owned(), "evt_2".to_owned()]);
    assert_eq!(c.times[1], Time::from_millis(20));
    assert!(c.note.contains("dead-lettered at 30.000ms"), "{}", c.note);
    assert!(v.to_string().contains("skip"), "{v}");
}

#[test]
fn a_delivery_sent_as_the_head_is_dead_lettered_is_not_a_skip() {
    // Seq 2 goes out at the very instant seq 1 is dead-lettered: the head has cleared.
    let mut b = skipped_head();
    b.h.deliveries[1].sent_at = Time::from_millis(30);
    b.h.deliveries[1].arrived_at = Time::from_millis(30);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::Gap, 1)], "{v}");
    // One millisecond earlier it had not.
    let mut b = skipped_head();
    b.h.deliveries[1].sent_at = Time::from_millis(29);
    assert_eq!(only(&b.verdict()), vec![(Kind::Skip, 1)]);
}

#[test]
fn after_a_dead_letter_the_next_delivery_must_be_the_next_event() {
    // Seq 1 is ejected; the key's next delivery is seq 3 while seq 2 is still queued.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0).enqueue(3, "a", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).dead_letter(1);
    b.deliver(3).ack(3).deliver(2).ack(2);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::Reorder, 1), (Kind::Skip, 1), (Kind::Gap, 1)], "{v}");
    let c = v.finding(Kind::Skip).unwrap().first.as_ref().unwrap();
    assert_eq!(c.seqs, vec![Seq(2), Seq(3)]);
    assert!(c.note.contains("delivered at"), "{}", c.note);
    // In order it is only the counted gap.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0).enqueue(3, "a", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).dead_letter(1);
    b.deliver(2).ack(2).deliver(3).ack(3);
    assert_eq!(only(&b.verdict()), vec![(Kind::Gap, 1)]);
}

#[test]
fn a_refused_attempt_past_a_queued_head_is_a_skip_not_a_reorder() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver_with(2, Outcome::Rejected("503".into()), 0).deliver(1).ack(1).deliver(2).ack(2);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::Skip, 1)], "{v}");
    // Counted once per skipping event, however often it is sent past the head.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver_with(2, Outcome::Rejected("503".into()), 0);
    b.deliver_with(2, Outcome::Rejected("503".into()), 0).deliver(1).ack(1).deliver(2).ack(2);
    assert_eq!(b.verdict().count(Kind::Skip), 1);
}

#[test]
fn only_a_queued_earlier_event_of_the_same_key_makes_a_skip() {
    // Another key's queued head does not hold this key back.
    let mut b = Builder::default();
    b.enqueue(1, "b", 0).enqueue(2, "a", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).deliver(2).ack(2).deliver(1).ack(1);
    assert_eq!(only(&b.verdict()), vec![]);
    // An earlier seq enqueued only after the later one was sent was not queued then: that is
    // the producers' reorder, not a skip.
    let mut b = Builder::default();
    b.enqueue(2, "a", 0).deliver(2).ack(2).enqueue(1, "a", 0).deliver(1).ack(1);
    assert_eq!(only(&b.verdict()), vec![(Kind::Reorder, 1)]);
    // A head still queued at the end is queued the whole time.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0);
    b.deliver_with(1, Outcome::Rejected("503".into()), 0).deliver(2).ack(2);
    b.h.queued_at_end = vec![Seq(1)];
    b.h.end = Time::from_millis(100);
    let v = b.verdict();
    assert_eq!(only(&v), vec![(Kind::Skip, 1)], "{v}");
    let note = &v.finding(Kind::Skip).unwrap().first.as_ref().unwrap().note;
    assert!(note.contains("still queued at the end"), "{note}");
    // A head that vanished is lost, and when it left is unknown: not judged as a skip.
    b.h.queued_at_end.clear();
    assert_eq!(only(&b.verdict()), vec![(Kind::Lost, 1)]);
}

/// The current rules against [`super::reference`], the rules as they were before each was made
/// linear or n log n: on messy random histories (ties, overlaps, layouts, dead letters, events
/// without enqueues) the verdicts agree field for field, counterexamples included.
mod against_the_reference {
    use proptest::prelude::*;

    use super::super::reference as old;
    use super::*;

    fn reference_check(history: &History, config: &CheckConfig) -> Verdict {
        let index = old::Index::new(history);
        let findings = Kind::ALL
            .iter()
            .map(|&kind| {
                let (count, first) = match kind {
                    Kind::Reorder => old::reorder(&index),
                    Kind::SplitKey => old::split_keys(&index),
                    Kind::Lost => old::lost(&index),
                    Kind::Concurrent => old::concurrent(&index),
                    Kind::Skip => old::skips(&index),
                    Kind::Stall => old::stalls(&index, config.stall_after),
                    Kind::Gap => old::gaps(&index),
                    Kind::Duplicate => old::duplicates(&index, false),
                    Kind::StaleDuplicate => old::duplicates(&index, true),
                    Kind::HeadOfLine => old::head_of_line(&index),
                    Kind::Premature | Kind::ConcurrentKey => unreachable!("not in Kind::ALL"),
                };
                Finding { kind, count, first }
            })
            .collect();
        Verdict {
            events: history.enqueued.len(),
            deliveries: history.deliveries.len(),
            dead_lettered: history.dead_letters.len(),
            findings,
            not_judged: Vec::new(),
            skew_forgiven: 0,
        }
    }

    /// A history from a list of choices: small times (many ties), few keys and partitions,
    /// two layouts, random outcomes and spans, some events dead-lettered, acknowledged or
    /// listed as queued, and a few deliveries of events never enqueued.
    fn messy(events: usize, choices: &[u16]) -> History {
        let mut c = choices.iter().copied().cycle();
        let mut next = move |n: u16| c.next().map_or(0, |x| x % n.max(1));
        let mut h = History::default();
        for i in 0..events {
            h.enqueued.push(Enqueued {
                event_id: format!("e{i}"),
                key: format!("k{}", next(3)),
                seq: Seq(i as i64 + 1),
                partition: PartitionId(next(3)),
                layout: u64::from(next(4) / 3),
                at: Time::from_millis(u64::from(next(40))),
            });
        }
        let deliveries = events * 2 + usize::from(next(8));
        for _ in 0..deliveries {
            let seq = i64::from(next(events as u16 + 1)) + 1;
            let key =
                h.enqueued.get(seq as usize - 1).map_or_else(|| "k0".to_owned(), |e| e.key.clone());
            let partition = PartitionId(next(3));
            let sent = u64::from(next(60));
            let arrived = sent + u64::from(next(3));
            let finished = match next(5) {
                0 => None,
                n => Some(Time::from_millis(arrived + u64::from(n) * u64::from(next(4)))),
            };
            let outcome =
                if next(3) == 0 { Outcome::Rejected("HTTP 503".into()) } else { Outcome::Accepted };
            h.deliveries.push(Delivery {
                event_id: format!("e{}", seq - 1),
                key,
                seq: Seq(seq),
                partition,
                attempt: 1,
                worker: format!("w{}", next(2)),
                sent_at: Time::from_millis(sent),
                arrived_at: Time::from_millis(arrived),
                finished_at: finished,
                outcome,
            });
        }
        for e in 0..events {
            let seq = Seq(e as i64 + 1);
            let at = Time::from_millis(u64::from(next(70)));
            match next(6) {
                0 => h.dead_letters.push(DeadLettered { seq, reason: "exhausted".into(), at }),
                1 | 2 => h.acks.push(Acked { seq, at }),
                3 => h.queued_at_end.push(seq),
                _ => {}
            }
        }
        h.end = Time::from_millis(60 + u64::from(next(30)) * 500);
        h
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn the_rules_give_the_reference_verdict(
            events in 1usize..24,
            choices in prop::collection::vec(any::<u16>(), 1..200),
        ) {
            let h = messy(events, &choices);
            let config = CheckConfig {
                stall_after: std::time::Duration::from_millis(3_000),
                ..CheckConfig::default()
            };
            prop_assert_eq!(check_with(&h, &config), reference_check(&h, &config));
        }
    }
}

/// The verdict with the rules only logs need, and a clock-skew tolerance in ms.
fn log_verdict(h: &History, skew_ms: u64) -> Verdict {
    let config = CheckConfig {
        log_rules: true,
        clock_skew: std::time::Duration::from_millis(skew_ms),
        ..CheckConfig::default()
    };
    check_with(h, &config)
}

#[test]
fn a_delivery_sent_before_its_enqueue_is_premature() {
    // Enqueued (committed) at 100 ms, delivered and accepted at 10 ms: an outbox relay that
    // published before its transaction committed.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).deliver_at(1, 10, Outcome::Accepted);
    b.h.enqueued[0].at = Time::from_millis(100);
    b.h.end = Time::from_millis(200);
    let v = log_verdict(&b.h, 0);
    assert_eq!(v.violated(), vec![Kind::Premature], "{v}");
    let c = v.finding(Kind::Premature).unwrap().first.as_ref().unwrap();
    assert_eq!(c.event_ids, vec!["evt_1".to_owned(), "evt_1".to_owned()]);
    assert!(c.note.contains("before it was enqueued at 100.000ms"), "{}", c.note);
    // Within the tolerance for the two clocks it is not; exactly at the enqueue it is not.
    assert!(log_verdict(&b.h, 90).is_ok());
    assert_eq!(log_verdict(&b.h, 89).count(Kind::Premature), 1);
    // The simulation's verdict leaves the log rules out.
    assert!(check(&b.h).finding(Kind::Premature).is_none());
}

#[test]
fn a_delivery_of_a_rolled_back_enqueue_is_premature_whenever_it_is_sent() {
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 0).deliver(1).ack(1).deliver(2).ack(2);
    let clean = log_verdict(&b.h, 0);
    assert!(clean.is_ok(), "{clean}");
    // Seq 2's enqueue rolled back: its delivery, long after, is still a violation.
    let rolled_back = b.h.enqueued.remove(1);
    b.h.aborted.push(rolled_back);
    b.h.acks.retain(|a| a.seq != Seq(2));
    let v = log_verdict(&b.h, 1_000_000);
    assert_eq!(v.violated(), vec![Kind::Premature], "{v}");
    assert_eq!(v.count(Kind::Premature), 1);
    assert!(v
        .finding(Kind::Premature)
        .unwrap()
        .first
        .as_ref()
        .unwrap()
        .note
        .contains("rolled back"));
}

#[test]
fn two_deliveries_of_one_key_in_flight_at_once_are_concurrent_key() {
    // One key, two events, on two partitions (a modulus change, say): no partition has two
    // deliveries out, but the key has.
    let mut b = Builder::default();
    b.enqueue(1, "a", 0).enqueue(2, "a", 1).enqueue(3, "b", 2);
    b.deliver_with(1, Outcome::Accepted, 10); // sent at 4, in flight until 14
    b.deliver(2); // sent at 5
    b.deliver(3); // another key: not concurrent with either
    b.ack(1).ack(2).ack(3);
    let v = log_verdict(&b.h, 0);
    assert_eq!(v.count(Kind::ConcurrentKey), 1, "{v}");
    assert_eq!(v.count(Kind::Concurrent), 0, "{v}");
    let c = v.finding(Kind::ConcurrentKey).unwrap().first.as_ref().unwrap();
    assert_eq!((c.key.as_str(), c.seqs.clone()), ("a", vec![Seq(1), Seq(2)]));
    // Sent as the other ends: not in flight at once.
    b.h.deliveries[0].finished_at = Some(b.h.deliveries[1].sent_at);
    assert_eq!(log_verdict(&b.h, 0).count(Kind::ConcurrentKey), 0);
}

#[test]
fn the_log_rules_come_after_the_other_violations_and_only_for_logs() {
    assert_eq!(Kind::judged(false), Kind::ALL.to_vec());
    let kinds = Kind::judged(true);
    assert_eq!(kinds.len(), Kind::ALL.len() + 2);
    assert_eq!(&kinds[6..8], &Kind::FROM_LOGS);
    assert!(Kind::FROM_LOGS.iter().all(|k| k.is_violation()));
    assert_eq!(Kind::ConcurrentKey.name(), "concurrent_key");
}
