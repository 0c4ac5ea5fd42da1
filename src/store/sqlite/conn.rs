//! One SQLite connection on its own thread: the async side sends it jobs over a channel and
//! awaits the answers, so no blocking call ever runs on the worker's executor. The thread can
//! also run a periodic job of its own (a lease or membership renewal) between requests, on
//! its own timer, so renewal goes on while the async side waits on a long delivery.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::clock::{Clock, TokioClock};
use crate::store::StoreError;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The thread's periodic job: how often, and what. It runs at least every `every`, also while
/// requests keep arriving.
pub(crate) struct Tick {
    pub(crate) every: Duration,
    pub(crate) run: Box<dyn FnMut(&mut Connection) + Send>,
}

/// The handle of a connection thread. Dropping it ends the thread and closes the connection.
pub(crate) struct Conn {
    tx: mpsc::Sender<Job>,
    /// The database, and how long a statement waits for its locks: a write that gives up is
    /// reported with the processes holding them ([`super::lock_holders`]).
    path: PathBuf,
    busy_timeout: Duration,
}

/// The pragmas every connection opens with: WAL (readers never block the writer), NORMAL
/// synchronisation (durable at checkpoints; a power cut may lose the last commits, a process
/// crash loses nothing), and a busy timeout instead of immediate `SQLITE_BUSY`. The producer's
/// connection ([`super::admin::SqliteAdmin::open`]) then raises it to FULL.
pub(crate) fn configure(conn: &Connection, busy_timeout: Duration) -> Result<(), StoreError> {
    conn.busy_timeout(busy_timeout)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Refused {
            operation: "open the database",
            reason: format!("cannot switch the journal to WAL (it is {mode})"),
        });
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // One connection serves all of a worker's partitions: let its cache hold the hot pages.
    conn.pragma_update(None, "cache_size", -65536)?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    super::lease_clock::register(conn)?;
    Ok(())
}

/// Opens an existing database file read-write (never creates one).
pub(crate) fn open_existing(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_URI;
    let conn = Connection::open_with_flags(path, flags)?;
    configure(&conn, busy_timeout)?;
    Ok(conn)
}

impl Conn {
    /// Opens `path` (which must exist) on a new thread, optionally with a periodic job.
    pub(crate) async fn open(
        path: &Path,
        busy_timeout: Duration,
        tick: Option<Tick>,
    ) -> Result<Conn, StoreError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let database = path.to_owned();
        let path = path.to_owned();
        std::thread::Builder::new().name("keyorder-sqlite".into()).spawn(move || {
            let conn = match open_existing(&path, busy_timeout) {
                Ok(c) => {
                    let _ = ready_tx.send(Ok(()));
                    c
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            serve(conn, rx, tick);
        })?;
        let opened = ready_rx.await.map_err(|_| gone())?;
        opened.map_err(|e| super::lock_holders::explain_busy(e, &database, busy_timeout))?;
        Ok(Conn { tx, path: database, busy_timeout })
    }

    /// Runs `f` on the connection's thread and returns its answer.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Box::new(move |c| {
                let _ = tx.send(f(c));
            }))
            .map_err(|_| gone())?;
        let answer = rx.await.map_err(|_| gone())?;
        answer.map_err(|e| super::lock_holders::explain_busy(e, &self.path, self.busy_timeout))
    }

    /// Queues `f` without waiting for it (for clean-ups in `Drop`).
    pub(crate) fn detach(&self, f: impl FnOnce(&mut Connection) + Send + 'static) {
        // A thread that ended has closed the connection; there is nothing left to clean.
        let _ = self.tx.send(Box::new(f));
    }
}

fn gone() -> StoreError {
    StoreError::Io(std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "the SQLite connection thread ended",
    ))
}

/// The thread's loop: requests in order, the periodic job whenever it is due.
fn serve(mut conn: Connection, rx: mpsc::Receiver<Job>, mut tick: Option<Tick>) {
    // The thread's own timer: the clock is the one place time is read.
    let clock = TokioClock::start();
    let mut due = tick.as_ref().map(|t| clock.now().saturating_add(t.every));
    loop {
        let job = match (&mut tick, due) {
            (Some(t), Some(at)) => {
                let wait = at.saturating_since(clock.now());
                if wait.is_zero() {
                    (t.run)(&mut conn);
                    due = Some(clock.now().saturating_add(t.every));
                    continue;
                }
                match rx.recv_timeout(wait) {
                    Ok(job) => job,
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            _ => match rx.recv() {
                Ok(job) => job,
                Err(_) => break,
            },
        };
        job(&mut conn);
    }
}
