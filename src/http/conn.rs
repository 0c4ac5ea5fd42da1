//! One HTTP/1.1 connection (plain or TLS) and its hyper driver, polled by the delivering task
//! itself: no spawned task, so nothing outlives the deliverer and no `LocalSet` is needed.

use std::future::{poll_fn, Future};
use std::net::{IpAddr, SocketAddr};
use std::pin::{pin, Pin};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::{http1, TrySendError};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::connect::Connector;
use super::target::Target;
use super::tls::TlsConfig;
use crate::address_policy::{AddressPolicy, Verdict};
use crate::deliver::DeliverError;

/// The connection's state machine; it must be polled for the request and reply to progress.
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>>>>;

/// A request as the connection sends it.
pub(super) type Req = Request<Full<Bytes>>;

/// An open connection: the request sender and, until the connection ends, its driver.
pub(super) struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    driver: Option<Driver>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("open", &self.driver.is_some()).finish()
    }
}

impl Conn {
    /// Connects to `target` through `connector` (TCP with `TCP_NODELAY` in production, then TLS
    /// when `tls` is given) within
    /// `timeout` for each step, and waits until the connection takes a request.
    ///
    /// With a `policy`, the host is resolved once, every address it resolved to is checked,
    /// and only those checked addresses are connected to (never the name again, so a DNS
    /// answer that changes in between cannot slip past): one refused address refuses the
    /// connection, since which address a name yields is up to whoever controls its DNS.
    pub(super) async fn open<C: Connector>(
        connector: &C,
        target: &Target,
        tls: Option<&TlsConfig>,
        timeout: Duration,
        policy: Option<&AddressPolicy>,
    ) -> Result<Conn, DeliverError> {
        let addr = target.authority();
        let timed_out = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no {what} within {timeout:?} (the connect timeout)"),
            )
        };
        let connect_err = |source| DeliverError::Connect { addr: addr.clone(), source };
        let addresses = tokio::time::timeout(timeout, resolve(connector, target))
            .await
            .map_err(|_| timed_out("DNS answer"))
            .and_then(|r| r)
            .map_err(connect_err)?;
        if let Some(policy) = policy {
            for a in &addresses {
                if let Verdict::Refused { rule } = policy.check(a.ip()) {
                    return Err(DeliverError::Refused { addr, ip: a.ip(), rule });
                }
            }
        }
        let tcp = tokio::time::timeout(timeout, connect_any(connector, &addresses))
            .await
            .map_err(|_| timed_out("connection"))
            .and_then(|r| r)
            .map_err(connect_err)?;
        let handshake = match tls {
            None => http1::handshake(TokioIo::new(tcp)).await.map(boxed),
            Some(config) => {
                let tls_err = |source| DeliverError::Tls { addr: addr.clone(), source };
                let name = ServerName::try_from(target.host().to_owned()).map_err(|e| {
                    tls_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
                })?;
                let connector = TlsConnector::from(config.0.clone());
                let stream = tokio::time::timeout(timeout, connector.connect(name, tcp))
                    .await
                    .map_err(|_| timed_out("TLS handshake"))
                    .and_then(|r| r)
                    .map_err(tls_err)?;
                http1::handshake(TokioIo::new(stream)).await.map(boxed)
            }
        };
        let (sender, driver) = handshake.map_err(|source| DeliverError::Exchange {
            addr: addr.clone(),
            source: Box::new(source),
        })?;
        let mut conn = Conn { sender, driver: Some(driver) };
        if conn.ready().await {
            Ok(conn)
        } else {
            let source = std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the server closed the connection before a request was sent",
            );
            Err(DeliverError::Connect { addr, source })
        }
    }

    /// Whether the connection can take another request; `false` once the server closed it
    /// (`Connection: close`, an HTTP/1.0 reply, an idle timeout), found without waiting.
    pub(super) async fn ready(&mut self) -> bool {
        if self.driver.is_none() || self.sender.is_closed() {
            return false;
        }
        let sender = &mut self.sender;
        drive(&mut self.driver, poll_fn(|cx| sender.poll_ready(cx))).await.is_ok()
    }

    /// Sends `request` and waits for the reply's head. A request that was not written comes
    /// back in the error.
    pub(super) async fn send(
        &mut self,
        request: Req,
    ) -> Result<Response<Incoming>, TrySendError<Req>> {
        let reply = self.sender.try_send_request(request);
        drive(&mut self.driver, reply).await
    }

    /// The next frame of `body`.
    pub(super) async fn frame(
        &mut self,
        body: &mut Incoming,
    ) -> Option<Result<Frame<Bytes>, hyper::Error>> {
        drive(&mut self.driver, body.frame()).await
    }
}

/// Every address of `target`'s host: the address itself, or what the resolver answers for the
/// name. An IPv4-mapped IPv6 address is connected to as the IPv4 address it is.
async fn resolve<C: Connector>(connector: &C, target: &Target) -> std::io::Result<Vec<SocketAddr>> {
    let mut addresses: Vec<SocketAddr> = match target.ip() {
        Some(ip) => vec![SocketAddr::new(ip, target.port())],
        None => connector.resolve(target.host(), target.port()).await?,
    };
    for a in &mut addresses {
        if let IpAddr::V6(v6) = a.ip() {
            if let Some(v4) = v6.to_ipv4_mapped() {
                a.set_ip(IpAddr::V4(v4));
            }
        }
    }
    if addresses.is_empty() {
        let e = format!("{} resolved to no address", target.host());
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, e));
    }
    Ok(addresses)
}

/// A connection to the first of `addresses` that accepts one, tried in order (as the resolver
/// ordered them); the last error if none does.
async fn connect_any<C: Connector>(
    connector: &C,
    addresses: &[SocketAddr],
) -> std::io::Result<C::Stream> {
    let mut last = None;
    for a in addresses {
        match connector.connect(*a).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no address to connect to")))
}

fn boxed<T>(
    (sender, conn): (http1::SendRequest<Full<Bytes>>, http1::Connection<T, Full<Bytes>>),
) -> (http1::SendRequest<Full<Bytes>>, Driver)
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
{
    (sender, Box::pin(conn))
}

/// Polls `fut` to completion while driving the connection. The driver is polled first, so a
/// reply it reads is seen by `fut` in the same wake-up. Once the driver has finished (the
/// connection closed), hyper has failed or completed everything in flight, so `fut` ends.
async fn drive<T>(driver: &mut Option<Driver>, fut: impl Future<Output = T>) -> T {
    let mut fut = pin!(fut);
    poll_fn(|cx| {
        if let Some(d) = driver {
            if d.as_mut().poll(cx).is_ready() {
                *driver = None;
            }
        }
        fut.as_mut().poll(cx)
    })
    .await
}
