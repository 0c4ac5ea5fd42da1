//! The one place a tokio-postgres error becomes a [`StoreError`]: the driver's error is kept as
//! the source, so nothing outside this folder names tokio-postgres.

use crate::store::StoreError;

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Backend { backend: "postgres", source: Box::new(e) }
    }
}
