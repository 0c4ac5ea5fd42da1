//! The HTTP deliverer: `POST` each event as its JSON body to an `http://` or `https://`
//! endpoint over one keep-alive HTTP/1.1 connection per leased partition (hyper, rustls).
//!
//! What it guarantees:
//! - **Success is a 2xx** whose reply body was read completely and is at most
//!   [`HttpOptions::max_reply`] bytes. Everything else is a [`DeliverError`] whose text says
//!   what to fix: the status (and `Retry-After`), a redirect's `Location` (redirects are not
//!   followed), the TLS reason, or the `host:port` that could not be reached.
//! - **One connection, reused** while the server keeps it open. A reply with
//!   `Connection: close`, an HTTP/1.0 reply, or a server that closed an idle connection is
//!   noticed before the next request, which opens a new connection at once (never waiting for
//!   a timeout). A request that hyper had not written yet when the connection turned out closed
//!   is resent on a fresh connection.
//! - **Abandoned calls start afresh**: when the worker's delivery timeout drops a call, the
//!   next call discards the half-used connection.
//! - **Headers** identify the event: `X-Keyorder-Event-Id`, `-Key`, `-Seq`, `-Partition`,
//!   `-Attempt`, and the Standard Webhooks `webhook-id` (the event id). With a [`Signing`] key
//!   also `webhook-timestamp` and `webhook-signature` (see [`sign`]); without one, neither.
//!
//! - **The address policy** ([`crate::address_policy`]), when [`HttpOptions::policy`] is set: the host is
//!   resolved once per connection, every address checked, and only a checked address is
//!   connected to; a refusal is [`DeliverError::Refused`], and no connection is made.
//!
//! The worker's delivery timeout bounds a whole call; [`HttpOptions::connect_timeout`] bounds
//! connecting (TCP, then the TLS handshake) separately.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{
    HeaderMap, HeaderValue, CONNECTION, CONTENT_TYPE, HOST, LOCATION, RETRY_AFTER,
};
use hyper::{Method, Request, Version};

use crate::deliver::{Deliver, DeliverError};
use crate::drain::Head;
use crate::ids::PartitionId;

mod conn;
mod connect;
mod routed;
pub mod serve;
pub mod sign;
mod target;
mod tls;

use crate::address_policy::AddressPolicy;
pub use routed::{EndpointDirectory, EndpointSpec, RoutedDeliverer};
pub use sign::{SecretError, Signing, SigningKey, SigningKeys};
pub use target::{Scheme, Target, UrlError};
pub use tls::{TlsConfig, TlsError};

use conn::{Conn, Req};
pub use connect::{Connector, TcpConnector};

/// The default limit of a reply body: 1 MiB.
pub const DEFAULT_MAX_REPLY: usize = 1 << 20;
/// The default connect timeout (TCP and TLS handshake each).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How a [`HttpDeliverer`] connects, signs and reads replies.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// The longest wait for a TCP connection, and again for the TLS handshake.
    pub connect_timeout: Duration,
    /// The largest reply body accepted; a longer one fails the delivery.
    pub max_reply: usize,
    /// The TLS configuration of `https://` targets; `None` trusts the webpki roots only.
    pub tls: Option<TlsConfig>,
    /// The signing keys and clock; `None` sends no `webhook-signature`.
    pub signing: Option<Signing>,
    /// The address policy every connection is checked against (endpoint-table URLs, which a
    /// tenant chose); `None`: every address is trusted (the operator's own `--deliver`).
    pub policy: Option<AddressPolicy>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_reply: DEFAULT_MAX_REPLY,
            tls: None,
            signing: None,
            policy: None,
        }
    }
}

/// What every clone shares.
#[derive(Debug)]
struct Shared {
    target: Target,
    addr: String,
    host: HeaderValue,
    /// `Some` exactly for `https://` targets.
    tls: Option<TlsConfig>,
    options: HttpOptions,
}

/// Delivers over HTTP(S), reaching hosts through the connector `C` (the system's TCP unless
/// the simulation plugs in its network). Each clone (one per leased partition) keeps its own
/// connection and shares the configuration.
#[derive(Debug)]
pub struct HttpDeliverer<C: Connector = TcpConnector> {
    shared: Arc<Shared>,
    connector: C,
    conn: Option<Conn>,
    /// Set during a call: still set at the next call means the last one was abandoned.
    busy: bool,
}

impl HttpDeliverer {
    /// A deliverer to `target` with the default options (webpki roots, no signing).
    pub fn new(target: Target) -> Self {
        Self::with_options(target, HttpOptions::default())
    }

    /// A deliverer to `target` with `options`, over the system's TCP.
    pub fn with_options(target: Target, options: HttpOptions) -> Self {
        Self::with_connector(target, options, TcpConnector)
    }
}

impl<C: Connector> HttpDeliverer<C> {
    /// A deliverer to `target` with `options` that resolves and connects through `connector`.
    pub fn with_connector(target: Target, options: HttpOptions, connector: C) -> Self {
        let addr = target.authority();
        let tls = match target.scheme() {
            Scheme::Http => None,
            Scheme::Https => Some(options.tls.clone().unwrap_or_else(TlsConfig::webpki)),
        };
        let host = header(&addr);
        let shared = Shared { target, addr, host, tls, options };
        Self { shared: Arc::new(shared), connector, conn: None, busy: false }
    }

    /// The target deliveries go to.
    pub fn target(&self) -> &Target {
        &self.shared.target
    }
}

impl<C: Connector> Clone for HttpDeliverer<C> {
    /// A clone shares the configuration and starts without a connection.
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            connector: self.connector.clone(),
            conn: None,
            busy: false,
        }
    }
}

impl<C: Connector> Deliver for HttpDeliverer<C> {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        // A call abandoned by the worker's timeout leaves a half-used connection: start afresh.
        if std::mem::replace(&mut self.busy, true) {
            self.conn = None;
        }
        let result = self.exchange(partition, head, attempt).await;
        self.busy = false;
        result
    }
}

impl<C: Connector> HttpDeliverer<C> {
    async fn exchange(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let request = self.request(partition, head, attempt);
        let (mut conn, reused) = self.connection().await?;
        let reply = match conn.send(request).await {
            Ok(reply) => reply,
            Err(mut e) => match e.take_message() {
                // Not written: the server closed the connection as we sent. Resend once.
                Some(request) => {
                    conn = self.open().await?;
                    conn.send(request).await.map_err(|e| self.failed(e.into_error()))?
                }
                None => {
                    let err = e.into_error();
                    if !(reused && err.is_incomplete_message()) {
                        return Err(self.failed(err));
                    }
                    // A kept connection the server closed just as it was reused, before any
                    // answer: send once more on a fresh one (at-least-once: the receiver may
                    // see the event twice, as after any unanswered attempt).
                    conn = self.open().await?;
                    let again = self.request(partition, head, attempt);
                    conn.send(again).await.map_err(|e| self.failed(e.into_error()))?
                }
            },
        };
        let (parts, mut body) = reply.into_parts();
        let limit = self.shared.options.max_reply;
        let (mut read, mut too_large) = (0usize, false);
        while let Some(frame) = conn.frame(&mut body).await {
            let frame = frame.map_err(|e| self.failed(e))?;
            read += frame.data_ref().map_or(0, Bytes::len);
            if read > limit {
                too_large = true;
                break;
            }
        }
        if !too_large && keeps_alive(parts.version, &parts.headers) {
            self.conn = Some(conn);
        }
        outcome(parts.status.as_u16(), &parts.headers, too_large, limit)
    }

    /// The kept connection if it still takes requests (`true`: reused), else a new one.
    async fn connection(&mut self) -> Result<(Conn, bool), DeliverError> {
        if let Some(mut conn) = self.conn.take() {
            if conn.ready().await {
                return Ok((conn, true));
            }
        }
        Ok((self.open().await?, false))
    }

    async fn open(&self) -> Result<Conn, DeliverError> {
        let s = &self.shared;
        let policy = s.options.policy.as_ref();
        Conn::open(&self.connector, &s.target, s.tls.as_ref(), s.options.connect_timeout, policy)
            .await
    }

    fn failed(&self, source: hyper::Error) -> DeliverError {
        DeliverError::Exchange { addr: self.shared.addr.clone(), source: Box::new(source) }
    }

    fn request(&self, partition: PartitionId, head: &Head, attempt: u32) -> Req {
        let s = &self.shared;
        let body = if head.payload.is_empty() { "null" } else { head.payload.as_str() };
        let event_id = header(&head.event_id);
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(s.target.path_and_query().clone())
            .header(HOST, s.host.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("x-keyorder-event-id", event_id.clone())
            .header("x-keyorder-key", header(&head.key))
            .header("x-keyorder-seq", head.seq.to_string())
            .header("x-keyorder-partition", partition.to_string())
            .header("x-keyorder-attempt", attempt.to_string())
            .header("webhook-id", event_id);
        if let Some(signing) = &s.options.signing {
            let now = (signing.unix_time)();
            let signature = signing.keys.sign(&header_text(&head.event_id), now, body.as_bytes());
            builder = builder
                .header("webhook-timestamp", now.to_string())
                .header("webhook-signature", signature);
        }
        match builder.body(Full::new(Bytes::copy_from_slice(body.as_bytes()))) {
            Ok(request) => request,
            // Every header value is printable ASCII (see `header_text`), the URI was checked.
            Err(e) => unreachable!("the request is well-formed: {e}"),
        }
    }
}

/// Whether the connection may carry another request after this reply.
fn keeps_alive(version: Version, headers: &HeaderMap) -> bool {
    let says = |token: &str| {
        headers.get_all(CONNECTION).iter().any(|v| {
            v.to_str().is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if says("close") {
        return false;
    }
    version != Version::HTTP_10 || says("keep-alive")
}

/// The delivery's result from the reply's status and headers.
fn outcome(
    status: u16,
    headers: &HeaderMap,
    too_large: bool,
    limit: usize,
) -> Result<(), DeliverError> {
    let text = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    match status {
        200..=299 if too_large => Err(DeliverError::ReplyTooLarge { status, limit }),
        200..=299 => Ok(()),
        300..=399 => {
            Err(DeliverError::Redirect { status, location: text(LOCATION).map(str::to_owned) })
        }
        _ => {
            let retry_after =
                text(RETRY_AFTER).and_then(|v| v.trim().parse().ok()).map(Duration::from_secs);
            Err(DeliverError::Status { status, retry_after })
        }
    }
}

/// A header value made safe: printable ASCII kept, anything else percent-encoded.
fn header_text(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if (0x20..0x7f).contains(&b) && b != b'%' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn header(text: &str) -> HeaderValue {
    match HeaderValue::try_from(header_text(text)) {
        Ok(v) => v,
        Err(e) => unreachable!("printable ASCII is a valid header value: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_ascii() {
        assert_eq!(header_text("sub_é\r\n"), "sub_%C3%A9%0D%0A");
    }

    #[test]
    fn keep_alive_follows_version_and_connection() {
        let mut h = HeaderMap::new();
        assert!(keeps_alive(Version::HTTP_11, &h));
        assert!(!keeps_alive(Version::HTTP_10, &h));
        h.insert(CONNECTION, HeaderValue::from_static("Keep-Alive"));
        assert!(keeps_alive(Version::HTTP_10, &h));
        h.insert(CONNECTION, HeaderValue::from_static("foo, close"));
        assert!(!keeps_alive(Version::HTTP_11, &h));
    }

    #[test]
    fn outcomes_name_status_location_and_retry_after() {
        let mut h = HeaderMap::new();
        assert!(outcome(204, &h, false, 10).is_ok());
        let big = outcome(200, &h, true, 1 << 20).unwrap_err();
        assert_eq!(big.to_string(), "HTTP 200 reply larger than 1 MiB (the limit)");
        h.insert(LOCATION, HeaderValue::from_static("https://new.example/hook"));
        h.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        let moved = outcome(301, &h, false, 10).unwrap_err().to_string();
        assert!(
            moved.contains("HTTP 301") && moved.contains("https://new.example/hook"),
            "{moved}"
        );
        let busy = outcome(503, &h, false, 10).unwrap_err();
        assert_eq!(busy.retry_after(), Some(Duration::from_secs(7)));
        assert!(!busy.may_be_processing());
    }
}
