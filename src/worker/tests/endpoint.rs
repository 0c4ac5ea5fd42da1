//! The fake endpoint: scripted replies, and what it received.

use super::*;

/// What the endpoint does with one delivery attempt.
#[derive(Clone, Copy, Debug)]
pub(super) enum Reply {
    Accept,
    Status(u16, Option<Duration>),
    /// Never answers.
    Hang,
    /// Accepts after this long.
    Slow(Duration),
    Panic,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Delivered {
    pub(super) partition: PartitionId,
    pub(super) seq: Seq,
    pub(super) attempt: u32,
    pub(super) at: Time,
}

#[derive(Default)]
pub(super) struct EndpointState {
    /// Per event id, the replies to its attempts in order; then it accepts.
    pub(super) script: BTreeMap<String, VecDeque<Reply>>,
    /// Per event id, the reply to every attempt once the script is used up.
    pub(super) always: BTreeMap<String, Reply>,
    pub(super) latency: Duration,
    pub(super) log: Vec<Delivered>,
    pub(super) in_flight: BTreeMap<PartitionId, usize>,
    pub(super) most_per_partition: usize,
    pub(super) most_overall: usize,
}

#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) state: Rc<RefCell<EndpointState>>,
    pub(super) clock: TokioClock,
}

/// Counts a delivery in flight until dropped (a timed-out delivery is dropped, not finished).
pub(super) struct InFlight(Rc<RefCell<EndpointState>>, PartitionId);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.borrow_mut().in_flight.get_mut(&self.1).expect("counted") -= 1;
    }
}

impl Deliver for Endpoint {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let (reply, latency) = {
            let mut s = self.state.borrow_mut();
            s.log.push(Delivered { partition, seq: head.seq, attempt, at: self.clock.now() });
            *s.in_flight.entry(partition).or_default() += 1;
            let here = s.in_flight[&partition];
            let overall = s.in_flight.values().sum();
            s.most_per_partition = s.most_per_partition.max(here);
            s.most_overall = s.most_overall.max(overall);
            let scripted = s.script.get_mut(&head.event_id).and_then(VecDeque::pop_front);
            let reply =
                scripted.or_else(|| s.always.get(&head.event_id).copied()).unwrap_or(Reply::Accept);
            (reply, s.latency)
        };
        let _counted = InFlight(self.state.clone(), partition);
        match reply {
            Reply::Accept => {
                tokio::time::sleep(latency).await;
                Ok(())
            }
            Reply::Status(status, retry_after) => {
                tokio::time::sleep(latency).await;
                Err(DeliverError::Status { status, retry_after })
            }
            Reply::Hang => std::future::pending().await,
            Reply::Slow(after) => {
                tokio::time::sleep(after).await;
                Ok(())
            }
            Reply::Panic => panic!("endpoint exploded"),
        }
    }
}
