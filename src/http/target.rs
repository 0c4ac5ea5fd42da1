//! The delivery URL: `http://` or `https://`, a host (name, IPv4, or `[IPv6]`), an optional
//! port and a path with query. Parsed once, so every request reuses the checked parts.
//!
//! A host that ends in a number is an IPv4 address, read as browsers and curl read it (the
//! WHATWG URL standard's IPv4 parser): `2130706433`, `0x7f000001`, `0177.0.0.1` and `127.1` all
//! mean `127.0.0.1`, and `1.2.3.4.5` or `example.123` are refused as malformed. So such a host
//! is never handed to the resolver as a name (glibc would read it as an address too), and the
//! address policy of endpoint rows judges the address it means.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hyper::http::uri::PathAndQuery;

/// Why a delivery URL was refused. Each variant carries the URL as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// The scheme is neither `http://` nor `https://`; `problem` says what the URL has instead.
    #[error("delivery URL {url:?} {problem}; it must start with http:// or https://, e.g. http://127.0.0.1:8080/hook")]
    Scheme {
        /// The URL as given.
        url: String,
        /// What is wrong with its start, as a phrase ("has no scheme", ...).
        problem: String,
    },
    /// No host, or a host with characters no host name has.
    #[error("delivery URL {url:?} has no valid host (a name, an IPv4 address or [IPv6])")]
    Host {
        /// The URL as given.
        url: String,
    },
    /// `user:password@` in the URL: credentials are not sent from the URL.
    #[error("delivery URL {url:?} contains credentials (user@host), which are not supported")]
    Credentials {
        /// The URL as given.
        url: String,
    },
    /// The port is not a number from 1 to 65535.
    #[error("delivery URL {url:?} has an invalid port (1 to 65535)")]
    Port {
        /// The URL as given.
        url: String,
    },
    /// The path or query contains characters that cannot be sent (spaces, controls, `#`).
    #[error("delivery URL {url:?} has an invalid path or query (spaces, control characters and #fragments cannot be sent)")]
    Path {
        /// The URL as given.
        url: String,
    },
}

/// The transport of a [`Target`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain TCP.
    Http,
    /// TLS over TCP, the server's certificate checked against the host name.
    Https,
}

/// Where deliveries go: a parsed, checked `http://` or `https://` URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    scheme: Scheme,
    /// The host without brackets: what is resolved and what TLS checks. An IP address is kept
    /// in its canonical form (`127.0.0.1`, `::ffff:127.0.0.1`).
    host: String,
    /// The host's address when it is one (no resolution needed).
    ip: Option<IpAddr>,
    port: u16,
    path: PathAndQuery,
}

impl Target {
    /// Parses `http[s]://host[:port][/path][?query]`; the port defaults to 80 or 443 and the
    /// path to `/`. Anything else is refused with an error that says what is wrong.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let owned = || url.to_owned();
        let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
        let (scheme, rest) = if lower.starts_with("https://") {
            (Scheme::Https, &url[8..])
        } else if lower.starts_with("http://") {
            (Scheme::Http, &url[7..])
        } else {
            return Err(UrlError::Scheme { url: owned(), problem: scheme_problem(url) });
        };
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        if authority.contains('@') {
            return Err(UrlError::Credentials { url: owned() });
        }
        let (host, port) =
            split_authority(authority).ok_or_else(|| UrlError::Host { url: owned() })?;
        let ip = if host.contains(':') {
            // `split_authority` parsed it already.
            host.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
        } else if ends_in_a_number(host) {
            Some(IpAddr::V4(parse_ipv4(host).ok_or_else(|| UrlError::Host { url: owned() })?))
        } else {
            None
        };
        let host = ip.map_or_else(|| host.to_owned(), |ip| ip.to_string());
        let port = match port {
            None => match scheme {
                Scheme::Http => 80,
                Scheme::Https => 443,
            },
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return Err(UrlError::Port { url: owned() }),
            },
        };
        let path = match path {
            "" => "/".to_owned(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_owned(),
        };
        if path.contains('#') || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(UrlError::Path { url: owned() });
        }
        let path = PathAndQuery::try_from(path).map_err(|_| UrlError::Path { url: owned() })?;
        Ok(Self { scheme, host, ip, port, path })
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// The host, without the brackets of an IPv6 address.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The host's IP address when the URL names one (in any spelling), else `None`: a name.
    pub fn ip(&self) -> Option<IpAddr> {
        self.ip
    }

    /// The port (80 or 443 unless the URL gave one).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path and query, at least `/`.
    pub fn path(&self) -> &str {
        self.path.as_str()
    }

    /// `host:port` (`[v6]:port`), as connect errors and the `Host` header name it.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    pub(crate) fn path_and_query(&self) -> &PathAndQuery {
        &self.path
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.authority(), self.path)
    }
}

/// What is wrong with the start of `url`, which is not `http://` or `https://`, as a phrase.
fn scheme_problem(url: &str) -> String {
    if url.is_empty() {
        return "is empty".to_owned();
    }
    if url.trim() != url {
        return "begins or ends with spaces".to_owned();
    }
    let scheme_end = url.find(':').filter(|&i| {
        i > 0 && url[..i].bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    });
    match scheme_end {
        Some(i) if url[i..].starts_with("://") => {
            let scheme = &url[..i];
            if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") {
                "has a malformed scheme".to_owned()
            } else {
                format!("has the scheme {scheme:?}, but only http and https are delivered to")
            }
        }
        Some(i)
            if url[..i].eq_ignore_ascii_case("http") || url[..i].eq_ignore_ascii_case("https") =>
        {
            format!("has {:?} not followed by //", &url[..=i])
        }
        _ if url.chars().any(char::is_whitespace) => {
            "is not a URL (it has no scheme and contains spaces)".to_owned()
        }
        _ => "has no scheme (a host and path alone are not enough)".to_owned(),
    }
}

/// Splits `host[:port]` or `[v6][:port]`; `None` if the host is empty or malformed.
fn split_authority(authority: &str) -> Option<(&str, Option<&str>)> {
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (v6, after) = inner.split_once(']')?;
        v6.parse::<Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        return Some((v6, port));
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let name_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if host.is_empty() || !host.chars().all(name_char) {
        return None;
    }
    Some((host, port))
}

/// Whether the WHATWG URL standard reads `host` as an IPv4 address: its last label (a trailing
/// dot aside) is decimal digits or `0x` and hex digits.
fn ends_in_a_number(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    let last = host.rsplit('.').next().unwrap_or(host);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    let hex = last.strip_prefix("0x").or_else(|| last.strip_prefix("0X"));
    hex.is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The WHATWG URL standard's IPv4 parser: one to four parts, each decimal, `0x` hex or
/// `0`-prefixed octal; the last part fills the remaining bytes. `None` if malformed.
fn parse_ipv4(host: &str) -> Option<Ipv4Addr> {
    let host = host.strip_suffix('.').unwrap_or(host);
    let parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let numbers = parts.iter().map(|p| ipv4_number(p)).collect::<Option<Vec<u64>>>()?;
    let (last, init) = numbers.split_last()?;
    if init.iter().any(|&n| n > 255) || *last >= 256u64.pow(5 - numbers.len() as u32) {
        return None;
    }
    let mut address = *last;
    for (i, &n) in init.iter().enumerate() {
        address += n << (8 * (3 - i));
    }
    u32::try_from(address).ok().map(Ipv4Addr::from)
}

/// One part of a numeric IPv4 host; `None` for an empty or malformed part.
fn ipv4_number(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(h) = part.strip_prefix("0x").or(part.strip_prefix("0X")) {
        (h, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        return Some(0);
    }
    // More than 11 digits cannot fit 32 bits in any radix: refuse before overflowing.
    if digits.len() > 11 || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_their_parts() {
        let t = Target::parse("http://127.0.0.1:8080/hook?a=1").unwrap();
        assert_eq!(
            (t.scheme(), t.host(), t.port(), t.path()),
            (Scheme::Http, "127.0.0.1", 8080, "/hook?a=1")
        );
        let t = Target::parse("HTTPS://example.com").unwrap();
        assert_eq!((t.scheme(), t.port(), t.path()), (Scheme::Https, 443, "/"));
        let t = Target::parse("http://example/").unwrap();
        assert_eq!(t.port(), 80);
        let t = Target::parse("https://[::1]:8443?x=y").unwrap();
        assert_eq!((t.host(), t.port(), t.path()), ("::1", 8443, "/?x=y"));
        assert_eq!(t.authority(), "[::1]:8443");
        assert_eq!(t.to_string(), "https://[::1]:8443/?x=y");
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        let kind = |url: &str| Target::parse(url).unwrap_err();
        assert!(matches!(kind("ftp://example/"), UrlError::Scheme { .. }));
        assert!(matches!(kind("example.com/hook"), UrlError::Scheme { .. }));
        // The scheme error says what the URL has instead.
        let says = |url: &str| kind(url).to_string();
        assert!(says("not a url").contains("is not a URL (it has no scheme and contains spaces)"));
        assert!(says("ftp://example/").contains("has the scheme \"ftp\", but only http and https"));
        assert!(says("example.com/hook").contains("has no scheme"));
        assert!(says("http:/example.com/hook").contains("has \"http:\" not followed by //"));
        assert!(says(" http://h/").contains("begins or ends with spaces"));
        assert!(says("").contains("is empty"));
        assert!(says("not a url").contains("e.g. http://127.0.0.1:8080/hook"));
        assert!(matches!(kind("http://:80/"), UrlError::Host { .. }));
        assert!(matches!(kind("http:///x"), UrlError::Host { .. }));
        assert!(matches!(kind("http://[zz]:80/"), UrlError::Host { .. }));
        assert!(matches!(kind("http://::1/"), UrlError::Host { .. }));
        assert!(matches!(kind("http://a b/"), UrlError::Host { .. }));
        assert!(matches!(kind("http://u:p@h/"), UrlError::Credentials { .. }));
        assert!(matches!(kind("http://h:port/"), UrlError::Port { .. }));
        assert!(matches!(kind("http://h:0/"), UrlError::Port { .. }));
        assert!(matches!(kind("http://h:70000/"), UrlError::Port { .. }));
        assert!(matches!(kind("http://h:/"), UrlError::Port { .. }));
        assert!(matches!(kind("http://h/a b"), UrlError::Path { .. }));
        assert!(matches!(kind("http://h/a#frag"), UrlError::Path { .. }));
        assert!(kind("ftp://x").to_string().contains("http:// or https://"));
    }

    #[test]
    fn numeric_hosts_mean_the_address_a_browser_would_connect_to() {
        let ip = |url: &str| Target::parse(url).unwrap().ip().map(|ip| ip.to_string());
        for url in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0X7F000001/",
            "http://0177.0.0.1/",
            "http://0177.0.0.01/",
            "http://127.1/",
            "http://127.0.1/",
            "http://0x7f.1/",
            "http://127.0.0.1./",
            "http://017700000001:8080/",
        ] {
            assert_eq!(ip(url).as_deref(), Some("127.0.0.1"), "{url}");
        }
        assert_eq!(ip("http://0/").as_deref(), Some("0.0.0.0"));
        assert_eq!(ip("http://0x/").as_deref(), Some("0.0.0.0"));
        assert_eq!(ip("http://4294967295/").as_deref(), Some("255.255.255.255"));
        assert_eq!(ip("http://[::FFFF:127.0.0.1]/").as_deref(), Some("::ffff:127.0.0.1"));
        assert_eq!(ip("http://example.com/"), None);
        assert_eq!(ip("http://0x7f.example/"), None, "a name: its last label is not a number");
        let t = Target::parse("http://0x7f000001:81/x").unwrap();
        assert_eq!((t.host(), t.authority()), ("127.0.0.1", "127.0.0.1:81".to_owned()));
        for url in [
            "http://4294967296/",
            "http://1.2.3.4.5/",
            "http://256.0.0.1/",
            "http://1.2.3.256/",
            "http://1.2.65536/",
            "http://08.0.0.1/",
            "http://0x1g.0.0.1/",
            "http://example.123/",
            "http://1..2/",
            "http://99999999999999999999/",
        ] {
            assert!(matches!(Target::parse(url), Err(UrlError::Host { .. })), "{url}");
        }
    }
}
