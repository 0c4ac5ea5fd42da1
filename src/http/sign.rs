//! Standard Webhooks signatures: `webhook-signature: v1,<base64(HMAC-SHA256(key,
//! "{id}.{timestamp}.{body}"))>`, so a receiver's existing Standard Webhooks (or Svix)
//! library verifies what keyorder sends.

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
}

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

/// Signing of requests: the key, and the wall clock that stamps `webhook-timestamp`.
///
/// The clock is injected (the binary reads the system time; tests pass a fixed one) because
/// the library reads no clock of its own.
#[derive(Clone, Debug)]
pub struct Signing {
    /// The HMAC key.
    pub key: SigningKey,
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
}
