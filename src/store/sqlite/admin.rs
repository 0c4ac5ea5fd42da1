//! [`Admin`] on SQLite: one connection to the file, opened as [`schema::open`] allows. The
//! calls block: they run on the command line's runtime with nothing else on it.
//!
//! This is the producer's connection (`keyorder enqueue`, `dlq redrive`, the bench's enqueue):
//! it commits with `synchronous = FULL` unless [`Admin::set_durability`] says otherwise, so an
//! enqueue that returned survives a power cut. The worker's connections stay `NORMAL`: a lost
//! acknowledgement is redelivered (a duplicate), never lost.

use std::path::Path;

use rusqlite::Connection;

use crate::endpoints::EndpointRow;
use crate::ids::PartitionId;
use crate::key::Event;
use crate::layout::{LayoutRecord, Placement, RoutingState};
use crate::routing::PartitionCount;
use crate::store::admin::{
    Admin, DeadRow, Durability, EnqueueReport, KeyDepth, Layout, OpenError, OpenMode, PartitionLag,
    PinChange, SplitKey,
};
use crate::store::StoreError;

use super::{layout, queue, schema};

/// One SQLite connection for the admin operations.
pub struct SqliteAdmin {
    conn: Connection,
    /// The database file: a write that gives up waiting for its lock names the holders.
    path: std::path::PathBuf,
}

impl SqliteAdmin {
    /// Opens the file at `path` as `mode` allows (see [`schema::open`]); a refusal the user can
    /// fix (no such file, not a database, read-only, another schema version) is
    /// [`OpenError::Unusable`]. Its commits are [`Durability::Full`].
    pub fn open(path: &Path, mode: OpenMode) -> Result<Self, OpenError> {
        let opened = schema::open(path, mode).and_then(|conn| {
            let mut admin = Self { conn, path: path.to_owned() };
            admin.set_durability(Durability::Full)?;
            Ok(admin)
        });
        let opened = opened
            .map_err(|e| super::lock_holders::explain_busy(e, path, schema::DEFAULT_BUSY_TIMEOUT));
        match opened {
            Ok(admin) => Ok(admin),
            Err(error @ (StoreError::Refused { .. } | StoreError::CannotOpen { .. })) => {
                Err(OpenError::Unusable { file: path.to_owned(), error })
            }
            Err(error) => Err(OpenError::Other { file: path.to_owned(), error }),
        }
    }
}

impl SqliteAdmin {
    /// `result`, with a write that gave up on the database's lock reported with its holders.
    fn located<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        result.map_err(|e| {
            super::lock_holders::explain_busy(e, &self.path, schema::DEFAULT_BUSY_TIMEOUT)
        })
    }
}

impl Admin for SqliteAdmin {
    fn schema_version(&self) -> i32 {
        schema::SCHEMA_VERSION
    }

    async fn migrate(&mut self) -> Result<Vec<i32>, StoreError> {
        // Opening for migration applied nothing; this applies what was missing and reports it.
        let applied = schema::migrate(&mut self.conn);
        self.located(applied)
    }

    async fn enqueue(
        &mut self,
        events: &[Event],
        _serialise_keys: bool,
    ) -> Result<EnqueueReport, StoreError> {
        // One writer at a time: rows of one key always commit in seq order.
        let report = queue::enqueue(&mut self.conn, events);
        self.located(report)
    }

    async fn record_layout(&mut self, count: PartitionCount) -> Result<LayoutRecord, StoreError> {
        self.located(layout::record(&self.conn, count))
    }

    async fn routing_state(&self) -> Result<RoutingState, StoreError> {
        layout::state(&self.conn)
    }

    async fn placements(&self) -> Result<Vec<Placement>, StoreError> {
        layout::placements(&self.conn)
    }

    async fn change_pin(
        &mut self,
        key: &str,
        partition: Option<PartitionId>,
    ) -> Result<PinChange, StoreError> {
        let change = layout::change_pin(&mut self.conn, key, partition);
        self.located(change)
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, StoreError> {
        queue::lag(&self.conn)
    }

    async fn heaviest_keys(&self, limit: i64) -> Result<Vec<KeyDepth>, StoreError> {
        queue::heaviest_keys(&self.conn, limit)
    }

    async fn split_keys(&self, limit: i64) -> Result<Vec<SplitKey>, StoreError> {
        queue::split_keys(&self.conn, limit)
    }

    async fn queued_keys(&self) -> Result<Vec<(String, f64)>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT partition_key, CAST(sum(queued) AS REAL) FROM keyorder_key_rows GROUP BY 1 ORDER BY 1",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    async fn dead_letters(&self, id: Option<i64>, limit: i64) -> Result<Vec<DeadRow>, StoreError> {
        queue::dead_letters(&self.conn, id, limit)
    }

    async fn redrive(&mut self, id: i64) -> Result<Option<i64>, StoreError> {
        let redriven = queue::redrive(&mut self.conn, id);
        self.located(redriven)
    }

    async fn switch_online(
        &mut self,
        from: PartitionCount,
        to: PartitionCount,
    ) -> Result<Layout, StoreError> {
        let layout = queue::switch_online(&mut self.conn, from, to);
        self.located(layout)
    }

    async fn endpoints(&self) -> Result<Vec<EndpointRow>, StoreError> {
        queue::endpoints(&self.conn)
    }

    async fn set_endpoint(&mut self, row: &EndpointRow) -> Result<bool, StoreError> {
        self.located(super::endpoints::set(&self.conn, row))
    }

    async fn remove_endpoint(&mut self, key: &str) -> Result<bool, StoreError> {
        self.located(super::endpoints::remove(&self.conn, key))
    }

    async fn dead_letters_below(
        &self,
        below: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeadRow>, StoreError> {
        queue::dead_letter_page(&self.conn, None, below, limit)
    }

    async fn dead_letters_after(&self, after_id: i64) -> Result<i64, StoreError> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM delivery_dlq WHERE id > ?1",
            [after_id],
            |r| r.get(0),
        )?)
    }

    async fn depth(&self) -> Result<i64, StoreError> {
        // A count on an indexed table: short enough to run on the caller's runtime.
        queue::depth(&self.conn)
    }

    async fn empty_queue(&mut self, dead_letters: bool) -> Result<(), StoreError> {
        let sql = if dead_letters {
            "DELETE FROM delivery_queue; DELETE FROM delivery_dlq; DELETE FROM keyorder_lease;
             DELETE FROM keyorder_layout; DELETE FROM keyorder_pin;"
        } else {
            "DELETE FROM delivery_queue; DELETE FROM keyorder_lease;
             DELETE FROM keyorder_layout; DELETE FROM keyorder_pin;"
        };
        let emptied = self.conn.execute_batch(sql).map_err(StoreError::from);
        self.located(emptied)
    }

    fn deletes_leave_bloat(&self) -> bool {
        false
    }

    fn set_durability(&mut self, durability: Durability) -> Result<(), StoreError> {
        let level = match durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        Ok(self.conn.pragma_update(None, "synchronous", level)?)
    }

    fn durability(&self) -> Result<Option<Durability>, StoreError> {
        // 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA; this connection only ever sets 1 or 2.
        let level: i64 = self.conn.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
        Ok(Some(if level >= 2 { Durability::Full } else { Durability::Normal }))
    }
}
