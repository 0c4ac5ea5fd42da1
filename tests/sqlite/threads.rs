//! Worker loops of one process that start together share the partitions from the first
//! rebalance: none leases a partition only to hand it back.

use std::time::Duration;

use keyorder::clock::TokioClock;
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::store::sqlite::{SqliteOptions, SqliteStore};
use keyorder::worker::{self, StartTogether, WorkerConfig};
use keyorder::{PartitionCount, PartitionId};

use super::fixture::SqliteFixture;

#[derive(Clone)]
struct Accept;

impl Deliver for Accept {
    async fn deliver(&mut self, _: PartitionId, _: &Head, _: u32) -> Result<(), DeliverError> {
        Ok(())
    }
}

/// Leases taken by `loops` loops over 16 partitions in about a second, with or without the
/// meeting point.
fn acquired(loops: usize, together: bool) -> u64 {
    let fx = SqliteFixture::new(&format!("threads-{together}"));
    let count = PartitionCount::new(16).unwrap();
    let meet = StartTogether::new(loops);
    let threads: Vec<_> = (0..loops)
        .map(|i| {
            let (file, meet) = (fx.file.clone(), meet.clone());
            std::thread::spawn(move || {
                let options = SqliteOptions::for_delivery_timeout(Duration::from_millis(500));
                let store = SqliteStore::new(&file, count, options, TokioClock::start()).unwrap();
                let mut config = WorkerConfig::new(format!("loop-{i}"));
                config.rebalance_every = Duration::from_millis(50);
                config.start_offset = i as u16;
                config.start_together = together.then_some(meet);
                let rt =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                let run = async move {
                    let stop = tokio::time::sleep(Duration::from_millis(1200));
                    worker::run(store, Accept, TokioClock::start(), config, stop).await
                };
                tokio::task::LocalSet::new().block_on(&rt, run).acquired
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

#[test]
fn loops_that_start_together_lease_each_partition_once() {
    assert_eq!(acquired(2, true), 16, "each of the 16 partitions leased once, by one loop");
}
