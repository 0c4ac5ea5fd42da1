//! The catalogue of broken designs: each a real way teams break per-key ordering, each a
//! switch in the simulation that the checker must catch with the named violation.

use keyorder::check::Kind;
use serde::{Deserialize, Serialize};

/// A known-bad design, switched on in a scenario.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Break {
    /// Each producer process routes with its own randomly seeded hash (Python's `hash()` with
    /// PYTHONHASHSEED), and a key's events come from several producers.
    RandomHash,
    /// A second consumer reads a partition that already has one: the lease grants everyone
    /// and every worker believes it is alone (the autoscaler mistake).
    TwoReaders,
    /// The lease is taken on one connection while heads are read and acknowledged on another
    /// (a pooled one), so a worker that lost its lease keeps reading heads.
    UnfencedLease,
    /// The partition count changes while events are still queued.
    FlipWithoutDrain,
    /// A failed head is retried by re-enqueueing it at the tail.
    RequeueAtTail,
    /// The worker delivers the next event before the current one has finished.
    ParallelInPartition,
    /// Two producers enqueue for one key in concurrent transactions whose commit order differs
    /// from their seq order.
    UnserialisedProducers,
    /// No maximum attempts: a poison event stalls its partition forever.
    UnboundedRetry,
    /// The store tells every new lease that it was handed back cleanly, even when its last
    /// holder lost it with a delivery still out, so the new holder skips the takeover wait.
    HandoverAlwaysClean,
    /// An expiry lease whose head reads, acknowledgements, retry updates and dead-letters do not
    /// check the epoch: each renews and trusts whatever unexpired lease the partition has, so a
    /// holder that was stopped past its expiry wakes, finds the new holder's lease and believes
    /// it its own.
    UnfencedExpiry,
    /// A failing head is skipped while it backs off, but its key is not parked: the head read
    /// serves the same key's later events before it.
    SkipWithoutParking,
    /// A key pin (a whale moved to a partition of its own) takes effect at once, under the same
    /// layout epoch, while the key still has rows queued on its old partition: no barrier holds
    /// its new rows behind the old ones.
    PinWithoutBarrier,
    /// A drain whose cursor passes a key's rows: while the key is parked, other keys'
    /// acknowledgements move the cursor past its rows, and after the unpark a read after the
    /// cursor serves its later rows before them (an earlier keyorder PostgreSQL store, found
    /// when the simulation first ran its rules: docs/design/findings.md; with expiry leases,
    /// SQLite's cursor without its rewind).
    CursorPastParked,
    /// A drain whose cursor passes a row that commits late: a producer's transaction took its
    /// seq and stays open while later rows are delivered and acknowledged, and when it commits,
    /// its key's next row is read after the cursor before a full read finds it (an earlier
    /// keyorder PostgreSQL store: docs/design/drain-and-parking.md).
    /// Not in [`Break::ALL`]: the generated scenarios rarely reach its window
    /// (none within 20 small or 20 medium seeds in 5 sweeps), so it is proven on a saved case
    /// (`testdata/regressions/break-cursor-past-late-commit.json`).
    CursorPastLateCommit,
    /// The deliverer's own timeout gives up on a call before the worker's does, reports it as
    /// never sent (so the head is retried at once and a lease is handed back clean), and leaves
    /// the call running on its connection: the endpoint still works on the first delivery when
    /// the next one arrives (an HTTP client whose timeout does not cancel the request).
    TimeoutLeavesCallRunning,
    /// A worker fetches a batch of a partition's rows into a local queue and runs several at
    /// once, whatever their key (graphile-worker's `localQueue`, under which jobs of one serial
    /// queue ran concurrently).
    LocalBatch,
    /// The head read picks the highest-priority row first, then the oldest, so a later event of
    /// a key with a higher priority overtakes an earlier one (pg-boss's priority ordering).
    PriorityWithinKey,
    /// The head read orders by the insert's timestamp, kept in whole seconds (a `DATETIME`
    /// column's default precision), and breaks ties by the event's random id, so events of a
    /// key inserted within one second come out in any order (Hatchet's `createdAt` ordering).
    CreatedAtOrder,
    /// A worker that joins is handed a share of the others' partitions at once, as if they
    /// had been handed back clean, while the old holders' deliveries are still out (Pulsar
    /// Key_Shared's recently joined consumer).
    RebalanceOnJoin,
    /// A failing head is set aside while it backs off and its key moves on; once its attempts
    /// run out it is dead-lettered, after later events of its key were delivered (a FIFO queue
    /// whose redrive or visibility timeout lets a message group move on past a message that
    /// ends in the dead-letter queue).
    SetAsideHead,
    /// The head read takes the partition's oldest row whatever its key, and answers nothing
    /// while that row's key is stuck: parked while its head backs off, or holding a dead
    /// letter, whose failed row keeps the key's slot. A key that was dead-lettered blocks its
    /// partition for good (pg-boss's `key_strict_fifo`, where one stuck, retrying or failed key
    /// starved every other key of the queue).
    StuckKeyBlocksPartition,
}

impl Break {
    /// The catalogue, in order: every entry but `cursor-past-late-commit`.
    pub const ALL: [Break; 20] = [
        Break::RandomHash,
        Break::TwoReaders,
        Break::UnfencedLease,
        Break::FlipWithoutDrain,
        Break::RequeueAtTail,
        Break::ParallelInPartition,
        Break::UnserialisedProducers,
        Break::UnboundedRetry,
        Break::HandoverAlwaysClean,
        Break::UnfencedExpiry,
        Break::SkipWithoutParking,
        Break::PinWithoutBarrier,
        Break::CursorPastParked,
        Break::TimeoutLeavesCallRunning,
        Break::LocalBatch,
        Break::PriorityWithinKey,
        Break::CreatedAtOrder,
        Break::RebalanceOnJoin,
        Break::SetAsideHead,
        Break::StuckKeyBlocksPartition,
    ];

    /// The violation the checker must report when this design runs.
    pub fn expected(self) -> Kind {
        match self {
            Break::RandomHash | Break::FlipWithoutDrain | Break::PinWithoutBarrier => {
                Kind::SplitKey
            }
            Break::TwoReaders
            | Break::UnfencedLease
            | Break::ParallelInPartition
            | Break::HandoverAlwaysClean
            | Break::UnfencedExpiry
            | Break::TimeoutLeavesCallRunning
            | Break::LocalBatch
            | Break::RebalanceOnJoin => Kind::Concurrent,
            Break::RequeueAtTail
            | Break::UnserialisedProducers
            | Break::SkipWithoutParking
            | Break::CursorPastParked
            | Break::CursorPastLateCommit
            | Break::PriorityWithinKey
            | Break::CreatedAtOrder => Kind::Reorder,
            Break::UnboundedRetry | Break::StuckKeyBlocksPartition => Kind::Stall,
            Break::SetAsideHead => Kind::Skip,
        }
    }

    /// The name used on the command line and in files.
    pub fn name(self) -> &'static str {
        match self {
            Break::RandomHash => "random-hash",
            Break::TwoReaders => "two-readers",
            Break::UnfencedLease => "unfenced-lease",
            Break::FlipWithoutDrain => "flip-without-drain",
            Break::RequeueAtTail => "requeue-at-tail",
            Break::ParallelInPartition => "parallel-in-partition",
            Break::UnserialisedProducers => "unserialised-producers",
            Break::UnboundedRetry => "unbounded-retry",
            Break::HandoverAlwaysClean => "handover-always-clean",
            Break::UnfencedExpiry => "unfenced-expiry",
            Break::SkipWithoutParking => "skip-without-parking",
            Break::PinWithoutBarrier => "pin-without-barrier",
            Break::CursorPastParked => "cursor-past-parked",
            Break::CursorPastLateCommit => "cursor-past-late-commit",
            Break::TimeoutLeavesCallRunning => "timeout-leaves-call-running",
            Break::LocalBatch => "local-batch",
            Break::PriorityWithinKey => "priority-within-key",
            Break::CreatedAtOrder => "created-at-order",
            Break::RebalanceOnJoin => "rebalance-on-join",
            Break::SetAsideHead => "set-aside-head",
            Break::StuckKeyBlocksPartition => "stuck-key-blocks-partition",
        }
    }
}

/// How many deliveries the `local-batch` design runs at once.
const LOCAL_BATCH: usize = 4;

/// Every switch a scenario's broken designs turn on, decided in this one place from the
/// scenario and handed to the parts that carry them out.
#[derive(Clone, Copy, Debug, Default)]
pub struct Switches {
    /// The store host's.
    pub store: crate::hosts::store::StoreBreaks,
    /// The workers' store client's.
    pub client: crate::hosts::store_client::ClientBreaks,
    /// The workers' delivery path's.
    pub delivery: Option<crate::hosts::deliverer::DeliveryBreak>,
    /// `random-hash`: each producer routes with a hash of its own.
    pub random_hash: bool,
    /// `unserialised-producers`: producers commit one key's events concurrently.
    pub unserialised_producers: bool,
    /// `flip-without-drain`: the count changes with events queued.
    pub flip_without_drain: bool,
    /// `pin-without-barrier`: a pin takes effect at once.
    pub pin_without_barrier: bool,
    /// `unbounded-retry`: no maximum attempts.
    pub unbounded_retry: bool,
}

impl Switches {
    /// The switches of the broken designs `breaks` (a scenario's, whose delivery timeout is
    /// `delivery_timeout_ms`).
    pub fn of(breaks: &[Break], delivery_timeout_ms: u64) -> Self {
        use crate::hosts::deliverer::DeliveryBreak;
        let has = |b| breaks.contains(&b);
        let delivery = if has(Break::ParallelInPartition) {
            Some(DeliveryBreak::Parallel)
        } else if has(Break::TimeoutLeavesCallRunning) {
            let after = std::time::Duration::from_millis(delivery_timeout_ms / 2);
            Some(DeliveryBreak::LeavesCallRunning { after })
        } else if has(Break::LocalBatch) {
            Some(DeliveryBreak::LocalBatch { width: LOCAL_BATCH })
        } else {
            None
        };
        Switches {
            store: crate::hosts::store::StoreBreaks {
                shared_locks: has(Break::TwoReaders),
                requeue_at_tail: has(Break::RequeueAtTail),
                always_clean: has(Break::HandoverAlwaysClean),
                unfenced_expiry: has(Break::UnfencedExpiry),
                skip_without_parking: has(Break::SkipWithoutParking) || has(Break::SetAsideHead),
                head_order: if has(Break::PriorityWithinKey) {
                    Some(crate::hosts::store::HeadOrder::Priority)
                } else if has(Break::CreatedAtOrder) {
                    Some(crate::hosts::store::HeadOrder::CreatedAt)
                } else {
                    None
                },
                rebalance_on_join: has(Break::RebalanceOnJoin),
                stuck_key_blocks: has(Break::StuckKeyBlocksPartition),
            },
            client: crate::hosts::store_client::ClientBreaks {
                unfenced: has(Break::UnfencedLease),
                cursor_past_parked: has(Break::CursorPastParked),
                cursor_past_late_commit: has(Break::CursorPastLateCommit),
            },
            delivery,
            random_hash: has(Break::RandomHash),
            unserialised_producers: has(Break::UnserialisedProducers),
            flip_without_drain: has(Break::FlipWithoutDrain),
            pin_without_barrier: has(Break::PinWithoutBarrier),
            unbounded_retry: has(Break::UnboundedRetry),
        }
    }
}
