//! The database commands: `migrate`, `enqueue`, `work`, `lag`, `dlq`, and the runtime they
//! share (one current-thread runtime with a `LocalSet`, as the worker loop requires).

use std::future::Future;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use keyorder::key::Event;
use keyorder::retry::RetryPolicy;
use keyorder::store::postgres::{self, queue, schema, PgOptions, PgStore};
use keyorder::store::sqlite::{self, schema::OpenMode, SqliteOptions, SqliteStore};
use keyorder::store::{Store, StoreError};
use keyorder::worker::{self, WorkerConfig};
use keyorder::{PartitionCount, Router};
use tokio_postgres::Client;

use super::delivery::DeliveryArgs;
use super::BadInput;
use keyorder::endpoints::EndpointRow;
use keyorder::http::{EndpointDirectory, RoutedDeliverer};

/// Runs `fut` on a current-thread runtime inside a `LocalSet`.
pub fn block_on<F: Future>(fut: F) -> anyhow::Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let local = tokio::task::LocalSet::new();
    Ok(local.block_on(&rt, fut))
}

/// The database to use.
#[derive(Debug, Clone, Args)]
pub struct Database {
    /// Where the queue lives: sqlite:PATH (a file, created on first `enqueue`, `migrate` or
    /// `work`) or a PostgreSQL URL, postgres://user@host/db. Default: sqlite:keyorder.db in the
    /// working directory, unless DATABASE_URL is set.
    #[arg(long, env = "DATABASE_URL", default_value = DEFAULT_DATABASE)]
    pub database: String,
}

/// The database when neither --database nor DATABASE_URL says otherwise.
pub const DEFAULT_DATABASE: &str = "sqlite:keyorder.db";

/// A parsed --database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbTarget {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL URL or key=value connection string.
    Postgres(String),
}

/// The store's queue operations, on either database. The SQLite calls block: these are
/// one-shot commands with nothing else on their runtime.
pub enum Queue {
    /// PostgreSQL.
    Pg(Client),
    /// SQLite.
    Sqlite(rusqlite::Connection),
}

/// A refusal to open a SQLite file is input the user can fix (the file or the flag).
pub(crate) fn sqlite_refusal(path: &std::path::Path, e: StoreError) -> anyhow::Error {
    let detail = match &e {
        StoreError::Refused { reason, .. } => reason.clone(),
        StoreError::CannotOpen { .. } => {
            format!("cannot open {}: {}", path.display(), keyorder::worker::chain(&e))
        }
        _ => return anyhow::Error::new(e).context(format!("opening {}", path.display())),
    };
    BadInput(format!("--database sqlite:{}: {detail}", path.display())).into()
}

impl Database {
    /// Which database --database names.
    pub fn target(&self) -> Result<DbTarget, BadInput> {
        let text = self.database.trim();
        if let Some(rest) = text.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(BadInput(
                    "--database sqlite: needs a path, e.g. sqlite:keyorder.db".into(),
                ));
            }
            return Ok(DbTarget::Sqlite(PathBuf::from(path)));
        }
        Ok(DbTarget::Postgres(text.to_owned()))
    }

    /// A connected PostgreSQL client; the error names what failed. A SQLite --database is bad
    /// input here (the caller needs PostgreSQL).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let DbTarget::Postgres(url) = self.target()? else {
            return Err(BadInput(format!(
                "this needs PostgreSQL (--database postgres://...), not {}",
                self.database
            ))
            .into());
        };
        let store = PgStore::new(&url, PartitionCount::new(1)?, PgOptions::default())
            .map_err(|e| BadInput(format!("bad --database URL: {e}")))?;
        postgres::connect(store.config())
            .await
            .context("cannot connect to the database (check --database)")
    }

    /// The queue, opened as `mode` says (on PostgreSQL: connected, and unless migrating,
    /// checked to be at the current schema version).
    pub async fn queue(&self, mode: OpenMode) -> anyhow::Result<Queue> {
        match self.target()? {
            DbTarget::Sqlite(path) => sqlite::schema::open(&path, mode)
                .map(Queue::Sqlite)
                .map_err(|e| sqlite_refusal(&path, e)),
            DbTarget::Postgres(_) => {
                let client = self.client().await?;
                if mode != OpenMode::Migrate {
                    schema::require_current(&client).await?;
                }
                Ok(Queue::Pg(client))
            }
        }
    }
}

impl Queue {
    pub(crate) async fn enqueue(
        &mut self,
        router: &Router,
        events: &[Event],
        serialise_keys: bool,
    ) -> Result<keyorder::store::admin::EnqueueReport, StoreError> {
        match self {
            Queue::Pg(c) => queue::enqueue(c, router, events, serialise_keys).await,
            // One writer at a time: rows of one key always commit in seq order.
            Queue::Sqlite(c) => sqlite::queue::enqueue(c, router, events),
        }
    }

    pub(crate) async fn lag(
        &self,
    ) -> Result<
        (Vec<keyorder::store::admin::PartitionLag>, Vec<keyorder::store::admin::KeyDepth>),
        StoreError,
    > {
        match self {
            Queue::Pg(c) => Ok((queue::lag(c).await?, queue::heaviest_keys(c, 10).await?)),
            Queue::Sqlite(c) => Ok((sqlite::queue::lag(c)?, sqlite::queue::heaviest_keys(c, 10)?)),
        }
    }

    pub(crate) async fn dead_letters(
        &self,
        id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<keyorder::store::admin::DeadRow>, StoreError> {
        match self {
            Queue::Pg(c) => queue::dead_letters(c, id, limit).await,
            Queue::Sqlite(c) => sqlite::queue::dead_letters(c, id, limit),
        }
    }

    pub(crate) async fn redrive(
        &mut self,
        router: &Router,
        id: i64,
    ) -> Result<Option<i64>, StoreError> {
        match self {
            Queue::Pg(c) => queue::redrive(c, router, id).await,
            Queue::Sqlite(c) => sqlite::queue::redrive(c, router, id),
        }
    }

    pub(crate) async fn switch(
        &mut self,
        from: PartitionCount,
        to: PartitionCount,
    ) -> Result<keyorder::store::admin::Layout, StoreError> {
        match self {
            Queue::Pg(c) => queue::switch_online(c, from, to).await,
            Queue::Sqlite(c) => sqlite::queue::switch_online(c, from, to),
        }
    }
}

pub(crate) fn parse_count(text: &str) -> Result<PartitionCount, String> {
    text.parse::<PartitionCount>().map_err(|e| e.to_string())
}

/// Completes on SIGINT, SIGTERM, or after `after` seconds.
pub(crate) async fn shutdown(after: Option<u64>) {
    let timer = async {
        match after {
            Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            None => std::future::pending().await,
        }
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return timer.await,
        };
        tokio::select! {
            biased;
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            _ = timer => {}
        }
    }
    #[cfg(not(unix))]
    tokio::select! {
        biased;
        _ = tokio::signal::ctrl_c() => {}
        _ = timer => {}
    }
}
