//! What the database commands share: the process runtime (one current-thread runtime with a
//! `LocalSet`, as the worker loop requires), the shutdown signal, and the `--database`
//! argument with the mapping of a store's refusal to open onto the command line's errors.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use keyorder::store::admin::Admin;
use keyorder::store::lock_wait::LockWait;
use keyorder::store::open::{AdminConn, Location, OpenError, OpenMode};
use keyorder::PartitionCount;

use super::bad_input::BadInput;

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

/// A store's refusal to open, as the command line reports it: what the user can fix (the flag,
/// the file) is bad input (exit 2), anything else a failure (exit 1).
pub fn open_error(e: OpenError) -> anyhow::Error {
    match e {
        OpenError::NoPath => BadInput(format!("--database {e}")).into(),
        OpenError::BadUrl(e) => BadInput(format!("bad --database URL: {e}")).into(),
        OpenError::Connect(e) => {
            anyhow::Error::new(e).context("cannot connect to the database (check --database)")
        }
        OpenError::Unusable { file, error } => {
            let detail = match &error {
                keyorder::store::StoreError::Refused { reason, .. } => reason.clone(),
                other => {
                    format!("cannot open {}: {}", file.display(), keyorder::worker::chain(other))
                }
            };
            BadInput(format!("--database sqlite:{}: {detail}", file.display())).into()
        }
        OpenError::Options(e) => {
            BadInput(format!("--lease-expiry-ms: {}", keyorder::worker::chain(&e))).into()
        }
        other => other.into(),
    }
}

impl Database {
    /// Where --database says the store is.
    pub fn location(&self) -> anyhow::Result<Location> {
        Location::parse(&self.database).map_err(open_error)
    }

    /// The store's admin connection, opened as `mode` says (checked, unless migrating, to be
    /// at the current schema version).
    pub async fn admin(&self, mode: OpenMode) -> anyhow::Result<AdminConn> {
        self.location()?.open_admin(mode).await.map_err(open_error)
    }
}

/// How long an operation that locks what producers and workers need (migrate, switch, pin)
/// may wait for those locks in all (PostgreSQL).
#[derive(Debug, Args)]
pub struct LockWaitArgs {
    /// Seconds to keep trying for locks that other sessions hold (PostgreSQL). Each try waits
    /// at most 1 s, so producers and workers never queue behind this command longer than that,
    /// and pauses 1 s between tries; each try that gave up is reported on stderr with the
    /// sessions holding the locks. After the last, the command fails naming them.
    #[arg(long, value_name = "SECONDS", default_value_t = LockWait::TOTAL.as_secs())]
    pub lock_wait: u64,
}

impl LockWaitArgs {
    /// The admin connection of `db` for `operation`, its lock waits bounded as these flags say
    /// (a session setting), each try that gave up reported on stderr. Refused first when the
    /// sessions would not be the command's own (a pooler in transaction mode) or the server is
    /// read-only: these operations set session settings and write.
    pub async fn admin(
        &self,
        db: &Database,
        mode: OpenMode,
        operation: &'static str,
    ) -> anyhow::Result<AdminConn> {
        require_own_sessions(&db.location()?, operation).await?;
        let mut admin = db.admin(mode).await?;
        admin.bound_lock_waits(
            LockWait::within(Duration::from_secs(self.lock_wait)),
            Box::new(|notice| tracing::warn!("{notice}")),
        );
        Ok(admin)
    }
}

/// Refuses `operation` before it locks or writes anything when the sessions of `location` would
/// not be its own or the store is read-only (both exit 2, naming the fix).
pub async fn require_own_sessions(
    location: &Location,
    operation: &'static str,
) -> anyhow::Result<()> {
    use keyorder::store::StoreError;
    match location.require_own_sessions(operation).await {
        Ok(()) => Ok(()),
        Err(e @ (StoreError::SessionsPooled { .. } | StoreError::ReadOnly { .. })) => Err(e.into()),
        Err(e) => Err(anyhow::Error::new(e)
            .context("cannot connect to the database to check its sessions (check --database)")),
    }
}

/// A partition count argument.
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
