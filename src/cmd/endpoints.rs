//! `keyorder endpoints set|list|rm`: the per-key endpoint table, written only after a row is
//! validated (URL syntax and scheme, the address policy for a literal address, the secret
//! reference's form), and the address-policy flags `work` shares.

use std::net::{IpAddr, Ipv4Addr};

use clap::{Args, Subcommand};
use keyorder::address_policy::{AddressPolicy, Cidr, Verdict};
use keyorder::endpoints::{EndpointRow, SecretRef};
use keyorder::http::Target;
use keyorder::store::admin::Admin;
use keyorder::store::open::OpenMode;

use super::bad_input::BadInput;
use super::runtime::{block_on, Database};

/// Which addresses the URLs of endpoint-table rows (chosen by tenants) may connect to. The
/// operator's own --deliver URL is trusted and not checked.
#[derive(Debug, Clone, Default, Args)]
pub struct PolicyArgs {
    /// Allow endpoint-table URLs to connect to this network, e.g. 10.20.0.0/16 or fd12::/64
    /// (repeatable). By default they may not connect to loopback, private (RFC 1918,
    /// fc00::/7), link-local (169.254.0.0/16, fe80::/10), carrier-grade NAT, unspecified,
    /// multicast, broadcast, reserved or documentation addresses, cloud metadata services
    /// (169.254.169.254, 168.63.129.16, fd00:ec2::254), nor the IPv4-mapped, NAT64, 6to4 and
    /// Teredo forms of any of them; such a delivery fails naming the address and the rule
    /// (retried, then dead-lettered; never sent to --deliver).
    #[arg(long, value_name = "CIDR")]
    pub allow_endpoint_network: Vec<Cidr>,
    /// Allow endpoint-table URLs to connect to any address (for a network where every tenant
    /// is trusted, or tests). Nothing else changes.
    #[arg(long)]
    pub allow_private_endpoints: bool,
}

impl PolicyArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> AddressPolicy {
        if self.allow_private_endpoints {
            AddressPolicy::allow_all()
        } else {
            AddressPolicy::new(self.allow_endpoint_network.clone())
        }
    }
}

/// `keyorder endpoints`.
#[derive(Debug, Args)]
pub struct EndpointsArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Deliver KEY's events to URL (replacing its row if it has one). Refused with exit 2: a
    /// malformed URL, a scheme other than http/https, a literal address (or localhost) that the
    /// address policy refuses, a secret reference other than env:NAME or file:/ABSOLUTE/PATH.
    /// A host name is resolved and checked at every connection, not here.
    Set {
        #[command(flatten)]
        db: Database,
        /// The partition key (e.g. the subscription id).
        key: String,
        /// http://host[:port]/path or https://...
        url: String,
        /// Where the key's signing secrets are (one a line, newest first): env:NAME (the
        /// worker's environment) or file:PATH (absolute, on the worker's machine). Default:
        /// the worker's own secret.
        #[arg(long, value_name = "env:NAME|file:PATH")]
        secret_ref: Option<String>,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Print every row: key, URL, secret reference (never a secret), in key order.
    List {
        #[command(flatten)]
        db: Database,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Remove KEY's row: its events go to --deliver again (within a worker's reload, 10 s).
    Rm {
        #[command(flatten)]
        db: Database,
        /// The partition key.
        key: String,
    },
}

/// Runs `keyorder endpoints`.
pub fn run(args: EndpointsArgs) -> anyhow::Result<()> {
    let db = match &args.action {
        Action::Set { db, .. } | Action::List { db, .. } | Action::Rm { db, .. } => db.clone(),
    };
    if let Action::Set { key, url, secret_ref, policy, .. } = &args.action {
        let row =
            EndpointRow { key: key.clone(), url: url.clone(), secret_ref: secret_ref.clone() };
        validate(&row, &policy.policy())?;
    }
    block_on(async move {
        let mut admin = db.admin(OpenMode::Existing).await?;
        match args.action {
            Action::Set { key, url, secret_ref, .. } => {
                let row = EndpointRow { key, url, secret_ref };
                let replaced = admin.set_endpoint(&row).await?;
                let what = if replaced { "replaced" } else { "added" };
                println!("{what}: key {:?} delivers to {}", row.key, row.url);
            }
            Action::List { json, .. } => {
                for r in admin.endpoints().await? {
                    if json {
                        println!("{}", serde_json::to_string(&r)?);
                    } else {
                        println!(
                            "{}\t{}\t{}",
                            r.key,
                            r.url,
                            r.secret_ref.as_deref().unwrap_or("-")
                        );
                    }
                }
            }
            Action::Rm { key, .. } => {
                let removed = admin.remove_endpoint(&key).await?;
                if !removed {
                    return Err(BadInput(format!("no endpoint row for key {key:?}")).into());
                }
                println!("removed: key {key:?} delivers to the worker's --deliver URL again");
            }
        }
        anyhow::Ok(())
    })?
}

/// Whether `row` may be written under `policy`, or what the user must fix.
fn validate(row: &EndpointRow, policy: &AddressPolicy) -> Result<(), BadInput> {
    if row.key.is_empty() {
        return Err(BadInput("the key is empty".into()));
    }
    let target = Target::parse(&row.url).map_err(|e| BadInput(e.to_string()))?;
    if let Some(ip) = literal_address(&target) {
        if let Verdict::Refused { rule } = policy.check(ip) {
            return Err(BadInput(format!(
                "{} connects to {ip}, which the endpoint address policy refuses: {rule} (a worker would refuse it too; --allow-endpoint-network CIDR or --allow-private-endpoints, here and on `keyorder work`, allow it)",
                row.url
            )));
        }
    }
    if let Some(r) = &row.secret_ref {
        r.parse::<SecretRef>().map_err(|e| BadInput(e.to_string()))?;
    }
    Ok(())
}

/// The address the URL names, or `127.0.0.1` for `localhost` and `*.localhost` (which resolve
/// to loopback, RFC 6761); `None` for other names, checked when resolved.
fn literal_address(target: &Target) -> Option<IpAddr> {
    let host = target.host().trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    target.ip()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, secret_ref: Option<&str>, policy: &AddressPolicy) -> Result<(), String> {
        let row = EndpointRow {
            key: "sub_1".into(),
            url: url.into(),
            secret_ref: secret_ref.map(str::to_owned),
        };
        validate(&row, policy).map_err(|e| e.0)
    }

    #[test]
    fn rows_are_refused_for_url_scheme_address_and_secret_reference() {
        let strict = AddressPolicy::default();
        assert!(check("https://hooks.example.com/x", Some("env:HOOK_SECRET"), &strict).is_ok());
        assert!(check("http://93.184.215.14/", Some("file:/etc/k/s"), &strict).is_ok());
        assert!(check("ftp://h/", None, &strict).unwrap_err().contains("http:// or https://"));
        assert!(check("http://a b/", None, &strict).unwrap_err().contains("no valid host"));
        for url in [
            "http://127.0.0.1:8080/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://localhost:9/",
            "http://api.LOCALHOST./",
            "http://169.254.169.254/latest/meta-data/",
        ] {
            let e = check(url, None, &strict).unwrap_err();
            assert!(e.contains("address policy refuses"), "{url}: {e}");
        }
        assert!(check("http://10.0.0.1/", None, &strict).unwrap_err().contains("10.0.0.0/8"));
        assert!(check("http://h/", Some("whsec_x"), &strict).unwrap_err().contains("env:NAME"));
        assert!(check("http://h/", Some("file:rel"), &strict).unwrap_err().contains("absolute"));
        let open = AddressPolicy::allow_all();
        assert!(check("http://127.0.0.1:8080/", None, &open).is_ok());
        let ten = AddressPolicy::new(vec!["10.0.0.0/8".parse().unwrap()]);
        assert!(check("http://10.0.0.1/", None, &ten).is_ok());
        assert!(check("http://127.0.0.1/", None, &ten).is_err());
    }
}
