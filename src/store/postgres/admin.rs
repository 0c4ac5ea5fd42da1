//! [`Admin`] on PostgreSQL: one connection, opened from a URL and checked to be at the schema
//! version unless migrating.

use tokio_postgres::Client;

use crate::endpoints::EndpointRow;
use crate::ids::PartitionId;
use crate::key::Event;
use crate::layout::{LayoutRecord, Placement, RoutingState};
use crate::routing::PartitionCount;
use crate::store::admin::{
    Admin, DeadRow, Durability, EnqueueReport, KeyDepth, Layout, OpenError, OpenMode, PartitionLag,
    PinChange, SplitKey,
};
use crate::store::lock_wait::{LockWait, LockWaitReport};
use crate::store::StoreError;

use super::{layout, queue, schema, PgOptions, PgStore};

/// One PostgreSQL connection for the admin operations.
pub struct PgAdmin {
    client: Client,
    lock_wait: LockWait,
    lock_report: Option<LockWaitReport>,
}

impl PgAdmin {
    /// Connects to the database at `url` (a `postgres://` URL or key=value string); unless
    /// `mode` is [`OpenMode::Migrate`], the schema must be current. PostgreSQL creates nothing
    /// on open: [`OpenMode::Create`] is [`OpenMode::Existing`] here.
    pub async fn open(url: &str, mode: OpenMode) -> Result<Self, OpenError> {
        let config = PgStore::config_of(url).map_err(OpenError::BadUrl)?;
        let client = super::connect(&config).await.map_err(OpenError::Connect)?;
        if mode != OpenMode::Migrate {
            schema::require_current(&client).await.map_err(OpenError::Schema)?;
        }
        Ok(Self { client, lock_wait: LockWait::default(), lock_report: None })
    }
}

impl Admin for PgAdmin {
    fn schema_version(&self) -> i32 {
        schema::SCHEMA_VERSION
    }

    fn bound_lock_waits(&mut self, wait: LockWait, report: LockWaitReport) {
        self.lock_wait = wait;
        self.lock_report = Some(report);
    }

    async fn migrate(&mut self) -> Result<Vec<i32>, StoreError> {
        schema::migrate_to(
            &mut self.client,
            schema::SCHEMA_VERSION,
            &self.lock_wait,
            &mut self.lock_report,
        )
        .await
    }

    async fn enqueue(
        &mut self,
        events: &[Event],
        serialise_keys: bool,
    ) -> Result<EnqueueReport, StoreError> {
        queue::enqueue(&mut self.client, events, serialise_keys).await
    }

    async fn record_layout(&mut self, count: PartitionCount) -> Result<LayoutRecord, StoreError> {
        layout::record(&self.client, count).await
    }

    async fn routing_state(&self) -> Result<RoutingState, StoreError> {
        layout::state(&self.client).await
    }

    async fn placements(&self) -> Result<Vec<Placement>, StoreError> {
        layout::placements(&self.client).await
    }

    async fn change_pin(
        &mut self,
        key: &str,
        partition: Option<PartitionId>,
    ) -> Result<PinChange, StoreError> {
        layout::change_pin(&mut self.client, key, partition, &self.lock_wait, &mut self.lock_report)
            .await
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, StoreError> {
        queue::lag(&self.client).await
    }

    async fn heaviest_keys(&self, limit: i64) -> Result<Vec<KeyDepth>, StoreError> {
        queue::heaviest_keys(&self.client, limit).await
    }

    async fn split_keys(&self, limit: i64) -> Result<Vec<SplitKey>, StoreError> {
        queue::split_keys(&self.client, limit).await
    }

    async fn queued_keys(&self) -> Result<Vec<(String, f64)>, StoreError> {
        let rows = self
            .client
            .query_typed(
                "SELECT partition_key, count(*)::float8 FROM delivery_queue GROUP BY 1 ORDER BY 1",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn dead_letters(&self, id: Option<i64>, limit: i64) -> Result<Vec<DeadRow>, StoreError> {
        queue::dead_letters(&self.client, id, limit).await
    }

    async fn redrive(&mut self, id: i64) -> Result<Option<i64>, StoreError> {
        queue::redrive(&mut self.client, id).await
    }

    async fn switch_online(
        &mut self,
        from: PartitionCount,
        to: PartitionCount,
    ) -> Result<Layout, StoreError> {
        queue::switch_online(&mut self.client, from, to, &self.lock_wait, &mut self.lock_report)
            .await
    }

    async fn endpoints(&self) -> Result<Vec<EndpointRow>, StoreError> {
        queue::endpoints(&self.client).await
    }

    async fn set_endpoint(&mut self, row: &EndpointRow) -> Result<bool, StoreError> {
        super::endpoints::set(&self.client, row).await
    }

    async fn remove_endpoint(&mut self, key: &str) -> Result<bool, StoreError> {
        super::endpoints::remove(&self.client, key).await
    }

    async fn dead_letters_below(
        &self,
        below: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeadRow>, StoreError> {
        queue::dead_letter_page(&self.client, None, below, limit).await
    }

    async fn dead_letters_after(&self, after_id: i64) -> Result<i64, StoreError> {
        Ok(self
            .client
            .query_typed_one(
                "SELECT count(*) FROM delivery_dlq WHERE id > $1",
                &[(&after_id, tokio_postgres::types::Type::INT8)],
            )
            .await?
            .get(0))
    }

    async fn depth(&self) -> Result<i64, StoreError> {
        queue::depth(&self.client).await
    }

    async fn empty_queue(&mut self, dead_letters: bool) -> Result<(), StoreError> {
        let sql = if dead_letters {
            "TRUNCATE delivery_queue, delivery_dlq, keyorder_layout, keyorder_pin"
        } else {
            "TRUNCATE delivery_queue, keyorder_layout, keyorder_pin"
        };
        Ok(self.client.batch_execute(sql).await?)
    }

    fn deletes_leave_bloat(&self) -> bool {
        true
    }

    fn set_durability(&mut self, _durability: Durability) -> Result<(), StoreError> {
        // A commit here is as durable as the server's `synchronous_commit` makes it (on by
        // default: flushed before COMMIT returns); the producer's choice does not override it.
        Ok(())
    }

    fn durability(&self) -> Result<Option<Durability>, StoreError> {
        Ok(None)
    }
}

/// The wait of a lease taken after an unclean hand-back, for a delivery timeout of
/// `delivery_timeout`: a holder serves rows it read ahead for up to `ack_delay` after the
/// server last answered, so after a lost session the next holder waits that much longer than
/// a delivery can take.
pub fn takeover_delay(delivery_timeout: std::time::Duration) -> std::time::Duration {
    delivery_timeout + PgOptions::default().ack_delay
}
