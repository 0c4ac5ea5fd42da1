//! Whether a URL's sessions are the client's own: the check `work`, `migrate`, `switch` and
//! the pin commands run before anything else, since a session advisory lock (a lease), a
//! session setting and a prepared statement all belong to the server connection, and a pooler
//! in transaction or statement mode hands that connection to other clients between
//! transactions.
//!
//! The check uses the simple query protocol only (no prepared statement, which such a pooler
//! may refuse or forward), and trusts nothing the pooler could answer for the server: two
//! client connections each set a session-level marker (`keyorder.session_probe`) to a token of
//! their own and read back `pg_backend_pid()` with it, while the other holds a transaction
//! open, so that a pooler has both reason and room to swap server connections. A session is
//! its own when every read answers its own marker from the same server process, and the two
//! sessions were never one server process. A pooler that refuses a transaction block is in
//! statement mode.
//!
//! The same check reads whether the server accepts writes: a standby in recovery (or a server
//! with `default_transaction_read_only`) is refused with [`StoreError::ReadOnly`].

use std::time::Duration;

use tokio_postgres::{Client, Config, SimpleQueryMessage};

use crate::store::StoreError;

/// How a pooler between the client and the server shares server connections, as the check
/// found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolingMode {
    /// A server connection serves a client for one transaction, then others (PgBouncer's
    /// `pool_mode = transaction`).
    Transaction,
    /// A server connection serves a client for one statement; transaction blocks are refused
    /// (`pool_mode = statement`).
    Statement,
}

impl std::fmt::Display for PoolingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PoolingMode::Transaction => "transaction",
            PoolingMode::Statement => "statement",
        })
    }
}

impl PoolingMode {
    fn between(self) -> &'static str {
        match self {
            PoolingMode::Transaction => "transactions",
            PoolingMode::Statement => "statements",
        }
    }
}

/// How long the check holds a transaction open on one connection while the other reads: room
/// for a pooler to hand the other a different server connection. Paid once, at start.
const HOLD: Duration = Duration::from_millis(200);

/// Reads of the marker after it was set, on each connection.
const READS: usize = 3;

/// The statement that reads a session's server process and marker.
const READ: &str = "SELECT pg_backend_pid()::text, current_setting('keyorder.session_probe', true)";

/// What one read answered: the server process and the marker it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    pid: String,
    marker: Option<String>,
}

/// Checks, before `operation` takes any lock or writes anything, that sessions opened from
/// `config` are the client's own and that the server accepts writes. Opens two connections
/// and closes them again.
///
/// Errors: [`StoreError::SessionsPooled`] naming the pooling mode found,
/// [`StoreError::ReadOnly`] for a read-only server, or the driver's error.
pub async fn require_own_sessions(
    config: &Config,
    operation: &'static str,
) -> Result<(), StoreError> {
    let a = super::connect(config).await?;
    let b = super::connect(config).await?;
    let pooled =
        |mode: PoolingMode| StoreError::SessionsPooled { operation, mode, between: mode.between() };
    let token = |who: &str| format!("{who}-{}-{:p}", std::process::id(), &a);
    let (mark_a, mark_b) = (token("a"), token("b"));
    let first_a = mark(&a, &mark_a).await?;
    // A pooler in statement mode refuses a transaction block (PgBouncer closes the connection).
    if let Err(e) = b.batch_execute("BEGIN").await {
        return Err(if refused_block(&e) { pooled(PoolingMode::Statement) } else { e.into() });
    }
    let first_b = mark(&b, &mark_b).await?;
    let mut own = first_a.pid != first_b.pid && first_b.marker.as_deref() == Some(&mark_b);
    // While b's transaction holds its server connection, a reads; then b commits, and a reads
    // again after b's marker could have reached a's server connection.
    let reads = async {
        let mut seen = Vec::with_capacity(READS);
        for _ in 0..READS {
            seen.push(read(&a).await?);
        }
        Ok::<_, StoreError>(seen)
    };
    let commit = async {
        tokio::time::sleep(HOLD).await;
        b.batch_execute("COMMIT").await
    };
    let (seen, committed) = tokio::join!(reads, commit);
    committed?;
    let mut seen = seen?;
    seen.push(read(&a).await?);
    seen.push(read(&b).await?);
    let last_b = seen.pop().expect("pushed just above");
    own &= last_b == first_b;
    own &= seen.iter().all(|s| *s == first_a);
    if !own {
        return Err(pooled(PoolingMode::Transaction));
    }
    read_only(&a, operation).await
}

/// Sets `token` as the session's marker, in a statement of its own, and reads it back.
async fn mark(client: &Client, token: &str) -> Result<Seen, StoreError> {
    // The token is ours (no quote in it): no injection.
    client.batch_execute(&format!("SET keyorder.session_probe = '{token}'")).await?;
    read(client).await
}

/// The session's server process and marker, by the simple query protocol.
async fn read(client: &Client) -> Result<Seen, StoreError> {
    let row = first_row(client.simple_query(READ).await?)?;
    Ok(Seen {
        pid: row.first().cloned().flatten().unwrap_or_default(),
        marker: row.get(1).cloned().flatten().filter(|m| !m.is_empty()),
    })
}

/// Refuses `operation` when the server accepts no writes.
async fn read_only(client: &Client, operation: &'static str) -> Result<(), StoreError> {
    let row = first_row(
        client
            .simple_query(
                "SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only')",
            )
            .await?,
    )?;
    let recovering = row.first().cloned().flatten().as_deref() == Some("true");
    let read_only = row.get(1).cloned().flatten().as_deref() == Some("on");
    let why = if recovering {
        "it is a standby in recovery"
    } else if read_only {
        "its transactions are read-only: default_transaction_read_only is on"
    } else {
        return Ok(());
    };
    Err(StoreError::ReadOnly { operation, why: why.to_owned() })
}

/// The columns of the first row of a simple query's answer.
fn first_row(messages: Vec<SimpleQueryMessage>) -> Result<Vec<Option<String>>, StoreError> {
    for m in messages {
        if let SimpleQueryMessage::Row(row) = m {
            return Ok((0..row.len()).map(|i| row.get(i).map(str::to_owned)).collect());
        }
    }
    Err(StoreError::Refused {
        operation: "check the database sessions",
        reason: "the server answered a SELECT with no row".into(),
    })
}

/// Whether `e` is a pooler refusing a transaction block (statement pooling).
fn refused_block(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|d| d.message().contains("statement pooling"))
}
