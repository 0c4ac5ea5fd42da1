//! Delivery: order, retries, timeouts, hand-backs.

use super::*;

#[tokio::test(start_paused = true)]
async fn every_queued_event_is_delivered_once_in_seq_order_and_acknowledged() {
    let h = Harness::new(2);
    local(async {
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(10);
        let mut want: BTreeMap<u16, Vec<i64>> = BTreeMap::new();
        for i in 0..12 {
            let partition = [0, 1, 1][i % 3];
            want.entry(partition).or_default().push(h.enqueue(partition).0);
        }
        let worker = h.start(h.config("w1"));
        h.at(1500).await;
        for (partition, seqs) in &want {
            let got: Vec<(i64, u32)> = h
                .delivered()
                .iter()
                .filter(|d| d.partition.0 == *partition)
                .map(|d| (d.seq.0, d.attempt))
                .collect();
            let once: Vec<(i64, u32)> = seqs.iter().map(|s| (*s, 1)).collect();
            assert_eq!(got, once, "p{partition}: each event once, in seq order, first attempt");
            let acked: Vec<i64> =
                h.db.borrow()
                    .acks
                    .iter()
                    .filter(|(q, _, _)| q.0 == *partition)
                    .map(|(_, s, _)| s.0)
                    .collect();
            assert_eq!(&acked, seqs, "p{partition}: acknowledged in order");
            assert_eq!(h.queued(*partition), 0);
        }
        {
            let s = h.endpoint.state.borrow();
            assert_eq!(s.most_per_partition, 1, "one delivery at a time per partition");
            assert_eq!(s.most_overall, 2, "the partitions progress in parallel");
        }
        assert_eq!(h.held(), BTreeSet::from([0, 1]));

        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 2, lost: 0 });
        assert!(h.held().is_empty(), "shutdown gives every lease back");
        let events = h.events();
        assert_eq!(events.len(), 4, "{events:?}");
        for event in [
            (0, acquired(0, 1)),
            (0, acquired(1, 1)),
            (1500, released(0, 1)),
            (1500, released(1, 1)),
        ] {
            assert!(events.contains(&event), "{event:?} missing from {events:?}");
        }
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_empty_partition_looks_again_every_idle_poll() {
    let h = Harness::new(1);
    local(async {
        let worker = h.start(h.config("w1"));
        h.at(1050).await;
        let seq = h.enqueue(0);
        h.at(1500).await;
        let fetches: Vec<u64> = h.db.borrow().fetches.iter().map(|f| ms(f.2)).collect();
        // Found at the poll of 1200, delivered, and the partition read again after the ack.
        assert_eq!(fetches, [0, 200, 400, 600, 800, 1000, 1200, 1200, 1400]);
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 1200), "found at the next poll");
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_head_is_retried_per_the_policy_then_dead_lettered_and_the_next_follows() {
    let h = Harness::new(1);
    local(async {
        let first = h.enqueue(0);
        let second = h.enqueue(0);
        h.always(first, Reply::Status(503, None));
        let worker = h.start(h.config("w1"));
        h.at(3000).await;
        assert_eq!(
            h.attempts(),
            [(0, first.0, 1), (0, first.0, 2), (0, first.0, 3), (0, second.0, 1)],
            "three attempts (the policy's maximum), then the next event"
        );
        {
            let db = h.db.borrow();
            let retries: Vec<_> = db.retries.iter().map(|r| (r.1, r.2, r.4.as_str())).collect();
            assert_eq!(retries, [(first, 1, "HTTP 503"), (first, 2, "HTTP 503")]);
            // Each retry waits its recorded backoff, which stays under the policy's ceiling.
            let d = h.delivered();
            for (i, retry) in db.retries.iter().enumerate() {
                let ceiling = Duration::from_millis(100 << i);
                assert!(retry.3 <= ceiling, "backoff {:?} above {ceiling:?}", retry.3);
                let waited = d[i + 1].at.saturating_since(d[i].at);
                assert!(
                    waited >= retry.3,
                    "attempt {} came after {waited:?} < {:?}",
                    i + 2,
                    retry.3
                );
            }
            assert_eq!(db.dead, [(p(0), first, 3, "exhausted after 3 attempts: HTTP 503".into())]);
            let acked: Vec<Seq> = db.acks.iter().map(|a| a.1).collect();
            assert_eq!(acked, [second], "the dead-lettered head is not acknowledged");
        }
        worker.stop().await;
    })
    .await;
}

/// Every change in a partition's parked keys is reported, in order, and only a change: what
/// `--metrics-addr` exports as `keyorder_partition_parked_keys`.
#[tokio::test(start_paused = true)]
async fn each_change_in_the_parked_keys_is_reported() {
    let h = Harness::new(1);
    local(async {
        let failing = h.enqueue_key(0, "a");
        let other = h.enqueue_key(0, "b");
        h.always(failing, Reply::Status(503, None));
        let worker = h.start(h.config("w1"));
        h.at(3000).await;
        let parked: Vec<(u64, usize)> = h
            .events()
            .into_iter()
            .filter_map(|(at, e)| match e {
                WorkerEvent::Parked { partition, keys } if partition == p(0) => Some((at, keys)),
                _ => None,
            })
            .collect();
        let counts: Vec<usize> = parked.iter().map(|(_, k)| *k).collect();
        // Parked at each of its first two failures, due again before each retry; the third
        // failure dead-letters it without parking.
        assert_eq!(counts, [1, 0, 1, 0], "{parked:?}");
        let b = h.delivered().into_iter().find(|d| d.seq == other).expect("b delivered");
        assert!(
            parked[0].0 <= ms(b.at) && ms(b.at) < parked[1].0,
            "b went out while a was parked: {parked:?}, b at {}",
            ms(b.at)
        );
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_endpoints_retry_after_is_the_least_wait() {
    let h = Harness::new(1);
    local(async {
        let seq = h.enqueue(0);
        h.script(seq, &[Reply::Status(429, Some(Duration::from_millis(700)))]);
        let worker = h.start(h.config("w1"));
        h.at(2000).await;
        let retry_in = h.db.borrow().retries[0].3;
        assert!(retry_in >= Duration::from_millis(700), "{retry_in:?}");
        let d = h.delivered();
        assert_eq!(d.len(), 2);
        assert!(d[1].at.saturating_since(d[0].at) >= Duration::from_millis(700));
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_delivery_that_outlasts_the_timeout_is_a_failed_attempt() {
    let h = Harness::new(1);
    local(async {
        let seq = h.enqueue(0);
        h.script(seq, &[Reply::Hang]);
        let worker = h.start(h.config("w1"));
        h.at(1999).await;
        assert!(h.db.borrow().retries.is_empty(), "still waiting for the endpoint");
        h.at(2001).await;
        let retries = h.db.borrow().retries.clone();
        assert_eq!(retries.len(), 1);
        assert_eq!((retries[0].1, retries[0].2), (seq, 1));
        assert_eq!(retries[0].4, "timed out after 2s");
        h.at(4000).await;
        assert_eq!(h.attempts(), [(0, seq.0, 1), (0, seq.0, 2)]);
        assert_eq!(h.db.borrow().acks.len(), 1, "the second attempt was accepted");
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_hand_back_is_unclean_only_when_a_delivery_may_still_be_out() {
    let h = Harness::new(4);
    local(async {
        let hangs = h.enqueue(0);
        h.always(hangs, Reply::Hang);
        let refused = h.enqueue(1);
        h.always(refused, Reply::Status(503, None));
        h.enqueue(2);
        let hung_once = h.enqueue(3);
        h.script(hung_once, &[Reply::Hang]);
        let worker = h.start(h.config("w1"));
        h.at(5000).await;
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 4, released: 4, lost: 0 });
        let handovers: BTreeMap<u16, Handover> =
            h.db.borrow().releases.iter().map(|r| (r.0 .0, r.2)).collect();
        assert_eq!(
            handovers,
            BTreeMap::from([
                (0, Handover::Unclean), // its last delivery never answered
                (1, Handover::Clean),   // an error status is an answer
                (2, Handover::Clean),
                (3, Handover::Clean), // timed out once, then answered
            ])
        );
        // The partition whose delivery was out was handed back only once it had timed out.
        let release_0 = h.db.borrow().releases.iter().find(|r| r.0 == p(0)).map(|r| ms(r.3));
        let last_0 = h.delivered().iter().rfind(|d| d.partition == p(0)).map(|d| ms(d.at));
        assert_eq!(release_0, last_0.map(|t| t + 2000));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_the_delivery_in_flight_then_gives_every_lease_back() {
    let h = Harness::new(2);
    local(async {
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(1500);
        let first = h.enqueue(0);
        let second = h.enqueue(0);
        let worker = h.start(h.config("w1"));
        h.at(1000).await;
        let report = worker.stop().await;
        assert_eq!(ms(h.clock.now()), 1500, "the loop ended when the delivery had");
        assert_eq!(report, WorkerReport { acquired: 2, released: 2, lost: 0 });
        assert_eq!(h.attempts(), [(0, first.0, 1)], "nothing new starts after shutdown");
        let db = h.db.borrow();
        assert_eq!(db.acks.iter().map(|a| a.1).collect::<Vec<_>>(), [first]);
        assert!(db.queues[&p(0)].contains_key(&second));
        let releases: BTreeMap<u16, (Handover, u64)> =
            db.releases.iter().map(|r| (r.0 .0, (r.2, ms(r.3)))).collect();
        assert_eq!(
            releases,
            BTreeMap::from([(0, (Handover::Clean, 1500)), (1, (Handover::Clean, 1000))])
        );
        assert!(db.held.is_empty());
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_partition_task_whose_worker_is_gone_gives_its_lease_back_after_the_delivery() {
    let h = Harness::new(1);
    local(async {
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(1500);
        let first = h.enqueue(0);
        h.enqueue(0);
        let store = FakeStore { db: h.db.clone(), clock: h.clock };
        let limits = WorkerConfig::new("w").limits();
        let store = crate::store::timed::TimedStore::new(store, h.clock, limits);
        let lease = store.acquire(p(0)).await.unwrap().expect("free");
        let task = partition::PartitionTask {
            deliver: h.endpoint.clone(),
            clock: h.clock,
            drain: crate::drain::DrainConfig::new(p(0), 0),
            delivery_timeout: Duration::from_secs(2),
            observer: None,
            parked: 0,
            unsettled: false,
            inherited: false,
            repeat_results: false,
        };
        let (tx, rx) = oneshot::channel();
        let handle = tokio::task::spawn_local(task.run(lease, rx));
        h.at(1000).await;
        // The sender goes without a word (its worker dropped it): that is a release request.
        drop(tx);
        let exit = handle.await.expect("no panic");
        assert!(matches!(exit, PartitionExit::Released(q) if q == p(0)), "{exit:?}");
        assert_eq!(ms(h.clock.now()), 1500);
        assert_eq!(h.attempts(), [(0, first.0, 1)]);
        assert_eq!(h.db.borrow().releases.len(), 1);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_busy_partition_gives_its_lease_back_promptly() {
    let h = Harness::new(2);
    local(async {
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(10);
        let seqs: Vec<Seq> = (0..400).map(|_| h.enqueue(1)).collect();
        let worker = h.start(h.config("w1"));
        h.at(1500).await;
        h.db.borrow_mut().others = 1;
        h.at(3000).await;
        let acked: Vec<Seq> = {
            let db = h.db.borrow();
            let release = db.releases.iter().find(|r| r.0 == p(1)).expect("p1 given back");
            // Asked at the rebalance of 2000, mid-delivery: given back once that one is acked.
            assert!((2000..=2010).contains(&ms(release.3)), "released at {}", ms(release.3));
            db.acks.iter().map(|a| a.1).collect()
        };
        assert!(acked.len() < seqs.len(), "given back before the partition was drained");
        assert_eq!(acked, seqs[..acked.len()], "a prefix, in order");
        let delivered: Vec<Seq> = h.delivered().iter().map(|d| d.seq).collect();
        assert_eq!(delivered, acked, "the delivery in flight at the request was acknowledged");
        assert_eq!(h.held(), BTreeSet::from([0]));
        worker.stop().await;
    })
    .await;
}
