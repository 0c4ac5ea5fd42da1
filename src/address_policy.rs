//! The address policy of endpoint-table URLs: which IP addresses a delivery to a URL that a
//! tenant chose (a `keyorder_endpoint` row) may connect to. Sans-IO: a pure function from an
//! address (and the operator's allow-list) to a [`Verdict`]; the connection code resolves the
//! host once, asks here about every address, and connects only to an address allowed here.
//!
//! Deny by default. Refused, unless the operator allows them: every address the IANA IPv4 and
//! IPv6 special-purpose address registries mark as not globally reachable (loopback,
//! unspecified, RFC 1918 and unique-local, link-local, carrier-grade NAT, benchmarking,
//! documentation, reserved, the IETF protocol assignments), multicast and broadcast, every
//! IPv6 address outside global unicast `2000::/3`, the cloud metadata services that sit
//! outside those ranges (Azure's `168.63.129.16`; AWS's `fd00:ec2::254` and GCP/AWS/Azure's
//! `169.254.169.254` are named too), and every IPv6 form that carries an IPv4 address inside
//! (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo) when the IPv4 address inside is refused.
//! The operator's own `--deliver` URL is trusted and never asks here.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Whether a connection to an address may be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The address is globally reachable, or the operator allowed it.
    Allowed,
    /// The address falls under `rule`: no connection is made.
    Refused {
        /// The rule that refuses it, with a name a person understands.
        rule: Rule,
    },
}

/// A rule of the policy: a named range (`loopback`, `127.0.0.0/8`), and when the refused
/// address was carried inside an IPv6 address, the form that carried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    name: &'static str,
    range: &'static str,
    via: Option<&'static str>,
}

impl Rule {
    /// What the range is, e.g. `loopback` or `cloud metadata service`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The range in CIDR notation, e.g. `127.0.0.0/8`.
    pub fn range(&self) -> &'static str {
        self.range
    }

    /// The IPv6 form that carried a refused IPv4 address (e.g. `IPv4-mapped ::ffff:0:0/96`).
    pub fn via(&self) -> Option<&'static str> {
        self.via
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.range)?;
        if let Some(via) = self.via {
            write!(f, " inside an {via} address")?;
        }
        Ok(())
    }
}

/// Why a `--allow-endpoint-network` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// Not `ADDRESS/PREFIX` with an IPv4 or IPv6 address.
    #[error("{text:?} is not a network ADDRESS/PREFIX such as 10.20.0.0/16 or fd12::/64")]
    Syntax {
        /// The text as given.
        text: String,
    },
    /// The prefix is longer than the address (32 for IPv4, 128 for IPv6).
    #[error("{text:?} has a prefix longer than {max} bits")]
    Prefix {
        /// The text as given.
        text: String,
        /// The longest prefix of that family.
        max: u8,
    },
    /// Bits are set past the prefix (`10.1.2.3/8`): probably a typo for another network.
    #[error("{text:?} has host bits set past the prefix: did you mean {network}?")]
    HostBits {
        /// The text as given.
        text: String,
        /// The network with those bits cleared.
        network: String,
    },
}

/// A network `ADDRESS/PREFIX` (IPv4 or IPv6); a bare address is a `/32` or `/128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `ip` is inside this network (an IPv4 network never contains an IPv6 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => in_v4(u32::from(ip), u32::from(net), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                in_v6(u128::from(ip), u128::from(net), self.prefix)
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, CidrError> {
        let syntax = || CidrError::Syntax { text: text.to_owned() };
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                (a, Some(p.parse::<u8>().map_err(|_| syntax())?))
            }
            Some(_) => return Err(syntax()),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| syntax())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return Err(CidrError::Prefix { text: text.to_owned(), max });
        }
        let network = match addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask32(prefix))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask128(prefix))),
        };
        if network != addr {
            return Err(CidrError::HostBits {
                text: text.to_owned(),
                network: format!("{network}/{prefix}"),
            });
        }
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The policy in force for endpoint-table URLs: the deny rules, minus what the operator
/// allowed. The default refuses everything this module's doc lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allow_all: bool,
    allow: Vec<Cidr>,
}

impl AddressPolicy {
    /// Deny by default, except the networks in `allow` (`--allow-endpoint-network`).
    pub fn new(allow: Vec<Cidr>) -> Self {
        Self { allow_all: false, allow }
    }

    /// Every address allowed (`--allow-private-endpoints`): nothing else changes (URL syntax,
    /// schemes, TLS and secrets are checked as before).
    pub fn allow_all() -> Self {
        Self { allow_all: true, allow: Vec::new() }
    }

    /// Whether every address is allowed.
    pub fn allows_all(&self) -> bool {
        self.allow_all
    }

    /// The verdict on connecting to `ip`. An address inside an allowed network is allowed,
    /// and so is an IPv6 form whose IPv4 address inside is; otherwise the deny rules decide.
    pub fn check(&self, ip: IpAddr) -> Verdict {
        if self.allow_all {
            return Verdict::Allowed;
        }
        match ip {
            IpAddr::V4(v4) => self.check_v4(v4),
            IpAddr::V6(v6) => self.check_v6(v6),
        }
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|c| c.contains(ip))
    }

    fn check_v4(&self, ip: Ipv4Addr) -> Verdict {
        if self.allowed(IpAddr::V4(ip)) {
            return Verdict::Allowed;
        }
        let bits = u32::from(ip);
        match V4_RULES.iter().find(|r| in_v4(bits, r.base, r.prefix)) {
            Some(r) => Verdict::Refused { rule: r.rule(None) },
            None => Verdict::Allowed,
        }
    }

    fn check_v6(&self, ip: Ipv6Addr) -> Verdict {
        // An IPv4-mapped address is the IPv4 address (a socket connects to that): judged as
        // it, by IPv4 networks only, so `--allow-endpoint-network ::/0` does not open it.
        if let Some(v4) = ip.to_ipv4_mapped() {
            return match self.check_v4(v4) {
                Verdict::Refused { rule } => {
                    Verdict::Refused { rule: Rule { via: Some(MAPPED), ..rule } }
                }
                allowed => allowed,
            };
        }
        if self.allowed(IpAddr::V6(ip)) {
            return Verdict::Allowed;
        }
        let bits = u128::from(ip);
        // The forms that carry an IPv4 address: refused if any address inside is refused.
        if let Some((form, inner)) = embedded_v4(bits) {
            for v4 in inner.into_iter().flatten() {
                if let Verdict::Refused { rule } = self.check_v4(v4) {
                    return Verdict::Refused { rule: Rule { via: Some(form), ..rule } };
                }
            }
        }
        match V6_RULES.iter().find(|r| in_v6(bits, r.base, r.prefix)) {
            Some(r) if r.refuse => Verdict::Refused { rule: r.rule(None) },
            Some(_) => Verdict::Allowed,
            None if in_v6(bits, 0x2000 << 112, 3) => Verdict::Allowed,
            None => Verdict::Refused { rule: NOT_GLOBAL_UNICAST },
        }
    }
}

/// A row of the IPv4 deny table.
struct V4Rule {
    base: u32,
    prefix: u8,
    name: &'static str,
    range: &'static str,
}

/// A row of the IPv6 table: a range refused, or (`refuse: false`) an exception inside a
/// refused range that IANA marks globally reachable. The first match decides.
struct V6Rule {
    base: u128,
    prefix: u8,
    refuse: bool,
    name: &'static str,
    range: &'static str,
}

impl V4Rule {
    fn rule(&self, via: Option<&'static str>) -> Rule {
        Rule { name: self.name, range: self.range, via }
    }
}

impl V6Rule {
    fn rule(&self, via: Option<&'static str>) -> Rule {
        Rule { name: self.name, range: self.range, via }
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> u32 {
    u32::from_be_bytes([a, b, c, d])
}

const fn r4(base: u32, prefix: u8, name: &'static str, range: &'static str) -> V4Rule {
    V4Rule { base, prefix, name, range }
}

/// IPv4, most specific first (the first match names the refusal). From the IANA IPv4
/// Special-Purpose Address Registry (entries not globally reachable), plus multicast and the
/// metadata services; 192.0.0.0/24 is refused whole (its two anycast exceptions are not
/// webhook receivers).
const V4_RULES: &[V4Rule] = &[
    r4(v4(169, 254, 169, 254), 32, "cloud metadata service", "169.254.169.254/32"),
    r4(v4(168, 63, 129, 16), 32, "cloud metadata service (Azure)", "168.63.129.16/32"),
    r4(v4(255, 255, 255, 255), 32, "limited broadcast", "255.255.255.255/32"),
    r4(v4(0, 0, 0, 0), 8, "unspecified (\"this network\")", "0.0.0.0/8"),
    r4(v4(10, 0, 0, 0), 8, "private network (RFC 1918)", "10.0.0.0/8"),
    r4(v4(100, 64, 0, 0), 10, "carrier-grade NAT (RFC 6598)", "100.64.0.0/10"),
    r4(v4(127, 0, 0, 0), 8, "loopback", "127.0.0.0/8"),
    r4(v4(169, 254, 0, 0), 16, "link-local", "169.254.0.0/16"),
    r4(v4(172, 16, 0, 0), 12, "private network (RFC 1918)", "172.16.0.0/12"),
    r4(v4(192, 0, 0, 0), 24, "IETF protocol assignments", "192.0.0.0/24"),
    r4(v4(192, 0, 2, 0), 24, "documentation (TEST-NET-1)", "192.0.2.0/24"),
    r4(v4(192, 88, 99, 0), 24, "deprecated 6to4 relay anycast", "192.88.99.0/24"),
    r4(v4(192, 168, 0, 0), 16, "private network (RFC 1918)", "192.168.0.0/16"),
    r4(v4(198, 18, 0, 0), 15, "benchmarking", "198.18.0.0/15"),
    r4(v4(198, 51, 100, 0), 24, "documentation (TEST-NET-2)", "198.51.100.0/24"),
    r4(v4(203, 0, 113, 0), 24, "documentation (TEST-NET-3)", "203.0.113.0/24"),
    r4(v4(224, 0, 0, 0), 4, "multicast", "224.0.0.0/4"),
    r4(v4(240, 0, 0, 0), 4, "reserved", "240.0.0.0/4"),
];

const fn r6(base: u128, prefix: u8, name: &'static str, range: &'static str) -> V6Rule {
    V6Rule { base, prefix, refuse: true, name, range }
}

const fn ok6(base: u128, prefix: u8) -> V6Rule {
    V6Rule { base, prefix, refuse: false, name: "", range: "" }
}

/// `h[0]:h[1]:…` as 128 bits.
const fn v6(h: [u16; 8]) -> u128 {
    let mut bits = 0u128;
    let mut i = 0;
    while i < 8 {
        bits = (bits << 16) | h[i] as u128;
        i += 1;
    }
    bits
}

/// IPv6, most specific first. From the IANA IPv6 Special-Purpose Address Registry; anything
/// matching no row is allowed inside global unicast 2000::/3 and refused outside it. The
/// forms that carry IPv4 (checked first, in [`embedded_v4`]) are allowed here when the
/// address inside is, except IPv4-compatible addresses (deprecated by RFC 4291).
const V6_RULES: &[V6Rule] = &[
    r6(0, 128, "unspecified", "::/128"),
    r6(1, 128, "loopback", "::1/128"),
    r6(0, 96, "IPv4-compatible IPv6 (deprecated, RFC 4291)", "::/96"),
    ok6(v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0]), 96),
    r6(v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0]), 48, "local-use NAT64 (RFC 8215)", "64:ff9b:1::/48"),
    r6(v6([0x100, 0, 0, 0, 0, 0, 0, 0]), 64, "discard-only (RFC 6666)", "100::/64"),
    // 2001::/23 is not globally reachable, except these (IANA marks them reachable).
    ok6(v6([0x2001, 1, 0, 0, 0, 0, 0, 1]), 128),
    ok6(v6([0x2001, 1, 0, 0, 0, 0, 0, 2]), 128),
    ok6(v6([0x2001, 1, 0, 0, 0, 0, 0, 3]), 128),
    ok6(v6([0x2001, 3, 0, 0, 0, 0, 0, 0]), 32),
    ok6(v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0]), 48),
    ok6(v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0]), 28),
    ok6(v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0]), 28),
    ok6(v6([0x2001, 0, 0, 0, 0, 0, 0, 0]), 32),
    r6(v6([0x2001, 2, 0, 0, 0, 0, 0, 0]), 48, "benchmarking", "2001:2::/48"),
    r6(v6([0x2001, 0, 0, 0, 0, 0, 0, 0]), 23, "IETF protocol assignments", "2001::/23"),
    r6(v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0]), 32, "documentation", "2001:db8::/32"),
    ok6(v6([0x2002, 0, 0, 0, 0, 0, 0, 0]), 16),
    r6(v6([0x3fff, 0, 0, 0, 0, 0, 0, 0]), 20, "documentation", "3fff::/20"),
    r6(
        v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254]),
        128,
        "cloud metadata service (AWS)",
        "fd00:ec2::254/128",
    ),
    r6(v6([0xfc00, 0, 0, 0, 0, 0, 0, 0]), 7, "unique local (private network)", "fc00::/7"),
    r6(v6([0xfe80, 0, 0, 0, 0, 0, 0, 0]), 10, "link-local", "fe80::/10"),
    r6(v6([0xfec0, 0, 0, 0, 0, 0, 0, 0]), 10, "site-local (deprecated)", "fec0::/10"),
    r6(v6([0xff00, 0, 0, 0, 0, 0, 0, 0]), 8, "multicast", "ff00::/8"),
];

const NOT_GLOBAL_UNICAST: Rule =
    Rule { name: "not global unicast (reserved by IETF)", range: "outside 2000::/3", via: None };

/// The form name of IPv4-mapped addresses (`::ffff:a.b.c.d`), judged as their IPv4 address.
const MAPPED: &str = "IPv4-mapped ::ffff:0:0/96";

/// The IPv4 addresses an IPv6 address carries, and the name of its form: IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`), 6to4
/// (`2002:AABB:CCDD::`, bits 16..48) or Teredo (`2001:0:SERVER:…:~CLIENT`: the server in bits
/// 32..64, the client's address inverted in the last 32 bits).
fn embedded_v4(bits: u128) -> Option<(&'static str, [Option<Ipv4Addr>; 2])> {
    let low = Some(Ipv4Addr::from(bits as u32));
    if in_v6(bits, 0, 96) && bits > 1 {
        Some(("IPv4-compatible ::/96", [low, None]))
    } else if in_v6(bits, v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0]), 96) {
        Some(("NAT64 64:ff9b::/96", [low, None]))
    } else if in_v6(bits, v6([0x2002, 0, 0, 0, 0, 0, 0, 0]), 16) {
        Some(("6to4 2002::/16", [Some(Ipv4Addr::from((bits >> 80) as u32)), None]))
    } else if in_v6(bits, v6([0x2001, 0, 0, 0, 0, 0, 0, 0]), 32) {
        let server = Ipv4Addr::from((bits >> 64) as u32);
        let client = Ipv4Addr::from(!(bits as u32));
        Some(("Teredo 2001::/32", [Some(server), Some(client)]))
    } else {
        None
    }
}

fn mask32(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

fn mask128(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

fn in_v4(ip: u32, base: u32, prefix: u8) -> bool {
    ip & mask32(prefix) == base
}

fn in_v6(ip: u128, base: u128, prefix: u8) -> bool {
    ip & mask128(prefix) == base
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_by(policy: &AddressPolicy, ip: &str) -> Option<Rule> {
        match policy.check(ip.parse().unwrap()) {
            Verdict::Allowed => None,
            Verdict::Refused { rule } => Some(rule),
        }
    }

    fn rule(ip: &str) -> Option<&'static str> {
        refused_by(&AddressPolicy::default(), ip).map(|r| r.range())
    }

    #[test]
    fn every_ipv4_rule_refuses_its_range_and_its_edges_stay_apart() {
        let cases = [
            ("0.0.0.0", "0.0.0.0/8"),
            ("0.255.255.255", "0.0.0.0/8"),
            ("10.0.0.1", "10.0.0.0/8"),
            ("10.255.255.255", "10.0.0.0/8"),
            ("100.64.0.0", "100.64.0.0/10"),
            ("100.127.255.255", "100.64.0.0/10"),
            ("100.100.100.200", "100.64.0.0/10"), // Alibaba's metadata service
            ("127.0.0.1", "127.0.0.0/8"),
            ("127.255.0.1", "127.0.0.0/8"),
            ("169.254.0.1", "169.254.0.0/16"),
            ("169.254.169.254", "169.254.169.254/32"),
            ("168.63.129.16", "168.63.129.16/32"),
            ("172.16.0.0", "172.16.0.0/12"),
            ("172.31.255.255", "172.16.0.0/12"),
            ("192.0.0.8", "192.0.0.0/24"),
            ("192.0.0.192", "192.0.0.0/24"), // Oracle's metadata service
            ("192.0.2.1", "192.0.2.0/24"),
            ("192.88.99.1", "192.88.99.0/24"),
            ("192.168.1.1", "192.168.0.0/16"),
            ("198.18.0.1", "198.18.0.0/15"),
            ("198.19.255.255", "198.18.0.0/15"),
            ("198.51.100.7", "198.51.100.0/24"),
            ("203.0.113.9", "203.0.113.0/24"),
            ("224.0.0.1", "224.0.0.0/4"),
            ("239.255.255.255", "224.0.0.0/4"),
            ("240.0.0.1", "240.0.0.0/4"),
            ("255.255.255.254", "240.0.0.0/4"),
            ("255.255.255.255", "255.255.255.255/32"),
        ];
        for (ip, range) in cases {
            assert_eq!(rule(ip), Some(range), "{ip}");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.0",
            "192.0.3.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "198.51.99.255",
            "203.0.112.255",
            "223.255.255.255",
            "168.63.129.17",
            "192.31.196.1",
            "192.52.193.1",
            "192.175.48.1",
        ] {
            assert_eq!(rule(ip), None, "{ip} is globally reachable");
        }
    }

    #[test]
    fn every_ipv6_rule_refuses_its_range() {
        let cases = [
            ("::", "::/128"),
            ("::1", "::1/128"),
            ("::2", "0.0.0.0/8"), // IPv4-compatible 0.0.0.2
            ("::8.8.8.8", "::/96"),
            ("64:ff9b:1::1", "64:ff9b:1::/48"),
            ("100::1", "100::/64"),
            ("2001:2::1", "2001:2::/48"),
            ("2001:10::1", "2001::/23"),
            ("2001:1::4", "2001::/23"),
            ("2001:1ff:ffff::1", "2001::/23"),
            ("2001:db8::1", "2001:db8::/32"),
            ("3fff::1", "3fff::/20"),
            ("fc00::1", "fc00::/7"),
            ("fd12:3456::1", "fc00::/7"),
            ("fd00:ec2::254", "fd00:ec2::254/128"),
            ("fe80::1", "fe80::/10"),
            ("febf::1", "fe80::/10"),
            ("fec0::1", "fec0::/10"),
            ("ff02::1", "ff00::/8"),
            ("100:1::1", "outside 2000::/3"),
            ("5f00::1", "outside 2000::/3"),
            ("4000::1", "outside 2000::/3"),
            ("1fff:ffff::1", "outside 2000::/3"),
        ];
        for (ip, range) in cases {
            assert_eq!(rule(ip), Some(range), "{ip}");
        }
        for ip in [
            "2606:4700:4700::1111",
            "2001:1::3",
            "2a00:1450::1",
            "2001:200::1",
            "2001:1::1",
            "2001:3::1",
            "2001:4:112::1",
            "2001:20::1",
            "2001:db7:ffff::1",
            "2001:db9::1",
            "3ffe::1",
            "2620:4f:8000::1",
            "3fff:1000::1",
        ] {
            assert_eq!(rule(ip), None, "{ip} is globally reachable");
        }
    }

    #[test]
    fn ipv6_forms_of_a_refused_ipv4_address_are_refused_naming_both() {
        let p = AddressPolicy::default();
        let cases = [
            ("::ffff:127.0.0.1", "127.0.0.0/8", "IPv4-mapped ::ffff:0:0/96"),
            ("::ffff:169.254.169.254", "169.254.169.254/32", "IPv4-mapped ::ffff:0:0/96"),
            ("::127.0.0.1", "127.0.0.0/8", "IPv4-compatible ::/96"),
            ("64:ff9b::10.0.0.1", "10.0.0.0/8", "NAT64 64:ff9b::/96"),
            ("64:ff9b::a9fe:a9fe", "169.254.169.254/32", "NAT64 64:ff9b::/96"),
            ("2002:7f00:1::", "127.0.0.0/8", "6to4 2002::/16"),
            ("2002:c0a8:101::1", "192.168.0.0/16", "6to4 2002::/16"),
            ("2002:a9fe:a9fe::", "169.254.169.254/32", "6to4 2002::/16"),
            // Teredo: server 127.0.0.1 in bits 32..64, or client 10.0.0.1 inverted at the end.
            ("2001:0:7f00:1:0:0:0808:0808", "127.0.0.0/8", "Teredo 2001::/32"),
            ("2001:0:0808:0808::f5ff:fffe", "10.0.0.0/8", "Teredo 2001::/32"),
        ];
        for (ip, range, via) in cases {
            let r = refused_by(&p, ip).unwrap_or_else(|| panic!("{ip} refused"));
            assert_eq!((r.range(), r.via()), (range, Some(via)), "{ip}");
        }
        let refused = refused_by(&p, "::ffff:127.0.0.1").unwrap();
        assert_eq!(refused.name(), "loopback");
        assert_eq!(
            refused.to_string(),
            "loopback (127.0.0.0/8) inside an IPv4-mapped ::ffff:0:0/96 address"
        );
        // The same forms of a global address connect to that address, and are allowed.
        for ip in
            ["::ffff:8.8.8.8", "64:ff9b::8.8.8.8", "2002:808:808::1", "2001:0:808:808::f7f7:f7f7"]
        {
            assert_eq!(rule(ip), None, "{ip}");
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_its_networks() {
        let allow = ["127.0.0.0/8", "fd12::/16", "169.254.169.254"];
        let p = AddressPolicy::new(allow.iter().map(|c| c.parse().unwrap()).collect());
        assert_eq!(refused_by(&p, "127.0.0.1"), None);
        assert_eq!(refused_by(&p, "::ffff:127.0.0.1"), None, "the mapped form of an allowed one");
        let v6_all = AddressPolicy::new(vec!["::/0".parse().unwrap()]);
        assert_eq!(refused_by(&v6_all, "fd00::1"), None);
        let mapped = refused_by(&v6_all, "::ffff:10.0.0.1").map(|r| r.range());
        assert_eq!(mapped, Some("10.0.0.0/8"), "a mapped address is IPv4: ::/0 does not open it");
        assert_eq!(refused_by(&p, "2002:7f00:1::"), None, "the 6to4 form of an allowed one");
        assert_eq!(refused_by(&p, "fd12:1::1"), None);
        assert_eq!(refused_by(&p, "169.254.169.254"), None);
        assert_eq!(refused_by(&p, "169.254.169.253").map(|r| r.range()), Some("169.254.0.0/16"));
        assert_eq!(refused_by(&p, "::1").map(|r| r.range()), Some("::1/128"), "v4 nets stay v4");
        assert_eq!(refused_by(&p, "fd13::1").map(|r| r.range()), Some("fc00::/7"));
        assert_eq!(refused_by(&p, "10.0.0.1").map(|r| r.range()), Some("10.0.0.0/8"));
        let all = AddressPolicy::allow_all();
        for ip in ["127.0.0.1", "::1", "10.1.1.1", "169.254.169.254", "::ffff:127.0.0.1", "ff02::1"]
        {
            assert_eq!(refused_by(&all, ip), None, "{ip}");
        }
    }

    #[test]
    fn networks_parse_and_typos_are_refused() {
        let c: Cidr = "10.20.0.0/16".parse().unwrap();
        assert!(c.contains("10.20.255.1".parse().unwrap()));
        assert!(!c.contains("10.21.0.1".parse().unwrap()));
        assert_eq!("::1".parse::<Cidr>().unwrap().to_string(), "::1/128");
        assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().to_string(), "0.0.0.0/0");
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains("8.8.8.8".parse().unwrap()));
        let err = |t: &str| t.parse::<Cidr>().unwrap_err();
        assert!(matches!(err("10.0.0.0/33"), CidrError::Prefix { max: 32, .. }));
        assert!(matches!(err("::/129"), CidrError::Prefix { max: 128, .. }));
        assert!(matches!(err("example.com/8"), CidrError::Syntax { .. }));
        assert!(matches!(err("10.0.0.0/"), CidrError::Syntax { .. }));
        assert!(matches!(err("10.0.0.0/-1"), CidrError::Syntax { .. }));
        assert!(err("10.1.2.3/8").to_string().contains("did you mean 10.0.0.0/8"));
        // Only digits after the slash: Rust's integer parser alone would take "+8" as 8.
        assert!(matches!(err("10.0.0.0/+8"), CidrError::Syntax { .. }));
        assert!(matches!(err("::/+0"), CidrError::Syntax { .. }));
    }

    #[test]
    fn only_allow_all_allows_all() {
        assert!(AddressPolicy::allow_all().allows_all());
        assert!(!AddressPolicy::default().allows_all());
        let everything = vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()];
        assert!(!AddressPolicy::new(everything).allows_all(), "networks, however wide");
    }
}
