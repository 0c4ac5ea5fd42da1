//! A test HTTP endpoint on loopback that records every delivery (with headers) and answers as
//! told: 200, or 500 for poison events.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

#[derive(Clone, Debug)]
pub struct Arrival {
    pub event_id: String,
    pub key: String,
    pub seq: i64,
    pub partition: u16,
    pub attempt: u32,
    pub at: Duration,
    pub done: Duration,
    pub accepted: bool,
}

#[derive(Default)]
pub struct Shared {
    pub arrivals: Vec<Arrival>,
    pub poison: BTreeSet<String>,
    pub latency: Duration,
    /// Connections accepted.
    pub connections: usize,
}

pub struct Endpoint {
    pub url: String,
    pub shared: Arc<Mutex<Shared>>,
}

impl Endpoint {
    /// Serves on its own thread and runtime until the process ends.
    pub fn start(epoch: Instant) -> Endpoint {
        Self::start_at("127.0.0.1:0", epoch)
    }

    /// Serves on `bind` (a loopback address, e.g. `[::1]:0`), as [`Endpoint::start`].
    pub fn start_at(bind: &str, epoch: Instant) -> Endpoint {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let listener = std::net::TcpListener::bind(bind).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let s = shared.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    let Ok((stream, _)) = listener.accept().await else { continue };
                    s.lock().unwrap().connections += 1;
                    tokio::spawn(serve(stream, s.clone(), epoch));
                }
            });
        });
        Endpoint { url, shared }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.lock().unwrap().connections
    }

    pub fn arrivals(&self) -> Vec<Arrival> {
        self.shared.lock().unwrap().arrivals.clone()
    }
}

#[allow(clippy::disallowed_methods)] // a real endpoint's clock: the test measures wall time
fn now(epoch: Instant) -> Duration {
    Instant::now().duration_since(epoch)
}

async fn serve(stream: tokio::net::TcpStream, shared: Arc<Mutex<Shared>>, epoch: Instant) {
    let mut conn = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let (mut len, mut a) = (
            0usize,
            Arrival {
                event_id: String::new(),
                key: String::new(),
                seq: 0,
                partition: 0,
                attempt: 0,
                at: now(epoch),
                done: Duration::ZERO,
                accepted: true,
            },
        );
        loop {
            line.clear();
            if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                return;
            }
            let h = line.trim_end();
            if h.is_empty() {
                break;
            }
            let Some((name, value)) = h.split_once(':') else { continue };
            let value = value.trim().to_owned();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => len = value.parse().unwrap_or(0),
                "x-keyorder-event-id" => a.event_id = value,
                "x-keyorder-key" => a.key = value,
                "x-keyorder-seq" => a.seq = value.parse().unwrap_or(0),
                "x-keyorder-partition" => a.partition = value.parse().unwrap_or(0),
                "x-keyorder-attempt" => a.attempt = value.parse().unwrap_or(0),
                _ => {}
            }
        }
        let mut body = vec![0u8; len];
        if conn.read_exact(&mut body).await.is_err() {
            return;
        }
        let (poison, latency) = {
            let s = shared.lock().unwrap();
            (s.poison.contains(&a.event_id), s.latency)
        };
        a.accepted = !poison;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let status = if poison { "500 Internal Server Error" } else { "200 OK" };
        let response = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
        let ok = conn.get_mut().write_all(response.as_bytes()).await.is_ok();
        a.done = now(epoch);
        shared.lock().unwrap().arrivals.push(a);
        if !ok {
            return;
        }
    }
}
