//! `keyorder work --threads N`: N worker loops in one process, each on its own OS thread with
//! its own current-thread runtime and `LocalSet` (the worker loop is the simulation's, which
//! needs no `Send`), each a member of its own. Fair share counts them like separate processes,
//! so partitions spread over the threads and the threads over the cores.

use std::time::Duration;

use anyhow::Context;
use keyorder::clock::TokioClock;
use keyorder::deliver::Deliver;
use keyorder::store::admin::Admin;
use keyorder::store::open::{Location, OpenMode};
use keyorder::store::Store;
use keyorder::worker::{self, StartTogether, WorkerConfig, WorkerReport};
use tokio::sync::watch;

use super::runtime::{block_on, open_error};

/// The default thread count: the machine's cores.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The name of loop `index` of `threads` for a worker called `name`: the name itself for one
/// loop, `name-INDEX` for several (members must be told apart).
pub fn loop_name(name: &str, index: usize, threads: usize) -> String {
    if threads == 1 {
        name.to_owned()
    } else {
        format!("{name}-{index}")
    }
}

/// When [`run`] stops its worker loops (besides SIGINT and SIGTERM).
#[derive(Debug, Default)]
pub struct StopWhen {
    /// After this many seconds.
    pub after: Option<u64>,
    /// Once the queue of this store is empty (`--until-empty`).
    pub until_empty: Option<Location>,
}

/// What [`run`] did: the loops' reports summed and, with [`StopWhen::until_empty`], how it
/// ended.
#[derive(Debug, Default)]
pub struct RunReport {
    /// The loops' reports summed.
    pub workers: WorkerReport,
    /// With `until_empty`: whether the queue was found empty (rather than a signal or `after`
    /// stopping the loops), and the dead letters written between the start and the end.
    pub drained: Option<Drained>,
}

/// How an `--until-empty` run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// The queue was seen empty (not stopped by a signal or a timer first).
    pub empty: bool,
    /// Rows in the queue once every loop had stopped (0 unless a producer added some).
    pub depth_after: i64,
    /// Dead letters written while the loops ran.
    pub dead_letters: i64,
}

/// How often `--until-empty` reads the queue's depth.
pub const EMPTY_POLL: Duration = Duration::from_millis(200);

/// Runs `threads` worker loops until SIGINT, SIGTERM or what `when` says; each gives its leases
/// back after its in-flight deliveries. Returns the loops' reports summed.
///
/// With `until_empty` the newest dead letter is noted before any loop starts, the depth read
/// every [`EMPTY_POLL`], and the loops stopped at the first read of 0: a row leaves the queue
/// only once acknowledged or dead-lettered, so depth 0 means nothing is in flight.
///
/// `make(index)` builds loop `index`'s store, deliverer and configuration on that loop's
/// thread (none of them need be `Send`); the name becomes [`loop_name`], and the start offset
/// and jitter seed are spread per loop.
pub fn run<S, D, F>(threads: usize, when: StopWhen, make: F) -> anyhow::Result<RunReport>
where
    S: Store,
    D: Deliver,
    F: Fn(usize) -> anyhow::Result<(S, D, WorkerConfig)> + Send + Sync + 'static,
{
    block_on(run_async(threads, when, make))?
}

async fn run_async<S, D, F>(threads: usize, when: StopWhen, make: F) -> anyhow::Result<RunReport>
where
    S: Store,
    D: Deliver,
    F: Fn(usize) -> anyhow::Result<(S, D, WorkerConfig)> + Send + Sync + 'static,
{
    // Opened (and the dead-letter mark read) before any loop can write a dead letter.
    let until = match &when.until_empty {
        Some(location) => {
            let admin = location.open_admin(OpenMode::Existing).await.map_err(open_error)?;
            let mark = admin
                .dead_letters(None, 1)
                .await
                .context("reading the dead letters (--until-empty)")?
                .first()
                .map_or(0, |d| d.id);
            Some((admin, mark))
        }
        None => None,
    };
    let threads = threads.max(1);
    let (stop_tx, stop_rx) = watch::channel(false);
    let make = std::sync::Arc::new(make);
    let meet = StartTogether::new(threads);
    let mut handles = Vec::with_capacity(threads);
    for index in 0..threads {
        let (make, meet) = (make.clone(), meet.clone());
        let mut stop = stop_rx.clone();
        let handle = std::thread::Builder::new()
            .name(format!("worker-{index}"))
            .spawn(move || -> anyhow::Result<WorkerReport> {
                let (store, deliver, mut config) = make(index)?;
                config.name = loop_name(&config.name, index, threads);
                config.start_offset = config.start_offset.wrapping_add(index as u16);
                config.rng_seed ^= (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                config.start_together = Some(meet);
                block_on(async move {
                    let stopped = async move {
                        // A dropped sender (the main thread failed) stops the loop as well.
                        let _ = stop.wait_for(|s| *s).await;
                    };
                    worker::run(store, deliver, TokioClock::start(), config, stopped).await
                })
            })
            .context("starting a worker thread")?;
        handles.push(handle);
    }
    let empty = async {
        match &until {
            Some((admin, _)) => loop {
                if admin.depth().await.context("reading the queue's depth (--until-empty)")? == 0 {
                    return anyhow::Ok(true);
                }
                tokio::time::sleep(EMPTY_POLL).await;
            },
            None => std::future::pending().await,
        }
    };
    let found_empty = tokio::select! {
        biased;
        _ = super::runtime::shutdown(when.after) => false,
        empty = empty => match empty {
            Ok(e) => e,
            Err(e) => {
                // Stop the loops before reporting it.
                let _ = stop_tx.send(true);
                for handle in handles {
                    let _ = handle.join();
                }
                return Err(e);
            }
        },
    };
    let _ = stop_tx.send(true);
    let mut total = WorkerReport::default();
    for handle in handles {
        let report = handle.join().map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
        total.acquired += report.acquired;
        total.released += report.released;
        total.lost += report.lost;
    }
    let drained = match &until {
        Some((admin, mark)) => Some(Drained {
            empty: found_empty,
            depth_after: admin.depth().await.context("reading the queue's depth")?,
            dead_letters: admin
                .dead_letters_after(*mark)
                .await
                .context("counting the dead letters written")?,
        }),
        None => None,
    };
    Ok(RunReport { workers: total, drained })
}
