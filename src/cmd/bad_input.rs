//! The command line's one error type of its own: input the user can fix.

/// Input the user can fix: reported with exit code 2, like a usage error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);
