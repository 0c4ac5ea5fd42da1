//! The delivery options of `keyorder work` (`--deliver`, `--ca-file`, signing, timeouts) and
//! the deliverer they build. Every mistake the user can fix is a [`BadInput`] saying what.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use keyorder::endpoints::{EndpointRow, SecretRef};
use keyorder::http::{
    EndpointSpec, HttpDeliverer, HttpOptions, Scheme, Signing, SigningKeys, Target, TlsConfig,
};

use super::bad_input::BadInput;
use super::endpoints::PolicyArgs;

/// The environment variable that may hold the signing secret.
pub const SECRET_ENV: &str = "KEYORDER_SIGNING_SECRET";

/// Where and how events are delivered.
#[derive(Debug, Clone, Args)]
pub struct DeliveryArgs {
    /// Where to POST each event: http://host[:port]/path or https://host[:port]/path
    /// (IPv6 as [addr]). Redirects are not followed.
    #[arg(long)]
    pub deliver: String,
    /// PEM file of extra CA certificates trusted for https:// (a private CA), besides the
    /// built-in Mozilla roots.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// File holding the Standard Webhooks signing secrets, one a line, newest first
    /// ("whsec_<base64>", or any other text used as raw bytes; blank lines are skipped). The
    /// secrets may instead be in the KEYORDER_SIGNING_SECRET environment variable, in the same
    /// form; the file wins. With secrets each request carries webhook-id, webhook-timestamp and
    /// webhook-signature, one "v1,<sig>" per secret, space-separated (to rotate: put the new
    /// secret on the first line, remove the old line once every receiver has the new one);
    /// without, no webhook-timestamp or webhook-signature is sent. A row's secret_ref file or
    /// variable takes the same form.
    #[arg(long, value_name = "PATH")]
    pub signing_secret_file: Option<PathBuf>,
    /// How long connecting may take, in ms (TCP, then the TLS handshake, each).
    #[arg(long, default_value_t = 5_000)]
    pub connect_timeout_ms: u64,
    /// The largest reply body accepted, in bytes; a longer reply fails the delivery.
    #[arg(long, default_value_t = keyorder::http::DEFAULT_MAX_REPLY)]
    pub max_reply_bytes: usize,
    /// Which addresses the URLs of the endpoint table may connect to.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

impl DeliveryArgs {
    /// The deliverer these options describe, or what the user must fix.
    pub fn deliverer(&self) -> Result<HttpDeliverer, BadInput> {
        let target = Target::parse(&self.deliver).map_err(|e| BadInput(e.to_string()))?;
        if self.ca_file.is_some() && target.scheme() == Scheme::Http {
            return Err(BadInput(format!(
                "--ca-file applies to https:// only, but --deliver is {target}"
            )));
        }
        let env = std::env::var(SECRET_ENV).ok();
        let key = secret(self.signing_secret_file.as_deref(), env.as_deref())?;
        Ok(HttpDeliverer::with_options(target, self.options(key)?))
    }

    /// The options of every deliverer: TLS roots, timeouts, limit, and `key` to sign with.
    fn options(&self, keys: Option<SigningKeys>) -> Result<HttpOptions, BadInput> {
        let tls = match &self.ca_file {
            None => None,
            Some(path) => Some(
                TlsConfig::with_ca_file(path).map_err(|e| BadInput(format!("--ca-file: {e}")))?,
            ),
        };
        let signing = keys.map(|keys| Signing { keys, unix_time: unix_now });
        Ok(HttpOptions {
            connect_timeout: Duration::from_millis(self.connect_timeout_ms.max(1)),
            max_reply: self.max_reply_bytes,
            tls,
            signing,
            policy: None,
        })
    }

    /// The deliverer of each `keyorder_endpoint` row, with these options, the row's own
    /// secrets (`env:NAME` or `file:PATH`; none: the default secrets) and the address policy
    /// (`--allow-endpoint-network`, `--allow-private-endpoints`), or why the row cannot be
    /// used — then that key's deliveries fail rather than go to the default URL.
    pub fn endpoint_table(&self, rows: &[EndpointRow]) -> EndpointTable {
        let env = std::env::var(SECRET_ENV).ok();
        rows.iter()
            .map(|row| {
                let built = (|| {
                    let target = Target::parse(&row.url).map_err(|e| e.to_string())?;
                    let key = match &row.secret_ref {
                        None => secret(self.signing_secret_file.as_deref(), env.as_deref()),
                        Some(r) => secret_ref(r),
                    }
                    .map_err(|e| e.0)?;
                    let mut options = self.options(key).map_err(|e| e.0)?;
                    options.policy = Some(self.policy.policy());
                    Ok(Arc::new(EndpointSpec { target, options }))
                })();
                (row.key.clone(), built)
            })
            .collect()
    }
}

/// Each key's deliverer, as [`DeliveryArgs::endpoint_table`] builds it.
pub type EndpointTable = BTreeMap<String, Result<Arc<EndpointSpec>, String>>;

/// The signing keys a `secret_ref` names: `env:NAME` or `file:PATH`.
fn secret_ref(reference: &str) -> Result<Option<SigningKeys>, BadInput> {
    match reference.parse::<SecretRef>().map_err(|e| BadInput(e.to_string()))? {
        SecretRef::Env(name) => {
            let value = std::env::var(&name).map_err(|_| {
                BadInput(format!("secret_ref {reference:?}: the environment has no {name}"))
            })?;
            secret(None, Some(&value))
        }
        SecretRef::File(path) => secret(Some(&path), None),
    }
}

/// The signing keys (one a line, newest first) from the secret file, else from the
/// environment's value, else none.
fn secret(file: Option<&Path>, env: Option<&str>) -> Result<Option<SigningKeys>, BadInput> {
    let (text, from) = match (file, env) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                BadInput(format!("cannot read --signing-secret-file {}: {e}", path.display()))
            })?;
            (text, format!("--signing-secret-file {}", path.display()))
        }
        (None, Some(value)) => (value.to_owned(), SECRET_ENV.to_owned()),
        (None, None) => return Ok(None),
    };
    SigningKeys::from_lines(&text).map(Some).map_err(|e| BadInput(format!("{from}: {e}")))
}

/// Unix seconds now, for `webhook-timestamp`.
#[allow(clippy::disallowed_methods)] // the signature's timestamp is wall-clock time by definition
fn unix_now() -> u64 {
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyorder::http::SigningKey;

    fn args(url: &str) -> DeliveryArgs {
        DeliveryArgs {
            deliver: url.into(),
            ca_file: None,
            signing_secret_file: None,
            connect_timeout_ms: 5_000,
            max_reply_bytes: 1 << 20,
            policy: PolicyArgs::default(),
        }
    }

    #[test]
    fn bad_options_say_what_to_fix() {
        let err = |a: DeliveryArgs| a.deliverer().unwrap_err().0;
        assert!(err(args("ftp://h/")).contains("http:// or https://"));
        let ca = |url: &str, path: &str| DeliveryArgs { ca_file: Some(path.into()), ..args(url) };
        assert!(err(ca("http://h/", "x.pem")).contains("https:// only"));
        let missing = err(ca("https://h/", "/nonexistent/ca.pem"));
        assert!(
            missing.starts_with("--ca-file: cannot read CA file /nonexistent/ca.pem"),
            "{missing}"
        );
        assert!(args("https://localhost/").deliverer().is_ok());
    }

    #[test]
    fn secrets_come_from_the_file_first_then_the_environment() {
        let dir = std::env::temp_dir().join(format!("keyorder-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
        let from_file = secret(Some(&file), Some("ignored")).unwrap().unwrap();
        let expected = SigningKey::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(from_file.sign("id", 1, b"x"), expected.sign("id", 1, b"x"), "newline trimmed");
        let raw = secret(None, Some("plain")).unwrap().unwrap();
        assert_eq!(
            raw.sign("id", 1, b"x"),
            SigningKey::from_secret("plain").unwrap().sign("id", 1, b"x")
        );
        assert!(secret(None, None).unwrap().is_none());
        std::fs::write(&file, "\n").unwrap();
        let empty = secret(Some(&file), None).unwrap_err().0;
        assert!(
            empty.contains("--signing-secret-file") && empty.contains("no signing secret"),
            "{empty}"
        );
        std::fs::write(&file, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\nold\n").unwrap();
        let both = secret(Some(&file), None).unwrap().unwrap();
        assert_eq!(both.len(), 2, "one secret a line");
        let old = SigningKey::from_secret("old").unwrap().sign("id", 1, b"x");
        assert_eq!(both.sign("id", 1, b"x"), format!("{} {old}", expected.sign("id", 1, b"x")));
        assert!(secret(Some(&dir.join("none")), None).unwrap_err().0.contains("cannot read"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
