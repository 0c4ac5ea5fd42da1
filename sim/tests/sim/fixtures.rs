//! Small fixed scenarios, written out in full so that a change to the generator cannot move
//! them.

use keyorder::retry::RetryPolicy;
use keyorder_sim::scenario::{EndpointSpec, Fault, FaultKind, KeySpec};
use keyorder_sim::Scenario;
use std::time::Duration;

/// Two partitions, two workers, three keys of four events, no fault.
pub fn clean() -> Scenario {
    Scenario {
        partitions: 2,
        workers: 2,
        producers: 1,
        keys: ["sub_a", "sub_b", "sub_c"]
            .into_iter()
            .map(|k| KeySpec {
                key: k.into(),
                events: 4,
                endpoint: EndpointSpec { latency_ms: 1, ..Default::default() },
            })
            .collect(),
        load_ms: 200,
        commit_latency_ms: 2,
        min_latency_ms: 1,
        max_latency_ms: 1,
        detection_ms: 3_000,
        request_timeout_ms: 800,
        delivery_timeout_ms: 400,
        takeover_delay_ms: None,
        retry: RetryPolicy::new(3, Duration::from_millis(50), Duration::from_millis(400))
            .expect("valid"),
        idle_poll_ms: 100,
        rebalance_ms: 300,
        faults: vec![],
        tail_ms: 500,
        duration_ms: 30_000,
        procedure: Default::default(),
        breaks: vec![],
        strict_partition_order: false,
        lease: Default::default(),
    }
}

/// The clean scenario with a worker crash and a lease loss while events are still coming.
pub fn crash_and_lease_loss() -> Scenario {
    let mut s = clean();
    s.load_ms = 1_500;
    s.keys[1].endpoint.fail_first = 1;
    s.faults = vec![
        Fault { at_ms: 300, kind: FaultKind::CrashWorker { worker: 0, down_ms: 400 } },
        Fault { at_ms: 900, kind: FaultKind::LeaseLoss { worker: 1, for_ms: 3_500 } },
    ];
    s
}
