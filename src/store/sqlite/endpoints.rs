//! Writing the per-key endpoint table (`keyorder_endpoint`) of a SQLite file: `keyorder
//! endpoints set` and `rm`. The caller validates a row before it is written; reading is
//! [`super::queue::endpoints`].

use rusqlite::{params, Connection, OptionalExtension};

use crate::endpoints::EndpointRow;
use crate::store::StoreError;

/// Writes `row`, replacing the key's row if it has one, in one transaction. Returns whether
/// a row was replaced.
pub fn set(c: &Connection, row: &EndpointRow) -> Result<bool, StoreError> {
    let tx = c.unchecked_transaction()?;
    let existed = tx
        .query_row("SELECT 1 FROM keyorder_endpoint WHERE partition_key = ?1", [&row.key], |_| {
            Ok(())
        })
        .optional()?
        .is_some();
    tx.execute(
        "INSERT INTO keyorder_endpoint (partition_key, url, secret_ref) VALUES (?1, ?2, ?3)
         ON CONFLICT (partition_key) DO UPDATE SET url = excluded.url, secret_ref = excluded.secret_ref",
        params![row.key, row.url, row.secret_ref],
    )?;
    tx.commit()?;
    Ok(existed)
}

/// Deletes the row of `key`. Returns whether there was one.
pub fn remove(c: &Connection, key: &str) -> Result<bool, StoreError> {
    Ok(c.execute("DELETE FROM keyorder_endpoint WHERE partition_key = ?1", [key])? > 0)
}
