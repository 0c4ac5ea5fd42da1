//! Per-key delivery targets: a webhook platform delivers each subscription to its own URL.
//! The store's `keyorder_endpoint(partition_key, url, secret_ref)` table says where a key's
//! events go; a key without a row goes to the worker's default (`--deliver`).
//!
//! A [`Directory`] is the table as last loaded, shared by every deliverer of a process and
//! replaced whole by whoever reloads it, so a delivery sees one consistent version.

use std::collections::BTreeMap;
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
