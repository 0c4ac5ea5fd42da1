//! The store-side designs of the broken-design catalogue, as a decorator around the correct
//! store ([`handle`]) and strategies it hands the correct rules ([`Rules`]: how an expiry
//! lease's queue statements are fenced, how a head read picks its rows). The correct rules in
//! the other files of this module take no switch; each design here names the production flaw
//! it builds (the catalogue, `docs/design/catalogue.md`).

use keyorder::drain::ParkedKeys;
use keyorder::{PartitionId, Seq, Time};

use super::{ExpiryFence, Leases, Row, StoreState};
use crate::protocol::{StoreRequest, StoreResponse, WireHead};
use crate::trace::{now, SharedRecorder};

/// The store-side switches of the broken-design catalogue.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreBreaks {
    /// `two-readers`: a lock is granted whoever holds it, and every worker is told it is alone.
    pub shared_locks: bool,
    /// `requeue-at-tail`: a failed attempt moves the row to the tail with a new seq.
    pub requeue_at_tail: bool,
    /// `handover-always-clean`: every lease is granted as handed back cleanly, even after its
    /// last holder lost it.
    pub always_clean: bool,
    /// `unfenced-expiry`: queue statements on an expiry lease check only that the partition has
    /// an unexpired lease, not that it is theirs, and renew whichever it is.
    pub unfenced_expiry: bool,
    /// `skip-without-parking`: a head read passes over the rows that are backing off but
    /// serves the same key's later rows.
    pub skip_without_parking: bool,
    /// `priority-within-key` and `created-at-order`: a head read picks rows in another
    /// order than seq.
    pub head_order: Option<HeadOrder>,
    /// `rebalance-on-join`: a worker that registers is handed half of the other workers'
    /// partitions at once, as handed back clean, whether or not their deliveries are done.
    pub rebalance_on_join: bool,
    /// `stuck-key-blocks-partition`: a head read answers nothing while the partition's oldest
    /// row belongs to a parked key or to a key with a dead letter.
    pub stuck_key_blocks: bool,
}

impl StoreBreaks {
    /// Whether any store-side design is switched on.
    pub fn any(&self) -> bool {
        self.shared_locks
            || self.requeue_at_tail
            || self.always_clean
            || self.unfenced_expiry
            || self.skip_without_parking
            || self.head_order.is_some()
            || self.rebalance_on_join
            || self.stuck_key_blocks
    }

    /// The strategies these designs hand the correct rules.
    fn rules(&self) -> Rules {
        let heads =
            if self.skip_without_parking || self.head_order.is_some() || self.stuck_key_blocks {
                HeadRule::Design(HeadDesign {
                    order: self.head_order,
                    skip_backing_off: self.skip_without_parking,
                    stuck_key_blocks: self.stuck_key_blocks,
                })
            } else {
                HeadRule::Seq
            };
        let queue_fence =
            if self.unfenced_expiry { ExpiryFence::AnyHolder } else { ExpiryFence::Epoch };
        Rules { queue_fence, heads }
    }
}

/// An order a broken head read picks rows in, instead of seq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadOrder {
    /// By a per-event priority, highest first, then seq (pg-boss's `ORDER BY priority DESC`).
    Priority,
    /// By the insert's timestamp in whole seconds, ties broken by the event id's hash (a
    /// random id standing in for the sequence: `ORDER BY created_at, id`).
    CreatedAt,
}

impl HeadOrder {
    /// The sort key of a row under this order.
    fn key(self, seq: Seq, row: &Row) -> (u64, u64) {
        let digest = keyorder::routing::key_digest(&row.event_id);
        match self {
            HeadOrder::Priority => (u64::MAX - digest % 3, seq.0 as u64),
            HeadOrder::CreatedAt => (row.created_ms / 1000, digest),
        }
    }
}

/// The strategies the correct store's rules are run with.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rules {
    /// How an expiry lease's queue statements (head, acknowledgement, retry, dead letter) match
    /// their lease; renewals and hand-backs are always fenced by epoch.
    pub queue_fence: ExpiryFence,
    /// How a head read picks its rows.
    pub heads: HeadRule,
}

impl Rules {
    /// The store's own rules.
    pub const CORRECT: Rules = Rules { queue_fence: ExpiryFence::Epoch, heads: HeadRule::Seq };
}

/// How a head read picks its rows.
#[derive(Clone, Copy, Debug)]
pub(super) enum HeadRule {
    /// The oldest rows in seq order, parked keys passed over: the store's own.
    Seq,
    /// A broken design's read.
    Design(HeadDesign),
}

/// The head-read designs: `skip-without-parking`, `priority-within-key`, `created-at-order`
/// and `stuck-key-blocks-partition`.
#[derive(Clone, Copy, Debug)]
pub(super) struct HeadDesign {
    order: Option<HeadOrder>,
    skip_backing_off: bool,
    stuck_key_blocks: bool,
}

impl HeadDesign {
    /// The heads this design's read answers, at most `limit` and ending at the first that
    /// waits.
    pub(super) fn heads(
        &self,
        st: &StoreState,
        partition: PartitionId,
        from: Seq,
        at: Time,
        skip: &ParkedKeys,
        limit: usize,
    ) -> Vec<WireHead> {
        if self.stuck_key_blocks && oldest_key_is_stuck(st, partition, skip) {
            return Vec::new();
        }
        let visible = st.rows_from(partition, from).filter(|(_, row)| {
            if self.skip_backing_off {
                // `skip-without-parking`: the rows backing off are passed over, whatever their
                // key, so a failing key's later rows go first.
                row.not_before.is_none_or(|t| t <= at)
            } else {
                !skip.contains(&row.key)
            }
        });
        match self.order {
            Some(order) => {
                let mut rows: Vec<(Seq, &Row)> = visible.collect();
                rows.sort_by_key(|(seq, row)| order.key(*seq, row));
                st.until_one_waits(rows.into_iter().take(limit), at)
            }
            None => st.until_one_waits(visible.take(limit), at),
        }
    }
}

/// `stuck-key-blocks-partition`: whether the partition's oldest row belongs to a key that is
/// parked (in `skip`) or has a row in the dead-letter table.
fn oldest_key_is_stuck(st: &StoreState, partition: PartitionId, skip: &ParkedKeys) -> bool {
    st.rows_from(partition, Seq(0)).next().is_some_and(|(_, row)| {
        skip.contains(&row.key) || st.durable.dead.iter().any(|(_, dead, _)| dead.key == row.key)
    })
}

/// The decorator: a request through the correct store run with the designs' strategies, with
/// what the designs change before (`two-readers` grants a held lock) and after (the answer or
/// the state: `two-readers`, `handover-always-clean`, `requeue-at-tail`, `rebalance-on-join`).
pub(super) fn handle(
    st: &mut StoreState,
    session: u64,
    req: StoreRequest,
    at: Time,
    rec: &SharedRecorder,
) -> StoreResponse {
    let breaks = st.durable.breaks;
    let echo = req.clone();
    let answer = match (&req, &mut st.leases) {
        // `two-readers`: a lock is granted whoever holds it.
        (StoreRequest::TryLock { partition, worker }, Leases::SessionLocks(locks))
            if breaks.shared_locks && locks.is_held(*partition) =>
        {
            let state = (&mut st.durable, &mut st.volatile);
            locks.grant(state, session, *partition, worker.clone(), rec)
        }
        _ => st.handle_by(&breaks.rules(), session, req, at, rec),
    };
    follow(st, breaks, session, &echo, answer, at, rec)
}

/// What the designs do once the store answered `req`.
fn follow(
    st: &mut StoreState,
    breaks: StoreBreaks,
    session: u64,
    req: &StoreRequest,
    mut answer: StoreResponse,
    at: Time,
    rec: &SharedRecorder,
) -> StoreResponse {
    match req {
        // `two-readers`: every worker is told it is alone.
        StoreRequest::LiveWorkers if breaks.shared_locks => answer = StoreResponse::Count(1),
        // `handover-always-clean`: every lease is granted as handed back cleanly.
        StoreRequest::TryLock { partition, .. } if breaks.always_clean => {
            if let StoreResponse::Lock(Some(granted)) = &mut answer {
                if !granted.clean {
                    granted.clean = true;
                    let mut rec = rec.borrow_mut();
                    rec.log(now(), "store", format_args!("p{partition} was handed back clean"));
                }
            }
        }
        // `requeue-at-tail`: a failed attempt moves the row to the tail with a new seq.
        StoreRequest::Retry { partition, seq, .. }
            if breaks.requeue_at_tail && !matches!(answer, StoreResponse::NotHeld) =>
        {
            requeue_at_tail(st, *partition, *seq, rec);
        }
        // `rebalance-on-join`: the joining worker is handed half of the others' partitions.
        StoreRequest::Register { worker } if breaks.rebalance_on_join => {
            hand_to_joiner(st, session, worker, at, rec);
        }
        _ => {}
    }
    answer
}

/// Moves row `seq` of `partition`, if it is still queued, to the tail with a new seq.
fn requeue_at_tail(st: &mut StoreState, partition: PartitionId, seq: Seq, rec: &SharedRecorder) {
    let Some(row) = st.durable.dequeue(partition, seq) else { return };
    st.durable.next_seq += 1;
    let tail = Seq(st.durable.next_seq);
    rec.borrow_mut().log(
        now(),
        "store",
        format_args!("requeue p{partition} seq={seq} at the tail as seq={tail}"),
    );
    st.durable.queue(partition, tail, row);
}

/// The `rebalance-on-join` design: every other partition leased by another worker is taken
/// from its holder and marked handed back clean, for the joining worker to lease at once.
fn hand_to_joiner(st: &mut StoreState, session: u64, worker: &str, at: Time, rec: &SharedRecorder) {
    let mut held = match &st.leases {
        Leases::ExpiryRows(rows) => rows.held_by_others(worker, at),
        Leases::SessionLocks(locks) => locks.held_by_others(&st.volatile, session, worker),
    };
    held.sort();
    held.dedup();
    for partition in held.into_iter().step_by(2) {
        if st.break_lease(partition, rec) {
            st.durable.unclean.remove(&partition);
            rec.borrow_mut().log(
                at,
                "store",
                format_args!("rebalance: p{partition} handed to the joining {worker}"),
            );
        }
    }
}
