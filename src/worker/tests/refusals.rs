//! A refused input, store calls that hang, sessions kept alive.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_refused_input_is_reported_and_the_lease_given_back_unclean() {
    let h = Harness::new(1);
    local(async {
        let seq = h.enqueue(0);
        let worker = h.start(WorkerConfig { repeat_results: true, ..h.config("w1") });
        h.at(500).await;
        assert_eq!(h.attempts(), vec![(0, seq.0, 1)], "delivered once before the refusal");
        let refused: Vec<u16> = h
            .events()
            .iter()
            .filter_map(|(_, e)| match e {
                WorkerEvent::DrainRefused { partition, error } => {
                    assert!(error.contains("nothing is in flight"), "{error}");
                    Some(partition.0)
                }
                _ => None,
            })
            .collect();
        assert_eq!(refused, vec![0], "the refusal is a worker event: {:?}", h.events());
        let releases: Vec<(u16, u64, Handover)> =
            h.db.borrow().releases.iter().map(|(q, e, how, _)| (q.0, e.0, *how)).collect();
        assert_eq!(releases, vec![(0, 1, Handover::Unclean)], "given back at once, unclean");
        // Taken again afresh: the next lease waits out the takeover before it reads.
        let acquired: Vec<(u64, Handover)> =
            h.db.borrow().acquired.iter().map(|(_, e, how, _)| (e.0, *how)).collect();
        assert_eq!(acquired[1..], [(2, Handover::Unclean)], "{acquired:?}");
        assert_eq!(h.queued(0), 1, "nothing acknowledged after the refusal: redelivered later");
        let report = worker.stop().await;
        assert_eq!(report.lost, 1, "the refused lease counts as lost: {report:?}");
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_store_call_that_never_answers_times_out_and_ends_the_lease() {
    let h = Harness::new(1);
    local(async {
        h.db.borrow_mut().hang_fetch.insert(p(0));
        let config = WorkerConfig { request_timeout: Duration::from_millis(700), ..h.config("w1") };
        let worker = h.start(config);
        h.at(699).await;
        assert_eq!(h.held(), BTreeSet::from([0]), "still waiting for the store");
        h.at(700).await;
        tokio::task::yield_now().await;
        let lost = WorkerEvent::Lost {
            partition: p(0),
            epoch: Epoch(1),
            error: "store did not answer fetch_head within 700ms".into(),
        };
        assert_eq!(h.events()[1], (700, lost), "lost when the request timeout ran out");
        h.db.borrow_mut().hang_fetch.clear();
        let report = worker.stop().await;
        assert_eq!(report.lost, 1);
        assert_eq!(h.db.borrow().acquired[0].1, Epoch(1));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_quiet_lease_is_kept_alive_every_third_of_the_session_timeout() {
    let h = Harness::new(1);
    local(async {
        let config = WorkerConfig {
            session_timeout: Some(Duration::from_millis(4500)),
            delivery_timeout: Duration::from_secs(3),
            idle_poll: Duration::from_secs(5),
            ..h.config("w1")
        };
        let worker = h.start(config);
        h.at(4400).await;
        let times: Vec<u64> = h.db.borrow().keep_alives.iter().map(|k| ms(k.1)).collect();
        assert_eq!(times, [1500, 3000], "idle: heard every 1.5 s");
        // A delivery of 2.5 s (5 000 to 7 500) is kept heard as well.
        h.endpoint.state.borrow_mut().latency = Duration::from_millis(2500);
        let seq = h.enqueue(0);
        h.at(8000).await;
        let d = h.delivered();
        assert_eq!((d.len(), d[0].seq, ms(d[0].at)), (1, seq, 5000));
        let times: Vec<u64> = h.db.borrow().keep_alives.iter().map(|k| ms(k.1)).collect();
        assert_eq!(times, [1500, 3000, 4500, 6500], "during the delivery too");
        assert_eq!(worker.stop().await.lost, 0);
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_store_that_ends_no_silent_session_is_not_kept_alive() {
    let h = Harness::new(1);
    local(async {
        let config = WorkerConfig { idle_poll: Duration::from_secs(5), ..h.config("w1") };
        let worker = h.start(config);
        h.at(4500).await;
        assert!(h.db.borrow().keep_alives.is_empty());
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_session_may_end_before_the_delivery_does_not_deliver() {
    for (delay_ms, delivers) in [(3_500, true), (4_500, false)] {
        let h = Harness::new(1);
        local(async {
            h.db.borrow_mut().fetch_delay = Duration::from_millis(delay_ms);
            h.enqueue(0);
            let config = WorkerConfig {
                session_timeout: Some(Duration::from_secs(6)),
                request_timeout: Duration::from_secs(5),
                ..h.config("w1")
            };
            let worker = h.start(config);
            // The head read started at 0 and answered after the delay; the delivery of up to
            // 2 s must end before 6 s after the read started.
            h.at(delay_ms + 10).await;
            assert_eq!(h.delivered().len(), usize::from(delivers), "fetch delay {delay_ms} ms");
            if !delivers {
                let (at, event) = h.events()[1].clone();
                assert_eq!(at, delay_ms);
                assert!(
                    matches!(&event, WorkerEvent::Lost { error, .. } if error.contains("may expire within 6.5s")),
                    "{event:?}"
                );
            }
            worker.stop().await;
        })
        .await;
    }
}
