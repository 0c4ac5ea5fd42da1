//! Per-key endpoints: deliver each key to its own URL when the endpoint table has a row for it,
//! and to the default target otherwise. Each partition's clone keeps one connection per target
//! it has used; the table is shared ([`EndpointDirectory`]) and may be replaced at any time.

use std::collections::BTreeMap;
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

/// Delivers a key to its row's target, other keys to the default. A key whose row is
/// misconfigured fails with [`DeliverError::Misconfigured`]: never delivered elsewhere.
#[derive(Debug)]
pub struct RoutedDeliverer {
    default: HttpDeliverer,
    directory: EndpointDirectory,
    /// This clone's deliverer (and connection) per target URL, made on first use from the
    /// prototype beside it; a reload that brings a new prototype replaces it.
    own: BTreeMap<String, (Arc<EndpointSpec>, HttpDeliverer)>,
}

impl RoutedDeliverer {
    /// Keys with a row in `directory` go there; the rest to `default`.
    pub fn new(default: HttpDeliverer, directory: EndpointDirectory) -> Self {
        Self { default, directory, own: BTreeMap::new() }
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
        match self.directory.get(&head.key) {
            None => self.default.deliver(partition, head, attempt).await,
            Some(Err(reason)) => Err(DeliverError::Misconfigured { key: head.key.clone(), reason }),
            Some(Ok(spec)) => {
                // One deliverer per URL, with the configuration (secret, TLS) of the row as
                // loaded now: after a reload the next delivery uses the new one.
                let made =
                    || HttpDeliverer::with_options(spec.target.clone(), spec.options.clone());
                let entry = self
                    .own
                    .entry(spec.target.to_string())
                    .or_insert_with(|| (spec.clone(), made()));
                if !Arc::ptr_eq(&entry.0, &spec) {
                    *entry = (spec.clone(), made());
                }
                entry.1.deliver(partition, head, attempt).await
            }
        }
    }
}
