//! The endpoint host: records every arrival with the simulated time, then answers as the key's
//! [`EndpointSpec`] says (fast, slow, failing, poison). One host serves every key.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use crate::simulator::net::Listener;
use keyorder::check::Outcome;

use crate::protocol::{Conn, DeliveryRequest, DeliveryResponse, ENDPOINT_PORT};
use crate::scenario::EndpointSpec;
use crate::trace::SharedRecorder;

/// Endpoint behaviour per key plus arrival counts per event (outside the factory).
#[derive(Debug, Default)]
pub struct Endpoints {
    specs: BTreeMap<String, EndpointSpec>,
    arrivals: BTreeMap<String, u32>,
    /// How long a "slow" answer takes: beyond the workers' delivery timeout.
    slow: Duration,
}

/// Shared endpoint state.
pub type SharedEndpoints = Rc<RefCell<Endpoints>>;

/// An endpoint's decision for one arrival.
struct Answer {
    status: u16,
    retry_after_ms: Option<u64>,
    delay: Duration,
}

impl Endpoints {
    /// Endpoints for `specs` (key → behaviour); slow answers take `slow`.
    pub fn new(specs: BTreeMap<String, EndpointSpec>, slow: Duration) -> SharedEndpoints {
        Rc::new(RefCell::new(Endpoints { specs, arrivals: BTreeMap::new(), slow }))
    }

    fn answer(&mut self, req: &DeliveryRequest, rec: &SharedRecorder) -> Answer {
        let spec = self.specs.get(&req.key).cloned().unwrap_or_default();
        let n = self.arrivals.entry(req.event_id.clone()).or_default();
        *n += 1;
        let arrival = *n;
        let number = event_number(&req.event_id);
        let latency = Duration::from_millis(spec.latency_ms);
        let mut rec = rec.borrow_mut();
        if number.is_some_and(|k| spec.poison.contains(&k)) {
            rec.fault("poison_endpoint");
            return Answer { status: 500, retry_after_ms: None, delay: latency };
        }
        if arrival <= spec.fail_first {
            rec.fault("failing_endpoint");
            return Answer { status: 503, retry_after_ms: spec.retry_after_ms, delay: latency };
        }
        if spec.flaky_percent > 0 && flaky_roll(&req.event_id, arrival) < spec.flaky_percent {
            rec.fault("flaky_endpoint");
            return Answer { status: 503, retry_after_ms: None, delay: latency };
        }
        if arrival <= spec.fail_first + spec.slow_first {
            rec.fault("slow_endpoint");
            return Answer { status: 200, retry_after_ms: None, delay: self.slow };
        }
        Answer { status: 200, retry_after_ms: None, delay: latency }
    }
}

/// A number in 0..100 fixed by the event and its arrival count.
fn flaky_roll(event_id: &str, arrival: u32) -> u32 {
    (keyorder::routing::key_digest(&format!("{event_id}/{arrival}")) % 100) as u32
}

/// The per-key event number in an event id `key#n`.
fn event_number(event_id: &str) -> Option<u32> {
    event_id.rsplit_once('#').and_then(|(_, n)| n.parse().ok())
}

/// The endpoint host's factory.
pub fn host(
    endpoints: SharedEndpoints,
    rec: SharedRecorder,
) -> impl Fn() -> crate::simulator::HostFuture {
    move || {
        let (endpoints, rec) = (endpoints.clone(), rec.clone());
        Box::pin(async move {
            let listener = Listener::bind(ENDPOINT_PORT)?;
            loop {
                let stream = listener.accept().await?;
                tokio::task::spawn_local(serve(Conn::new(stream), endpoints.clone(), rec.clone()));
            }
        })
    }
}

async fn serve(mut conn: Conn, endpoints: SharedEndpoints, rec: SharedRecorder) {
    while let Ok(Some(req)) = conn.recv::<DeliveryRequest>().await {
        let answer = endpoints.borrow_mut().answer(&req, &rec);
        let outcome = if (200..300).contains(&answer.status) {
            Outcome::Accepted
        } else {
            Outcome::Rejected(format!("HTTP {}", answer.status))
        };
        rec.borrow_mut().arrived(
            req.delivery,
            req.partition,
            req.seq,
            &req.event_id,
            &req.key,
            req.attempt,
            outcome,
        );
        tokio::time::sleep(answer.delay).await;
        let resp =
            DeliveryResponse { status: answer.status, retry_after_ms: answer.retry_after_ms };
        if conn.send(resp).await.is_err() {
            return;
        }
    }
}
