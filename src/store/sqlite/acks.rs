//! Deleting a connection's buffered acknowledgements (an [`ExpiryAcks`] flush) in SQL.
//!
//! [`ExpiryAcks`]: crate::store::expiry_drain::ExpiryAcks

use rusqlite::Connection;

use super::Fence;
use crate::store::expiry_drain::{Flush, LeaseKey};
use crate::store::StoreError;

/// Deletes `flush` inside the open transaction `tx`: each lease's rows after its fenced
/// renewal. Returns the leases whose renewal was refused (their rows untouched); any other
/// error fails the whole flush.
pub(super) fn delete_batch(
    tx: &Connection,
    flush: &Flush<Fence>,
) -> Result<Vec<LeaseKey>, StoreError> {
    let mut lost = Vec::new();
    let mut del = tx.prepare_cached(super::DELETE_SQL)?;
    for (key, fence, seqs) in flush.leases() {
        match fence.renew(tx) {
            Ok(()) => {
                for seq in seqs {
                    del.execute([fence.p(), *seq])?;
                }
            }
            Err(StoreError::LeaseNotHeld { .. }) => lost.push(key),
            Err(other) => return Err(other),
        }
    }
    Ok(lost)
}
