//! One function per finding kind. Each returns the count and the first counterexample in time.
//! Every collection iterated is a `BTreeMap`, a sorted `Vec` or a `Vec` indexed by key id (keys
//! numbered in their string order), so results never depend on hash order: the hash maps and
//! sets are only looked up.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use super::fast_hash::{FastMap, FastSet};
use super::history::{DeadLettered, Delivery, Enqueued, History, Outcome};
use super::Counterexample;
use crate::ids::{PartitionId, Seq, Time};

type Found = (u64, Option<Counterexample>);

/// Lookups shared by the rules, built once per history.
pub(super) struct Index<'h> {
    history: &'h History,
    events: BTreeMap<Seq, &'h Enqueued>,
    dead: FastMap<Seq, &'h DeadLettered>,
    /// Every key of the history, numbered in string order.
    keys: FastMap<&'h str, usize>,
    /// Indices into `deliveries`, sorted by arrival time then observation order.
    arrival_order: Vec<usize>,
    /// When each row left the queue (first acknowledgement or dead-letter).
    resolved_at: FastMap<Seq, Time>,
    /// Each key's deliveries in arrival order, by key id.
    key_arrivals: Vec<Vec<&'h Delivery>>,
}

impl<'h> Index<'h> {
    pub(super) fn new(history: &'h History) -> Self {
        let events = history.enqueued.iter().map(|e| (e.seq, e)).collect();
        let dead = history.dead_letters.iter().map(|d| (d.seq, d)).collect();
        let mut arrival_order: Vec<usize> = (0..history.deliveries.len()).collect();
        arrival_order.sort_by_key(|&i| (history.deliveries[i].arrived_at, i));
        let mut resolved_at = FastMap::default();
        let resolutions = history.acks.iter().map(|a| (a.seq, a.at));
        for (seq, at) in resolutions.chain(history.dead_letters.iter().map(|d| (d.seq, d.at))) {
            resolved_at.entry(seq).and_modify(|t: &mut Time| *t = (*t).min(at)).or_insert(at);
        }
        let keys = key_ids(history);
        let mut key_arrivals: Vec<Vec<&Delivery>> = vec![Vec::new(); keys.len()];
        for &i in &arrival_order {
            let d = &history.deliveries[i];
            key_arrivals[keys[d.key.as_str()]].push(d);
        }
        Self { history, events, dead, keys, arrival_order, resolved_at, key_arrivals }
    }

    /// The id of `key`, a key of the history.
    fn key(&self, key: &str) -> usize {
        self.keys[key]
    }

    fn arrivals(&self) -> impl Iterator<Item = &'h Delivery> + '_ {
        self.arrival_order.iter().map(|&i| &self.history.deliveries[i])
    }
}

/// The keys of the enqueues and deliveries, numbered in string order.
fn key_ids(history: &History) -> FastMap<&str, usize> {
    let mut seen: FastSet<&str> = FastSet::default();
    let names = history.enqueued.iter().map(|e| e.key.as_str());
    let mut distinct: Vec<&str> = names
        .chain(history.deliveries.iter().map(|d| d.key.as_str()))
        .filter(|k| seen.insert(k))
        .collect();
    distinct.sort_unstable();
    distinct.into_iter().enumerate().map(|(i, k)| (k, i)).collect()
}

fn example(
    key: &str,
    partitions: Vec<PartitionId>,
    items: &[(&str, Seq, Time)],
    note: String,
) -> Counterexample {
    Counterexample {
        key: key.to_owned(),
        partitions,
        event_ids: items.iter().map(|(id, _, _)| (*id).to_owned()).collect(),
        seqs: items.iter().map(|(_, s, _)| *s).collect(),
        times: items.iter().map(|(_, _, t)| *t).collect(),
        note,
    }
}

fn record(found: &mut Found, make: impl FnOnce() -> Counterexample) {
    found.0 += 1;
    if found.1.is_none() {
        found.1 = Some(make());
    }
}

/// First accepted deliveries per key must come in seq order. A rejected attempt is not a
/// delivery the receiver acted on: what it acted on, and in which order, is what counts.
pub(super) fn reorder(index: &Index<'_>) -> Found {
    let mut found = (0, None);
    let mut seen = FastSet::default();
    let mut latest: Vec<Option<&Delivery>> = vec![None; index.keys.len()];
    for d in index.arrivals() {
        if d.outcome != Outcome::Accepted || !seen.insert(d.seq) {
            continue;
        }
        let slot = &mut latest[index.key(&d.key)];
        match *slot {
            Some(later) if later.seq > d.seq => record(&mut found, || {
                example(
                    &d.key,
                    vec![later.partition, d.partition],
                    &[
                        (&later.event_id, later.seq, later.arrived_at),
                        (&d.event_id, d.seq, d.arrived_at),
                    ],
                    format!(
                        "seq {} was first accepted at {}, after seq {} of the same key at {}",
                        d.seq, d.arrived_at, later.seq, later.arrived_at
                    ),
                )
            }),
            _ => *slot = Some(d),
        }
    }
    found
}

/// Redeliveries after acceptance; with `stale_only`, those that came after a later event.
pub(super) fn duplicates(index: &Index<'_>, stale_only: bool) -> Found {
    let mut found = (0, None);
    let mut accepted: FastMap<Seq, &Delivery> = FastMap::default();
    let mut max_seq: Vec<Option<&Delivery>> = vec![None; index.keys.len()];
    for d in index.arrivals() {
        let k = index.key(&d.key);
        if let Some(first) = accepted.get(&d.seq) {
            let later = max_seq[k].filter(|m| m.seq > d.seq);
            if !stale_only || later.is_some() {
                record(&mut found, || {
                    let mut items = vec![(first.event_id.as_str(), first.seq, first.arrived_at)];
                    items.push((&d.event_id, d.seq, d.arrived_at));
                    let mut note = format!(
                        "seq {} accepted at {} arrived again at {}",
                        d.seq, first.arrived_at, d.arrived_at
                    );
                    if let Some(l) = later {
                        items.push((&l.event_id, l.seq, l.arrived_at));
                        note.push_str(&format!(", after seq {} at {}", l.seq, l.arrived_at));
                    }
                    example(&d.key, vec![first.partition, d.partition], &items, note)
                });
            }
        }
        if d.outcome == Outcome::Accepted {
            accepted.entry(d.seq).or_insert(d);
        }
        if max_seq[k].is_none_or(|m| m.seq < d.seq) {
            max_seq[k] = Some(d);
        }
    }
    found
}

/// Events neither accepted by an endpoint nor dead-lettered, and no longer queued.
pub(super) fn lost(index: &Index<'_>) -> Found {
    let queued: FastSet<Seq> = index.history.queued_at_end.iter().copied().collect();
    let accepted: FastSet<Seq> = index
        .history
        .deliveries
        .iter()
        .filter(|d| d.outcome == Outcome::Accepted)
        .map(|d| d.seq)
        .collect();
    let mut found = (0, None);
    for e in index.events.values() {
        if !accepted.contains(&e.seq)
            && !index.dead.contains_key(&e.seq)
            && !queued.contains(&e.seq)
        {
            record(&mut found, || {
                example(
                    &e.key,
                    vec![e.partition],
                    &[(&e.event_id, e.seq, e.at)],
                    format!(
                        "seq {} enqueued at {} was neither delivered nor dead-lettered",
                        e.seq, e.at
                    ),
                )
            });
        }
    }
    found
}

/// Partitions whose head, still queued at the end, was enqueued more than `bound` before it.
/// Each partition counts once; the counterexample names the head and its wait.
pub(super) fn stalls(index: &Index<'_>, bound: std::time::Duration) -> Found {
    let end = index.history.end;
    let mut heads: BTreeMap<PartitionId, &Enqueued> = BTreeMap::new();
    for seq in &index.history.queued_at_end {
        let Some(e) = index.events.get(seq) else { continue };
        heads
            .entry(e.partition)
            .and_modify(|h| *h = if e.seq < h.seq { e } else { h })
            .or_insert(e);
    }
    let mut found = (0, None);
    for (p, head) in heads {
        let waited = end.saturating_since(head.at);
        if waited > bound {
            record(&mut found, || {
                example(
                    &head.key,
                    vec![p],
                    &[(&head.event_id, head.seq, head.at)],
                    format!(
                        "partition {p}: head seq {} had waited {:.1}s at the end (bound {:.1}s)",
                        head.seq,
                        waited.as_secs_f64(),
                        bound.as_secs_f64()
                    ),
                )
            });
        }
    }
    found
}

/// How long events of healthy keys waited behind a failing key of their partition, in ms.
///
/// An attempt failed when it was refused or the same event was sent again after it. A key with
/// a failed attempt is failing; the others are healthy. A partition is blocked from a failed
/// attempt's answer to that event's next attempt (or its resolution, or the end), except while
/// it has a delivery out (then it is busy, not blocked: waiting behind a delivery in progress
/// is the cost of one-in-flight, not of a failing key). An event of a
/// healthy key is next in line from its enqueue or its key's previous resolution, whichever is
/// later, to its first send; the count is the sum, over those events, of the blocked time of
/// their partition within that span. The counterexample is the longest single wait.
pub(super) fn head_of_line(index: &Index<'_>) -> Found {
    let history = index.history;
    // Each event's attempts in send order (observation order at equal sends), events by seq.
    let mut by_seq: Vec<&Delivery> = history.deliveries.iter().collect();
    by_seq.sort_by_key(|d| (d.seq, d.sent_at));
    let mut first_sent: FastMap<Seq, Time> = FastMap::default();
    let mut failing = vec![false; index.keys.len()];
    let mut blocked: BTreeMap<PartitionId, Vec<(Time, Time)>> = BTreeMap::new();
    for ds in by_seq.chunk_by(|a, b| a.seq == b.seq) {
        let seq = &ds[0].seq;
        first_sent.insert(*seq, ds[0].sent_at);
        for (i, d) in ds.iter().enumerate() {
            let next = ds.get(i + 1).map(|n| n.sent_at);
            if matches!(d.outcome, Outcome::Accepted) && next.is_none() {
                continue;
            }
            failing[index.key(&d.key)] = true;
            let from = d.finished_at.unwrap_or(d.arrived_at);
            let to = next.or_else(|| index.resolved_at.get(seq).copied()).unwrap_or(history.end);
            if to > from {
                blocked.entry(d.partition).or_default().push((from, to));
            }
        }
    }
    let mut busy: BTreeMap<PartitionId, Vec<(Time, Time)>> = BTreeMap::new();
    for d in &history.deliveries {
        busy.entry(d.partition)
            .or_default()
            .push((d.sent_at, d.finished_at.unwrap_or(d.arrived_at)));
    }
    for (p, spans) in blocked.iter_mut() {
        let out = busy.get_mut(p).map(|b| merge(std::mem::take(b))).unwrap_or_default();
        *spans = subtract(merge(std::mem::take(spans)), &out);
    }
    let mut healthy: Vec<Vec<&Enqueued>> = vec![Vec::new(); index.keys.len()];
    for e in &history.enqueued {
        let k = index.key(&e.key);
        if !failing[k] {
            healthy[k].push(e);
        }
    }
    let (mut total, mut longest) = (std::time::Duration::ZERO, None);
    for events in &mut healthy {
        events.sort_by_key(|e| e.seq);
        let mut previous = Time::ZERO;
        for e in events.iter() {
            let Some(&sent) = first_sent.get(&e.seq) else { continue };
            let ready = e.at.max(previous);
            previous = index.resolved_at.get(&e.seq).copied().unwrap_or(sent);
            let spans = blocked.get(&e.partition).map_or(&[][..], Vec::as_slice);
            let waited = overlap(spans, ready, sent);
            total += waited;
            if !waited.is_zero() && longest.is_none_or(|(w, _)| waited > w) {
                longest = Some((waited, *e));
            }
        }
    }
    let first = longest.map(|(waited, e)| {
        example(
            &e.key,
            vec![e.partition],
            &[(&e.event_id, e.seq, e.at)],
            format!(
                "partition {}: seq {} of a healthy key waited {} ms behind a failing key",
                e.partition,
                e.seq,
                waited.as_millis()
            ),
        )
    });
    (total.as_millis() as u64, first)
}

/// `spans` sorted and merged where they overlap or touch.
fn merge(mut spans: Vec<(Time, Time)>) -> Vec<(Time, Time)> {
    spans.sort();
    let mut out: Vec<(Time, Time)> = Vec::with_capacity(spans.len());
    for (a, b) in spans {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The parts of `spans` outside `holes` (both merged).
fn subtract(spans: Vec<(Time, Time)>, holes: &[(Time, Time)]) -> Vec<(Time, Time)> {
    let mut out = Vec::new();
    let mut h = 0;
    for (mut a, b) in spans {
        while h < holes.len() && holes[h].1 <= a {
            h += 1;
        }
        let mut i = h;
        while i < holes.len() && holes[i].0 < b {
            if holes[i].0 > a {
                out.push((a, holes[i].0));
            }
            a = a.max(holes[i].1);
            i += 1;
        }
        if b > a {
            out.push((a, b));
        }
    }
    out
}

/// The time within `from..to` covered by `spans` (sorted and disjoint).
///
/// `spans` come from [`subtract`], so both their starts and their ends increase: the search
/// starts at the first span ending after `from` and stops at the first starting at `to`.
fn overlap(spans: &[(Time, Time)], from: Time, to: Time) -> std::time::Duration {
    let (mut covered, mut reached) = (std::time::Duration::ZERO, from);
    let first = spans.partition_point(|&(_, b)| b <= from);
    for &(a, b) in spans[first..].iter().take_while(|&&(a, _)| a < to) {
        let (a, b) = (a.max(reached), b.min(to));
        if b > a {
            covered += b.saturating_since(a);
            reached = b;
        }
    }
    covered
}

/// Dead-lettered events followed by a delivery of a later event of their key.
///
/// Each key's arrivals, in arrival order, carry the highest seq from each one to the last: a
/// dead letter is followed when that maximum, from its first arrival at or after it, is above
/// its seq. Only the first counterexample scans for the delivery that follows.
pub(super) fn gaps(index: &Index<'_>) -> Found {
    let by_key = &index.key_arrivals;
    let later_max: Vec<Vec<Seq>> = by_key
        .iter()
        .map(|ds| {
            let mut max = Vec::with_capacity(ds.len());
            let mut m = Seq(i64::MIN);
            for d in ds.iter().rev() {
                m = m.max(d.seq);
                max.push(m);
            }
            max.reverse();
            max
        })
        .collect();
    let mut found = (0, None);
    let mut by_time: Vec<&DeadLettered> = index.history.dead_letters.iter().collect();
    by_time.sort_by_key(|d| (d.at, d.seq));
    for dl in by_time {
        let Some(ev) = index.events.get(&dl.seq) else { continue };
        let k = index.key(&ev.key);
        let (ds, max) = (&by_key[k], &later_max[k]);
        let from = ds.partition_point(|d| d.arrived_at < dl.at);
        if max.get(from).is_none_or(|m| *m <= dl.seq) {
            continue;
        }
        record(&mut found, || {
            let next =
                ds[from..].iter().find(|d| d.seq > dl.seq).expect("the maximum says one follows");
            example(
                &ev.key,
                vec![ev.partition],
                &[(&ev.event_id, dl.seq, dl.at), (&next.event_id, next.seq, next.arrived_at)],
                format!(
                    "seq {} was dead-lettered at {} ({}); seq {} followed",
                    dl.seq, dl.at, dl.reason, next.seq
                ),
            )
        });
    }
    found
}

/// Overlapping deliveries from one partition, of different events or of the same event by two
/// workers at once (one worker never has two deliveries out).
pub(super) fn concurrent(index: &Index<'_>) -> Found {
    let deliveries = &index.history.deliveries;
    let mut by_partition: BTreeMap<PartitionId, Vec<usize>> = BTreeMap::new();
    for (i, d) in deliveries.iter().enumerate() {
        by_partition.entry(d.partition).or_default().push(i);
    }
    let mut hits: Vec<(Time, usize, usize)> = Vec::new();
    for mut list in by_partition.into_values() {
        list.sort_by_key(|&i| (deliveries[i].sent_at, i));
        hits.extend(overlaps(deliveries, &list));
    }
    hits.sort();
    let mut found = (0, None);
    for (_, a, b) in hits {
        let (a, b) = (&deliveries[a], &deliveries[b]);
        record(&mut found, || {
            example(
                &b.key,
                vec![a.partition],
                &[(&a.event_id, a.seq, a.sent_at), (&b.event_id, b.seq, b.sent_at)],
                format!(
                    "partition {}: seq {} was sent at {} while seq {} (sent at {}) was still in flight until {}",
                    a.partition, b.seq, b.sent_at, a.seq, a.sent_at, a.end()
                ),
            )
        });
    }
    found
}

/// Keys live on two partitions at once. Each key counts once. Within one layout, being queued
/// on two partitions at the same time is a split. Across layouts (a modulus change), a key may
/// be queued on its old and new partitions while a barrier holds the new rows back; it is a
/// split only if a newer-layout event is delivered while an older-layout event of the key is
/// still queued on another partition.
pub(super) fn split_keys(index: &Index<'_>) -> Found {
    let mut by_key: Vec<Vec<&Enqueued>> = vec![Vec::new(); index.keys.len()];
    for e in index.events.values() {
        by_key[index.key(&e.key)].push(e);
    }
    let mut hits: Vec<(Time, Counterexample)> = Vec::new();
    for events in by_key {
        let Some(first) = events.first() else { continue };
        let key = first.key.as_str();
        if events.iter().all(|e| e.partition == events[0].partition) {
            continue;
        }
        let hit = same_layout_split(index, key, &events)
            .or_else(|| cross_layout_split(index, key, &events));
        hits.extend(hit);
    }
    hits.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.key.cmp(&b.1.key)));
    let count = hits.len() as u64;
    (count, hits.into_iter().next().map(|(_, c)| c))
}

fn resolved(index: &Index<'_>, e: &Enqueued) -> Time {
    index.resolved_at.get(&e.seq).copied().unwrap_or(Time(std::time::Duration::MAX))
}

/// The first moment one layout has the key queued on two partitions.
fn same_layout_split(
    index: &Index<'_>,
    key: &str,
    events: &[&Enqueued],
) -> Option<(Time, Counterexample)> {
    // Sweep: at equal times a row leaving (false) sorts before a row arriving (true).
    let mut points: Vec<(Time, bool, &Enqueued)> = Vec::new();
    for e in events {
        points.push((e.at, true, e));
        points.push((resolved(index, e), false, e));
    }
    points.sort_by_key(|(t, arriving, e)| (*t, *arriving, e.seq));
    let mut active: BTreeMap<(u64, PartitionId), Vec<&Enqueued>> = BTreeMap::new();
    for (t, arriving, e) in points {
        let slot = (e.layout, e.partition);
        if !arriving {
            if let Some(list) = active.get_mut(&slot) {
                list.retain(|x| x.seq != e.seq);
            }
            continue;
        }
        let other = active
            .iter()
            .find(|((l, p), list)| *l == e.layout && *p != e.partition && !list.is_empty());
        if let Some(((_, p), list)) = other {
            let o = list[0];
            let note = format!(
                "key queued on partition {} (seq {}) when seq {} was enqueued on partition {}",
                p, o.seq, e.seq, e.partition
            );
            let items = [(o.event_id.as_str(), o.seq, o.at), (e.event_id.as_str(), e.seq, e.at)];
            return Some((t, example(key, vec![*p, e.partition], &items, note)));
        }
        active.entry(slot).or_default().push(e);
    }
    None
}

/// The first delivery of a newer-layout event while an older-layout one is queued elsewhere.
///
/// A sweep over the key's arrivals: the key's rows enter the queued set at their enqueue and
/// leave it at their resolution, and each arrival looks through the rows queued then, lowest
/// seq first.
fn cross_layout_split(
    index: &Index<'_>,
    key: &str,
    events: &[&Enqueued],
) -> Option<(Time, Counterexample)> {
    if events.iter().all(|e| e.layout == events[0].layout) {
        return None;
    }
    let mut entering: Vec<&Enqueued> = events.to_vec();
    entering.sort_by_key(|e| (e.at, e.seq));
    let mut leaving: Vec<&Enqueued> = events.to_vec();
    leaving.sort_by_key(|e| (resolved(index, e), e.seq));
    let (mut next_in, mut next_out) = (0, 0);
    let mut queued: BTreeMap<Seq, &Enqueued> = BTreeMap::new();
    for d in &index.key_arrivals[index.key(key)] {
        let t = d.arrived_at;
        while let Some(o) = entering.get(next_in).filter(|o| o.at <= t) {
            if resolved(index, o) > t {
                queued.insert(o.seq, o);
            }
            next_in += 1;
        }
        while let Some(o) = leaving.get(next_out).filter(|o| resolved(index, o) <= t) {
            queued.remove(&o.seq);
            next_out += 1;
        }
        let Some(e) = index.events.get(&d.seq) else { continue };
        let older = queued.values().find(|o| o.layout < e.layout && o.partition != d.partition);
        if let Some(o) = older {
            let note = format!(
                "seq {} (layout {}) was delivered from partition {} while seq {} (layout {}) was still queued on partition {}",
                e.seq, e.layout, d.partition, o.seq, o.layout, o.partition
            );
            let items = [(o.event_id.as_str(), o.seq, o.at), (e.event_id.as_str(), e.seq, t)];
            return Some((t, example(key, vec![o.partition, d.partition], &items, note)));
        }
    }
    None
}

/// Deliveries of a later event of a key while an earlier event of that key was still queued.
///
/// An event is queued from its enqueue until it leaves: its first accepted arrival, its
/// acknowledgement or its dead-letter, whichever comes first; an event listed as queued at the
/// end never leaves. An event that never left and is not queued at the end is lost (its own
/// finding) and is not judged here: when it left the queue is unknown. A delivery skips when,
/// at the moment it was sent, its key had a queued event with a lower seq. Any attempt counts,
/// accepted or refused: the worker should not have sent it. Each skipping event counts once;
/// the counterexample names the earlier event and how it left.
pub(super) fn skips(index: &Index<'_>) -> Found {
    let history = index.history;
    let accepted_at = {
        let mut first: FastMap<Seq, Time> = FastMap::default();
        for d in history.deliveries.iter().filter(|d| d.outcome == Outcome::Accepted) {
            first.entry(d.seq).and_modify(|t| *t = (*t).min(d.arrived_at)).or_insert(d.arrived_at);
        }
        first
    };
    let queued_at_end: FastSet<Seq> = history.queued_at_end.iter().copied().collect();
    // (time, order, what): at one instant, rows enter, then leave, then deliveries are judged.
    enum Step<'a> {
        Enter(&'a Enqueued),
        Leave(&'a Enqueued),
        Send(&'a Delivery),
    }
    let mut steps: Vec<(Time, u8, usize, Step<'_>)> = Vec::new();
    let mut left_at: FastMap<Seq, Time> = FastMap::default();
    for (n, e) in index.events.values().enumerate() {
        let left = [accepted_at.get(&e.seq), index.resolved_at.get(&e.seq)]
            .into_iter()
            .flatten()
            .copied()
            .min();
        match left {
            Some(t) if t < e.at => continue,
            Some(t) => {
                left_at.insert(e.seq, t);
                steps.push((t, 1, n, Step::Leave(e)));
            }
            None if queued_at_end.contains(&e.seq) => {}
            None => continue,
        }
        steps.push((e.at, 0, n, Step::Enter(e)));
    }
    for (n, d) in history.deliveries.iter().enumerate() {
        steps.push((d.sent_at, 2, n, Step::Send(d)));
    }
    steps.sort_by_key(|(t, order, n, _)| (*t, *order, *n));
    let mut queued: Vec<BTreeSet<Seq>> = vec![BTreeSet::new(); index.keys.len()];
    let mut counted: FastSet<Seq> = FastSet::default();
    let mut found = (0, None);
    for (_, _, _, step) in steps {
        match step {
            Step::Enter(e) => {
                queued[index.key(&e.key)].insert(e.seq);
            }
            Step::Leave(e) => {
                queued[index.key(&e.key)].remove(&e.seq);
            }
            Step::Send(d) => {
                let head = queued[index.key(&d.key)].first().copied();
                let Some(head) = head.filter(|h| *h < d.seq) else { continue };
                if !counted.insert(d.seq) {
                    continue;
                }
                let Some(e) = index.events.get(&head) else { continue };
                let how = match (left_at.get(&head), index.dead.get(&head)) {
                    (Some(t), Some(dl)) if dl.at == *t => format!("dead-lettered at {t}"),
                    (Some(t), _) => format!("delivered at {t}"),
                    (None, _) => "still queued at the end".to_owned(),
                };
                record(&mut found, || {
                    example(
                        &d.key,
                        vec![e.partition, d.partition],
                        &[(&e.event_id, e.seq, e.at), (&d.event_id, d.seq, d.sent_at)],
                        format!(
                            "seq {} was sent at {} while seq {} (enqueued at {}) was still queued: it was {how}",
                            d.seq, d.sent_at, e.seq, e.at
                        ),
                    )
                });
            }
        }
    }
    found
}

/// Deliveries sent before their event's enqueue by more than `skew`, or of an event whose
/// enqueue rolled back. Each event counts once; the counterexample is the earliest such send
/// (observation order at equal times).
pub(super) fn premature(index: &Index<'_>, skew: std::time::Duration) -> Found {
    let aborted: FastMap<Seq, &Enqueued> =
        index.history.aborted.iter().map(|e| (e.seq, e)).collect();
    let mut hits: Vec<(Time, usize, &Delivery, &Enqueued, bool)> = Vec::new();
    for (n, d) in index.history.deliveries.iter().enumerate() {
        if let Some(e) = aborted.get(&d.seq) {
            hits.push((d.sent_at, n, d, e, true));
        } else if let Some(e) = index.events.get(&d.seq) {
            if d.sent_at.saturating_add(skew) < e.at {
                hits.push((d.sent_at, n, d, e, false));
            }
        }
    }
    hits.sort_by_key(|(t, n, ..)| (*t, *n));
    let mut counted: FastSet<Seq> = FastSet::default();
    let mut found = (0, None);
    for (_, _, d, e, rolled_back) in hits {
        if !counted.insert(d.seq) {
            continue;
        }
        record(&mut found, || {
            let note = if rolled_back {
                format!(
                    "seq {} was sent at {} although its enqueue rolled back at {}",
                    d.seq, d.sent_at, e.at
                )
            } else {
                format!(
                    "seq {} was sent at {}, before it was enqueued at {} (clock-skew tolerance {} ms)",
                    d.seq,
                    d.sent_at,
                    e.at,
                    skew.as_secs_f64() * 1000.0
                )
            };
            let items =
                [(e.event_id.as_str(), e.seq, e.at), (d.event_id.as_str(), d.seq, d.sent_at)];
            example(&d.key, vec![e.partition, d.partition], &items, note)
        });
    }
    found
}

/// Overlapping deliveries of one key, whatever their partitions: a delivery sent while an
/// earlier one of its key (another event, or the same one by another worker) had not ended.
/// From a receiver's log, sent is the arrival and the end is the answer.
pub(super) fn concurrent_key(index: &Index<'_>) -> Found {
    let deliveries = &index.history.deliveries;
    let mut by_key: Vec<Vec<usize>> = vec![Vec::new(); index.keys.len()];
    for (i, d) in deliveries.iter().enumerate() {
        by_key[index.key(&d.key)].push(i);
    }
    let mut hits: Vec<(Time, usize, usize)> = Vec::new();
    for list in &mut by_key {
        list.sort_by_key(|&i| (deliveries[i].sent_at, i));
        hits.extend(overlaps(deliveries, list));
    }
    hits.sort();
    let mut found = (0, None);
    for (_, a, b) in hits {
        let (a, b) = (&deliveries[a], &deliveries[b]);
        record(&mut found, || {
            example(
                &b.key,
                vec![a.partition, b.partition],
                &[(&a.event_id, a.seq, a.sent_at), (&b.event_id, b.seq, b.sent_at)],
                format!(
                    "seq {} was sent at {} while seq {} of the same key (sent at {}) was still in flight until {}",
                    b.seq, b.sent_at, a.seq, a.sent_at, a.end()
                ),
            )
        });
    }
    found
}

/// For deliveries `list` in send order, each one sent while an earlier one had not ended, with
/// the earliest such: `(sent, earlier, later)`.
fn overlaps(deliveries: &[Delivery], list: &[usize]) -> Vec<(Time, usize, usize)> {
    let mut hits = Vec::new();
    // The deliveries still in flight, by send order, and the same by end to retire them.
    let mut active: BTreeSet<usize> = BTreeSet::new();
    let mut ends: BinaryHeap<Reverse<(Time, usize)>> = BinaryHeap::new();
    for (n, i) in list.iter().copied().enumerate() {
        let d = &deliveries[i];
        while let Some(Reverse((end, m))) = ends.peek().copied() {
            if end > d.sent_at {
                break;
            }
            ends.pop();
            active.remove(&m);
        }
        if let Some(&other) = active.first() {
            hits.push((d.sent_at, list[other], i));
        }
        active.insert(n);
        ends.push(Reverse((d.end(), n)));
    }
    hits
}
