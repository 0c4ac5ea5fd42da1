//! Takeover: the wait before a new holder's first read.

use super::*;

#[tokio::test(start_paused = true)]
async fn an_unclean_lease_waits_out_the_delivery_timeout_before_its_first_read() {
    let h = Harness::new(2);
    local(async {
        h.db.borrow_mut().unclean.insert(p(0));
        h.enqueue(0);
        h.enqueue(1);
        let worker = h.start(h.config("w1"));
        h.at(2500).await;
        {
            let db = h.db.borrow();
            let handovers: Vec<_> = db.acquired.iter().map(|a| (a.0 .0, a.2)).collect();
            assert_eq!(handovers, [(0, Handover::Unclean), (1, Handover::Clean)]);
            let first_read = |q: u16| db.fetches.iter().find(|f| f.0 == p(q)).map(|f| ms(f.2));
            assert_eq!(first_read(0), Some(2000), "after the delivery timeout");
            assert_eq!(first_read(1), Some(0), "a clean hand-back needs no wait");
        }
        let at: Vec<(u16, u64)> = h.delivered().iter().map(|d| (d.partition.0, ms(d.at))).collect();
        assert_eq!(at, [(1, 0), (0, 2000)]);
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_configured_takeover_delay_replaces_the_delivery_timeout() {
    let h = Harness::new(1);
    local(async {
        h.db.borrow_mut().unclean.insert(p(0));
        let mut config = h.config("w1");
        config.takeover_delay = Some(Duration::from_millis(700));
        let worker = h.start(config);
        h.at(1000).await;
        let first_read = h.db.borrow().fetches.first().map(|f| ms(f.2));
        assert_eq!(first_read, Some(700));
        worker.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_given_back_before_its_first_read_after_an_unclean_takeover_stays_unclean() {
    let h = Harness::new(2);
    local(async {
        h.db.borrow_mut().unclean.insert(p(0));
        let mut config = h.config("w1");
        config.takeover_delay = Some(Duration::from_secs(5));
        let worker = h.start(config);
        h.at(1000).await;
        let report = worker.stop().await;
        assert_eq!(report, WorkerReport { acquired: 2, released: 2, lost: 0 });
        let db = h.db.borrow();
        assert!(db.fetches.iter().all(|f| f.0 != p(0)), "p0 never read");
        let handovers: BTreeMap<u16, Handover> =
            db.releases.iter().map(|r| (r.0 .0, r.2)).collect();
        // The previous holder of p0 may still have a delivery out: the next holder must wait.
        assert_eq!(handovers, BTreeMap::from([(0, Handover::Unclean), (1, Handover::Clean)]));
        assert!(db.unclean.contains(&p(0)) && !db.unclean.contains(&p(1)));
    })
    .await;
}
