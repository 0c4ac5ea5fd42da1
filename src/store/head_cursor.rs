//! Where an expiry lease's next head read starts. Sans-IO: a part of
//! [`ExpiryDrain`](crate::store::expiry_drain::ExpiryDrain), which the SQLite store and the
//! simulation's expiry-lease client both drive.
//!
//! Heads are read after the last acknowledged (or dead-lettered) seq. That skips rows whose
//! deletes are still buffered ([`crate::store::ack_buffer`]) without looking at them, and is
//! sound only where seq order is commit order, so no row can commit behind the cursor: SQLite
//! serialises its writers, and the simulated store gives an expiry lease's queue its seqs at
//! commit for that reason. Every row at or below the cursor is acknowledged or of a key the
//! drain had parked; once a key is unparked its oldest row lies behind the cursor, so the
//! cursor goes back to the partition's start ([`HeadCursor::look`]).

use crate::drain::ParkedKeys;
use crate::ids::Seq;

/// An expiry lease's read position and the parked keys its last head read passed over.
#[derive(Debug, Default)]
pub struct HeadCursor {
    /// The last acknowledged or dead-lettered seq (0: the partition's start).
    after: i64,
    /// The parked keys the last head read passed over.
    skipped: ParkedKeys,
}

impl HeadCursor {
    /// A cursor at the partition's start.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the drain's parked keys before a head read. Returns `true` when a key was unparked
    /// since the last read: its oldest row lies behind the cursor, beside acknowledged rows whose
    /// deletes may still be buffered, so the caller must drop what it read ahead and delete the
    /// buffered acknowledgements before it reads; the cursor is back at the start.
    pub fn look(&mut self, skip: &ParkedKeys) -> bool {
        let unparked = !self.skipped.is_subset(skip);
        if unparked {
            self.after = 0;
        }
        if self.skipped != *skip {
            self.skipped = skip.clone();
        }
        unparked
    }

    /// The seq the next head read starts after.
    pub fn after(&self) -> i64 {
        self.after
    }

    /// Records that `seq` was acknowledged or dead-lettered: reads start after it.
    pub fn passed(&mut self, seq: Seq) {
        self.after = self.after.max(seq.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(keys: &[&str]) -> ParkedKeys {
        ParkedKeys::new(keys.iter().map(|k| (*k).to_owned()))
    }

    #[test]
    fn moves_past_acknowledged_rows_and_never_back_while_keys_stay_parked() {
        let mut c = HeadCursor::new();
        assert!(!c.look(&ParkedKeys::NONE));
        c.passed(Seq(5));
        c.passed(Seq(3));
        assert_eq!(c.after(), 5, "an older seq does not move it back");
        assert!(!c.look(&parked(&["a"])), "parking a key keeps the cursor");
        c.passed(Seq(9));
        assert!(!c.look(&parked(&["a", "b"])));
        assert_eq!(c.after(), 9);
    }

    #[test]
    fn an_unparked_key_sends_the_cursor_back_to_the_start_once() {
        let mut c = HeadCursor::new();
        c.look(&parked(&["a", "b"]));
        c.passed(Seq(7));
        assert!(c.look(&parked(&["b"])), "a was unparked");
        assert_eq!(c.after(), 0);
        c.passed(Seq(2));
        assert!(!c.look(&parked(&["b"])), "reported once");
        assert_eq!(c.after(), 2);
    }
}
