//! The endpoint host: an HTTP/1.1 server (hyper's, over turmoil-net's TCP) that records every
//! request it takes with the simulated time, then answers as the key's [`EndpointSpec`] says:
//! fast, slow, failing, poison, or with a fault only a wire has (a reply cut off half-way, a
//! kept connection closed just as it is reused, a peer gone silent, a slow reply body). One
//! host serves every key. The worker reaches it only through production's `HttpDeliverer`.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderMap, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use keyorder::check::Outcome;
use keyorder::{PartitionId, Seq};
use tokio::sync::Notify;
use turmoil_net::shim::tokio::net::TcpStream;

use super::deliverer::sim_keys;
use crate::protocol::ENDPOINT_PORT;
use crate::scenario::EndpointSpec;
use crate::trace::{DeliveryTag, SharedRecorder};

/// Endpoint behaviour per key plus arrival counts per event (outside the factory).
#[derive(Debug, Default)]
pub struct Endpoints {
    specs: BTreeMap<String, EndpointSpec>,
    arrivals: BTreeMap<String, u32>,
    /// Requests of each event turned away by a connection closed as it was reused.
    closed_on_reuse: BTreeMap<String, u32>,
    /// How long a "slow" answer takes: beyond the workers' delivery timeout.
    slow: Duration,
}

/// Shared endpoint state.
pub type SharedEndpoints = Rc<RefCell<Endpoints>>;

/// How the reply goes out on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    /// Whole, after the answer's delay.
    Whole,
    /// The head and half the body, then the connection closes.
    Cut,
    /// Never: the peer keeps the connection open and says nothing more.
    Silent,
    /// The head at once, the body's end only after the answer's delay.
    SlowBody,
}

/// An endpoint's decision for one arrival.
struct Answer {
    status: u16,
    retry_after_ms: Option<u64>,
    delay: Duration,
    wire: Wire,
}

impl Endpoints {
    /// Endpoints for `specs` (key → behaviour); slow answers take `slow`.
    pub fn new(specs: BTreeMap<String, EndpointSpec>, slow: Duration) -> SharedEndpoints {
        Rc::new(RefCell::new(Endpoints { specs, slow, ..Default::default() }))
    }

    /// Whether a request of `event_id` that came on a reused connection finds the connection
    /// closed by the server instead (the key's `close_on_reuse_first`).
    fn closes_on_reuse(&mut self, key: &str, event_id: &str, rec: &SharedRecorder) -> bool {
        let limit = self.specs.get(key).map_or(0, |s| s.close_on_reuse_first);
        if limit == 0 {
            return false;
        }
        let n = self.closed_on_reuse.entry(event_id.to_owned()).or_default();
        if *n >= limit {
            return false;
        }
        *n += 1;
        rec.borrow_mut().fault("close_on_reuse");
        true
    }

    fn answer(&mut self, key: &str, event_id: &str, rec: &SharedRecorder) -> Answer {
        let spec = self.specs.get(key).cloned().unwrap_or_default();
        let n = self.arrivals.entry(event_id.to_owned()).or_default();
        *n += 1;
        let arrival = *n;
        let number = event_number(event_id);
        let latency = Duration::from_millis(spec.latency_ms);
        let mut rec = rec.borrow_mut();
        let plain =
            |status| Answer { status, retry_after_ms: None, delay: latency, wire: Wire::Whole };
        if number.is_some_and(|k| spec.poison.contains(&k)) {
            rec.fault("poison_endpoint");
            return plain(500);
        }
        if arrival <= spec.fail_first {
            rec.fault("failing_endpoint");
            return Answer { retry_after_ms: spec.retry_after_ms, ..plain(503) };
        }
        if spec.flaky_percent > 0 && flaky_roll(event_id, arrival) < spec.flaky_percent {
            rec.fault("flaky_endpoint");
            return plain(503);
        }
        let mut past = spec.fail_first;
        if arrival <= past + spec.slow_first {
            rec.fault("slow_endpoint");
            return Answer { delay: self.slow, ..plain(200) };
        }
        past += spec.slow_first;
        let wire_faults = [
            (spec.cut_reply_first, Wire::Cut, "reply_cut"),
            (spec.silent_first, Wire::Silent, "half_open"),
            (spec.slow_body_first, Wire::SlowBody, "slow_body"),
        ];
        for (first, wire, kind) in wire_faults {
            if arrival <= past + first {
                rec.fault(kind);
                let delay = if wire == Wire::SlowBody { self.slow } else { latency };
                return Answer { delay, wire, ..plain(200) };
            }
            past += first;
        }
        plain(200)
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
    let held = super::HeldListener::default();
    move || {
        let (endpoints, rec, held) = (endpoints.clone(), rec.clone(), held.clone());
        Box::pin(async move {
            let listener = held.get(ENDPOINT_PORT).await?;
            loop {
                let (stream, _) = listener.accept().await?;
                tokio::task::spawn_local(serve(stream, endpoints.clone(), rec.clone()));
            }
        })
    }
}

/// What a connection's requests share: how many it has served, and the signal that closes it.
#[derive(Default)]
struct ConnState {
    served: Cell<u32>,
    close: Notify,
}

/// Serves one connection with keep-alive until the client closes it or a fault closes it.
async fn serve(stream: TcpStream, endpoints: SharedEndpoints, rec: SharedRecorder) {
    let state = Rc::new(ConnState::default());
    let conn_state = state.clone();
    let service = service_fn(move |req| {
        let (endpoints, rec, state) = (endpoints.clone(), rec.clone(), conn_state.clone());
        async move { Ok::<_, Infallible>(respond(req, &endpoints, &rec, &state).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        biased;
        () = state.close.notified() => {}
        _ = conn => {}
    }
}

/// The event a request carries, from the deliverer's headers and the recorder's body tag.
struct Carried {
    event_id: String,
    key: String,
    seq: Seq,
    partition: PartitionId,
    attempt: u32,
    tag: DeliveryTag,
}

/// The event a request carries, if it came from production's `HttpDeliverer` as the
/// simulation configures it: its headers, and a Standard Webhooks signature that verifies.
fn carried(headers: &HeaderMap, body: &[u8]) -> Result<Carried, &'static str> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(timestamp), Some(signature)) =
        (text("webhook-id"), text("webhook-timestamp"), text("webhook-signature"))
    else {
        return Err("no webhook-id, webhook-timestamp and webhook-signature headers");
    };
    let timestamp = timestamp.parse().map_err(|_| "a webhook-timestamp that is not a number")?;
    if sim_keys().sign(id, timestamp, body) != signature {
        return Err("a webhook-signature that does not verify");
    }
    fields(headers, body).ok_or("no x-keyorder-* headers or no delivery tag in the body")
}

fn fields(headers: &HeaderMap, body: &[u8]) -> Option<Carried> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    Some(Carried {
        event_id: text("x-keyorder-event-id")?.to_owned(),
        key: text("x-keyorder-key")?.to_owned(),
        seq: Seq(text("x-keyorder-seq")?.parse().ok()?),
        partition: PartitionId(text("x-keyorder-partition")?.parse().ok()?),
        attempt: text("x-keyorder-attempt")?.parse().ok()?,
        tag: serde_json::from_slice(body).ok()?,
    })
}

async fn respond(
    req: Request<Incoming>,
    endpoints: &SharedEndpoints,
    rec: &SharedRecorder,
    state: &ConnState,
) -> Response<Reply> {
    let reused = state.served.get() > 0;
    state.served.set(state.served.get() + 1);
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return std::future::pending().await,
    };
    let c = match carried(&parts.headers, &body) {
        Ok(c) => c,
        Err(why) => {
            crate::simulator::fail(format!(
                "the endpoint was reached other than through HttpDeliverer: {why}"
            ));
            return reply(400, None, Reply::whole());
        }
    };
    if reused && endpoints.borrow_mut().closes_on_reuse(&c.key, &c.event_id, rec) {
        // As if an idle timeout closed the connection just as the request came in: nothing
        // was processed, and the client sees the connection end before any answer.
        state.close.notify_one();
        return std::future::pending().await;
    }
    let answer = endpoints.borrow_mut().answer(&c.key, &c.event_id, rec);
    if answer.wire == Wire::Silent {
        // The peer goes quiet with the connection open: no answer, no close.
        return std::future::pending().await;
    }
    let outcome = if (200..300).contains(&answer.status) {
        Outcome::Accepted
    } else {
        Outcome::Rejected(format!("HTTP {}", answer.status))
    };
    rec.borrow_mut().arrived(
        c.tag.delivery,
        c.partition,
        c.seq,
        &c.event_id,
        &c.key,
        c.attempt,
        outcome,
    );
    let body = match answer.wire {
        Wire::Cut => Reply { stage: Stage::Cut, sleep: None },
        Wire::SlowBody => Reply { stage: Stage::Slow(answer.delay), sleep: None },
        Wire::Whole | Wire::Silent => {
            tokio::time::sleep(answer.delay).await;
            Reply::whole()
        }
    };
    reply(answer.status, answer.retry_after_ms, body)
}

fn reply(status: u16, retry_after_ms: Option<u64>, body: Reply) -> Response<Reply> {
    let mut builder = Response::builder().status(status);
    if let Some(ms) = retry_after_ms {
        // HTTP counts Retry-After in whole seconds.
        builder = builder.header(RETRY_AFTER, ms.div_ceil(1000).to_string());
    }
    builder.body(body).unwrap_or_else(|_| Response::new(Reply::whole()))
}

/// A reply body as the endpoint's wire fault sends it.
struct Reply {
    stage: Stage,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

enum Stage {
    /// The whole body, then the end.
    Whole,
    /// Half a body, then an error: hyper closes the connection mid-reply.
    Cut,
    /// Half a body at once, the rest after the delay.
    Slow(Duration),
    /// Half sent, the rest waits for the sleep.
    Rest,
    /// Half sent, the next poll fails.
    Fail,
    Done,
}

const REPLY: &[u8] = b"{\"ok\":true}";

impl Reply {
    fn whole() -> Self {
        Reply { stage: Stage::Whole, sleep: None }
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let half = Bytes::from_static(&REPLY[..REPLY.len() / 2]);
        let rest = Bytes::from_static(&REPLY[REPLY.len() / 2..]);
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Whole => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(REPLY))))),
            Stage::Cut => {
                self.stage = Stage::Fail;
                Poll::Ready(Some(Ok(Frame::data(half))))
            }
            Stage::Fail => Poll::Ready(Some(Err(std::io::Error::other("reply cut off")))),
            Stage::Slow(delay) => {
                self.sleep = Some(Box::pin(tokio::time::sleep(delay)));
                self.stage = Stage::Rest;
                Poll::Ready(Some(Ok(Frame::data(half))))
            }
            Stage::Rest => {
                let sleep = self.sleep.as_mut().expect("set with Stage::Rest");
                if sleep.as_mut().poll(cx).is_pending() {
                    self.stage = Stage::Rest;
                    return Poll::Pending;
                }
                Poll::Ready(Some(Ok(Frame::data(rest))))
            }
            Stage::Done => Poll::Ready(None),
        }
    }

    /// A whole reply's exact length, so that hyper sends it with a `Content-Length` in the
    /// same write as the head; a faulty one's is left open (chunked).
    fn size_hint(&self) -> hyper::body::SizeHint {
        match self.stage {
            Stage::Whole => hyper::body::SizeHint::with_exact(REPLY.len() as u64),
            Stage::Done => hyper::body::SizeHint::with_exact(0),
            _ => hyper::body::SizeHint::default(),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.stage, Stage::Done)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use keyorder::deliver::Deliver;
    use keyorder::drain::Head;
    use keyorder::{PartitionId, Seq};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use turmoil_net::shim::tokio::net::TcpStream;

    use super::{host, Endpoints};
    use crate::hosts::deliverer::{http_deliverer, Recorded};
    use crate::simulator::Builder;
    use crate::trace::Recorder;

    fn head() -> Head {
        Head {
            seq: Seq(1),
            event_id: "sub_a#0".into(),
            key: "sub_a".into(),
            payload: String::new(),
            attempts: 0,
            not_before: None,
            last_error: None,
        }
    }

    #[test]
    fn a_delivery_through_the_http_deliverer_is_taken_and_recorded() {
        let rec = std::rc::Rc::new(std::cell::RefCell::new(Recorder::default()));
        let mut sim = Builder::new(1).build();
        sim.host("endpoint", host(Endpoints::new(Default::default(), ms(100)), rec.clone()));
        let worker_rec = rec.clone();
        let client = async move {
            let http = http_deliverer(ms(100));
            let mut deliver = Recorded::new(http, "w0".into(), worker_rec);
            deliver.deliver(PartitionId(3), &head(), 1).await?;
            Ok(())
        };
        sim.run_client("worker", client, ms(1_000)).expect("delivered");
        let history = &rec.borrow().history;
        assert_eq!(history.deliveries.len(), 1, "the endpoint recorded the arrival");
        assert_eq!(history.deliveries[0].worker, "w0");
        assert_eq!(history.deliveries[0].partition, PartitionId(3));
    }

    #[test]
    fn a_request_from_anything_but_the_http_deliverer_fails_the_run() {
        let rec = std::rc::Rc::new(std::cell::RefCell::new(Recorder::default()));
        let mut sim = Builder::new(1).build();
        sim.host("endpoint", host(Endpoints::new(Default::default(), ms(100)), rec.clone()));
        let client = async move {
            let mut tcp = TcpStream::connect(("endpoint", crate::protocol::ENDPOINT_PORT)).await?;
            // Every header the deliverer sends, but a signature made without the key.
            let request = "POST /hook HTTP/1.1\r\nhost: endpoint\r\nx-keyorder-event-id: sub_a#0\r\n\
                           webhook-id: sub_a#0\r\nwebhook-timestamp: 1800000000\r\n\
                           webhook-signature: v1,Zm9yZ2Vk\r\n\
                           x-keyorder-key: sub_a\r\nx-keyorder-seq: 1\r\nx-keyorder-partition: 3\r\n\
                           x-keyorder-attempt: 1\r\ncontent-length: 14\r\n\r\n{\"delivery\":1}";
            tcp.write_all(request.as_bytes()).await?;
            let mut answer = Vec::new();
            tcp.read_to_end(&mut answer).await?;
            Ok(())
        };
        let err = sim.run_client("impostor", client, ms(1_000)).expect_err("the run fails");
        assert!(err.contains("reached other than through HttpDeliverer"), "{err}");
        assert!(rec.borrow().history.deliveries.is_empty(), "nothing was recorded");
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
}
