//! The endpoint boundary: deliver one event, learn whether the endpoint accepted it.

// See `store`: the worker's futures need no `Send` bound.
#![allow(async_fn_in_trait)]

use std::time::Duration;

use crate::drain::Head;
use crate::ids::PartitionId;

/// Why a delivery did not succeed. All of them are retried by the policy.
///
/// A variant's text describes that variant only; its cause is its [`source`], never repeated in
/// the text, so that whatever walks the chain prints each cause once. For the one-line text
/// that the `last_error` column keeps, walk the chain with [`crate::worker::chain`].
///
/// [`source`]: std::error::Error::source
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeliverError {
    /// The endpoint answered with a non-2xx status.
    #[error("HTTP {status}")]
    Status {
        /// The status code.
        status: u16,
        /// The endpoint's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// The endpoint did not answer within the delivery timeout.
    #[error("timed out after {after:?}")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// The endpoint could not be reached or the connection broke.
    #[error("connection failed")]
    Io(#[from] std::io::Error),
    /// No connection could be made to `addr` (refused, unresolvable, connect timeout): the
    /// request was never sent.
    #[error("cannot connect to {addr}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake with `addr` failed (for example an untrusted certificate): the request
    /// was never sent.
    #[error("TLS handshake with {addr} failed")]
    Tls {
        /// `host:port`.
        addr: String,
        /// What failed, with rustls's reason.
        #[source]
        source: std::io::Error,
    },
    /// The request was sent, or may have been, and no complete answer came back (the
    /// connection broke or the reply was malformed): the endpoint may still be processing it.
    #[error("request to {addr} failed")]
    Exchange {
        /// `host:port`.
        addr: String,
        /// What failed: the HTTP client's error, boxed so that only `src/http/` names the HTTP
        /// library.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The endpoint answered with a redirect, which is not followed.
    #[error("HTTP {status} redirect to {} (redirects are not followed: deliver to the final URL)", location.as_deref().unwrap_or("<no Location header>"))]
    Redirect {
        /// The 3xx status.
        status: u16,
        /// The `Location` header, if any.
        location: Option<String>,
    },
    /// The key's own endpoint (its `keyorder_endpoint` row) cannot be used, saying why; nothing
    /// was sent. Its events fail (and are retried, then dead-lettered) rather than go elsewhere.
    #[error("the endpoint of key {key:?} is misconfigured: {reason}")]
    Misconfigured {
        /// The partition key.
        key: String,
        /// What is wrong with its row.
        reason: String,
    },
    /// The endpoint's reply body was longer than the limit.
    #[error("HTTP {status} reply larger than {} (the limit)", size(*.limit))]
    ReplyTooLarge {
        /// The status that came with the body.
        status: u16,
        /// The limit in bytes.
        limit: usize,
    },
    /// The address policy of endpoint-table URLs refused the address that `addr` is (or
    /// resolved to): no connection was made, nothing was sent. Retried like any failure (a DNS
    /// answer may change), then dead-lettered with this text, never sent elsewhere.
    #[error("refused by the endpoint address policy: {addr} is {ip}, {rule}; nothing was sent (an operator can allow it with --allow-endpoint-network or --allow-private-endpoints)")]
    Refused {
        /// `host:port` as the URL names it.
        addr: String,
        /// The address refused.
        ip: std::net::IpAddr,
        /// The rule that refused it.
        rule: crate::address_policy::Rule,
    },
}

/// `1 MiB`, `64 KiB` or `100 bytes`.
fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

impl DeliverError {
    /// The endpoint's minimum delay before the next attempt, if it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            DeliverError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the endpoint may still be processing the request: no answer came back although
    /// the request was (or may have been) sent. A lease handed back after such a delivery is
    /// unclean, so a successor waits out the delivery timeout before delivering.
    pub fn may_be_processing(&self) -> bool {
        matches!(
            self,
            DeliverError::Timeout { .. } | DeliverError::Io(_) | DeliverError::Exchange { .. }
        )
    }
}

/// Delivers events to their endpoint. The worker clones one per leased partition, and calls it
/// one event at a time.
pub trait Deliver: Clone + 'static {
    /// Delivers `head` (attempt `attempt`) from `partition`. `Ok` means a 2xx.
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_error_names_its_cause_once_along_its_chain() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = DeliverError::Connect { addr: "h:80".into(), source: refused };
        let mut layers = vec![err.to_string()];
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            layers.push(s.to_string());
            source = s.source();
        }
        let mentions = layers.iter().filter(|l| l.contains("refused")).count();
        assert_eq!(mentions, 1, "{layers:?}");
        // What the worker's one-line `chain` of this error reads.
        assert_eq!(layers.join(": "), "cannot connect to h:80: refused");
    }
}
