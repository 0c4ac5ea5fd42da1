//! The one place a rusqlite error becomes a [`StoreError`]: the driver's error is kept as the
//! source, so nothing outside this folder names rusqlite.

use rusqlite::ErrorCode;

use crate::store::StoreError;

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend { backend: "sqlite", source: Box::new(e) }
    }
}

/// An error met while opening a file, classified: SQLite's refusals to open, create or write
/// the file (or a file that is not a database) become [`StoreError::CannotOpen`], which the
/// user can fix; anything else is returned as it is.
pub(crate) fn opening(e: StoreError) -> StoreError {
    let code = sqlite_code(&e);
    let StoreError::Backend { backend, source } = e else { return e };
    if matches!(
        code,
        Some(
            ErrorCode::CannotOpen
                | ErrorCode::ReadOnly
                | ErrorCode::NotADatabase
                | ErrorCode::PermissionDenied
        )
    ) {
        StoreError::CannotOpen { backend, source }
    } else {
        StoreError::Backend { backend, source }
    }
}

/// SQLite's primary result code behind `e`, when `e` is a SQLite statement's error.
pub(crate) fn sqlite_code(e: &StoreError) -> Option<ErrorCode> {
    let StoreError::Backend { source, .. } = e else { return None };
    source.downcast_ref::<rusqlite::Error>().and_then(rusqlite::Error::sqlite_error_code)
}
