//! The routing records on SQLite, the counterparts of PostgreSQL's (see
//! [`crate::layout`]): the layouts, the pins, and the queued placements the audit judges.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::ids::PartitionId;
use crate::layout::{LayoutRecord, PinSpan, Placement, RoutingState};
use crate::routing::{Overrides, PartitionCount, Router};
use crate::store::admin::{no_layout, recorded_count, PinChange};
use crate::store::StoreError;

/// In a producing transaction (which holds the write lock): the layout in force and the
/// router of it with the pins in force.
pub(crate) fn router_in(
    c: &Connection,
    operation: &'static str,
) -> Result<(i64, Router), StoreError> {
    let (epoch, count) = c
        .query_row(
            "SELECT epoch, partitions FROM keyorder_layout ORDER BY epoch DESC LIMIT 1",
            [],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()?
        .ok_or_else(|| no_layout(operation))?;
    let mut pins = Overrides::new();
    let mut stmt = c.prepare_cached(
        "SELECT partition_key, partition FROM keyorder_pin WHERE until_epoch IS NULL",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    for row in rows {
        let (key, p) = row?;
        pins.pin(key, PartitionId(p as u16));
    }
    let router = Router::with_overrides(recorded_count(count)?, pins)
        .map_err(|e| StoreError::Refused { operation, reason: e.to_string() })?;
    Ok((epoch, router))
}

/// Records `count` as layout 0 when no layout is recorded; returns the layout in force.
pub fn record(c: &Connection, count: PartitionCount) -> Result<LayoutRecord, StoreError> {
    c.execute(
        "INSERT INTO keyorder_layout (epoch, partitions)
         SELECT 0, ?1 WHERE NOT EXISTS (SELECT 1 FROM keyorder_layout)",
        [i64::from(count.get())],
    )?;
    state(c)?.current().ok_or_else(|| no_layout("record the layout"))
}

/// Every layout and pin.
pub fn state(c: &Connection) -> Result<RoutingState, StoreError> {
    let mut layouts = Vec::new();
    let mut stmt = c.prepare("SELECT epoch, partitions FROM keyorder_layout ORDER BY 1")?;
    for row in stmt.query_map([], |r| Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?)))? {
        let (epoch, n) = row?;
        layouts.push(LayoutRecord { epoch, partitions: recorded_count(n)? });
    }
    let mut stmt = c.prepare(
        "SELECT partition_key, partition, from_epoch, until_epoch FROM keyorder_pin ORDER BY 1, 3",
    )?;
    let pins = stmt
        .query_map([], |r| {
            Ok(PinSpan {
                key: r.get(0)?,
                partition: PartitionId(r.get::<_, i64>(1)? as u16),
                from_epoch: r.get(2)?,
                until_epoch: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(RoutingState { layouts, pins })
}

/// Queued rows grouped by key, partition and layout, in that order.
pub fn placements(c: &Connection) -> Result<Vec<Placement>, StoreError> {
    let mut stmt = c.prepare(
        "SELECT partition_key, partition, layout, queued FROM keyorder_key_rows ORDER BY 1, 2, 3",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(Placement { key: r.get(0)?, partition: r.get(1)?, layout: r.get(2)?, rows: r.get(3)? })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Pins `key` to `partition` (`None`: unpins it) under a new layout epoch of the same count
/// (see [`crate::store::postgres`]'s counterpart).
pub fn change_pin(
    c: &mut Connection,
    key: &str,
    partition: Option<PartitionId>,
) -> Result<PinChange, StoreError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (epoch, count) = tx
        .query_row(
            "SELECT epoch, partitions FROM keyorder_layout ORDER BY epoch DESC LIMIT 1",
            [],
            |r| Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()?
        .ok_or_else(|| no_layout("pin"))?;
    let count = recorded_count(count)?;
    crate::layout::check_pin(key, partition, count)
        .map_err(|reason| StoreError::Refused { operation: "pin", reason })?;
    let previous = tx
        .query_row(
            "SELECT partition FROM keyorder_pin WHERE partition_key = ?1 AND until_epoch IS NULL",
            [key],
            |r| r.get::<_, i64>(0),
        )
        .optional()?
        .map(|p| PartitionId(p as u16));
    let queued: i64 = tx.query_row(
        "SELECT coalesce(sum(queued), 0) FROM keyorder_key_rows WHERE partition_key = ?1",
        [key],
        |r| r.get(0),
    )?;
    if previous == partition {
        return Ok(PinChange { epoch, previous, queued_rows: queued, changed: false });
    }
    let next = epoch + 1;
    tx.execute(
        "UPDATE keyorder_pin SET until_epoch = ?2 WHERE partition_key = ?1 AND until_epoch IS NULL",
        params![key, next],
    )?;
    if let Some(p) = partition {
        tx.execute(
            "INSERT INTO keyorder_pin (partition_key, partition, from_epoch) VALUES (?1, ?2, ?3)",
            params![key, i64::from(p.0), next],
        )?;
    }
    tx.execute(
        "INSERT INTO keyorder_layout (epoch, partitions) VALUES (?1, ?2)",
        params![next, i64::from(count.get())],
    )?;
    tx.commit()?;
    Ok(PinChange { epoch: next, previous, queued_rows: queued, changed: true })
}
