use std::time::Duration;

use super::*;

fn row(seq: i64, key: &str) -> StoredHead {
    StoredHead {
        seq: Seq(seq),
        event_id: format!("e{seq}"),
        key: key.into(),
        payload: "{}".into(),
        attempts: 0,
        wait: None,
        last_error: None,
    }
}

fn at(ms: u64) -> Time {
    Time::from_millis(ms)
}

const OPTIONS: ExpiryDrainOptions = ExpiryDrainOptions {
    read_ahead: 4,
    ack_batch: 2,
    ack_delay: Duration::from_millis(50),
    delivery_timeout: Duration::from_millis(600),
    clock_skew: Duration::from_millis(400),
};

/// A lease of partition `p` at epoch 1 on `acks`, whose expiry is known to lie at 10 s.
fn drain(p: u16, acks: &ExpiryAcks<()>) -> ExpiryDrain<()> {
    let mut d = ExpiryDrain::new(OPTIONS, (p, 1), (), acks);
    d.answered(at(10_000));
    d
}

fn parked(keys: &[&str]) -> ParkedKeys {
    ParkedKeys::new(keys.iter().map(|k| (*k).to_owned()))
}

fn read(after: i64, flush_first: bool) -> ExpiryHeadPlan {
    ExpiryHeadPlan::Read(ExpiryRead { after: Seq(after), limit: 4, flush_first })
}

fn served(plan: ExpiryHeadPlan) -> Option<i64> {
    match plan {
        ExpiryHeadPlan::Serve(h) => Some(h.seq.0),
        ExpiryHeadPlan::Read(_) => None,
    }
}

#[test]
fn serves_what_it_read_ahead_then_reads_after_the_last_acknowledged_seq() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks);
    assert_eq!(d.plan_head(&ParkedKeys::NONE, at(0)), read(0, false));
    let filled = d.filled(vec![row(1, "a"), row(2, "b")]);
    assert_eq!((filled.head.map(|h| h.seq.0), filled.flush), (Some(1), false));
    assert!(!d.acked(Seq(1), at(1)), "one row, 0 ms old: not due");
    assert_eq!(served(d.plan_head(&ParkedKeys::NONE, at(2))), Some(2));
    assert!(!d.acked(Seq(2), at(3)), "a lease's batch is at least ROWS_PER_LEASE rows");
    assert!(d.acked(Seq(3), at(51)), "the oldest is ack_delay old: due");
    assert_eq!(d.plan_head(&ParkedKeys::NONE, at(52)), read(3, false));
}

#[test]
fn a_partition_that_runs_empty_flushes() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks);
    let _ = d.plan_head(&ParkedKeys::NONE, at(0));
    assert_eq!(d.filled(Vec::new()), ExpiryFilled { head: None, flush: true });
}

#[test]
fn nothing_is_served_once_the_lease_may_end_before_a_delivery_and_the_skew() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks);
    let _ = d.plan_head(&ParkedKeys::NONE, at(0));
    let _ = d.filled(vec![row(1, "a"), row(2, "b")]);
    // 600 ms timeout + 400 ms skew: 8,999 + 1,000 < 10,000 lasts, 9,000 does not.
    assert_eq!(served(d.plan_head(&ParkedKeys::NONE, at(8_999))), Some(1));
    assert!(d.lasts(at(8_999), OPTIONS.delivery_timeout));
    assert_eq!(d.plan_head(&ParkedKeys::NONE, at(9_000)), read(0, false));
    assert!(!d.lasts(at(9_000), OPTIONS.delivery_timeout));
    d.answered(at(20_000));
    assert!(d.lasts(at(9_000), OPTIONS.delivery_timeout), "a later answer extends it");
}

#[test]
fn an_unparked_key_flushes_and_reads_from_the_start() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks);
    let _ = d.plan_head(&parked(&["a"]), at(0));
    let _ = d.filled(vec![row(2, "b"), row(3, "b")]);
    let _ = d.acked(Seq(2), at(1));
    let _ = d.acked(Seq(3), at(1));
    assert_eq!(d.plan_head(&parked(&["a"]), at(2)), read(3, false));
    let _ = d.filled(Vec::new());
    assert_eq!(d.plan_head(&ParkedKeys::NONE, at(3)), read(0, true), "a's row 1 lies behind");
    let _ = d.filled(vec![row(1, "a")]);
    assert_eq!(d.plan_head(&ParkedKeys::NONE, at(4)), ExpiryHeadPlan::Serve(row(1, "a")));
}

#[cfg(feature = "broken-designs")]
#[test]
fn the_broken_rule_keeps_the_cursor_past_the_unparked_key() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks).keeping_the_cursor_on_unpark();
    let _ = d.plan_head(&parked(&["a"]), at(0));
    let _ = d.filled(vec![row(2, "b")]);
    let _ = d.acked(Seq(2), at(1));
    assert_eq!(d.plan_head(&ParkedKeys::NONE, at(2)), read(2, true));
}

#[test]
fn parked_keys_are_never_served_from_the_read_ahead() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks);
    let _ = d.plan_head(&ParkedKeys::NONE, at(0));
    let _ = d.filled(vec![row(1, "a"), row(2, "b"), row(3, "a"), row(4, "c")]);
    assert_eq!(served(d.plan_head(&parked(&["a"]), at(1))), Some(2));
    let _ = d.acked(Seq(2), at(1));
    assert_eq!(served(d.plan_head(&parked(&["a"]), at(2))), Some(4));
    assert_eq!(d.read_ahead_len(), 1);
}

#[test]
fn a_changed_row_is_read_again_and_a_dead_letter_moves_the_cursor() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks);
    let _ = d.plan_head(&ParkedKeys::NONE, at(0));
    let _ = d.filled(vec![row(1, "a"), row(2, "b")]);
    d.changing_row();
    assert_eq!(d.plan_head(&ParkedKeys::NONE, at(1)), read(0, false));
    d.dead_lettered(Seq(1));
    assert_eq!(d.plan_head(&ParkedKeys::NONE, at(2)), read(1, false));
}

#[test]
fn leases_of_one_connection_flush_together_and_a_refused_one_is_lost() {
    let acks = ExpiryAcks::new();
    let mut p0 = drain(0, &acks);
    let mut p1 = drain(1, &acks);
    let _ = p0.acked(Seq(5), at(0));
    let _ = p1.acked(Seq(6), at(0));
    let flush = acks.take().expect("two rows buffered");
    let leases: Vec<_> = flush.leases().map(|(k, _, seqs)| (k, seqs.to_vec())).collect();
    assert_eq!(leases, [((0, 1), vec![5]), ((1, 1), vec![6])]);
    assert!(acks.take().is_none(), "taken");
    acks.flushed([(1, 1)]);
    assert!(!p0.is_lost() && p1.is_lost());
}

#[test]
fn a_failed_flush_puts_every_row_back_and_a_dropped_lease_is_forgotten() {
    let acks = ExpiryAcks::new();
    let mut p0 = drain(0, &acks);
    let mut p1 = drain(1, &acks);
    let _ = p0.acked(Seq(5), at(0));
    let flush = acks.take().expect("one row");
    let _ = p1.acked(Seq(6), at(1));
    acks.failed(flush, at(2));
    drop(p1);
    let left: Vec<_> =
        acks.take().expect("p0's row").leases().map(|(k, _, s)| (k, s.to_vec())).collect();
    assert_eq!(left, [((0, 1), vec![5])]);
}

#[test]
#[should_panic(expected = "out of seq order")]
fn a_store_that_returns_rows_out_of_order_fails_the_assertion() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks);
    let _ = d.plan_head(&ParkedKeys::NONE, at(0));
    let _ = d.filled(vec![row(2, "a"), row(1, "b")]);
}

#[test]
#[should_panic(expected = "at or behind its cursor")]
fn a_store_that_returns_a_row_behind_the_cursor_fails_the_assertion() {
    let acks = ExpiryAcks::new();
    let mut d = drain(0, &acks);
    let _ = d.acked(Seq(4), at(0));
    let _ = d.plan_head(&ParkedKeys::NONE, at(1));
    let _ = d.filled(vec![row(3, "a")]);
}
