//! Per-key delivery targets: a webhook platform delivers each subscription to its own URL.
//! The store's `keyorder_endpoint(partition_key, url, secret_ref)` table says where a key's
//! events go; a key without a row goes to the worker's default (`--deliver`).
//!
//! A [`Directory`] is the table as last loaded, shared by every deliverer of a process and
//! replaced whole by whoever reloads it, so a delivery sees one consistent version.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

/// One row of the endpoint table.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct EndpointRow {
    /// The partition key (subscription) it applies to.
    pub key: String,
    /// Where that key's events are POSTed.
    pub url: String,
    /// Where its signing secret is (`env:NAME` or `file:PATH`); `None`: the default secret.
    pub secret_ref: Option<String>,
}

/// Where a row's signing secrets are: never the secrets themselves, so the table can be read
/// (and printed) without exposing them. The variable's value or the file's text holds one
/// secret a line, newest first (see [`crate::http::SigningKeys::from_lines`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretRef {
    /// `env:NAME`: the environment variable `NAME` of the worker (letters, digits and `_`,
    /// not starting with a digit).
    Env(String),
    /// `file:PATH`: the file at an absolute `PATH` on the worker's machine, re-read at every
    /// reload of the table (so a secret rotates by editing the file).
    File(PathBuf),
}

/// Why a `secret_ref` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretRefError {
    /// Neither `env:` nor `file:`.
    #[error("secret reference {text:?} is neither env:NAME nor file:PATH (the secret itself never goes in the table)")]
    Form {
        /// The reference as given.
        text: String,
    },
    /// `env:` with an empty or unusual variable name.
    #[error("secret reference {text:?}: the variable name must be letters, digits and _ (not starting with a digit)")]
    EnvName {
        /// The reference as given.
        text: String,
    },
    /// `file:` with a relative or empty path: the worker's working folder is not the writer's.
    #[error("secret reference {text:?}: the path must be absolute (file:/etc/keyorder/secret)")]
    Path {
        /// The reference as given.
        text: String,
    },
}

impl FromStr for SecretRef {
    type Err = SecretRefError;

    fn from_str(text: &str) -> Result<Self, SecretRefError> {
        let owned = || text.to_owned();
        if let Some(name) = text.strip_prefix("env:") {
            let mut chars = name.chars();
            let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
            if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(SecretRefError::EnvName { text: owned() });
            }
            Ok(Self::Env(name.to_owned()))
        } else if let Some(path) = text.strip_prefix("file:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(SecretRefError::Path { text: owned() });
            }
            Ok(Self::File(path))
        } else {
            Err(SecretRefError::Form { text: owned() })
        }
    }
}

/// The per-key targets in force, of any resolved form `T`. Cheap to clone; clones share.
#[derive(Debug)]
pub struct Directory<T> {
    map: Arc<RwLock<Arc<BTreeMap<String, T>>>>,
}

impl<T> Clone for Directory<T> {
    fn clone(&self) -> Self {
        Self { map: self.map.clone() }
    }
}

impl<T> Default for Directory<T> {
    fn default() -> Self {
        Self { map: Arc::new(RwLock::new(Arc::new(BTreeMap::new()))) }
    }
}

impl<T> Directory<T> {
    /// The target of `key`, if the table has one.
    pub fn get(&self, key: &str) -> Option<T>
    where
        T: Clone,
    {
        self.snapshot().get(key).cloned()
    }

    /// The whole table as loaded last.
    pub fn snapshot(&self) -> Arc<BTreeMap<String, T>> {
        // A writer never panics while holding the lock (it only swaps an Arc), so a poisoned
        // lock still holds a whole table.
        match self.map.read() {
            Ok(m) => m.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the table; deliveries started before keep the version they read.
    pub fn replace(&self, table: BTreeMap<String, T>) {
        let table = Arc::new(table);
        match self.map.write() {
            Ok(mut m) => *m = table,
            Err(poisoned) => *poisoned.into_inner() = table,
        }
    }

    /// Keys with a target of their own.
    pub fn len(&self) -> usize {
        self.snapshot().len()
    }

    /// Whether no key has a target of its own.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_references_name_a_variable_or_an_absolute_file() {
        let ok = |t: &str| t.parse::<SecretRef>().unwrap();
        assert_eq!(ok("env:HOOK_SECRET_2"), SecretRef::Env("HOOK_SECRET_2".into()));
        assert_eq!(ok("env:_x"), SecretRef::Env("_x".into()));
        assert_eq!(ok("file:/etc/k/s"), SecretRef::File("/etc/k/s".into()));
        let err = |t: &str| t.parse::<SecretRef>().unwrap_err();
        assert!(matches!(err("whsec_abc"), SecretRefError::Form { .. }));
        assert!(matches!(err("ENV:X"), SecretRefError::Form { .. }));
        assert!(matches!(err("env:"), SecretRefError::EnvName { .. }));
        assert!(matches!(err("env:1X"), SecretRefError::EnvName { .. }));
        assert!(matches!(err("env:A-B"), SecretRefError::EnvName { .. }));
        assert!(matches!(err("file:"), SecretRefError::Path { .. }));
        assert!(matches!(err("file:secret.txt"), SecretRefError::Path { .. }));
        assert!(err("whsec_abc").to_string().contains("never goes in the table"));
    }

    #[test]
    fn clones_share_the_table_and_a_reload_replaces_it_whole() {
        let d: Directory<String> = Directory::default();
        let seen_by_a_deliverer = d.clone();
        assert_eq!(seen_by_a_deliverer.get("sub_1"), None);
        d.replace(BTreeMap::from([("sub_1".to_owned(), "https://a/hook".to_owned())]));
        assert_eq!(seen_by_a_deliverer.get("sub_1").as_deref(), Some("https://a/hook"));
        let before = seen_by_a_deliverer.snapshot();
        d.replace(BTreeMap::from([("sub_2".to_owned(), "https://b/hook".to_owned())]));
        assert_eq!(seen_by_a_deliverer.get("sub_1"), None, "the old row is gone after a reload");
        assert_eq!(before.get("sub_1").map(String::as_str), Some("https://a/hook"));
        assert_eq!(d.len(), 1);
    }
}
