//! The worker's deliverer in the simulation: production's [`HttpDeliverer`] itself, reaching
//! the endpoint host through turmoil-net ([`SimConnector`]), wrapped by the recorder
//! ([`Recorded`]) and, in the two broken designs that live on the delivery path, by
//! [`BrokenDelivery`].

use std::rc::Rc;
use std::time::Duration;

use keyorder::address_policy::{AddressPolicy, Cidr};
use keyorder::deliver::{Deliver, DeliverError};
use keyorder::drain::Head;
use keyorder::http::{Connector, HttpDeliverer, HttpOptions, Signing, SigningKeys, Target};
use keyorder::PartitionId;
use turmoil_net::shim::tokio::net::TcpStream;

use crate::protocol::ENDPOINT_PORT;
use crate::trace::{DeliveryTag, SharedRecorder};

/// The subnet turmoil-net gives simulated hosts, allowed by the simulation's address policy
/// as an operator allows a private network (`--allow-endpoint-network`).
pub const SIM_SUBNET: &str = "192.168.0.0/16";

/// The signing secret every simulated delivery is signed with (Standard Webhooks' `whsec_`).
pub const SIM_SECRET: &str = "whsec_c2ltdWxhdGlvbi1zaWduaW5nLWtleQ==";

/// turmoil-net's name table and sockets, for the current simulated host.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimConnector;

impl Connector for SimConnector {
    type Stream = TcpStream;

    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<std::net::SocketAddr>> {
        match turmoil_net::lookup_host(host) {
            Some(ip) => Ok(vec![std::net::SocketAddr::new(ip, port)]),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no simulated host is named {host}"),
            )),
        }
    }

    async fn connect(&self, addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Ok(tcp)
    }
}

/// Unix time in the simulation: a fixed epoch plus simulated time, for signatures.
pub fn sim_unix_time() -> u64 {
    1_800_000_000 + crate::simulator::elapsed().as_secs()
}

/// The signing keys of [`SIM_SECRET`].
pub fn sim_keys() -> SigningKeys {
    SigningKeys::from_lines(SIM_SECRET).expect("the simulation's secret is well-formed")
}

/// Production's deliverer to the endpoint host, as an operator configures it: signing on, the
/// address policy on with the simulation's subnet allowed, the connect timeout given.
pub fn http_deliverer(connect_timeout: Duration) -> HttpDeliverer<SimConnector> {
    let target = Target::parse(&format!("http://endpoint:{ENDPOINT_PORT}/hook"))
        .expect("the endpoint's URL is well-formed");
    let subnet: Cidr = SIM_SUBNET.parse().expect("the simulation's subnet is well-formed");
    let options = HttpOptions {
        connect_timeout,
        signing: Some(Signing { keys: sim_keys(), unix_time: sim_unix_time }),
        policy: Some(AddressPolicy::new(vec![subnet])),
        ..HttpOptions::default()
    };
    HttpDeliverer::with_connector(target, options, SimConnector)
}

/// Records each delivery's start and end in the run's history, and tags its body with the
/// recorder's delivery id so that the endpoint's arrival is matched to it.
#[derive(Clone)]
pub struct Recorded<D> {
    inner: D,
    worker: Rc<str>,
    rec: SharedRecorder,
}

impl<D> Recorded<D> {
    /// Records `inner`'s deliveries as worker `worker`'s.
    pub fn new(inner: D, worker: Rc<str>, rec: SharedRecorder) -> Self {
        Self { inner, worker, rec }
    }
}

/// Records the end of a delivery when dropped: on an answer, a timeout or a crash alike.
struct Finish {
    id: u64,
    rec: SharedRecorder,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.rec.borrow_mut().finish_delivery(self.id);
    }
}

impl<D: Deliver> Deliver for Recorded<D> {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let id = self.rec.borrow_mut().start_delivery(&self.worker);
        let _finish = Finish { id, rec: self.rec.clone() };
        let mut tagged = head.clone();
        tagged.payload = serde_json::to_string(&DeliveryTag { delivery: id })
            .expect("a delivery tag serialises");
        self.inner.deliver(partition, &tagged, attempt).await
    }
}

/// The broken designs that live on the delivery path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryBreak {
    /// `parallel-in-partition`: success as soon as the call is under way; the call goes on in
    /// the background while the next event goes out.
    Parallel,
    /// `timeout-leaves-call-running`: the deliverer's own timeout gives up on a call after
    /// `after`, reports it as never sent (so the lease is handed back clean and the head is
    /// retried at once), and leaves the call running on its connection.
    LeavesCallRunning {
        /// The deliverer's own timeout, shorter than the worker's.
        after: Duration,
    },
    /// `local-batch`: up to `width` calls run at once; a call reports success as soon as it
    /// is under way, and waits only while the batch is full.
    LocalBatch {
        /// Calls in flight at most.
        width: usize,
    },
}

/// The longest a call left running in the background may take before it is dropped (a silent
/// peer would hold it forever).
const BACKGROUND_LIMIT: Duration = Duration::from_secs(60);

/// A deliverer with one of the broken designs of [`DeliveryBreak`], or none.
pub struct BrokenDelivery<D> {
    inner: D,
    design: Option<DeliveryBreak>,
    /// `local-batch`: the calls under way, oldest first.
    batch: std::collections::VecDeque<tokio::task::JoinHandle<()>>,
}

impl<D: Clone> Clone for BrokenDelivery<D> {
    /// A clone (a partition's own) starts with no call under way.
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), design: self.design, batch: Default::default() }
    }
}

impl<D> BrokenDelivery<D> {
    /// `inner`, broken as `design` says (`None`: unchanged).
    pub fn new(inner: D, design: Option<DeliveryBreak>) -> Self {
        Self { inner, design, batch: Default::default() }
    }
}

impl<D: Deliver> Deliver for BrokenDelivery<D> {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let Some(design) = self.design else {
            return self.inner.deliver(partition, head, attempt).await;
        };
        // A clone per call: its own connection, driven by a task of its own.
        let mut call = self.inner.clone();
        let head = head.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::task::spawn_local(async move {
            let call =
                tokio::time::timeout(BACKGROUND_LIMIT, call.deliver(partition, &head, attempt));
            if let Ok(result) = call.await {
                let _ = tx.send(result);
            }
        });
        match design {
            DeliveryBreak::Parallel => Ok(()),
            DeliveryBreak::LocalBatch { width } => {
                self.batch.retain(|t| !t.is_finished());
                self.batch.push_back(task);
                while self.batch.len() >= width {
                    if let Some(oldest) = self.batch.pop_front() {
                        let _ = oldest.await;
                    }
                }
                Ok(())
            }
            DeliveryBreak::LeavesCallRunning { after } => {
                match tokio::time::timeout(after, rx).await {
                    Ok(Ok(result)) => result,
                    Ok(Err(_)) => Err(DeliverError::Io(std::io::ErrorKind::Interrupted.into())),
                    Err(_) => Err(DeliverError::Connect {
                        addr: format!("endpoint:{ENDPOINT_PORT}"),
                        source: std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "given up on (the call goes on)",
                        ),
                    }),
                }
            }
        }
    }
}
