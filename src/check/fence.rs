//! What a receiver keeps to apply each key's events in order, whatever arrives late.
//!
//! A sender that gives up on a call (its delivery timeout) closes the connection, but cannot
//! stop the receiver: the abandoned request may still be running there when the key's retry
//! and later events arrive, and may finish after them. No sender can prevent that. The
//! `X-Keyorder-Seq` header, increasing per key, is the fencing token that makes it harmless:
//! apply an event only if its seq is above the last one applied for its key, checked and
//! recorded in the same transaction as the effect.
//!
//! ```
//! use keyorder::check::fence::SeqFence;
//!
//! // The receiver's state: the last applied seq per key, kept with the effects themselves.
//! let mut fence = SeqFence::default();
//! let mut balance = std::collections::BTreeMap::new();
//! let mut apply = |key: &str, seq: i64, value: i64| {
//!     if fence.admit(key, seq) {
//!         balance.insert(key.to_owned(), value);
//!     }
//! };
//! // Seq 1 timed out at the sender, which retried it and went on to seq 2; the abandoned
//! // first call of seq 1 finishes last.
//! apply("acct_1", 1, 100); // the retry of seq 1
//! apply("acct_1", 2, 250);
//! apply("acct_1", 1, 100); // the abandoned call, late: refused
//! assert_eq!(balance["acct_1"], 250);
//! ```

use std::collections::BTreeMap;

/// The last applied seq of each key: [`SeqFence::admit`] lets an event through only when its
/// seq is above it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqFence {
    applied: BTreeMap<String, i64>,
}

impl SeqFence {
    /// Whether the event `seq` of `key` may be applied now; if so, it is recorded as the last
    /// applied. A seq at or below the last applied (a duplicate, or a call the sender had
    /// abandoned finishing late) is refused: applying it would take the key back in time.
    pub fn admit(&mut self, key: &str, seq: i64) -> bool {
        match self.applied.get_mut(key) {
            Some(last) if seq <= *last => false,
            Some(last) => {
                *last = seq;
                true
            }
            None => {
                self.applied.insert(key.to_owned(), seq);
                true
            }
        }
    }

    /// The last applied seq of `key`, if any.
    pub fn last(&self, key: &str) -> Option<i64> {
        self.applied.get(key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request as the receiver runs it: it applies its effect when it finishes.
    struct Call {
        key: &'static str,
        seq: i64,
        finishes_at: u64,
    }

    /// A run with a delivery timeout of 10 ms against a receiver whose handler takes 25 ms on
    /// its first calls: the sender abandons seq 1 and seq 3 at 10 ms, retries them, and goes
    /// on to the next events of the key while the abandoned calls still run.
    fn abandoned_calls() -> Vec<Call> {
        let mut calls = vec![
            Call { key: "a", seq: 1, finishes_at: 25 }, // sent at 0, abandoned at 10
            Call { key: "a", seq: 1, finishes_at: 12 }, // the retry, sent at 11
            Call { key: "a", seq: 2, finishes_at: 14 },
            Call { key: "b", seq: 7, finishes_at: 15 },
            Call { key: "a", seq: 3, finishes_at: 40 }, // sent at 15, abandoned at 25
            Call { key: "a", seq: 3, finishes_at: 27 }, // the retry, sent at 26
            Call { key: "a", seq: 4, finishes_at: 29 },
        ];
        calls.sort_by_key(|c| c.finishes_at);
        calls
    }

    /// The value of each key after every call has finished, applying with or without the fence.
    fn final_state(fenced: bool) -> BTreeMap<&'static str, i64> {
        let mut fence = SeqFence::default();
        let mut state = BTreeMap::new();
        for c in abandoned_calls() {
            if !fenced || fence.admit(c.key, c.seq) {
                state.insert(c.key, c.seq);
            }
        }
        state
    }

    #[test]
    fn a_fenced_receiver_ends_in_order_under_abandoned_calls_and_a_naive_one_does_not() {
        assert_eq!(final_state(true), BTreeMap::from([("a", 4), ("b", 7)]));
        // The naive receiver applies whatever finishes last: the abandoned seq 3.
        assert_eq!(final_state(false), BTreeMap::from([("a", 3), ("b", 7)]));
    }

    #[test]
    fn only_a_seq_above_the_last_applied_is_admitted() {
        let mut f = SeqFence::default();
        assert!(f.admit("a", 5));
        assert!(!f.admit("a", 5), "a duplicate");
        assert!(!f.admit("a", 4), "an older event");
        assert!(f.admit("b", 1), "keys are fenced apart");
        assert!(f.admit("a", 6));
        assert_eq!((f.last("a"), f.last("b"), f.last("c")), (Some(6), Some(1), None));
    }
}
