//! A small HTTP/1.1 deliverer: one keep-alive connection per partition, `POST` with the event
//! as the body and its identity in headers, 2xx is success, `Retry-After` honoured. Plain
//! `http://` only (put TLS in a sidecar or proxy); a timeout is the worker's.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::deliver::{Deliver, DeliverError};
use crate::drain::Head;
use crate::ids::PartitionId;

/// Longest header line accepted from an endpoint.
const MAX_LINE: u64 = 16 * 1024;
/// Largest response body read (and discarded); a longer one closes the connection.
const MAX_BODY: u64 = 1 << 20;

/// Errors of the delivery URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// Not `http://host[:port][/path]`.
    #[error("delivery URL {url:?} is not of the form http://host[:port]/path (https is not supported: terminate TLS in a proxy)")]
    Unsupported {
        /// The URL as given.
        url: String,
    },
}

/// Where deliveries go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    host: String,
    port: u16,
    path: String,
}

impl Target {
    /// Parses `http://host[:port][/path]`.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let bad = || UrlError::Unsupported { url: url.to_owned() };
        let rest = url.strip_prefix("http://").ok_or_else(bad)?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().map_err(|_| bad())?),
            None => (authority, 80),
        };
        if host.is_empty() || path.contains(char::is_whitespace) {
            return Err(bad());
        }
        Ok(Self { host: host.to_owned(), port, path: path.to_owned() })
    }
}

/// Delivers over HTTP. Each clone (one per leased partition) keeps its own connection.
#[derive(Debug)]
pub struct HttpDeliverer {
    target: Target,
    conn: Option<BufReader<TcpStream>>,
    busy: bool,
}

impl HttpDeliverer {
    /// A deliverer to `target`.
    pub fn new(target: Target) -> Self {
        Self { target, conn: None, busy: false }
    }
}

impl Clone for HttpDeliverer {
    fn clone(&self) -> Self {
        Self::new(self.target.clone())
    }
}

/// A header value made safe: printable ASCII kept, anything else percent-encoded.
fn header_value(text: &str) -> String {
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

impl Deliver for HttpDeliverer {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        // A call abandoned by the worker's timeout leaves a half-read response: start afresh.
        if std::mem::replace(&mut self.busy, true) {
            self.conn = None;
        }
        let result = self.exchange(partition, head, attempt).await;
        if result.is_err() {
            self.conn = None;
        }
        self.busy = false;
        result.and_then(|status| status)
    }
}

type Exchange = Result<Result<(), DeliverError>, DeliverError>;

impl HttpDeliverer {
    async fn exchange(&mut self, partition: PartitionId, head: &Head, attempt: u32) -> Exchange {
        let t = &self.target;
        let conn = match &mut self.conn {
            Some(c) => c,
            None => self
                .conn
                .insert(BufReader::new(TcpStream::connect((t.host.as_str(), t.port)).await?)),
        };
        let body = if head.payload.is_empty() { "null" } else { head.payload.as_str() };
        let request = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             X-Keyorder-Event-Id: {}\r\nX-Keyorder-Key: {}\r\nX-Keyorder-Seq: {}\r\nX-Keyorder-Partition: {}\r\n\
             X-Keyorder-Attempt: {}\r\n\r\n",
            t.path,
            t.host,
            t.port,
            body.len(),
            header_value(&head.event_id),
            header_value(&head.key),
            head.seq,
            partition,
            attempt
        );
        let stream = conn.get_mut();
        stream.write_all(request.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        let (status, retry_after, keep) = read_response(conn).await?;
        if !keep {
            self.conn = None;
        }
        Ok(if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(DeliverError::Status { status, retry_after })
        })
    }
}

fn bad_response(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad HTTP response: {what}"))
}

/// Reads status, headers and body; returns (status, Retry-After, keep the connection).
async fn read_response(
    conn: &mut BufReader<TcpStream>,
) -> Result<(u16, Option<Duration>, bool), std::io::Error> {
    let mut line = String::new();
    (&mut *conn).take(MAX_LINE).read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad_response("no status line"))?;
    let (mut length, mut retry_after, mut keep) = (0u64, None, true);
    loop {
        line.clear();
        let n = (&mut *conn).take(MAX_LINE).read_line(&mut line).await?;
        if n == 0 {
            return Err(bad_response("headers cut short"));
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let Some((name, value)) = header.split_once(':') else { continue };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                length = value.parse().map_err(|_| bad_response("content-length"))?
            }
            "retry-after" => retry_after = value.parse::<u64>().ok().map(Duration::from_secs),
            "connection" => keep &= !value.eq_ignore_ascii_case("close"),
            "transfer-encoding" => keep = false,
            _ => {}
        }
    }
    if length > MAX_BODY {
        return Ok((status, retry_after, false));
    }
    let mut sink = vec![0u8; length as usize];
    conn.read_exact(&mut sink).await?;
    Ok((status, retry_after, keep))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_are_refused() {
        assert_eq!(Target::parse("http://127.0.0.1:8080/hook").unwrap().path, "/hook");
        assert_eq!(Target::parse("http://example/").unwrap().port, 80);
        assert!(Target::parse("https://example/").is_err());
        assert!(Target::parse("http://:80/").is_err());
        assert!(Target::parse("http://h:port/").is_err());
    }

    #[test]
    fn header_values_are_ascii() {
        assert_eq!(header_value("sub_é\r\n"), "sub_%C3%A9%0D%0A");
    }
}
