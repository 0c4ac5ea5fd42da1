//! The one place a tokio-postgres error becomes a [`StoreError`]: the driver's error is kept as
//! the source, so nothing outside this folder names tokio-postgres.

use crate::store::StoreError;

impl From<tokio_postgres::Error> for StoreError {
    /// A write refused by a read-only server (a standby) is [`StoreError::ReadOnly`], so the
    /// user reads what to point `--database` at, not an SQL error.
    fn from(e: tokio_postgres::Error) -> Self {
        if e.code() == Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION) {
            let why = e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned());
            return StoreError::ReadOnly { operation: "this command", why };
        }
        StoreError::Backend { backend: "postgres", source: Box::new(e) }
    }
}
