//! Histories as JSON lines, so that the checker can judge a run of any system: one record a
//! line, each an object with a `"type"`. Times are milliseconds (fractions allowed) on one clock
//! of the writer's choosing, Unix time or time since start.
//!
//! - `enqueued`: `event_id`, `key`, `seq` (or `order`: the event's position among its key's
//!   events), `at_ms`; optional `partition` and `layout`.
//! - `delivery`: `event_id`, `key`, `outcome` (`"accepted"` or `"rejected"`), at least one of
//!   `sent_ms` and `arrived_ms`; optional `answered_ms` (absent: never answered), `partition`,
//!   `worker`, `attempt`, `reason`, and `seq`/`order` (required without `enqueued` records).
//! - `dead_letter`: `event_id`, `at_ms`, optional `reason`. `ack`: `event_id`, `at_ms`.
//! - `end`: `at_ms`, optional `queued` (event ids still in the queue at the end: stuck, not
//!   lost).
//!
//! [`parse`] judges the full format (every delivered event has an `enqueued` record);
//! [`parse_receiver`] takes only what an endpoint can log (`delivery` records with arrival,
//! answer, event id, key and seq) and says which kinds it cannot judge.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::fast_hash::{FastMap, FastSet};
use super::history::{Acked, DeadLettered, Delivery, Enqueued, History, Outcome};
use super::Kind;
use crate::ids::{PartitionId, Seq, Time};

/// What is wrong with a history file.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// A line is not a record, or a record is inconsistent with the others.
    #[error("line {line}: {what}")]
    Line {
        /// The line, counting from 1.
        line: usize,
        /// What is wrong with it.
        what: String,
    },
    /// The file holds no record at all.
    #[error("the history holds no record (an empty file, or only blank lines)")]
    Empty,
    /// The file could not be read.
    #[error("reading the history: {0}")]
    Io(#[from] std::io::Error),
}

/// An endpoint's answer, as written in a `delivery` record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordOutcome {
    /// A 2xx: the endpoint has the event.
    Accepted,
    /// Anything else: a non-2xx status, a timeout, a broken connection.
    Rejected,
}

/// One line of a history file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// An event committed into the queue.
    Enqueued {
        /// The event's id: what the other records name it by.
        event_id: String,
        /// Its partition key.
        key: String,
        /// Its sequence number (unique, increasing per key).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<i64>,
        /// Its position among its key's events, when there is no sequence number.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order: Option<i64>,
        /// The partition it was routed to, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<u16>,
        /// The layout (partition-count epoch) it was routed under.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layout: Option<u64>,
        /// When it became visible (its commit), or when the writer first saw it.
        at_ms: f64,
    },
    /// One delivery attempt.
    Delivery {
        /// The event's id.
        event_id: String,
        /// Its partition key.
        key: String,
        /// Its sequence number, if the writer knows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<i64>,
        /// Its position among its key's events, when there is no sequence number.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order: Option<i64>,
        /// The partition it was delivered from, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<u16>,
        /// The delivering worker, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<String>,
        /// The attempt number, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        /// When the worker sent it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sent_ms: Option<f64>,
        /// When the endpoint received it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arrived_ms: Option<f64>,
        /// When the answer was given (or the worker stopped waiting); absent if never.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered_ms: Option<f64>,
        /// The answer.
        outcome: RecordOutcome,
        /// What the answer was, for a rejection (`"HTTP 503"`, `"timed out"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// An enqueue that rolled back (the producer's transaction aborted): the event must never
    /// be delivered.
    Aborted {
        /// The event's id.
        event_id: String,
        /// Its partition key.
        key: String,
        /// Its sequence number, as [`Record::Enqueued`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<i64>,
        /// Its position among its key's events, when there is no sequence number.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        order: Option<i64>,
        /// The partition it would have gone to, if known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<u16>,
        /// When the rollback happened.
        at_ms: f64,
    },
    /// An event moved to the dead-letter table.
    DeadLetter {
        /// The event's id.
        event_id: String,
        /// Why.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// When the move committed.
        at_ms: f64,
    },
    /// An event's row deleted after its delivery.
    Ack {
        /// The event's id.
        event_id: String,
        /// When the delete committed.
        at_ms: f64,
    },
    /// The end of the history.
    End {
        /// When the history ends.
        at_ms: f64,
        /// Events still queued then.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        queued: Vec<String>,
    },
}

/// A parsed history and the kinds it cannot judge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The history, ready for [`super::check_with`].
    pub history: History,
    /// Kinds the input holds too little to judge (see [`super::Verdict::not_judging`]).
    pub not_judged: Vec<Kind>,
    /// How many `enqueued` (or `aborted`) and `delivery` records name no partition: with any,
    /// the partition rules are not judged.
    pub without_partition: usize,
    /// How many deliveries arrived or were answered before their send by no more than the
    /// clock-skew tolerance, and were taken as arriving (answered) at the send.
    pub skew_forgiven: u64,
}

/// The kinds that need partitions: judged only when every record names its partition.
const NEED_PARTITIONS: [Kind; 4] =
    [Kind::SplitKey, Kind::Concurrent, Kind::Stall, Kind::HeadOfLine];

/// The kinds a receiver's log without partitions cannot judge: they need the producer's log
/// (lost, stall, premature) or the partitions (split key, concurrent, head-of-line). With a
/// `partition` on every record, concurrent is judged.
pub const RECEIVER_NOT_JUDGED: [Kind; 6] =
    [Kind::SplitKey, Kind::Lost, Kind::Concurrent, Kind::Stall, Kind::HeadOfLine, Kind::Premature];

/// Reads the full format: every delivered, dead-lettered or acknowledged event must have an
/// `enqueued` record. Errors name the first offending line.
pub fn parse(input: impl BufRead) -> Result<Parsed, HistoryError> {
    build(&read_records(input, 0)?, &ReadOptions::default())
}

/// Reads a receiver's log: `delivery` records (each with `seq` or `order`, and `arrived_ms`);
/// any other record is an error. Each event is taken as enqueued at its first arrival and, if
/// never accepted, dead-lettered at its last: the most lenient reading, so whatever is found is
/// certain (a later event arrived between two attempts of an earlier one is a skip whatever
/// the producer logged). Lost, stall, split key, concurrent and head-of-line are not judged.
pub fn parse_receiver(input: impl BufRead) -> Result<Parsed, HistoryError> {
    build(&read_records(input, 0)?, &ReadOptions { receiver_only: true, ..ReadOptions::default() })
}

/// How to read a history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Read a receiver's log ([`parse_receiver`]) rather than the full format ([`parse`]).
    pub receiver_only: bool,
    /// How far apart two writers' clocks may be: a delivery's arrival or answer before its
    /// send by at most this is forgiven (taken as at the send, and counted in
    /// [`Parsed::skew_forgiven`]) rather than rejecting the file. Zero: one clock.
    pub clock_skew: Duration,
}

/// Builds the history from the records of one or several inputs ([`read_records`]), in the
/// order given: the checker orders what it judges by time itself, so neither one file's lines
/// nor several files need be in time order. Errors name the first offending line.
pub fn build(lines: &[(usize, Record)], options: &ReadOptions) -> Result<Parsed, HistoryError> {
    if lines.is_empty() {
        return Err(HistoryError::Empty);
    }
    let b = Build { skew: options.clock_skew, ..Build::default() };
    if options.receiver_only {
        b.receiver(lines)
    } else {
        b.full(lines)
    }
}

/// Reads one input's records, each with its line number plus `first_line` (so that the lines
/// of several inputs number apart). Blank lines are skipped; an input may hold none.
pub fn read_records(
    mut input: impl BufRead,
    first_line: usize,
) -> Result<Vec<(usize, Record)>, HistoryError> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut line_no = first_line;
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        line_no += 1;
        let text = std::str::from_utf8(&buf)
            .map_err(|_| HistoryError::Line { line: line_no, what: "not UTF-8 text".into() })?;
        if text.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str::<Line<'_>>(text)
            .map_err(|e| describe(&e))
            .and_then(Line::record)
            .map_err(|what| HistoryError::Line { line: line_no, what: hint(what) })?;
        out.push((line_no, record));
    }
    Ok(out)
}

/// One line as read: the fields of every record type, strings borrowed from the line where it
/// holds them unescaped. [`Line::record`] checks the type and its required fields.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    event_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    key: Option<Cow<'a, str>>,
    seq: Option<i64>,
    order: Option<i64>,
    partition: Option<u16>,
    layout: Option<u64>,
    at_ms: Option<f64>,
    #[serde(borrow)]
    worker: Option<Cow<'a, str>>,
    attempt: Option<u32>,
    sent_ms: Option<f64>,
    arrived_ms: Option<f64>,
    answered_ms: Option<f64>,
    outcome: Option<RecordOutcome>,
    #[serde(borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(default)]
    queued: Vec<String>,
}

/// A required field, or serde's own words for its absence.
fn required<T>(value: Option<T>, field: &str) -> Result<T, String> {
    value.ok_or_else(|| format!("missing field `{field}`"))
}

fn owned(text: Option<Cow<'_, str>>) -> Option<String> {
    text.map(Cow::into_owned)
}

impl Line<'_> {
    /// The record this line describes.
    fn record(self) -> Result<Record, String> {
        let kind = required(self.kind, "type")?;
        let id = |id: Option<Cow<'_, str>>| required(id, "event_id").map(Cow::into_owned);
        Ok(match &*kind {
            "enqueued" => Record::Enqueued {
                event_id: id(self.event_id)?,
                key: required(self.key, "key")?.into_owned(),
                seq: self.seq,
                order: self.order,
                partition: self.partition,
                layout: self.layout,
                at_ms: required(self.at_ms, "at_ms")?,
            },
            "delivery" => Record::Delivery {
                event_id: id(self.event_id)?,
                key: required(self.key, "key")?.into_owned(),
                seq: self.seq,
                order: self.order,
                partition: self.partition,
                worker: owned(self.worker),
                attempt: self.attempt,
                sent_ms: self.sent_ms,
                arrived_ms: self.arrived_ms,
                answered_ms: self.answered_ms,
                outcome: required(self.outcome, "outcome")?,
                reason: owned(self.reason),
            },
            "aborted" => Record::Aborted {
                event_id: id(self.event_id)?,
                key: required(self.key, "key")?.into_owned(),
                seq: self.seq,
                order: self.order,
                partition: self.partition,
                at_ms: required(self.at_ms, "at_ms")?,
            },
            "dead_letter" => Record::DeadLetter {
                event_id: id(self.event_id)?,
                reason: owned(self.reason),
                at_ms: required(self.at_ms, "at_ms")?,
            },
            "ack" => Record::Ack { event_id: id(self.event_id)?, at_ms: required(self.at_ms, "at_ms")? },
            "end" => Record::End { at_ms: required(self.at_ms, "at_ms")?, queued: self.queued },
            other => {
                return Err(format!(
                    "unknown variant `{other}`, expected one of `enqueued`, `aborted`, `delivery`, `dead_letter`, `ack`, `end`"
                ))
            }
        })
    }
}

/// serde_json's message without its own "at line 1 column N" (every record is one line).
fn describe(e: &serde_json::Error) -> String {
    let text = e.to_string();
    text.split(" at line ").next().unwrap_or(&text).to_owned()
}

/// `text`, with what a record is when the type is what is wrong.
fn hint(text: String) -> String {
    if text.contains("missing field `type`") || text.contains("unknown variant") {
        format!(
            "{text} (each line is one JSON object whose \"type\" is enqueued, aborted, delivery, dead_letter, ack or end)"
        )
    } else {
        text
    }
}

fn bad(line: usize, what: impl Into<String>) -> HistoryError {
    HistoryError::Line { line, what: what.into() }
}

/// A time field: finite, not negative, within what a `Duration` holds.
fn time(line: usize, field: &str, ms: f64) -> Result<Time, HistoryError> {
    if !ms.is_finite() || !(0.0..=1e15).contains(&ms) {
        return Err(bad(line, format!("{field} is {ms}: a time must be milliseconds, 0 or more")));
    }
    Ok(Time(Duration::from_micros((ms * 1000.0).round() as u64)))
}

/// One event as the records describe it.
struct Event {
    line: usize,
    key: String,
    rank: i64,
    partition: Option<u16>,
    layout: u64,
    at: Time,
    /// Its enqueue rolled back (an `aborted` record).
    aborted: bool,
}

#[derive(Default)]
struct Build {
    /// Event id to its enqueue (or, for a receiver, its first delivery); only looked up, never
    /// iterated: `order` gives the order.
    events: FastMap<String, Event>,
    /// Event ids in the order they were first described.
    order: Vec<String>,
    partitions_known: bool,
    /// `enqueued` and `delivery` records without a partition.
    without_partition: usize,
    /// Arrivals or answers before their send by less than the tolerance, taken as at the send.
    skew_forgiven: u64,
    /// The clock-skew tolerance.
    skew: Duration,
}

/// The one rank of a record from `seq` or `order`.
fn rank(line: usize, seq: Option<i64>, order: Option<i64>) -> Result<Option<i64>, HistoryError> {
    match (seq, order) {
        (Some(_), Some(_)) => Err(bad(line, "give seq or order, not both")),
        (s, o) => Ok(s.or(o)),
    }
}

impl Build {
    fn full(mut self, lines: &[(usize, Record)]) -> Result<Parsed, HistoryError> {
        self.partitions_known = true;
        for (line, record) in lines {
            let (event_id, key, seq, order, partition, layout, at_ms, aborted) = match record {
                Record::Enqueued { event_id, key, seq, order, partition, layout, at_ms } => {
                    (event_id, key, seq, order, partition, layout.unwrap_or(0), at_ms, false)
                }
                Record::Aborted { event_id, key, seq, order, partition, at_ms } => {
                    (event_id, key, seq, order, partition, 0, at_ms, true)
                }
                _ => continue,
            };
            {
                let line = *line;
                let Some(r) = rank(line, *seq, *order)? else {
                    return Err(bad(
                        line,
                        format!("enqueued {event_id:?} has neither seq nor order"),
                    ));
                };
                if let Some(first) = self.events.get(event_id) {
                    return Err(bad(
                        line,
                        format!(
                            "event {event_id:?} is enqueued twice (first on line {})",
                            first.line
                        ),
                    ));
                }
                self.note_partition(partition.is_some());
                let at = time(line, "at_ms", *at_ms)?;
                let event = Event {
                    line,
                    key: key.clone(),
                    rank: r,
                    partition: *partition,
                    layout,
                    at,
                    aborted,
                };
                self.events.insert(event_id.clone(), event);
                self.order.push(event_id.clone());
            }
        }
        let mut h = History::default();
        let seqs = self.seqs()?;
        for (line, record) in lines {
            let line = *line;
            match record {
                Record::Enqueued { .. } | Record::Aborted { .. } => {}
                Record::Delivery { event_id, key, seq, order, partition, .. } => {
                    let event = self.events.get(event_id).ok_or_else(|| {
                        bad(line, format!("event {event_id:?} is delivered but has no enqueued record (a receiver's log is read with --receiver-only)"))
                    })?;
                    if *key != event.key {
                        return Err(bad(line, format!("event {event_id:?} has key {key:?} here and {:?} where it was enqueued (line {})", event.key, event.line)));
                    }
                    if let Some(r) = rank(line, *seq, *order)? {
                        if r != event.rank {
                            return Err(bad(line, format!("event {event_id:?} has seq/order {r} here and {} where it was enqueued (line {})", event.rank, event.line)));
                        }
                    }
                    self.note_partition(partition.is_some());
                    let d = self.delivery(line, record, seqs[event_id])?;
                    h.deliveries.push(d);
                }
                Record::DeadLetter { event_id, reason, at_ms } => {
                    let seq = self.known(&seqs, line, event_id, "dead-lettered")?;
                    let reason = reason.clone().unwrap_or_else(|| "no reason given".into());
                    h.dead_letters.push(DeadLettered {
                        seq,
                        reason,
                        at: time(line, "at_ms", *at_ms)?,
                    });
                }
                Record::Ack { event_id, at_ms } => {
                    let seq = self.known(&seqs, line, event_id, "acknowledged")?;
                    h.acks.push(Acked { seq, at: time(line, "at_ms", *at_ms)? });
                }
                Record::End { at_ms, queued } => {
                    h.end = h.end.max(time(line, "at_ms", *at_ms)?);
                    for id in queued {
                        let seq = self.known(&seqs, line, id, "listed as queued")?;
                        h.queued_at_end.push(seq);
                    }
                }
            }
        }
        Ok(self.finish(h, &seqs, Vec::new()))
    }

    fn receiver(mut self, lines: &[(usize, Record)]) -> Result<Parsed, HistoryError> {
        self.partitions_known = true;
        let mut last: BTreeMap<String, Time> = BTreeMap::new();
        for (line, record) in lines {
            let line = *line;
            let Record::Delivery { event_id, key, seq, order, arrived_ms, partition, .. } = record
            else {
                return Err(bad(line, "a receiver's log holds only delivery records (without --receiver-only, the full format is read)"));
            };
            let Some(r) = rank(line, *seq, *order)? else {
                return Err(bad(line, format!("delivery of {event_id:?} has neither seq nor order: a receiver needs the event's order, from a header")));
            };
            let Some(arrived) = arrived_ms else {
                return Err(bad(line, format!("delivery of {event_id:?} has no arrived_ms")));
            };
            let arrived = time(line, "arrived_ms", *arrived)?;
            self.note_partition(partition.is_some());
            match self.events.get_mut(event_id) {
                Some(e) => {
                    if e.key != *key || e.rank != r {
                        return Err(bad(line, format!("event {event_id:?} has key {key:?} and seq/order {r} here, key {:?} and {} on line {}", e.key, e.rank, e.line)));
                    }
                    e.at = e.at.min(arrived);
                }
                None => {
                    let event = Event {
                        line,
                        key: key.clone(),
                        rank: r,
                        partition: *partition,
                        layout: 0,
                        at: arrived,
                        aborted: false,
                    };
                    self.events.insert(event_id.clone(), event);
                    self.order.push(event_id.clone());
                }
            }
            let t = last.entry(event_id.clone()).or_insert(arrived);
            *t = (*t).max(arrived);
        }
        let seqs = self.seqs()?;
        let mut h = History::default();
        for (line, record) in lines {
            let mut d = self.delivery(*line, record, seqs[record_event(record)])?;
            // The receiver knows when a request arrived, not when it was sent.
            d.sent_at = d.arrived_at;
            if !self.partitions_known {
                d.partition = PartitionId(0);
            }
            h.deliveries.push(d);
        }
        let accepted: FastSet<Seq> =
            h.deliveries.iter().filter(|d| d.outcome == Outcome::Accepted).map(|d| d.seq).collect();
        for (id, at) in last {
            let seq = seqs[&id];
            if !accepted.contains(&seq) {
                let reason = "never accepted: taken as dead-lettered at its last arrival".into();
                h.dead_letters.push(DeadLettered { seq, reason, at });
            }
        }
        h.dead_letters.sort_by_key(|d| (d.at, d.seq));
        // With every record's partition, concurrent is judged; without, `finish` adds it.
        let not_judged = RECEIVER_NOT_JUDGED.into_iter().filter(|k| *k != Kind::Concurrent);
        Ok(self.finish(h, &seqs, not_judged.collect()))
    }

    fn known(
        &self,
        seqs: &FastMap<String, Seq>,
        line: usize,
        event_id: &str,
        what: &str,
    ) -> Result<Seq, HistoryError> {
        seqs.get(event_id).copied().ok_or_else(|| {
            bad(line, format!("event {event_id:?} is {what} but has no enqueued record"))
        })
    }

    /// A checker seq per event: the ranks as given when they are unique across keys (a queue's
    /// seq), or else positions that keep each key's order (per-key `order`s repeat across keys).
    fn seqs(&self) -> Result<FastMap<String, Seq>, HistoryError> {
        let mut per_key: FastMap<(&str, i64), &str> = FastMap::default();
        for id in &self.order {
            let e = &self.events[id];
            if let Some(other) = per_key.insert((&e.key, e.rank), id) {
                return Err(bad(
                    e.line,
                    format!(
                        "events {other:?} and {id:?} of key {:?} both have seq/order {}",
                        e.key, e.rank
                    ),
                ));
            }
        }
        let events = || self.order.iter().map(|id| (id, &self.events[id]));
        let mut ranks: Vec<i64> = events().map(|(_, e)| e.rank).collect();
        ranks.sort_unstable();
        let unique = ranks.windows(2).all(|w| w[0] != w[1]);
        if unique {
            return Ok(events().map(|(id, e)| (id.clone(), Seq(e.rank))).collect());
        }
        let mut sorted: Vec<(&i64, &str, &str)> =
            events().map(|(id, e)| (&e.rank, e.key.as_str(), id.as_str())).collect();
        sorted.sort_unstable();
        Ok(sorted
            .into_iter()
            .enumerate()
            .map(|(i, (_, _, id))| (id.to_owned(), Seq(i as i64 + 1)))
            .collect())
    }

    fn finish(
        self,
        mut h: History,
        seqs: &FastMap<String, Seq>,
        mut not_judged: Vec<Kind>,
    ) -> Parsed {
        for id in &self.order {
            let e = &self.events[id];
            let list = if e.aborted { &mut h.aborted } else { &mut h.enqueued };
            list.push(Enqueued {
                event_id: id.clone(),
                key: e.key.clone(),
                seq: seqs[id],
                partition: PartitionId(e.partition.unwrap_or(0)),
                layout: e.layout,
                at: e.at,
            });
        }
        let latest = h
            .enqueued
            .iter()
            .map(|e| e.at)
            .chain(h.deliveries.iter().map(|d| d.end().max(d.arrived_at)))
            .chain(h.acks.iter().map(|a| a.at))
            .chain(h.dead_letters.iter().map(|d| d.at))
            .max()
            .unwrap_or(Time::ZERO);
        h.end = h.end.max(latest);
        if !self.partitions_known {
            not_judged.extend(NEED_PARTITIONS);
        }
        not_judged.sort();
        not_judged.dedup();
        Parsed {
            history: h,
            not_judged,
            without_partition: self.without_partition,
            skew_forgiven: self.skew_forgiven,
        }
    }
}

fn record_event(record: &Record) -> &str {
    match record {
        Record::Enqueued { event_id, .. }
        | Record::Aborted { event_id, .. }
        | Record::Delivery { event_id, .. }
        | Record::DeadLetter { event_id, .. }
        | Record::Ack { event_id, .. } => event_id,
        Record::End { .. } => "",
    }
}

impl Build {
    fn note_partition(&mut self, known: bool) {
        self.partitions_known &= known;
        self.without_partition += usize::from(!known);
    }

    /// A `delivery` record as the checker's [`Delivery`] of `seq`; an arrival or answer before
    /// the send by no more than the tolerance is forgiven (taken as at the send) and counted.
    fn delivery(
        &mut self,
        line: usize,
        record: &Record,
        seq: Seq,
    ) -> Result<Delivery, HistoryError> {
        let mut d = delivery(line, record, seq, self.skew)?;
        let sent = d.sent_at;
        let mut forgiven = false;
        if d.arrived_at < sent {
            d.arrived_at = sent;
            forgiven = true;
        }
        if d.finished_at.is_some_and(|a| a < sent) {
            d.finished_at = Some(sent);
            forgiven = true;
        }
        self.skew_forgiven += u64::from(forgiven);
        Ok(d)
    }
}

/// A `delivery` record as the checker's [`Delivery`] of `seq`, its times as written; times
/// before the send by more than `skew` are an error.
fn delivery(
    line: usize,
    record: &Record,
    seq: Seq,
    skew: Duration,
) -> Result<Delivery, HistoryError> {
    let Record::Delivery {
        event_id,
        key,
        partition,
        worker,
        attempt,
        sent_ms,
        arrived_ms,
        answered_ms,
        outcome,
        reason,
        ..
    } = record
    else {
        return Err(bad(line, "not a delivery record"));
    };
    let sent = sent_ms.map(|t| time(line, "sent_ms", t)).transpose()?;
    let arrived = arrived_ms.map(|t| time(line, "arrived_ms", t)).transpose()?;
    let answered = answered_ms.map(|t| time(line, "answered_ms", t)).transpose()?;
    let too_early = |t: Time, s: Time| t.saturating_add(skew) < s;
    let (sent_at, arrived_at) = match (sent, arrived) {
        (Some(s), Some(a)) if too_early(a, s) => {
            return Err(bad(line, format!("arrived_ms is before sent_ms by {:.3} ms, more than the clock-skew tolerance (--clock-skew-ms {})", (s.0 - a.0).as_secs_f64() * 1000.0, skew.as_secs_f64() * 1000.0)));
        }
        (Some(s), Some(a)) => (s, a),
        (Some(s), None) => (s, s),
        (None, Some(a)) => (a, a),
        (None, None) => {
            return Err(bad(
                line,
                format!("delivery of {event_id:?} has neither sent_ms nor arrived_ms"),
            ))
        }
    };
    if answered.is_some_and(|a| too_early(a, sent_at)) {
        return Err(bad(line, "answered_ms is before the delivery was sent, by more than the clock-skew tolerance (--clock-skew-ms)"));
    }
    let outcome = match outcome {
        RecordOutcome::Accepted => Outcome::Accepted,
        RecordOutcome::Rejected => {
            Outcome::Rejected(reason.clone().unwrap_or_else(|| "rejected".into()))
        }
    };
    Ok(Delivery {
        event_id: event_id.clone(),
        key: key.clone(),
        seq,
        partition: PartitionId(partition.unwrap_or(0)),
        attempt: attempt.unwrap_or(0),
        worker: worker.clone().unwrap_or_default(),
        sent_at,
        arrived_at,
        finished_at: answered,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check, Kind};

    /// The skipped head of the checker's tests, as a file: seq 1 refused at 10 ms, seq 2
    /// accepted at 20 ms, seq 1 dead-lettered at 30 ms.
    const SKIPPED: &str = r#"{"type":"enqueued","event_id":"e1","key":"a","seq":1,"partition":0,"at_ms":1}
{"type":"enqueued","event_id":"e2","key":"a","seq":2,"partition":0,"at_ms":2}
{"type":"delivery","event_id":"e1","key":"a","partition":0,"worker":"w","sent_ms":10,"arrived_ms":10,"answered_ms":10.5,"outcome":"rejected","reason":"HTTP 503"}

{"type":"delivery","event_id":"e2","key":"a","partition":0,"worker":"w","sent_ms":20,"arrived_ms":20,"answered_ms":20.5,"outcome":"accepted"}
{"type":"ack","event_id":"e2","at_ms":21}
{"type":"dead_letter","event_id":"e1","reason":"exhausted","at_ms":30}
"#;

    fn full(text: &str) -> Result<Parsed, HistoryError> {
        parse(text.as_bytes())
    }

    fn line_error(result: Result<Parsed, HistoryError>) -> (usize, String) {
        match result {
            Err(HistoryError::Line { line, what }) => (line, what),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn a_file_reads_into_the_history_the_checker_judges() {
        let parsed = full(SKIPPED).unwrap();
        assert!(parsed.not_judged.is_empty());
        let h = &parsed.history;
        assert_eq!((h.enqueued.len(), h.deliveries.len(), h.acks.len()), (2, 2, 1));
        assert_eq!(h.deliveries[0].outcome, Outcome::Rejected("HTTP 503".into()));
        assert_eq!(h.deliveries[0].finished_at, Some(Time(Duration::from_micros(10_500))));
        assert_eq!(h.dead_letters[0].at, Time::from_millis(30));
        assert_eq!(h.end, Time::from_millis(30));
        let v = check(h);
        assert_eq!(v.violated(), vec![Kind::Skip], "{v}");
    }

    #[test]
    fn malformed_lines_are_named_with_what_is_wrong() {
        let cases: [(&str, usize, &str); 8] = [
            ("{\"type\":\"enqueued\"", 1, "EOF"),
            ("not json", 1, "expected"),
            (r#"{"type":"sent","event_id":"e1"}"#, 1, "\"type\" is enqueued, aborted, delivery"),
            (r#"{"event_id":"e1"}"#, 1, "missing field `type`"),
            (
                r#"{"type":"enqueued","event_id":"e1","key":"a","at_ms":1}"#,
                1,
                "neither seq nor order",
            ),
            (
                r#"{"type":"enqueued","event_id":"e1","key":"a","seq":1,"at_ms":-1}"#,
                1,
                "at_ms is -1",
            ),
            (
                r#"{"type":"enqueued","event_id":"e1","key":"a","seq":1,"at_ms":"soon"}"#,
                1,
                "invalid type",
            ),
            (
                r#"{"type":"enqueued","event_id":"e1","key":"a","seq":1,"order":1,"at_ms":1}"#,
                1,
                "not both",
            ),
        ];
        for (text, line, says) in cases {
            let (l, what) = line_error(full(text));
            assert_eq!(l, line, "{text}");
            assert!(what.contains(says), "{text}: {what}");
        }
        // Line numbers count blank lines too.
        let text = format!("{}\n\n{{\"type\":\"ack\"}}\n", SKIPPED.lines().next().unwrap());
        assert_eq!(line_error(full(&text)).0, 3);
        // A record naming an event never enqueued, a key that changed, a seq used twice.
        let head = SKIPPED.lines().take(2).collect::<Vec<_>>().join("\n");
        let (l, what) = line_error(full(&format!(
            "{head}\n{}",
            r#"{"type":"delivery","event_id":"e9","key":"a","sent_ms":3,"outcome":"accepted"}"#
        )));
        assert_eq!(l, 3);
        assert!(what.contains("\"e9\"") && what.contains("--receiver-only"), "{what}");
        let (_, what) = line_error(full(&format!(
            "{head}\n{}",
            r#"{"type":"delivery","event_id":"e1","key":"b","sent_ms":3,"outcome":"accepted"}"#
        )));
        assert!(what.contains("key \"b\" here"), "{what}");
        let (l, what) = line_error(full(&format!(
            "{head}\n{}",
            r#"{"type":"enqueued","event_id":"e3","key":"a","seq":2,"at_ms":3}"#
        )));
        assert_eq!(l, 3);
        assert!(what.contains("both have seq/order 2"), "{what}");
        let (_, what) = line_error(full(&format!(
            "{head}\n{}",
            r#"{"type":"delivery","event_id":"e1","key":"a","sent_ms":5,"arrived_ms":4,"outcome":"accepted"}"#
        )));
        assert!(what.contains("arrived_ms is before sent_ms"), "{what}");
        assert!(matches!(full("\n\n"), Err(HistoryError::Empty)));
        let (l, what) = line_error(parse(&b"{\"type\":\"ack\",\"event_id\":\"\xff\"}"[..]));
        assert_eq!((l, what.as_str()), (1, "not UTF-8 text"));
    }

    #[test]
    fn per_key_orders_become_seqs_that_keep_each_keys_order() {
        let text = r#"{"type":"enqueued","event_id":"a1","key":"a","order":1,"partition":0,"at_ms":1}
{"type":"enqueued","event_id":"b1","key":"b","order":1,"partition":1,"at_ms":1}
{"type":"enqueued","event_id":"a2","key":"a","order":2,"partition":0,"at_ms":2}
{"type":"delivery","event_id":"a2","key":"a","partition":0,"sent_ms":3,"answered_ms":3,"outcome":"accepted"}
{"type":"delivery","event_id":"a1","key":"a","partition":0,"sent_ms":4,"answered_ms":4,"outcome":"accepted"}
{"type":"delivery","event_id":"b1","key":"b","partition":1,"sent_ms":4,"answered_ms":4,"outcome":"accepted"}
"#;
        let h = full(text).unwrap().history;
        let seq = |id: &str| h.enqueued.iter().find(|e| e.event_id == id).unwrap().seq;
        assert!(seq("a1") < seq("a2"));
        assert_ne!(seq("a1"), seq("b1"));
        let v = check(&h);
        assert_eq!(v.violated(), vec![Kind::Reorder, Kind::Skip], "{v}");
    }

    #[test]
    fn without_partitions_the_partition_rules_are_not_judged() {
        // Two keys delivered at once: concurrent if they shared a partition, but none is named.
        let text = r#"{"type":"enqueued","event_id":"a1","key":"a","seq":1,"at_ms":1}
{"type":"enqueued","event_id":"b1","key":"b","seq":2,"at_ms":1}
{"type":"delivery","event_id":"a1","key":"a","sent_ms":3,"answered_ms":9,"outcome":"accepted"}
{"type":"delivery","event_id":"b1","key":"b","sent_ms":4,"answered_ms":9,"outcome":"accepted"}
"#;
        let parsed = full(text).unwrap();
        assert_eq!(
            parsed.not_judged,
            vec![Kind::SplitKey, Kind::Concurrent, Kind::Stall, Kind::HeadOfLine]
        );
        assert_eq!(check(&parsed.history).count(Kind::Concurrent), 1, "judged, it would be");
        let v = check(&parsed.history).not_judging(&parsed.not_judged);
        assert!(v.is_ok(), "{v}");
        assert!(v.to_string().contains("concurrent       not judged       -"), "{v}");
    }

    #[test]
    fn a_receivers_log_judges_order_and_skips_but_not_loss() {
        // What the endpoint saw of the skipped head: seq 1 refused at 10 and again at 25 (so
        // still queued, not dead-lettered, when seq 2 arrived at 20).
        let text = r#"{"type":"delivery","event_id":"e1","key":"a","seq":1,"arrived_ms":10,"answered_ms":10,"outcome":"rejected"}
{"type":"delivery","event_id":"e2","key":"a","seq":2,"arrived_ms":20,"answered_ms":20,"outcome":"accepted"}
{"type":"delivery","event_id":"e1","key":"a","seq":1,"arrived_ms":25,"answered_ms":25,"outcome":"rejected"}
"#;
        let parsed = parse_receiver(text.as_bytes()).unwrap();
        assert_eq!(parsed.not_judged, RECEIVER_NOT_JUDGED.to_vec());
        let v = check(&parsed.history).not_judging(&parsed.not_judged);
        assert_eq!(v.violated(), vec![Kind::Skip], "{v}");
        // Refused once only: it may have been dead-lettered before seq 2 came, which is a gap.
        let once: String = text.lines().take(2).map(|l| format!("{l}\n")).collect();
        let parsed = parse_receiver(once.as_bytes()).unwrap();
        let v = check(&parsed.history).not_judging(&parsed.not_judged);
        assert!(v.is_ok(), "{v}");
        assert_eq!(v.count(Kind::Gap), 1);
        // A receiver needs each event's order, and logs only deliveries.
        let (l, what) = line_error(parse_receiver(
            &br#"{"type":"delivery","event_id":"e1","key":"a","arrived_ms":1,"outcome":"accepted"}"#[..],
        ));
        assert!(l == 1 && what.contains("neither seq nor order"), "{what}");
        let (_, what) = line_error(parse_receiver(SKIPPED.as_bytes()));
        assert!(what.contains("only delivery records"), "{what}");
    }

    fn log_check(parsed: &Parsed) -> crate::check::Verdict {
        let config = crate::check::CheckConfig { log_rules: true, ..Default::default() };
        crate::check::check_with(&parsed.history, &config).not_judging(&parsed.not_judged)
    }

    #[test]
    fn an_arrival_before_its_send_is_forgiven_within_the_tolerance_and_counted() {
        let text = r#"{"type":"enqueued","event_id":"e1","key":"a","seq":1,"partition":0,"at_ms":1}
{"type":"delivery","event_id":"e1","key":"a","partition":0,"sent_ms":10.3,"arrived_ms":10,"answered_ms":10.1,"outcome":"accepted"}
"#;
        let (l, what) = line_error(full(text));
        assert_eq!(l, 2);
        assert!(what.contains("arrived_ms is before sent_ms by 0.300 ms"), "{what}");
        let lenient = |ms: u64| ReadOptions {
            clock_skew: Duration::from_micros(ms),
            ..ReadOptions::default()
        };
        let parsed = build(&read_records(text.as_bytes(), 0).unwrap(), &lenient(300)).unwrap();
        assert_eq!(parsed.skew_forgiven, 1);
        let d = &parsed.history.deliveries[0];
        assert_eq!((d.arrived_at, d.finished_at), (d.sent_at, Some(d.sent_at)));
        assert!(log_check(&parsed).is_ok());
        let (_, what) =
            line_error(build(&read_records(text.as_bytes(), 0).unwrap(), &lenient(299)));
        assert!(what.contains("--clock-skew-ms"), "{what}");
    }

    #[test]
    fn a_delivered_aborted_event_is_premature_and_an_undelivered_one_is_not_lost() {
        let text = r#"{"type":"aborted","event_id":"e1","key":"a","seq":3,"partition":0,"at_ms":5}
{"type":"enqueued","event_id":"e2","key":"a","seq":2,"partition":0,"at_ms":6}
{"type":"delivery","event_id":"e2","key":"a","partition":0,"sent_ms":10,"answered_ms":11,"outcome":"accepted"}
"#;
        let parsed = full(text).unwrap();
        assert_eq!((parsed.history.aborted.len(), parsed.history.enqueued.len()), (1, 1));
        assert!(log_check(&parsed).is_ok(), "{}", log_check(&parsed));
        let delivered = format!(
            "{text}{}\n",
            r#"{"type":"delivery","event_id":"e1","key":"a","partition":0,"sent_ms":20,"answered_ms":21,"outcome":"accepted"}"#
        );
        let v = log_check(&full(&delivered).unwrap());
        assert_eq!(v.violated(), vec![Kind::Premature], "{v}");
    }

    #[test]
    fn a_receivers_log_with_partitions_judges_concurrent_and_concurrent_key() {
        // Two requests of key a in flight at the endpoint at once (arrived 10 and 12, the first
        // answered at 20), both from partition 3.
        let text = r#"{"type":"delivery","event_id":"e1","key":"a","seq":1,"partition":3,"arrived_ms":10,"answered_ms":20,"outcome":"accepted"}
{"type":"delivery","event_id":"e2","key":"a","seq":2,"partition":3,"arrived_ms":12,"answered_ms":13,"outcome":"accepted"}
"#;
        let parsed = parse_receiver(text.as_bytes()).unwrap();
        assert!(!parsed.not_judged.contains(&Kind::Concurrent), "{:?}", parsed.not_judged);
        assert_eq!(parsed.without_partition, 0);
        let v = log_check(&parsed);
        assert_eq!(v.violated(), vec![Kind::Concurrent, Kind::ConcurrentKey], "{v}");
        // Without partitions, concurrent_key is still judged, concurrent is not.
        let bare = text.replace(r#""partition":3,"#, "");
        let parsed = parse_receiver(bare.as_bytes()).unwrap();
        assert_eq!(parsed.without_partition, 2);
        assert_eq!(parsed.not_judged, RECEIVER_NOT_JUDGED.to_vec());
        assert_eq!(log_check(&parsed).violated(), vec![Kind::ConcurrentKey]);
    }

    #[test]
    fn records_without_a_partition_are_counted() {
        let text = SKIPPED.replacen(r#""partition":0,"#, "", 2);
        let parsed = full(&text).unwrap();
        assert_eq!(parsed.without_partition, 2);
        assert!(parsed.not_judged.contains(&Kind::Concurrent));
        assert_eq!(full(SKIPPED).unwrap().without_partition, 0);
    }
}
