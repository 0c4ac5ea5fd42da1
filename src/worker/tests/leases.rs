//! Leases and membership: fair shares, rebalancing, lost leases, store failures, jitter.

use super::*;

#[tokio::test(start_paused = true)]
async fn partitions_are_leased_up_to_the_fair_share_from_the_start_offset() {
    let h = Harness::new(6);
    local(async {
        {
            let mut db = h.db.borrow_mut();
            db.others = 1; // two live workers: a share of 3
            db.foreign.insert(p(5));
        }
        let mut config = h.config("w1");
        config.start_offset = 4;
        let worker = h.start(config);
        h.at(2500).await;
        let order: Vec<u16> = h.db.borrow().acquired.iter().map(|a| a.0 .0).collect();
        assert_eq!(order, [4, 0, 1], "from the offset, wrapping, past the one held elsewhere");
        assert_eq!(h.held(), BTreeSet::from([0, 1, 4]));
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 3, released: 3, lost: 0 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn the_excess_is_given_back_when_more_workers_are_live_and_taken_again_when_they_leave() {
    let h = Harness::new(4);
    local(async {
        let worker = h.start(h.config("w1"));
        h.at(500).await;
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3]), "alone: every partition");
        h.db.borrow_mut().others = 1;
        h.at(1500).await;
        assert_eq!(h.held(), BTreeSet::from([0, 1]), "half, the highest given back");
        let given: BTreeSet<_> = h.db.borrow().releases.iter().map(|r| (r.0 .0, ms(r.3))).collect();
        assert_eq!(given, BTreeSet::from([(2, 1000), (3, 1000)]));
        h.db.borrow_mut().others = 0;
        let seq = h.enqueue(3);
        h.at(2500).await;
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3]));
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 2000), "at once: handed back clean");
        let reads: BTreeSet<u64> = h.db.borrow().control_reads.iter().map(|t| ms(*t)).collect();
        assert_eq!(reads, BTreeSet::from([0, 1000, 2000]), "membership read every second");
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 6, released: 6, lost: 0 });
        let events = h.events();
        let at_1000: Vec<_> = events.iter().filter(|e| e.0 == 1000).map(|e| &e.1).collect();
        assert_eq!(at_1000.len(), 2);
        assert!(at_1000.contains(&&released(2, 1)) && at_1000.contains(&&released(3, 1)));
        let at_2000: Vec<_> = events.iter().filter(|e| e.0 == 2000).map(|e| &e.1).collect();
        assert_eq!(at_2000, [&acquired(2, 2), &acquired(3, 2)]);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_second_worker_gets_its_share_once_the_first_gives_back_the_excess() {
    let h = Harness::new(4);
    local(async {
        let a = h.start(h.config("a"));
        h.at(500).await;
        let b = h.start(h.config("b"));
        h.at(2700).await;
        {
            let db = h.db.borrow();
            let by: Vec<(u16, u64)> = db.acquired.iter().map(|a| (a.0 .0, ms(a.3))).collect();
            // a takes all at 0 and gives back 2 and 3 at its rebalance at 1000 (b counted since
            // 500); b, rebalancing at 500 and 1500, takes them at 1500.
            assert_eq!(by, [(0, 0), (1, 0), (2, 0), (3, 0), (2, 1500), (3, 1500)]);
        }
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3]));
        let ra = a.stop().await;
        let rb = b.stop().await;
        assert_eq!(ra, WorkerReport { acquired: 4, released: 4, lost: 0 });
        assert_eq!(rb, WorkerReport { acquired: 2, released: 2, lost: 0 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_shrinking_partition_count_gives_back_what_is_beyond_it_and_fills_the_share_below() {
    let h = Harness::new(8);
    local(async {
        {
            let mut db = h.db.borrow_mut();
            db.others = 1;
            db.foreign.extend([1, 2, 3, 4, 6, 7].map(p));
        }
        // p5 is mid-delivery from 0 to 1500, so its hand-back completes only then.
        let slow = h.enqueue(5);
        h.script(slow, &[Reply::Slow(Duration::from_millis(1500))]);
        let worker = h.start(h.config("w1"));
        h.at(500).await;
        assert_eq!(h.held(), BTreeSet::from([0, 5]), "a share of 4, only two free");
        {
            let mut db = h.db.borrow_mut();
            db.count = 4;
            db.others = 0;
            db.foreign.clear();
        }
        h.at(1200).await;
        // The rebalance at 1000 counts only 0 as kept: it fills the share at once, while 5
        // finishes its delivery before it is given back.
        let taken: Vec<(u16, u64)> =
            h.db.borrow().acquired.iter().map(|a| (a.0 .0, ms(a.3))).collect();
        assert_eq!(taken, [(0, 0), (5, 0), (1, 1000), (2, 1000), (3, 1000)]);
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3, 5]));
        h.at(1700).await;
        assert_eq!(h.held(), BTreeSet::from([0, 1, 2, 3]), "5 is gone, the share is 4");
        let released: Vec<(u16, u64)> =
            h.db.borrow().releases.iter().map(|r| (r.0 .0, ms(r.3))).collect();
        assert_eq!(released, [(5, 1500)]);
        assert_eq!(h.db.borrow().acks.iter().map(|a| a.1).collect::<Vec<_>>(), [slow]);
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 5, released: 5, lost: 0 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn loops_started_together_share_the_partitions_from_their_first_rebalance() {
    let h = Harness::new(4);
    local(async {
        h.db.borrow_mut().connect_delay.insert("b".into(), Duration::from_millis(300));
        let meet = StartTogether::new(2);
        let mut config_a = h.config("a");
        config_a.start_together = Some(meet.clone());
        let mut config_b = h.config("b");
        config_b.start_together = Some(meet);
        let a = h.start(config_a);
        let b = h.start(config_b);
        h.at(2500).await;
        {
            let db = h.db.borrow();
            assert!(db.acquired.iter().all(|a| ms(a.3) == 300), "none before b registered");
            assert_eq!(db.acquired.len(), 4);
            assert!(db.releases.is_empty(), "nothing taken only to be given back");
        }
        let ra = a.stop().await;
        let rb = b.stop().await;
        assert_eq!((ra.acquired, rb.acquired), (2, 2));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_loop_waits_for_the_others_no_longer_than_the_start_together_wait() {
    let h = Harness::new(2);
    local(async {
        let mut config = h.config("alone");
        config.start_together = Some(StartTogether::new(2));
        let worker = h.start(config);
        h.at(3500).await;
        {
            let db = h.db.borrow();
            assert_eq!(db.connects.iter().map(|c| ms(c.1)).collect::<Vec<_>>(), [0]);
            let at: Vec<u64> = db.acquired.iter().map(|a| ms(a.3)).collect();
            assert_eq!(at, [2000, 2000], "StartTogether::WAIT after registering");
            // It waits once: the next rebalance follows a period later.
            let reads: Vec<u64> = db.control_reads.iter().map(|t| ms(*t)).collect();
            assert_eq!(reads, [2000, 2000, 3000, 3000]);
        }
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_reaped_at_once_reported_and_taken_again_after_the_takeover_wait() {
    let h = Harness::new(1);
    local(async {
        let worker = h.start(h.config("w1"));
        h.at(1100).await;
        h.break_lease(0);
        h.at(1500).await;
        let seq = h.enqueue(0);
        h.at(4000).await;
        let events = h.events();
        assert_eq!(
            events,
            [
                (0, acquired(0, 1)),
                (
                    1200,
                    WorkerEvent::Lost {
                        partition: p(0),
                        epoch: Epoch(1),
                        error: "partition 0: lease with epoch 1 is not held by this session".into()
                    }
                ),
                (1200, acquired(0, 2)),
            ],
            "lost at the next read, taken again at once"
        );
        {
            let db = h.db.borrow();
            assert_eq!(db.acquired[1].2, Handover::Unclean, "its holder did not hand it back");
            let reads: Vec<(u64, u64)> = db.fetches.iter().map(|f| (f.1 .0, ms(f.2))).collect();
            assert_eq!(reads.iter().find(|r| r.0 == 2), Some(&(2, 3200)));
        }
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 3200));
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 1, lost: 1 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_may_not_last_the_delivery_is_lost_without_delivering() {
    let h = Harness::new(1);
    local(async {
        h.db.borrow_mut().refuse_lasts.insert(p(0), 1);
        let seq = h.enqueue(0);
        let worker = h.start(h.config("w1"));
        h.at(1000).await;
        assert!(h.delivered().is_empty(), "refused before delivering");
        assert_eq!(
            h.events()[1],
            (
                0,
                WorkerEvent::Lost {
                    partition: p(0),
                    epoch: Epoch(1),
                    error: "partition 0: lease with epoch 1 may expire within 2s".into()
                }
            )
        );
        h.at(2500).await;
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 2000), "by the next holder");
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 1, lost: 1 });
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_hand_back_counts_as_a_lost_lease() {
    let h = Harness::new(1);
    local(async {
        h.db.borrow_mut().fail_release = true;
        let worker = h.start(h.config("w1"));
        h.at(500).await;
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 1, released: 0, lost: 1 });
        assert_eq!(
            h.events().last(),
            Some(&(
                500,
                WorkerEvent::Lost {
                    partition: p(0),
                    epoch: Epoch(1),
                    error: "store connection failed: release failed".into()
                }
            ))
        );
        assert!(h.held().is_empty(), "the session ended, and its lock with it");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_store_failure_is_reported_and_the_worker_reconnects_after_the_pause() {
    let h = Harness::new(2);
    local(async {
        h.db.borrow_mut().fail_connects = 2;
        let worker = h.start(h.config("w1"));
        h.at(1500).await;
        h.db.borrow_mut().fail_control = 1;
        let seq = h.enqueue(1);
        h.at(3200).await;
        let connects: Vec<u64> = h.db.borrow().connects.iter().map(|c| ms(c.1)).collect();
        assert_eq!(connects, [0, 500, 1000, 2500], "reconnect_after after each failure");
        let unavailable = |error: &str| WorkerEvent::StoreUnavailable { error: error.into() };
        let refused = "store connection failed: connection refused";
        assert_eq!(
            h.events(),
            [
                (0, unavailable(refused)),
                (500, unavailable(refused)),
                (1000, acquired(0, 1)),
                (1000, acquired(1, 1)),
                (2000, unavailable("store connection failed: membership read failed")),
            ]
        );
        // The partitions kept their leases and went on delivering meanwhile.
        assert_eq!(h.held(), BTreeSet::from([0, 1]));
        assert_eq!(h.delivered().iter().map(|d| d.seq).collect::<Vec<_>>(), [seq]);
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 2, lost: 0 });
        assert_eq!(h.db.borrow().members, 0, "the membership session is closed");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_partition_task_takes_the_loop_down() {
    let h = Harness::new(1);
    local(async {
        let seq = h.enqueue(0);
        h.script(seq, &[Reply::Panic]);
        let worker = h.start(h.config("w1"));
        h.at(1500).await;
        let _ = worker.stop.send(());
        let err = worker.handle.await.expect_err("the panic is surfaced, not hidden");
        let payload = err.into_panic();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"endpoint exploded"));
    })
    .await;
}

/// The first backoff of partitions 0 and 1 under worker seed `rng_seed` (jitter up to 1s).
async fn first_backoffs(rng_seed: u64) -> [Duration; 2] {
    let h = Harness::new(2);
    for partition in [0, 1] {
        let seq = h.enqueue(partition);
        h.script(seq, &[Reply::Status(503, None)]);
    }
    let mut config = h.config("w1");
    config.rng_seed = rng_seed;
    config.retry = RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(30)).unwrap();
    let worker = h.start(config);
    h.at(10).await;
    worker.stop().await;
    let db = h.db.borrow();
    let of = |q: u16| db.retries.iter().find(|r| r.0 == p(q)).expect("a retry").3;
    [of(0), of(1)]
}

#[tokio::test(start_paused = true)]
async fn jitter_differs_between_worker_seeds_and_between_partitions() {
    local(async {
        let seeds = [0, 1, 2, 3, 1 << 32, 1 << 33, 3 << 32];
        let mut draws = Vec::new();
        for seed in seeds {
            let [a, b] = first_backoffs(seed).await;
            assert_ne!(a, b, "seed {seed}: partitions 0 and 1 drew the same backoff");
            draws.push([a, b]);
        }
        for partition in 0..2 {
            let distinct: BTreeSet<Duration> = draws.iter().map(|d| d[partition]).collect();
            assert_eq!(distinct.len(), seeds.len(), "p{partition}: a seed repeated another's");
        }
        assert_eq!(first_backoffs(1 << 32).await, draws[4], "the same seed draws the same");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn each_lease_of_a_partition_draws_its_own_jitter() {
    let h = Harness::new(1);
    local(async {
        let under_first = h.enqueue(0);
        h.script(under_first, &[Reply::Status(503, None)]);
        let mut config = h.config("w1");
        config.retry =
            RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(30)).unwrap();
        let worker = h.start(config);
        h.at(2500).await;
        h.break_lease(0);
        let under_second = h.enqueue(0);
        h.script(under_second, &[Reply::Status(503, None)]);
        h.at(6000).await;
        {
            let db = h.db.borrow();
            let epochs: Vec<u64> = db.acquired.iter().map(|a| a.1 .0).collect();
            assert_eq!(epochs, [1, 2]);
            // Both first failures of an event, so both drew the first backoff of their lease.
            let retries: Vec<(Seq, u32)> = db.retries.iter().map(|r| (r.1, r.2)).collect();
            assert_eq!(retries, [(under_first, 1), (under_second, 1)]);
            let (first, second) = (db.retries[0].3, db.retries[1].3);
            assert_ne!(first, second, "the new lease replayed the old one's jitter");
        }
        worker.stop().await;
    })
    .await;
}
