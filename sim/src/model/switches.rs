//! The catalogue's broken designs as switches of the model, decided in this one place (as
//! `crate::breaks` does for the simulation), and the designs the model cannot express, with why.

use crate::Break;

/// Every switch a broken design turns on in the model. All off: the correct design.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Switches {
    /// `two-readers`: a lock that grants every session.
    pub shared_locks: bool,
    /// `unfenced-lease`: statements run on another connection than the lock's, so they succeed
    /// after the lock's session ended.
    pub unfenced: bool,
    /// `handover-always-clean`: every new lease is told its last holder handed it back clean.
    pub always_clean: bool,
    /// `requeue-at-tail`: a retry moves the row behind every other row.
    pub requeue_at_tail: bool,
    /// `parallel-in-partition`: the worker reports a delivery done as soon as it is sent.
    pub parallel: bool,
    /// `skip-without-parking`, `set-aside-head`: the head read passes over rows that back off,
    /// and no key is parked.
    pub skip_waiting: bool,
    /// `cursor-past-parked`: `SessionDrain::keeping_the_cursor_on_unpark`.
    pub cursor_past_parked: bool,
    /// `cursor-past-late-commit`: `SessionDrain::trusting_the_cursor`.
    pub cursor_past_late_commit: bool,
    /// `timeout-leaves-call-running`: the worker's timeout does not end the call, and reports
    /// the attempt as never sent (settled).
    pub call_outlives_timeout: bool,
    /// `stuck-key-blocks-partition`: the head read takes the oldest row whatever its key and
    /// answers nothing while that key is parked or holds a dead letter.
    pub stuck_key_blocks: bool,
    /// `unserialised-producers`: a key's later event commits while its earlier one is open.
    pub unserialised_producers: bool,
    /// `unbounded-retry`: no maximum attempts.
    pub unbounded_retry: bool,
}

/// A design the model cannot express, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported {
    /// The design.
    pub design: Break,
    /// Why the model leaves it out.
    pub why: &'static str,
}

/// The designs the model leaves out.
pub const UNSUPPORTED: [Unsupported; 9] = [
    Unsupported {
        design: Break::RandomHash,
        why: "routing is outside the model: each event's partition is fixed by its key",
    },
    Unsupported {
        design: Break::FlipWithoutDrain,
        why: "the model has one layout; a change of partition count is not among its steps",
    },
    Unsupported {
        design: Break::PinWithoutBarrier,
        why: "the model has one layout and no key pins",
    },
    Unsupported {
        design: Break::UnfencedExpiry,
        why: "the model has session leases only (no expiry lease yet)",
    },
    Unsupported {
        design: Break::LocalBatch,
        why: "a batch of concurrent deliveries is parallel-in-partition's mechanism; the model \
              has it under that name",
    },
    Unsupported { design: Break::PriorityWithinKey, why: "the model's events carry no priority" },
    Unsupported {
        design: Break::CreatedAtOrder,
        why: "the model's rows carry no insert timestamp; they are read in seq order",
    },
    Unsupported {
        design: Break::RebalanceOnJoin,
        why: "the model has no membership or rebalancing: workers take free partitions and \
              never hand one back on request",
    },
    Unsupported {
        design: Break::UnboundedRetry,
        why: "an endless retry needs an endless schedule; the bounded clock and refusal budget \
              end it, so the progress property cannot tell it from a slow one",
    },
];

impl Switches {
    /// The switches of `design`, or why the model cannot express it.
    pub fn of(design: Option<Break>) -> Result<Self, Unsupported> {
        let mut s = Switches::default();
        let Some(design) = design else { return Ok(s) };
        if let Some(u) = UNSUPPORTED.iter().find(|u| u.design == design) {
            return Err(*u);
        }
        match design {
            Break::TwoReaders => s.shared_locks = true,
            Break::UnfencedLease => s.unfenced = true,
            Break::HandoverAlwaysClean => s.always_clean = true,
            Break::RequeueAtTail => s.requeue_at_tail = true,
            Break::ParallelInPartition => s.parallel = true,
            Break::SkipWithoutParking | Break::SetAsideHead => s.skip_waiting = true,
            Break::CursorPastParked => s.cursor_past_parked = true,
            Break::CursorPastLateCommit => s.cursor_past_late_commit = true,
            Break::TimeoutLeavesCallRunning => s.call_outlives_timeout = true,
            Break::StuckKeyBlocksPartition => s.stuck_key_blocks = true,
            Break::UnserialisedProducers => s.unserialised_producers = true,
            Break::UnboundedRetry => s.unbounded_retry = true,
            Break::RandomHash
            | Break::FlipWithoutDrain
            | Break::PinWithoutBarrier
            | Break::UnfencedExpiry
            | Break::LocalBatch
            | Break::PriorityWithinKey
            | Break::CreatedAtOrder
            | Break::RebalanceOnJoin => unreachable!("listed in UNSUPPORTED"),
        }
        Ok(s)
    }
}
