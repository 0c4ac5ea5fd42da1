//! Standard Webhooks signatures: `webhook-signature: v1,<base64(HMAC-SHA256(key,
//! "{id}.{timestamp}.{body}"))>`, so a receiver's existing Standard Webhooks (or Svix)
//! library verifies what keyorder sends.
//!
//! Rotation: [`SigningKeys`] holds several secrets, newest first, and a request carries one
//! `v1,` signature per secret in the one header, space-separated (as the Standard Webhooks
//! specification allows), so a receiver holding either the old or the new secret accepts it.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Why a signing secret was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The secret (or its part after `whsec_`) is empty.
    #[error("the signing secret is empty")]
    Empty,
    /// The part after `whsec_` is not base64.
    #[error("the signing secret starts with whsec_ but the rest is not valid base64")]
    Base64(#[source] base64::DecodeError),
    /// No line holds a secret (only blank lines).
    #[error("no signing secret (only blank lines)")]
    NoSecret,
    /// More secrets than a request carries signatures for.
    #[error("{count} signing secrets, more than the {max} a request carries (keep the newest, one a line)")]
    TooMany {
        /// The number of secrets given.
        count: usize,
        /// [`MAX_SECRETS`].
        max: usize,
    },
    /// A line (1-based) of a list of secrets was refused.
    #[error("line {line}: {source}")]
    Line {
        /// The line, counting from 1.
        line: usize,
        /// Why.
        #[source]
        source: Box<SecretError>,
    },
}

/// The most secrets one request is signed with (each adds a 47-byte signature to the header):
/// a rotation needs two; a few more cover overlapping rotations.
pub const MAX_SECRETS: usize = 8;

/// The HMAC key requests are signed with. Its `Debug` does not show the key.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey({} bytes)", self.0.len())
    }
}

impl SigningKey {
    /// The key of `secret`: base64-decoded after a `whsec_` prefix (the Standard Webhooks
    /// form), otherwise the secret's raw bytes. Refuses an empty key.
    pub fn from_secret(secret: &str) -> Result<Self, SecretError> {
        let key = match secret.strip_prefix("whsec_") {
            Some(encoded) => STANDARD.decode(encoded).map_err(SecretError::Base64)?,
            None => secret.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self(key))
    }

    /// The `webhook-signature` value of message `id` sent at `timestamp` (unix seconds) with
    /// `body`, byte for byte as sent: `v1,` and the base64 of the HMAC-SHA256.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        // HMAC takes keys of any length: `new_from_slice` cannot fail for it.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.0) else {
            unreachable!("HMAC accepts any key length")
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The secrets requests are signed with, newest first: never empty, at most [`MAX_SECRETS`].
/// Its `Debug` does not show them.
#[derive(Clone, Debug)]
pub struct SigningKeys(Vec<SigningKey>);

impl From<SigningKey> for SigningKeys {
    fn from(key: SigningKey) -> Self {
        Self(vec![key])
    }
}

impl SigningKeys {
    /// The secrets of `text`, one a line, newest first: each line as [`SigningKey::from_secret`]
    /// reads it (a trailing `\r` dropped, nothing else trimmed, since a raw secret may contain
    /// spaces); blank lines are skipped. Refuses a text with no secret, a bad line (naming
    /// it), or more than [`MAX_SECRETS`].
    pub fn from_lines(text: &str) -> Result<Self, SecretError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim().is_empty() {
                continue;
            }
            let key = SigningKey::from_secret(line)
                .map_err(|e| SecretError::Line { line: i + 1, source: Box::new(e) })?;
            keys.push(key);
        }
        match keys.len() {
            0 => Err(SecretError::NoSecret),
            n if n > MAX_SECRETS => Err(SecretError::TooMany { count: n, max: MAX_SECRETS }),
            _ => Ok(Self(keys)),
        }
    }

    /// How many secrets (at least 1).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always `false`: there is at least one secret.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `webhook-signature` value: one `v1,<base64>` per secret, newest first, separated by
    /// single spaces (see [`SigningKey::sign`]).
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let signatures: Vec<String> = self.0.iter().map(|k| k.sign(id, timestamp, body)).collect();
        signatures.join(" ")
    }
}

/// Signing of requests: the keys, and the wall clock that stamps `webhook-timestamp`.
///
/// The clock is injected (the binary reads the system time; tests pass a fixed one) because
/// the library reads no clock of its own.
#[derive(Clone, Debug)]
pub struct Signing {
    /// The HMAC keys, newest first: one signature each.
    pub keys: SigningKeys,
    /// The current time in unix seconds.
    pub unix_time: fn() -> u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector published with the Standard Webhooks specification (and the Svix libraries'
    /// tests): reproducing it means receivers' libraries accept our signatures.
    #[test]
    fn the_standard_webhooks_test_vector_reproduces() {
        let key = SigningKey::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signature =
            key.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, br#"{"test": 2432232314}"#);
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let other =
            key.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_331, br#"{"test": 2432232314}"#);
        assert_ne!(other, signature, "the timestamp is signed");
    }

    #[test]
    fn secrets_without_the_prefix_are_raw_bytes() {
        let raw = SigningKey::from_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(raw.0, b"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        assert!(matches!(SigningKey::from_secret(""), Err(SecretError::Empty)));
        assert!(matches!(SigningKey::from_secret("whsec_"), Err(SecretError::Empty)));
        assert!(matches!(
            SigningKey::from_secret("whsec_not base64!"),
            Err(SecretError::Base64(_))
        ));
        assert_eq!(format!("{raw:?}"), "SigningKey(32 bytes)");
    }

    #[test]
    fn a_list_of_secrets_signs_with_each_newest_first() {
        let (new, old) = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "old secret with spaces");
        let keys = SigningKeys::from_lines(&format!("\n{new}\r\n\n{old}\n")).unwrap();
        assert_eq!(keys.len(), 2);
        let one = |s: &str| SigningKey::from_secret(s).unwrap().sign("id", 7, b"x");
        assert_eq!(keys.sign("id", 7, b"x"), format!("{} {}", one(new), one(old)));
        let single = SigningKeys::from(SigningKey::from_secret(old).unwrap());
        assert_eq!(single.sign("id", 7, b"x"), one(old), "one secret: one signature, no space");
        assert!(matches!(SigningKeys::from_lines(" \n\n"), Err(SecretError::NoSecret)));
        let bad = SigningKeys::from_lines("a\nwhsec_!!\n").unwrap_err();
        assert_eq!(
            bad.to_string(),
            "line 2: the signing secret starts with whsec_ but the rest is not valid base64"
        );
        let many = "s\n".repeat(MAX_SECRETS + 1);
        assert!(matches!(
            SigningKeys::from_lines(&many),
            Err(SecretError::TooMany { count: 9, .. })
        ));
        assert!(SigningKeys::from_lines(&"s\n".repeat(MAX_SECRETS)).is_ok());
    }
}
