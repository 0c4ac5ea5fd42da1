//! Test servers: a raw TCP server that answers each request with canned bytes (to produce
//! exactly the framing under test), and a hyper server that records requests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::http::{HttpDeliverer, HttpOptions, Target};
use keyorder::{PartitionId, Seq};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// Generous bound on one test delivery, so a regression fails instead of hanging.
pub const GUARD: Duration = Duration::from_secs(10);

/// How a raw connection answers.
#[derive(Clone)]
pub struct Canned {
    /// The bytes written after each request.
    pub reply: Vec<u8>,
    /// Close the connection after the first reply.
    pub close: bool,
}

impl Canned {
    pub fn new(reply: impl Into<Vec<u8>>, close: bool) -> Self {
        Self { reply: reply.into(), close }
    }
}

/// Counts of what a server saw.
#[derive(Clone, Default)]
pub struct Counts {
    pub connections: Arc<AtomicUsize>,
    pub requests: Arc<AtomicUsize>,
}

impl Counts {
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// A raw server: connection `i` answers with `plan[min(i, last)]`.
pub async fn raw(plan: Vec<Canned>) -> (SocketAddr, Counts) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Counts::default();
    let c = counts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let i = c.connections.fetch_add(1, Ordering::SeqCst);
            let canned = plan[i.min(plan.len() - 1)].clone();
            let requests = c.requests.clone();
            tokio::spawn(serve_raw(stream, canned, requests));
        }
    });
    (addr, counts)
}

async fn serve_raw<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    canned: Canned,
    requests: Arc<AtomicUsize>,
) {
    while read_request(&mut stream).await.is_some() {
        requests.fetch_add(1, Ordering::SeqCst);
        if stream.write_all(&canned.reply).await.is_err() {
            return;
        }
        if canned.close {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// Reads one request (head and `Content-Length` body); `None` at end of stream.
async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(body)
}

/// A request as a hyper server saw it.
#[derive(Clone, Debug)]
pub struct Captured {
    pub headers: hyper::HeaderMap,
    pub path: String,
    pub body: Bytes,
}

/// How the hyper server answers: status and extra headers.
pub type Answer = fn(&Captured) -> (u16, Vec<(&'static str, &'static str)>);

/// A hyper HTTP/1.1 keep-alive server answering with `answer`, recording every request.
pub async fn hyper_server(answer: Answer) -> (SocketAddr, Counts, Arc<Mutex<Vec<Captured>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Counts::default();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (c, s) = (counts.clone(), seen.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            c.connections.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve_hyper(TokioIo::new(stream), answer, c.clone(), s.clone()));
        }
    });
    (addr, counts, seen)
}

pub async fn serve_hyper<I>(io: I, answer: Answer, counts: Counts, seen: Arc<Mutex<Vec<Captured>>>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
{
    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
        let (counts, seen) = (counts.clone(), seen.clone());
        async move {
            let path = req.uri().to_string();
            let (parts, body) = req.into_parts();
            let body = body.collect().await?.to_bytes();
            let captured = Captured { headers: parts.headers, path, body };
            counts.requests.fetch_add(1, Ordering::SeqCst);
            let (status, headers) = answer(&captured);
            seen.lock().unwrap().push(captured);
            let mut reply = Response::builder().status(status);
            for (name, value) in headers {
                reply = reply.header(name, value);
            }
            Ok::<_, hyper::Error>(reply.body(Full::new(Bytes::new())).unwrap())
        }
    });
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
}

/// The head delivered in these tests.
pub fn head(n: i64) -> Head {
    Head {
        seq: Seq(n),
        event_id: format!("evt-{n}"),
        key: "sub_1".into(),
        payload: format!(r#"{{"n": {n}}}"#),
        attempts: 0,
        not_before: None,
        last_error: None,
    }
}

pub fn deliverer(url: &str, options: HttpOptions) -> HttpDeliverer {
    HttpDeliverer::with_options(Target::parse(url).unwrap(), options)
}

/// One delivery of `head(n)`, bounded by [`GUARD`].
pub async fn deliver(d: &mut HttpDeliverer, n: i64) -> Result<(), DeliverError> {
    tokio::time::timeout(GUARD, d.deliver(PartitionId(3), &head(n), 1))
        .await
        .expect("the delivery ended within the guard")
}
