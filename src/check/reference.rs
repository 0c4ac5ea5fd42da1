//! The rules as they were before each was made linear or n log n: the reference that the
//! property test in `tests.rs` compares the current rules with, verdict for verdict.

use std::collections::{BTreeMap, BTreeSet};

use super::history::{DeadLettered, Delivery, Enqueued, History, Outcome};
use super::Counterexample;
use crate::ids::{PartitionId, Seq, Time};

type Found = (u64, Option<Counterexample>);

/// Lookups shared by the rules, built once per history.
pub(super) struct Index<'h> {
    history: &'h History,
    events: BTreeMap<Seq, &'h Enqueued>,
    dead: BTreeMap<Seq, &'h DeadLettered>,
    /// Indices into `deliveries`, sorted by arrival time then observation order.
    arrival_order: Vec<usize>,
    /// When each row left the queue (first acknowledgement or dead-letter).
    resolved_at: BTreeMap<Seq, Time>,
}

impl<'h> Index<'h> {
    pub(super) fn new(history: &'h History) -> Self {
        let events = history.enqueued.iter().map(|e| (e.seq, e)).collect();
        let dead = history.dead_letters.iter().map(|d| (d.seq, d)).collect();
        let mut arrival_order: Vec<usize> = (0..history.deliveries.len()).collect();
        arrival_order.sort_by_key(|&i| (history.deliveries[i].arrived_at, i));
        let mut resolved_at = BTreeMap::new();
        let resolutions = history.acks.iter().map(|a| (a.seq, a.at));
        for (seq, at) in resolutions.chain(history.dead_letters.iter().map(|d| (d.seq, d.at))) {
            resolved_at.entry(seq).and_modify(|t: &mut Time| *t = (*t).min(at)).or_insert(at);
        }
        Self { history, events, dead, arrival_order, resolved_at }
    }

    fn arrivals(&self) -> impl Iterator<Item = &'h Delivery> + '_ {
        self.arrival_order.iter().map(|&i| &self.history.deliveries[i])
    }
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
    let mut seen = BTreeSet::new();
    let mut latest: BTreeMap<&str, &Delivery> = BTreeMap::new();
    for d in index.arrivals() {
        if d.outcome != Outcome::Accepted || !seen.insert(d.seq) {
            continue;
        }
        match latest.get(d.key.as_str()) {
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
            _ => {
                latest.insert(&d.key, d);
            }
        }
    }
    found
}

/// Redeliveries after acceptance; with `stale_only`, those that came after a later event.
pub(super) fn duplicates(index: &Index<'_>, stale_only: bool) -> Found {
    let mut found = (0, None);
    let mut accepted: BTreeMap<Seq, &Delivery> = BTreeMap::new();
    let mut max_seq: BTreeMap<&str, &Delivery> = BTreeMap::new();
    for d in index.arrivals() {
        if let Some(first) = accepted.get(&d.seq) {
            let later = max_seq.get(d.key.as_str()).filter(|m| m.seq > d.seq);
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
        if max_seq.get(d.key.as_str()).is_none_or(|m| m.seq < d.seq) {
            max_seq.insert(&d.key, d);
        }
    }
    found
}

/// Events neither accepted by an endpoint nor dead-lettered, and no longer queued.
pub(super) fn lost(index: &Index<'_>) -> Found {
    let queued: BTreeSet<Seq> = index.history.queued_at_end.iter().copied().collect();
    let accepted: BTreeSet<Seq> = index
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
    let mut attempts: BTreeMap<Seq, Vec<&Delivery>> = BTreeMap::new();
    for d in &history.deliveries {
        attempts.entry(d.seq).or_default().push(d);
    }
    let mut failing: BTreeSet<&str> = BTreeSet::new();
    let mut blocked: BTreeMap<PartitionId, Vec<(Time, Time)>> = BTreeMap::new();
    for (seq, ds) in &mut attempts {
        ds.sort_by_key(|d| d.sent_at);
        for (i, d) in ds.iter().enumerate() {
            let next = ds.get(i + 1).map(|n| n.sent_at);
            if matches!(d.outcome, Outcome::Accepted) && next.is_none() {
                continue;
            }
            failing.insert(d.key.as_str());
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
    let mut healthy: BTreeMap<&str, Vec<&Enqueued>> = BTreeMap::new();
    for e in history.enqueued.iter().filter(|e| !failing.contains(e.key.as_str())) {
        healthy.entry(e.key.as_str()).or_default().push(e);
    }
    let (mut total, mut longest) = (std::time::Duration::ZERO, None);
    for events in healthy.values_mut() {
        events.sort_by_key(|e| e.seq);
        let mut previous = Time::ZERO;
        for e in events.iter() {
            let Some(sent) = attempts.get(&e.seq).and_then(|ds| ds.first()).map(|d| d.sent_at)
            else {
                continue;
            };
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

/// The time within `from..to` covered by `spans` (sorted, possibly overlapping).
fn overlap(spans: &[(Time, Time)], from: Time, to: Time) -> std::time::Duration {
    let (mut covered, mut reached) = (std::time::Duration::ZERO, from);
    for &(a, b) in spans {
        let (a, b) = (a.max(reached), b.min(to));
        if b > a {
            covered += b.saturating_since(a);
            reached = b;
        }
    }
    covered
}

/// Dead-lettered events followed by a delivery of a later event of their key.
pub(super) fn gaps(index: &Index<'_>) -> Found {
    let mut found = (0, None);
    let mut by_time: Vec<&DeadLettered> = index.history.dead_letters.iter().collect();
    by_time.sort_by_key(|d| (d.at, d.seq));
    for dl in by_time {
        let Some(ev) = index.events.get(&dl.seq) else { continue };
        let next =
            index.arrivals().find(|d| d.key == ev.key && d.seq > dl.seq && d.arrived_at >= dl.at);
        if let Some(next) = next {
            record(&mut found, || {
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
        let mut active: Vec<usize> = Vec::new();
        for i in list {
            let d = &deliveries[i];
            active.retain(|&a| deliveries[a].end() > d.sent_at);
            if let Some(&other) = active.first() {
                hits.push((d.sent_at, other, i));
            }
            active.push(i);
        }
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
    let mut by_key: BTreeMap<&str, Vec<&Enqueued>> = BTreeMap::new();
    for e in index.events.values() {
        by_key.entry(&e.key).or_default().push(e);
    }
    let mut hits: Vec<(Time, Counterexample)> = Vec::new();
    for (key, events) in by_key {
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
fn cross_layout_split(
    index: &Index<'_>,
    key: &str,
    events: &[&Enqueued],
) -> Option<(Time, Counterexample)> {
    if events.iter().all(|e| e.layout == events[0].layout) {
        return None;
    }
    for d in index.arrivals().filter(|d| d.key == key) {
        let Some(e) = index.events.get(&d.seq) else { continue };
        let t = d.arrived_at;
        let older = events.iter().find(|o| {
            o.layout < e.layout && o.partition != d.partition && o.at <= t && resolved(index, o) > t
        });
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
        let mut first: BTreeMap<Seq, Time> = BTreeMap::new();
        for d in history.deliveries.iter().filter(|d| d.outcome == Outcome::Accepted) {
            first.entry(d.seq).and_modify(|t| *t = (*t).min(d.arrived_at)).or_insert(d.arrived_at);
        }
        first
    };
    let queued_at_end: BTreeSet<Seq> = history.queued_at_end.iter().copied().collect();
    // (time, order, what): at one instant, rows enter, then leave, then deliveries are judged.
    enum Step<'a> {
        Enter(&'a Enqueued),
        Leave(&'a Enqueued),
        Send(&'a Delivery),
    }
    let mut steps: Vec<(Time, u8, usize, Step<'_>)> = Vec::new();
    let mut left_at: BTreeMap<Seq, Time> = BTreeMap::new();
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
    let mut queued: BTreeMap<&str, BTreeSet<Seq>> = BTreeMap::new();
    let mut counted: BTreeSet<Seq> = BTreeSet::new();
    let mut found = (0, None);
    for (_, _, _, step) in steps {
        match step {
            Step::Enter(e) => {
                queued.entry(e.key.as_str()).or_default().insert(e.seq);
            }
            Step::Leave(e) => {
                if let Some(set) = queued.get_mut(e.key.as_str()) {
                    set.remove(&e.seq);
                }
            }
            Step::Send(d) => {
                let head = queued.get(d.key.as_str()).and_then(|s| s.first().copied());
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
