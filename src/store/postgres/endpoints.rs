//! Writing the per-key endpoint table (`keyorder_endpoint`) on PostgreSQL: `keyorder endpoints
//! set` and `rm`. The caller validates a row before it is written; reading is
//! [`super::queue::endpoints`].

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::endpoints::EndpointRow;
use crate::store::StoreError;

/// Writes `row`, replacing the key's row if it has one, in one statement. Returns whether a
/// row was replaced.
pub async fn set(client: &Client, row: &EndpointRow) -> Result<bool, StoreError> {
    // `xmax` is 0 on a freshly inserted row and set on one the conflict branch updated.
    let r = client
        .query_typed_one(
            "INSERT INTO keyorder_endpoint (partition_key, url, secret_ref) VALUES ($1, $2, $3)
             ON CONFLICT (partition_key) DO UPDATE SET url = excluded.url, secret_ref = excluded.secret_ref
             RETURNING xmax = 0",
            &[(&row.key, Type::TEXT), (&row.url, Type::TEXT), (&row.secret_ref, Type::TEXT)],
        )
        .await?;
    let inserted: bool = r.get(0);
    Ok(!inserted)
}

/// Deletes the row of `key`. Returns whether there was one.
pub async fn remove(client: &Client, key: &str) -> Result<bool, StoreError> {
    let rows = client
        .query_typed(
            "DELETE FROM keyorder_endpoint WHERE partition_key = $1 RETURNING 1",
            &[(&key, Type::TEXT)],
        )
        .await?;
    Ok(!rows.is_empty())
}
