//! `keyorder work --threads N`: N worker loops in one process, each on its own OS thread with
//! its own current-thread runtime and `LocalSet` (the worker loop is the simulation's, which
//! needs no `Send`), each a member of its own. Fair share counts them like separate processes,
//! so partitions spread over the threads and the threads over the cores.

use anyhow::Context;
use keyorder::clock::TokioClock;
use keyorder::deliver::Deliver;
use keyorder::store::Store;
use keyorder::worker::{self, StartTogether, WorkerConfig, WorkerReport};
use tokio::sync::watch;

use super::runtime::block_on;

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

/// Runs `threads` worker loops until SIGINT, SIGTERM or `stop_after`; each gives its leases
/// back after its in-flight deliveries. Returns the loops' reports summed.
///
/// `make(index)` builds loop `index`'s store, deliverer and configuration on that loop's
/// thread (none of them need be `Send`); the name becomes [`loop_name`], and the start offset
/// and jitter seed are spread per loop.
pub fn run<S, D, F>(
    threads: usize,
    stop_after: Option<u64>,
    make: F,
) -> anyhow::Result<WorkerReport>
where
    S: Store,
    D: Deliver,
    F: Fn(usize) -> anyhow::Result<(S, D, WorkerConfig)> + Send + Sync + 'static,
{
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
    block_on(super::runtime::shutdown(stop_after))?;
    let _ = stop_tx.send(true);
    let mut total = WorkerReport::default();
    for handle in handles {
        let report = handle.join().map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
        total.acquired += report.acquired;
        total.released += report.released;
        total.lost += report.lost;
    }
    Ok(total)
}
