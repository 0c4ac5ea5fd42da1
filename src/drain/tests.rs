//! Transition tests for the drain machine, driven without tokio or sleeps: the harness jumps
//! time to the machine's next timeout.

use std::time::Duration;

use super::*;

const P: PartitionId = PartitionId(3);

fn policy() -> RetryPolicy {
    RetryPolicy::new(3, Duration::from_millis(100), Duration::from_millis(800))
        .expect("valid policy")
}

/// The machine of the tests below that predate parking: partition FIFO, as it was then (they
/// pass unchanged, which is what `strict_partition_order` promises).
fn machine() -> Drain {
    let mut config = DrainConfig::new(P, 42);
    config.retry = policy();
    config.idle_poll = Duration::from_millis(50);
    config.strict_partition_order = true;
    Drain::new(config)
}

/// A machine that parks failing keys, at most `max_parked` at once.
fn parking(max_parked: usize) -> Harness {
    let mut config = DrainConfig::new(P, 42);
    config.retry = policy();
    config.idle_poll = Duration::from_millis(50);
    config.max_parked_keys = max_parked;
    Harness { drain: Drain::new(config), time: Time::ZERO }
}

fn keyed(seq: i64, key: &str) -> Head {
    Head { key: key.into(), ..head(seq) }
}

fn fetch_skipping(epoch: u64, keys: &[&str]) -> Action {
    let skip = ParkedKeys::new(keys.iter().map(|k| k.to_string()));
    Action::FetchHead { partition: P, epoch: Epoch(epoch), skip }
}

fn head(seq: i64) -> Head {
    Head {
        seq: Seq(seq),
        event_id: format!("evt_{seq}"),
        key: "sub_1".into(),
        payload: "{}".into(),
        attempts: 0,
        not_before: None,
        last_error: None,
    }
}

/// A machine plus a clock: `step()` jumps to the earliest timeout, `drain()` collects actions.
struct Harness {
    drain: Drain,
    time: Time,
}

impl Harness {
    fn new() -> Self {
        Self { drain: machine(), time: Time::ZERO }
    }

    fn input(&mut self, input: Input) -> Vec<Action> {
        self.drain.handle(input, self.time).expect("legal input");
        self.actions()
    }

    fn actions(&mut self) -> Vec<Action> {
        std::iter::from_fn(|| self.drain.poll_action()).take(100).collect()
    }

    /// Jumps to the next timeout and fires it; returns the actions it produced.
    fn step(&mut self) -> Vec<Action> {
        let at = self.drain.poll_timeout().expect("a timer is armed");
        self.time = self.time.max(at);
        self.drain.handle_timeout(self.time);
        self.actions()
    }

    fn acquire(&mut self, epoch: u64) -> Vec<Action> {
        self.input(Input::LeaseAcquired { epoch: Epoch(epoch) })
    }

    fn fail(&mut self, seq: i64) -> Vec<Action> {
        self.input(Input::DeliveryFailed {
            seq: Seq(seq),
            error: "HTTP 503".into(),
            retry_after: None,
        })
    }
}

fn fetch(epoch: u64) -> Action {
    Action::FetchHead { partition: P, epoch: Epoch(epoch), skip: ParkedKeys::NONE }
}

fn deliver(epoch: u64, h: &Head, attempt: u32) -> Action {
    Action::Deliver { partition: P, epoch: Epoch(epoch), head: h.clone(), attempt }
}

#[test]
fn success_path_delivers_acks_and_fetches_the_next_head() {
    let mut h = Harness::new();
    assert_eq!(h.acquire(1), vec![fetch(1)]);
    let first = head(10);
    assert_eq!(h.input(Input::HeadFetched(Some(first.clone()))), vec![deliver(1, &first, 1)]);
    assert_eq!(h.drain.in_flight(), Some((Seq(10), 1)));
    assert_eq!(
        h.input(Input::DeliverySucceeded { seq: Seq(10) }),
        vec![Action::Acknowledge { partition: P, epoch: Epoch(1), seq: Seq(10) }, fetch(1)]
    );
    assert_eq!(h.drain.in_flight(), None);
    // An empty partition waits for the idle poll, then looks again.
    assert_eq!(h.input(Input::HeadFetched(None)), vec![]);
    assert_eq!(h.drain.poll_timeout(), Some(Time::from_millis(50)));
    assert_eq!(h.step(), vec![fetch(1)]);
}

#[test]
fn retry_then_success_waits_for_the_backoff() {
    let mut h = Harness::new();
    h.acquire(1);
    let first = head(10);
    h.input(Input::HeadFetched(Some(first.clone())));
    let actions = h.fail(10);
    let [Action::ScheduleRetry { seq, attempts: 1, not_before, .. }] = actions.as_slice() else {
        panic!("expected one ScheduleRetry, got {actions:?}");
    };
    assert_eq!(*seq, Seq(10));
    assert!(*not_before <= Time::from_millis(100), "first backoff above base: {not_before}");
    assert_eq!(h.drain.in_flight(), None, "nothing in flight while waiting");
    // The retry re-reads the head under the lease before it delivers.
    assert_eq!(h.step(), vec![fetch(1)]);
    assert_eq!(h.time, *not_before);
    let mut retried = first.clone();
    retried.attempts = 1;
    retried.not_before = Some(*not_before);
    retried.last_error = Some("HTTP 503".into());
    assert_eq!(h.input(Input::HeadFetched(Some(retried.clone()))), vec![deliver(1, &retried, 2)]);
    let done = h.input(Input::DeliverySucceeded { seq: Seq(10) });
    assert_eq!(done[0], Action::Acknowledge { partition: P, epoch: Epoch(1), seq: Seq(10) });
}

#[test]
fn exhaustion_dead_letters_and_moves_on() {
    let mut h = Harness::new();
    h.acquire(1);
    h.input(Input::HeadFetched(Some(head(10))));
    for attempts in 1..=2 {
        h.fail(10);
        assert_eq!(h.step(), vec![fetch(1)]);
        let mut again = head(10);
        again.attempts = attempts;
        let delivered = h.input(Input::HeadFetched(Some(again)));
        assert!(
            matches!(delivered.as_slice(), [Action::Deliver { attempt, .. }] if *attempt == attempts + 1)
        );
    }
    assert_eq!(
        h.fail(10),
        vec![
            Action::DeadLetter {
                partition: P,
                epoch: Epoch(1),
                seq: Seq(10),
                attempts: 3,
                reason: "exhausted after 3 attempts: HTTP 503".into(),
            },
            fetch(1),
        ]
    );
    let next = head(11);
    assert_eq!(h.input(Input::HeadFetched(Some(next.clone()))), vec![deliver(1, &next, 1)]);
}

#[test]
fn lease_loss_in_flight_ignores_the_late_result_and_acknowledges_nothing() {
    let mut h = Harness::new();
    h.acquire(1);
    h.input(Input::HeadFetched(Some(head(10))));
    assert_eq!(h.input(Input::LeaseLost), vec![]);
    assert!(!h.drain.is_owned());
    assert_eq!(h.input(Input::DeliverySucceeded { seq: Seq(10) }), vec![], "late result ignored");
    assert_eq!(h.drain.poll_timeout(), None, "no timer survives the loss");
    // A second late result is no longer expected: it is an error, not a silent ack.
    assert!(matches!(
        h.drain.handle(Input::DeliverySucceeded { seq: Seq(10) }, h.time),
        Err(DrainError::NothingInFlight { .. })
    ));
    // A new lease must have a newer epoch; then the partition is fetched afresh.
    assert!(matches!(
        h.drain.handle(Input::LeaseAcquired { epoch: Epoch(1) }, h.time),
        Err(DrainError::StaleEpoch { .. })
    ));
    assert_eq!(h.acquire(2), vec![fetch(2)]);
}

#[test]
fn lease_loss_while_waiting_cancels_the_retry_and_queued_actions() {
    let mut h = Harness::new();
    h.acquire(1);
    h.input(Input::HeadFetched(Some(head(10))));
    h.drain
        .handle(
            Input::DeliveryFailed { seq: Seq(10), error: "x".into(), retry_after: None },
            h.time,
        )
        .unwrap();
    // The ScheduleRetry is still queued when the loss arrives: it must not reach the store.
    h.drain.handle(Input::LeaseLost, h.time).unwrap();
    assert_eq!(h.actions(), vec![]);
    assert_eq!(h.drain.poll_timeout(), None);
}

#[test]
fn backoff_stays_within_zero_and_cap() {
    for seed in 0..50 {
        let mut config = DrainConfig::new(P, seed);
        config.strict_partition_order = true;
        config.retry =
            RetryPolicy::new(50, Duration::from_millis(100), Duration::from_millis(800)).unwrap();
        let mut h = Harness { drain: Drain::new(config), time: Time::from_millis(1000) };
        h.acquire(1);
        h.input(Input::HeadFetched(Some(head(1))));
        for n in 0..40u32 {
            let actions = h.fail(1);
            let [Action::ScheduleRetry { not_before, .. }] = actions.as_slice() else {
                panic!("expected a retry: {actions:?}");
            };
            let delay = not_before.saturating_since(h.time);
            assert!(delay <= Duration::from_millis(800), "seed {seed}: {delay:?}");
            h.step();
            let mut again = head(1);
            again.attempts = n + 1;
            h.drain.handle(Input::HeadFetched(Some(again)), h.time).unwrap();
            h.actions();
        }
    }
}

#[test]
fn release_waits_for_the_in_flight_delivery() {
    let mut h = Harness::new();
    h.acquire(1);
    h.input(Input::HeadFetched(Some(head(10))));
    assert_eq!(h.input(Input::ReleaseRequested), vec![]);
    assert!(h.drain.is_owned());
    assert_eq!(
        h.input(Input::DeliverySucceeded { seq: Seq(10) }),
        vec![
            Action::Acknowledge { partition: P, epoch: Epoch(1), seq: Seq(10) },
            Action::Release { partition: P, epoch: Epoch(1) },
        ]
    );
    assert!(!h.drain.is_owned());
}

#[test]
fn a_recorded_backoff_is_honoured_after_a_handover() {
    let mut h = Harness::new();
    h.acquire(1);
    let mut waiting = head(10);
    waiting.attempts = 1;
    waiting.not_before = Some(Time::from_millis(300));
    assert_eq!(h.input(Input::HeadFetched(Some(waiting.clone()))), vec![]);
    assert_eq!(h.drain.poll_timeout(), Some(Time::from_millis(300)));
    assert_eq!(h.step(), vec![fetch(1)]);
    assert_eq!(h.input(Input::HeadFetched(Some(waiting.clone()))), vec![deliver(1, &waiting, 2)]);
}

#[test]
fn an_exhausted_head_is_dead_lettered_without_another_attempt() {
    let mut h = Harness::new();
    h.acquire(1);
    let mut worn = head(10);
    worn.attempts = 3;
    worn.last_error = Some("timeout".into());
    let actions = h.input(Input::HeadFetched(Some(worn)));
    assert!(matches!(
        actions.as_slice(),
        [Action::DeadLetter { attempts: 3, reason, .. }, Action::FetchHead { .. }]
            if reason == "exhausted after 3 attempts: timeout"
    ));
}

#[test]
fn illegal_inputs_are_errors_not_panics() {
    let mut h = Harness::new();
    let at = h.time;
    assert!(matches!(
        h.drain.handle(Input::DeliverySucceeded { seq: Seq(1) }, at),
        Err(DrainError::NothingInFlight { .. })
    ));
    assert!(matches!(
        h.drain.handle(Input::HeadFetched(None), at),
        Err(DrainError::UnexpectedHead { .. })
    ));
    h.acquire(5);
    assert!(matches!(
        h.drain.handle(Input::LeaseAcquired { epoch: Epoch(6) }, at),
        Err(DrainError::AlreadyOwned { .. })
    ));
    h.input(Input::HeadFetched(Some(head(10))));
    assert!(matches!(
        h.drain.handle(Input::DeliverySucceeded { seq: Seq(11) }, at),
        Err(DrainError::WrongSeq { expected: Seq(10), got: Seq(11), .. })
    ));
    assert_eq!(h.drain.in_flight(), Some((Seq(10), 1)), "an error leaves the state unchanged");
}

#[test]
fn time_never_runs_backwards_and_early_timeouts_are_no_ops() {
    let mut h = Harness::new();
    h.time = Time::from_millis(500);
    h.acquire(1);
    h.input(Input::HeadFetched(None));
    assert_eq!(h.drain.poll_timeout(), Some(Time::from_millis(550)));
    h.drain.handle_timeout(Time::from_millis(100));
    assert_eq!(h.actions(), vec![], "a backwards time does not fire anything");
    h.drain.handle_timeout(Time::from_millis(549));
    assert_eq!(h.actions(), vec![]);
    assert_eq!(h.step(), vec![fetch(1)]);
}

#[test]
fn a_new_lease_waits_out_the_takeover_delay_before_reading() {
    let mut config = DrainConfig::new(P, 1);
    config.takeover_delay = Duration::from_millis(400);
    let mut h = Harness { drain: Drain::new(config), time: Time::from_millis(100) };
    assert_eq!(h.acquire(1), vec![], "nothing is read during the takeover delay");
    assert_eq!(h.drain.poll_timeout(), Some(Time::from_millis(500)));
    assert_eq!(h.step(), vec![fetch(1)]);
    // A release during the delay gives the lease straight back.
    let mut config = DrainConfig::new(P, 1);
    config.takeover_delay = Duration::from_millis(400);
    let mut h = Harness { drain: Drain::new(config), time: Time::ZERO };
    h.acquire(1);
    assert_eq!(
        h.input(Input::ReleaseRequested),
        vec![Action::Release { partition: P, epoch: Epoch(1) }]
    );
}

// Mutation-testing kills.

#[test]
fn the_epoch_is_the_held_lease_and_gone_with_it() {
    let mut h = Harness::new();
    assert_eq!(h.drain.epoch(), None);
    h.acquire(7);
    assert_eq!(h.drain.epoch(), Some(Epoch(7)));
    h.input(Input::LeaseLost);
    assert_eq!(h.drain.epoch(), None);
    h.acquire(9);
    assert_eq!(h.drain.epoch(), Some(Epoch(9)));
}

#[test]
fn a_backoff_that_ends_now_is_delivered_at_once() {
    let mut h = Harness::new();
    h.time = Time::from_millis(300);
    h.acquire(1);
    let mut due = head(10);
    due.attempts = 1;
    due.not_before = Some(h.time);
    assert_eq!(h.input(Input::HeadFetched(Some(due.clone()))), vec![deliver(1, &due, 2)]);
    assert_eq!(h.drain.in_flight(), Some((Seq(10), 2)));
}

// Parking: a failing key holds up only itself.

#[test]
fn a_failing_key_is_parked_and_the_partition_moves_on_to_another_key() {
    let mut h = parking(16);
    h.acquire(1);
    h.input(Input::HeadFetched(Some(keyed(10, "a"))));
    let actions = h.fail(10);
    let [Action::ScheduleRetry { seq: Seq(10), not_before, .. }, next] = actions.as_slice() else {
        panic!("expected a retry and a read, got {actions:?}");
    };
    let not_before = *not_before;
    assert_eq!(*next, fetch_skipping(1, &["a"]), "the read passes over the parked key");
    assert_eq!(h.drain.parked(), ParkedKeys::new(["a".to_string()]));
    let b = keyed(12, "b");
    assert_eq!(h.input(Input::HeadFetched(Some(b.clone()))), vec![deliver(1, &b, 1)]);
    let done = h.input(Input::DeliverySucceeded { seq: Seq(12) });
    assert_eq!(done[1], fetch_skipping(1, &["a"]), "a stays parked until its retry time");
    // Nothing else is queued: the partition idles until `a` is due, then reads it again.
    assert_eq!(h.input(Input::HeadFetched(None)), vec![]);
    let mut reads = Vec::new();
    for _ in 0..10 {
        let fetched = h.step();
        if fetched == vec![fetch(1)] {
            break;
        }
        assert_eq!(fetched, vec![fetch_skipping(1, &["a"])], "only idle polls before a is due");
        reads.push(h.time);
        h.input(Input::HeadFetched(None));
    }
    assert_eq!(h.time, not_before, "a is read again exactly at its retry time");
    assert!(h.drain.parked().is_empty());
    let mut retried = keyed(10, "a");
    retried.attempts = 1;
    assert_eq!(h.input(Input::HeadFetched(Some(retried.clone()))), vec![deliver(1, &retried, 2)]);
}

#[test]
fn a_key_unparked_while_a_read_is_out_is_read_again_at_once() {
    let mut h = parking(16);
    h.acquire(1);
    h.input(Input::HeadFetched(Some(keyed(10, "a"))));
    h.input(Input::DeliveryFailed {
        seq: Seq(10),
        error: "HTTP 503".into(),
        retry_after: Some(Duration::from_millis(300)),
    });
    // The read skipping `a` is still out when `a` falls due.
    h.time = Time::from_millis(800);
    h.drain.handle_timeout(h.time);
    assert_eq!(h.actions(), vec![]);
    assert_eq!(h.input(Input::HeadFetched(None)), vec![fetch(1)], "an empty answer is stale");
}

#[test]
fn a_retry_after_is_the_earliest_time_a_parked_key_is_read_again() {
    let mut h = parking(16);
    h.acquire(1);
    h.input(Input::HeadFetched(Some(keyed(10, "a"))));
    let actions = h.input(Input::DeliveryFailed {
        seq: Seq(10),
        error: "HTTP 503".into(),
        retry_after: Some(Duration::from_millis(700)),
    });
    assert!(matches!(actions[0], Action::ScheduleRetry { not_before, .. }
        if not_before == Time::from_millis(700)));
    // The partition is empty but for `a`: idle polls skip it until 700 ms.
    h.input(Input::HeadFetched(None));
    while h.step() != vec![fetch(1)] {
        assert!(h.time < Time::from_millis(700), "a read skipped a after its retry time");
        h.input(Input::HeadFetched(None));
    }
    assert_eq!(h.time, Time::from_millis(700));
}

#[test]
fn parked_keys_are_bounded_and_past_the_bound_the_partition_waits() {
    let mut h = parking(2);
    h.acquire(1);
    for (seq, key, parked) in [(10, "a", vec!["a"]), (11, "b", vec!["a", "b"])] {
        h.input(Input::HeadFetched(Some(keyed(seq, key))));
        let actions = h.fail(seq);
        assert_eq!(actions.len(), 2, "{actions:?}");
        assert_eq!(actions[1], fetch_skipping(1, &parked));
    }
    h.input(Input::HeadFetched(Some(keyed(12, "c"))));
    let actions = h.fail(12);
    assert!(
        matches!(actions.as_slice(), [Action::ScheduleRetry { seq: Seq(12), .. }]),
        "a third key is not parked past the bound of two: {actions:?}"
    );
    assert_eq!(h.drain.parked().len(), 2);
    assert_eq!(h.drain.in_flight(), None);
}

#[test]
fn strict_partition_order_never_parks() {
    let mut h = Harness::new();
    h.acquire(1);
    h.input(Input::HeadFetched(Some(keyed(10, "a"))));
    let actions = h.fail(10);
    assert!(matches!(actions.as_slice(), [Action::ScheduleRetry { .. }]), "{actions:?}");
    assert!(h.drain.parked().is_empty());
    assert_eq!(h.step(), vec![fetch(1)], "the head is read again, nothing else");
}

#[test]
fn a_lease_loss_or_release_forgets_the_parked_keys() {
    let mut h = parking(16);
    h.acquire(1);
    h.input(Input::HeadFetched(Some(keyed(10, "a"))));
    h.fail(10);
    h.input(Input::LeaseLost);
    assert!(h.drain.parked().is_empty());
    assert_eq!(h.drain.poll_timeout(), None, "no parked-key timer survives the lease");
    assert_eq!(h.acquire(2), vec![fetch(2)], "the new lease starts from the oldest row");
    h.input(Input::HeadFetched(Some(keyed(10, "a"))));
    h.fail(10);
    h.input(Input::HeadFetched(None));
    assert_eq!(
        h.input(Input::ReleaseRequested),
        vec![Action::Release { partition: P, epoch: Epoch(2) }]
    );
    assert!(h.drain.parked().is_empty());
}

#[test]
fn a_recorded_backoff_read_after_a_handover_parks_its_key() {
    let mut h = parking(16);
    h.acquire(1);
    let mut waiting = keyed(10, "a");
    waiting.attempts = 1;
    waiting.not_before = Some(Time::from_millis(300));
    assert_eq!(h.input(Input::HeadFetched(Some(waiting))), vec![fetch_skipping(1, &["a"])]);
    let b = keyed(11, "b");
    assert_eq!(h.input(Input::HeadFetched(Some(b.clone()))), vec![deliver(1, &b, 1)]);
}

#[test]
fn parked_keys_are_listed_sorted_without_duplicates() {
    let keys = ParkedKeys::new(["b", "a", "b", "c"].map(String::from));
    assert_eq!(keys.as_slice(), ["a", "b", "c"].map(String::from).as_slice());
    assert_eq!((keys.len(), keys.contains("a"), keys.contains("d")), (3, true, false));
    assert!(ParkedKeys::NONE.as_slice().is_empty());
}
