//! Deleting a connection's buffered acknowledgements ([`AckBuffer`]) in SQL.

use rusqlite::Connection;

use super::Fence;
use crate::store::ack_buffer;
use crate::store::StoreError;

pub(super) use ack_buffer::{AckBuffer, LeaseKey};

/// Rows to delete, per lease, with the fence each batch is deleted under.
pub(super) type Batch = ack_buffer::Batch<Fence>;

/// Deletes `batch` inside the open transaction `tx`: each lease's rows after its fenced
/// renewal. Returns the leases whose renewal was refused (their rows untouched); any other
/// error fails the whole flush.
pub(super) fn delete_batch(tx: &Connection, batch: &Batch) -> Result<Vec<LeaseKey>, StoreError> {
    let mut lost = Vec::new();
    let mut del = tx.prepare_cached(super::DELETE_SQL)?;
    for (key, (fence, seqs)) in batch {
        match fence.renew(tx) {
            Ok(()) => {
                for seq in seqs {
                    del.execute([fence.p(), *seq])?;
                }
            }
            Err(StoreError::LeaseNotHeld { .. }) => lost.push(*key),
            Err(other) => return Err(other),
        }
    }
    Ok(lost)
}
