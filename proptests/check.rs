//! The checker over random histories: a valid history has no violation, and a history with one
//! injected anomaly is reported with exactly that kind.

use std::collections::{BTreeMap, VecDeque};

use keyorder::check::{check, Acked, DeadLettered, Delivery, Enqueued, History, Kind, Outcome};
use keyorder::{partition_for, PartitionCount, PartitionId, Seq, Time};
use proptest::prelude::*;

const MAX_ATTEMPTS: u32 = 3;

/// A valid history: every event enqueued first, then partitions delivered serially in a random
/// interleaving, with random failures, dead-letters and harmless duplicates.
fn valid_history(keys: usize, events: usize, choices: &[u8]) -> History {
    let count = PartitionCount::new(4).expect("valid");
    let mut h = History::default();
    let mut t = 0u64;
    let mut queues: BTreeMap<PartitionId, VecDeque<(usize, u32)>> = BTreeMap::new();
    for i in 0..events {
        t += 1;
        let key = format!("sub_{}", i % keys);
        let partition = partition_for(&key, count);
        h.enqueued.push(Enqueued {
            event_id: format!("evt_{i}"),
            key,
            seq: Seq(i as i64 + 1),
            partition,
            layout: 0,
            at: Time::from_millis(t),
        });
        queues.entry(partition).or_default().push_back((i, 0));
    }
    let mut c = choices.iter().cycle();
    while let Some(p) = {
        let live: Vec<_> = queues.iter().filter(|(_, q)| !q.is_empty()).map(|(p, _)| *p).collect();
        (!live.is_empty()).then(|| live[usize::from(*c.next().expect("cycle")) % live.len()])
    } {
        let q = queues.get_mut(&p).expect("live");
        let (i, attempts) = q.front_mut().expect("non-empty");
        let e = h.enqueued[*i].clone();
        t += 2;
        let choice = c.next().expect("cycle") % 8;
        let accepted = choice < 5;
        h.deliveries.push(Delivery {
            event_id: e.event_id.clone(),
            key: e.key.clone(),
            seq: e.seq,
            partition: p,
            attempt: *attempts + 1,
            worker: "w".into(),
            sent_at: Time::from_millis(t),
            arrived_at: Time::from_millis(t),
            finished_at: Some(Time::from_millis(t + 1)),
            outcome: if accepted { Outcome::Accepted } else { Outcome::Rejected("503".into()) },
        });
        if accepted {
            if choice == 0 {
                // The ack was lost: the same event is delivered again (a duplicate).
                t += 2;
                let mut again = h.deliveries.last().expect("just pushed").clone();
                again.sent_at = Time::from_millis(t);
                again.arrived_at = Time::from_millis(t);
                again.finished_at = Some(Time::from_millis(t + 1));
                h.deliveries.push(again);
            }
            t += 2;
            h.acks.push(Acked { seq: e.seq, at: Time::from_millis(t) });
            q.pop_front();
        } else {
            *attempts += 1;
            if *attempts == MAX_ATTEMPTS {
                t += 2;
                h.dead_letters.push(DeadLettered {
                    seq: e.seq,
                    reason: "exhausted".into(),
                    at: Time::from_millis(t),
                });
                q.pop_front();
            }
        }
    }
    h.end = Time::from_millis(t + 1);
    h
}

fn history() -> impl Strategy<Value = History> {
    (1usize..6, 2usize..40, prop::collection::vec(any::<u8>(), 1..64))
        .prop_map(|(keys, events, choices)| valid_history(keys, events, &choices))
}

fn violated(h: &History) -> Vec<Kind> {
    check(h).violated()
}

/// Two events of one key, both accepted, in seq order: their indices in `enqueued`.
fn same_key_pair(h: &History, pick: usize) -> Option<(usize, usize)> {
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, e) in h.enqueued.iter().enumerate() {
        if h.deliveries.iter().any(|d| d.seq == e.seq && d.outcome == Outcome::Accepted) {
            by_key.entry(&e.key).or_default().push(i);
        }
    }
    let pairs: Vec<(usize, usize)> =
        by_key.values().filter(|v| v.len() >= 2).map(|v| (v[0], v[1])).collect();
    (!pairs.is_empty()).then(|| pairs[pick % pairs.len()])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn valid_histories_have_no_violation(h in history()) {
        let v = check(&h);
        prop_assert!(v.is_ok(), "{}", v);
    }

    #[test]
    fn an_injected_reorder_is_reported_as_reorder(h in history(), pick in any::<usize>()) {
        let mut h = h;
        let Some((a, b)) = same_key_pair(&h, pick) else { return Ok(()) };
        // Swap the two events' sequence numbers everywhere: the later one was delivered first.
        let (sa, sb) = (h.enqueued[a].seq, h.enqueued[b].seq);
        let swap = |s: &mut Seq| *s = if *s == sa { sb } else if *s == sb { sa } else { *s };
        h.enqueued.iter_mut().for_each(|e| swap(&mut e.seq));
        h.deliveries.iter_mut().for_each(|d| swap(&mut d.seq));
        h.acks.iter_mut().for_each(|x| swap(&mut x.seq));
        h.dead_letters.iter_mut().for_each(|x| swap(&mut x.seq));
        // Both were queued from the start, so the later one also went out past a queued head.
        prop_assert_eq!(violated(&h), vec![Kind::Reorder, Kind::Skip]);
    }

    #[test]
    fn an_injected_split_is_reported_as_split_key(h in history(), pick in any::<usize>()) {
        let mut h = h;
        let Some((_, b)) = same_key_pair(&h, pick) else { return Ok(()) };
        // Its producer routed one event elsewhere while the key's other events were queued.
        let p = h.enqueued[b].partition;
        h.enqueued[b].partition = PartitionId((p.0 + 1) % 4);
        prop_assert_eq!(violated(&h), vec![Kind::SplitKey]);
    }

    #[test]
    fn an_injected_loss_is_reported_as_lost(h in history(), pick in any::<usize>()) {
        let mut h = h;
        let seq = h.enqueued[pick % h.enqueued.len()].seq;
        h.deliveries.retain(|d| d.seq != seq || d.outcome != Outcome::Accepted);
        h.acks.retain(|a| a.seq != seq);
        h.dead_letters.retain(|d| d.seq != seq);
        prop_assert_eq!(violated(&h), vec![Kind::Lost]);
    }

    #[test]
    fn an_injected_stuck_head_is_reported_as_stall(h in history(), pick in any::<usize>()) {
        let mut h = h;
        // One event never left the queue, and the history ends long after it was enqueued. It
        // is the last of its key: were a later event of the key delivered past it, that would
        // be a skip too.
        let last: Vec<Seq> = h
            .enqueued
            .iter()
            .filter(|e| !h.enqueued.iter().any(|o| o.key == e.key && o.seq > e.seq))
            .map(|e| e.seq)
            .collect();
        let seq = last[pick % last.len()];
        h.deliveries.retain(|d| d.seq != seq || d.outcome != Outcome::Accepted);
        h.acks.retain(|a| a.seq != seq);
        h.dead_letters.retain(|d| d.seq != seq);
        h.queued_at_end.push(seq);
        h.end = h.end.saturating_add(std::time::Duration::from_secs(60));
        prop_assert_eq!(violated(&h), vec![Kind::Stall]);
    }

    #[test]
    fn a_head_passed_over_while_queued_is_reported_as_skip(h in history(), pick in any::<usize>()) {
        let mut h = h;
        let Some((a, b)) = same_key_pair(&h, pick) else { return Ok(()) };
        // A refused attempt of the later event, sent 1 ms before the earlier event's first
        // attempt (when the partition is idle): nothing is reordered, yet the head was passed
        // over while queued.
        let (sa, sb) = (h.enqueued[a].seq, h.enqueued[b].seq);
        let first_of_a = h.deliveries.iter().position(|d| d.seq == sa).expect("delivered");
        let at = Time(h.deliveries[first_of_a].sent_at.0 - std::time::Duration::from_millis(1));
        let mut early = h.deliveries.iter().find(|d| d.seq == sb).expect("delivered").clone();
        early.outcome = Outcome::Rejected("HTTP 503".into());
        early.sent_at = at;
        early.arrived_at = at;
        early.finished_at = Some(at);
        h.deliveries.insert(first_of_a, early);
        prop_assert_eq!(violated(&h), vec![Kind::Skip]);
    }

    #[test]
    fn an_injected_overlap_is_reported_as_concurrent(h in history(), pick in any::<usize>()) {
        let mut h = h;
        let n = h.deliveries.len();
        let pairs: Vec<(usize, usize)> = (0..n)
            .flat_map(|i| ((i + 1)..n).map(move |j| (i, j)))
            .filter(|&(i, j)| h.deliveries[i].partition == h.deliveries[j].partition && h.deliveries[i].seq != h.deliveries[j].seq)
            .collect();
        if pairs.is_empty() { return Ok(()) }
        let (i, j) = pairs[pick % pairs.len()];
        // The earlier delivery was still in flight when the later one was sent.
        h.deliveries[i].finished_at = Some(h.deliveries[j].sent_at.saturating_add(std::time::Duration::from_millis(1)));
        prop_assert_eq!(violated(&h), vec![Kind::Concurrent]);
    }
}
