//! The routing records on PostgreSQL: the layouts and the pins (see [`crate::layout`]), and
//! the queued placements the audit judges.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient};

use crate::ids::PartitionId;
use crate::layout::{LayoutRecord, PinSpan, Placement, RoutingState};
use crate::routing::{Overrides, PartitionCount, Router};
use crate::store::admin::{no_layout, recorded_count, PinChange};
use crate::store::lock_wait::{LockWait, LockWaitReport};
use crate::store::StoreError;

use super::lock_wait::{retrying, LAYOUT_LOCK};

/// What a producing transaction needs before it inserts, read in one statement: the layout in
/// force, the router of it with the pins in force, the transaction's id and the queue's seq
/// sequence.
pub(crate) struct Producing {
    /// The layout epoch in force (read `FOR SHARE`: a switch or pin change waits for the
    /// transaction).
    pub epoch: i32,
    /// Routes by that layout's count and the pins in force.
    pub router: Router,
    /// The transaction's id, taken by this read, so before any seq the transaction takes: the
    /// value of `producer_xid` on every row it inserts (schema version 8).
    pub xid: i64,
    /// The oid of `delivery_queue`'s seq sequence, for `nextval` in the insert itself: the
    /// column default (`keyorder_next_seq()`) would take the id again for every row.
    pub seq_sequence: u32,
}

/// In a producing transaction: see [`Producing`]. Marks the transaction as routed by keyorder,
/// so the insert trigger that routes plain SQL inserts leaves its rows alone. The id is taken
/// here, before the transaction's first seq, which is the rule a head read's late-commit probe
/// relies on (`store::session_drain`).
pub(crate) async fn router_in(
    tx: &impl GenericClient,
    operation: &'static str,
) -> Result<Producing, StoreError> {
    let row = tx
        .query_typed_opt(
            "SELECT epoch, partitions, set_config('keyorder.routed', 'on', true),
                    pg_current_xact_id()::text::bigint,
                    pg_get_serial_sequence('delivery_queue', 'seq')::regclass::oid
             FROM keyorder_layout ORDER BY epoch DESC LIMIT 1 FOR SHARE",
            &[],
        )
        .await?
        .ok_or_else(|| no_layout(operation))?;
    let (epoch, count) = (row.get::<_, i32>(0), recorded_count(i64::from(row.get::<_, i16>(1)))?);
    let mut pins = Overrides::new();
    for r in tx
        .query_typed(
            "SELECT partition_key, partition FROM keyorder_pin WHERE until_epoch IS NULL",
            &[],
        )
        .await?
    {
        pins.pin(r.get::<_, String>(0), PartitionId(r.get::<_, i16>(1) as u16));
    }
    let router = Router::with_overrides(count, pins)
        .map_err(|e| StoreError::Refused { operation, reason: e.to_string() })?;
    Ok(Producing { epoch, router, xid: row.get(3), seq_sequence: row.get(4) })
}

/// Records `count` as layout 0 when no layout is recorded; returns the layout in force.
pub async fn record(client: &Client, count: PartitionCount) -> Result<LayoutRecord, StoreError> {
    client
        .query_typed(
            "INSERT INTO keyorder_layout (epoch, partitions)
             SELECT 0, $1 WHERE NOT EXISTS (SELECT 1 FROM keyorder_layout)
             ON CONFLICT DO NOTHING",
            &[(&(count.get() as i16), Type::INT2)],
        )
        .await?;
    state(client).await?.current().ok_or_else(|| no_layout("record the layout"))
}

/// Every layout and pin.
pub async fn state(client: &Client) -> Result<RoutingState, StoreError> {
    let mut layouts = Vec::new();
    for r in
        client.query_typed("SELECT epoch, partitions FROM keyorder_layout ORDER BY 1", &[]).await?
    {
        layouts.push(LayoutRecord {
            epoch: r.get(0),
            partitions: recorded_count(i64::from(r.get::<_, i16>(1)))?,
        });
    }
    let pins = client
        .query_typed(
            "SELECT partition_key, partition, from_epoch, until_epoch FROM keyorder_pin ORDER BY 1, 3",
            &[],
        )
        .await?
        .iter()
        .map(|r| PinSpan {
            key: r.get(0),
            partition: PartitionId(r.get::<_, i16>(1) as u16),
            from_epoch: r.get(2),
            until_epoch: r.get(3),
        })
        .collect();
    Ok(RoutingState { layouts, pins })
}

/// Queued rows grouped by key, partition and layout, in that order.
pub async fn placements(client: &Client) -> Result<Vec<Placement>, StoreError> {
    Ok(client
        .query_typed(
            "SELECT partition_key, partition, layout, count(*) FROM delivery_queue
             GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            &[],
        )
        .await?
        .iter()
        .map(|r| Placement { key: r.get(0), partition: r.get(1), layout: r.get(2), rows: r.get(3) })
        .collect())
}

/// Pins `key` to `partition` (`None`: unpins it) under a new layout epoch of the same count,
/// so the per-key barrier holds its new rows until its old ones are gone. Refused when no
/// layout is recorded or the partition is outside the count; nothing changes then, nor when
/// the key is already pinned so. Waits for its lock on `keyorder_layout`
/// (`lock_wait::LAYOUT_LOCK`) as a switch does.
pub async fn change_pin(
    client: &mut Client,
    key: &str,
    partition: Option<PartitionId>,
    wait: &LockWait,
    report: &mut Option<LockWaitReport>,
) -> Result<PinChange, StoreError> {
    let operation = if partition.is_some() { "pin" } else { "unpin" };
    let key = key.to_owned();
    retrying(client, wait, report, operation, &LAYOUT_LOCK, |c| {
        let key = key.clone();
        Box::pin(async move { change_pin_once(c, &key, partition).await })
    })
    .await
}

/// One try of [`change_pin`].
async fn change_pin_once(
    client: &mut Client,
    key: &str,
    partition: Option<PartitionId>,
) -> Result<PinChange, StoreError> {
    let tx = client.transaction().await?;
    tx.batch_execute("LOCK TABLE keyorder_layout IN EXCLUSIVE MODE").await?;
    let row = tx
        .query_typed_opt(
            "SELECT epoch, partitions FROM keyorder_layout ORDER BY epoch DESC LIMIT 1",
            &[],
        )
        .await?
        .ok_or_else(|| no_layout("pin"))?;
    let (epoch, count) = (row.get::<_, i32>(0), recorded_count(i64::from(row.get::<_, i16>(1)))?);
    crate::layout::check_pin(key, partition, count)
        .map_err(|reason| StoreError::Refused { operation: "pin", reason })?;
    let previous = tx
        .query_typed_opt(
            "SELECT partition FROM keyorder_pin WHERE partition_key = $1 AND until_epoch IS NULL",
            &[(&key, Type::TEXT)],
        )
        .await?
        .map(|r| PartitionId(r.get::<_, i16>(0) as u16));
    let queued: i64 = tx
        .query_typed_one(
            "SELECT count(*) FROM delivery_queue WHERE partition_key = $1",
            &[(&key, Type::TEXT)],
        )
        .await?
        .get(0);
    if previous == partition {
        return Ok(PinChange { epoch, previous, queued_rows: queued, changed: false });
    }
    let next = epoch + 1;
    tx.query_typed(
        "UPDATE keyorder_pin SET until_epoch = $2 WHERE partition_key = $1 AND until_epoch IS NULL",
        &[(&key, Type::TEXT), (&next, Type::INT4)],
    )
    .await?;
    if let Some(p) = partition {
        tx.query_typed(
            "INSERT INTO keyorder_pin (partition_key, partition, from_epoch) VALUES ($1, $2, $3)",
            &[(&key, Type::TEXT), (&(p.0 as i16), Type::INT2), (&next, Type::INT4)],
        )
        .await?;
    }
    tx.query_typed(
        "INSERT INTO keyorder_layout (epoch, partitions) VALUES ($1, $2)",
        &[(&next, Type::INT4), (&(count.get() as i16), Type::INT2)],
    )
    .await?;
    tx.commit().await?;
    Ok(PinChange { epoch: next, previous, queued_rows: queued, changed: true })
}
