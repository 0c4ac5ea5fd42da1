//! Per-key endpoints: deliver each key to its own URL when the endpoint table has a row for it,
//! and to the default target otherwise. Each partition's clone keeps a keep-alive connection
//! for each of the [`MAX_KEPT_TARGETS`] targets it used last, and drops those whose URL the
//! table no longer has; the table is shared ([`EndpointDirectory`]) and may be replaced at any
//! time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{HttpDeliverer, HttpOptions, Target};
use crate::deliver::{Deliver, DeliverError};
use crate::drain::Head;
use crate::endpoints::Directory;
use crate::ids::PartitionId;

/// Where one key's events go and how: the row's target with the options (TLS, secret) built
/// for it.
#[derive(Clone, Debug)]
pub struct EndpointSpec {
    /// The row's URL.
    pub target: Target,
    /// Its options; the signing key is the row's own secret, or the default one.
    pub options: HttpOptions,
}

/// Each key's endpoint, or why its row cannot be used.
pub type EndpointDirectory = Directory<Result<Arc<EndpointSpec>, String>>;

/// One loaded version of the endpoint table, as [`EndpointDirectory::snapshot`] returns it.
type Table = BTreeMap<String, Result<Arc<EndpointSpec>, String>>;

/// The most per-key targets one partition's deliverer keeps a connection to. A partition
/// delivers one event at a time, so more connections than its recent keys' URLs serve
/// nothing; with thousands of keys each on its own URL an unbounded map would hold a socket
/// per URL per partition for good. The least recently used one is dropped first.
pub const MAX_KEPT_TARGETS: usize = 16;

/// One target's deliverer (and connection), with the row it was made from.
#[derive(Debug)]
struct Kept {
    spec: Arc<EndpointSpec>,
    deliverer: HttpDeliverer,
    /// When it was last used, in this clone's deliveries (no clock: a counter).
    used: u64,
}

/// Delivers a key to its row's target, other keys to the default. A key whose row is
/// misconfigured fails with [`DeliverError::Misconfigured`]: never delivered elsewhere.
#[derive(Debug)]
pub struct RoutedDeliverer {
    default: HttpDeliverer,
    directory: EndpointDirectory,
    /// This clone's deliverer (and connection) per target URL, made on first use from the
    /// row's spec; a reload that brings a new spec replaces it. At most [`MAX_KEPT_TARGETS`].
    own: BTreeMap<String, Kept>,
    /// The table `own` was last pruned against.
    pruned: Option<Arc<Table>>,
    /// Deliveries to a per-key target so far: the clock of `Kept::used`.
    uses: u64,
}

impl RoutedDeliverer {
    /// Keys with a row in `directory` go there; the rest to `default`.
    pub fn new(default: HttpDeliverer, directory: EndpointDirectory) -> Self {
        Self { default, directory, own: BTreeMap::new(), pruned: None, uses: 0 }
    }

    /// The target URLs this clone keeps a deliverer (and connection) for, in URL order.
    pub fn kept_targets(&self) -> Vec<String> {
        self.own.keys().cloned().collect()
    }

    /// Drops the deliverers of URLs that `table` no longer has (a reload removed their rows).
    fn prune(&mut self, table: &Table) {
        let live: BTreeSet<String> = table
            .values()
            .filter_map(|row| row.as_ref().ok())
            .map(|s| s.target.to_string())
            .collect();
        self.own.retain(|url, _| live.contains(url));
    }

    /// The deliverer of `spec`'s URL: kept, remade when the row changed, or made (dropping the
    /// least recently used one when [`MAX_KEPT_TARGETS`] are kept).
    fn target(&mut self, spec: &Arc<EndpointSpec>) -> &mut HttpDeliverer {
        self.uses += 1;
        let url = spec.target.to_string();
        if !self.own.contains_key(&url) && self.own.len() >= MAX_KEPT_TARGETS {
            let oldest = self.own.iter().min_by_key(|(_, k)| k.used).map(|(u, _)| u.clone());
            if let Some(oldest) = oldest {
                self.own.remove(&oldest);
            }
        }
        let made = || HttpDeliverer::with_options(spec.target.clone(), spec.options.clone());
        let kept = self.own.entry(url).or_insert_with(|| Kept {
            spec: spec.clone(),
            deliverer: made(),
            used: 0,
        });
        if !Arc::ptr_eq(&kept.spec, spec) {
            *kept = Kept { spec: spec.clone(), deliverer: made(), used: 0 };
        }
        kept.used = self.uses;
        &mut kept.deliverer
    }
}

impl Clone for RoutedDeliverer {
    fn clone(&self) -> Self {
        Self::new(self.default.clone(), self.directory.clone())
    }
}

impl Deliver for RoutedDeliverer {
    async fn deliver(
        &mut self,
        partition: PartitionId,
        head: &Head,
        attempt: u32,
    ) -> Result<(), DeliverError> {
        let table = self.directory.snapshot();
        if !self.pruned.as_ref().is_some_and(|p| Arc::ptr_eq(p, &table)) {
            self.prune(&table);
            self.pruned = Some(table.clone());
        }
        match table.get(&head.key).cloned() {
            None => self.default.deliver(partition, head, attempt).await,
            Some(Err(reason)) => Err(DeliverError::Misconfigured { key: head.key.clone(), reason }),
            // One deliverer per URL, with the configuration (secret, TLS) of the row as loaded
            // now: after a reload the next delivery uses the new one.
            Some(Ok(spec)) => self.target(&spec).deliver(partition, head, attempt).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Seq;

    /// A loopback port with nothing listening: every delivery is refused at once.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener.local_addr().expect("bound").port()
    }

    fn spec(port: u16, path: &str) -> Result<Arc<EndpointSpec>, String> {
        let target = Target::parse(&format!("http://127.0.0.1:{port}/{path}")).expect("a URL");
        Ok(Arc::new(EndpointSpec { target, options: HttpOptions::default() }))
    }

    fn head(key: &str) -> Head {
        Head {
            seq: Seq(1),
            event_id: "e1".into(),
            key: key.into(),
            payload: "{}".into(),
            attempts: 0,
            not_before: None,
            last_error: None,
        }
    }

    fn deliverer(port: u16, directory: &EndpointDirectory) -> RoutedDeliverer {
        let default = Target::parse(&format!("http://127.0.0.1:{port}/default")).expect("a URL");
        RoutedDeliverer::new(HttpDeliverer::new(default), directory.clone())
    }

    #[tokio::test]
    async fn at_most_max_kept_targets_are_kept_the_least_recently_used_dropped_first() {
        let port = closed_port();
        let directory = EndpointDirectory::default();
        let keys: Vec<String> = (0..MAX_KEPT_TARGETS + 4).map(|i| format!("k{i:02}")).collect();
        directory.replace(keys.iter().map(|k| (k.clone(), spec(port, k))).collect());
        let mut routed = deliverer(port, &directory);
        for k in &keys {
            // Refused (nothing listens): the deliverer is kept all the same.
            assert!(routed.deliver(PartitionId(0), &head(k), 1).await.is_err());
            // k00 stays the most recently used one.
            assert!(routed.deliver(PartitionId(0), &head("k00"), 1).await.is_err());
        }
        let kept = routed.kept_targets();
        assert_eq!(kept.len(), MAX_KEPT_TARGETS, "{kept:?}");
        let url = |k: &str| format!("http://127.0.0.1:{port}/{k}");
        assert!(kept.contains(&url("k00")), "the most used is kept: {kept:?}");
        let newest: Vec<String> =
            keys[keys.len() - (MAX_KEPT_TARGETS - 1)..].iter().map(|k| url(k)).collect();
        assert!(newest.iter().all(|u| kept.contains(u)), "the newest are kept: {kept:?}");
    }

    #[tokio::test]
    async fn a_target_whose_row_is_gone_is_dropped_at_the_next_delivery() {
        let port = closed_port();
        let directory = EndpointDirectory::default();
        let rows = |keys: &[&str]| keys.iter().map(|k| (k.to_string(), spec(port, k))).collect();
        directory.replace(rows(&["a", "b"]));
        let mut routed = deliverer(port, &directory);
        for k in ["a", "b"] {
            assert!(routed.deliver(PartitionId(0), &head(k), 1).await.is_err());
        }
        assert_eq!(routed.kept_targets().len(), 2);
        directory.replace(rows(&["a"]));
        // A key without a row goes to the default: the table is pruned all the same.
        assert!(routed.deliver(PartitionId(0), &head("c"), 1).await.is_err());
        assert_eq!(routed.kept_targets(), vec![format!("http://127.0.0.1:{port}/a")]);
    }
}
