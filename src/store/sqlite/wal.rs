//! Keeping a worker connection's write-ahead log short.
//!
//! SQLite writes the WAL from its start again (a restart) only when a write transaction begins
//! with every frame checkpointed and no reader still reading from the log. Two worker
//! connections that commit and read in turn, tens of microseconds apart, almost never leave
//! such a moment: the automatic checkpoint after each commit keeps up, but the log is appended
//! to for hundreds of thousands of frames before a restart happens by chance (3 GB, 740,000
//! frames, in a drain of 1,000,000 events on two connections). Appending costs the file system
//! what overwriting does not (block allocation and the zeroing of new page-cache pages: 14% of
//! that drain's CPU), on top of a log file gigabytes long.
//!
//! So every [`RESTART_EVERY`] write transactions a connection asks for a `RESTART` checkpoint
//! after its commit: it copies what is left and waits at most [`RESTART_WAIT`] for the readers
//! still on the log, and the next writer starts the log from the beginning. The log then stays
//! at a few tens of megabytes. Durability is unchanged: a checkpoint copies committed frames to
//! the database file, and syncs, in any mode.

use std::cell::Cell;
use std::time::Duration;

use rusqlite::Connection;

/// Write transactions of a connection between two restart requests. A write deletes at least
/// `ack_batch` (512) acknowledged rows, and on a deep queue writes about a frame per row, so
/// this is a restart every 8,192 frames (32 MiB) or so, eight automatic checkpoints' worth.
pub(super) const RESTART_EVERY: u32 = 16;

/// How long a restart waits for the write lock and the readers before giving up until the next
/// request. A head read holds the log for tens of microseconds; a reader that holds it longer
/// (a paused process) costs each request this much, one in [`RESTART_EVERY`] writes.
pub(super) const RESTART_WAIT: Duration = Duration::from_millis(2);

/// Counts a connection's write transactions, to ask for a restart every [`RESTART_EVERY`].
#[derive(Debug, Default)]
pub(super) struct Restarts {
    writes: Cell<u32>,
}

impl Restarts {
    /// Counts a write about to run: whether it should end with a restart request.
    pub(super) fn next(&self) -> bool {
        let n = self.writes.get().wrapping_add(1);
        self.writes.set(n);
        n % RESTART_EVERY == 0
    }
}

/// After a commit on `c` (whose busy timeout is `busy_timeout`): asks for a restart, waiting at
/// most [`RESTART_WAIT`]. Best effort: the commit stands whatever happens here, so a refusal or
/// an error is dropped (the next request tries again).
pub(super) fn restart(c: &Connection, busy_timeout: Duration) {
    if c.busy_timeout(RESTART_WAIT).is_err() {
        return;
    }
    // One row: (busy, frames in the log, frames checkpointed). Busy is no error.
    let _ = c.query_row("PRAGMA wal_checkpoint(RESTART)", [], |_| Ok(()));
    let _ = c.busy_timeout(busy_timeout);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_is_asked_for_every_restart_every_writes() {
        let r = Restarts::default();
        let asked: Vec<u32> = (1..=3 * RESTART_EVERY).filter(|_| r.next()).collect();
        assert_eq!(asked.len(), 3);
    }

    #[test]
    fn a_restart_leaves_the_busy_timeout_as_it_was_and_empties_the_log() {
        let dir = std::env::temp_dir().join(format!("keyorder-wal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let c = Connection::open(dir.join("wal.db")).expect("open");
        let mode: String = c.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).expect("wal");
        assert_eq!(mode, "wal");
        c.execute_batch("CREATE TABLE t (x); INSERT INTO t VALUES (1);").expect("write");
        restart(&c, Duration::from_millis(1234));
        let timeout: i64 = c.query_row("PRAGMA busy_timeout", [], |r| r.get(0)).expect("read");
        assert_eq!(timeout, 1234);
        // Everything was copied, so the next write starts the log again: one short frame run.
        c.execute("INSERT INTO t VALUES (2)", []).expect("write");
        let log: i64 =
            c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1)).expect("state");
        assert!(log <= 2, "the log restarted: {log} frames");
        drop(c);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
