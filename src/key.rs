//! The key contract: which events are ordered relative to each other.
//!
//! Events with equal [`partition_key`]s are delivered in enqueue order; nothing else is
//! ordered. Changing [`partition_key`] changes the guarantee, which is why it is one named
//! function: "are these two events ordered?" is settled by comparing its two results.

use serde::{Deserialize, Serialize};

/// Errors of event validation: an event that could not be keyed or identified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The partition key (the subscription id) is empty, so the event has no ordering scope.
    #[error("event {event_id:?} has an empty subscription id, so it has no partition key")]
    EmptyKey {
        /// The event's id.
        event_id: String,
    },
    /// The event id is empty; the queue's `event_id` column is the idempotency key.
    #[error("an event has an empty event id (subscription {subscription_id:?}); every event needs a unique id")]
    EmptyEventId {
        /// The event's subscription, to help find it.
        subscription_id: String,
    },
}

/// A webhook event as producers hand it over (the reference design's `Event`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Unique id of the event; the queue refuses a second row with the same id.
    pub event_id: String,
    /// The tenant that owns the subscription.
    #[serde(default)]
    pub tenant_id: String,
    /// One endpoint of one tenant: the default ordering scope.
    pub subscription_id: String,
    /// The resource the event is about.
    #[serde(default)]
    pub resource_id: String,
    /// The body delivered to the endpoint.
    #[serde(default)]
    pub payload: serde_json::Value,
}

impl Event {
    /// Checks that the event can be keyed and identified.
    pub fn validate(&self) -> Result<(), KeyError> {
        if self.event_id.is_empty() {
            return Err(KeyError::EmptyEventId { subscription_id: self.subscription_id.clone() });
        }
        if self.subscription_id.is_empty() {
            return Err(KeyError::EmptyKey { event_id: self.event_id.clone() });
        }
        Ok(())
    }
}

/// The ordering contract, expressed as a key: the subscription id.
///
/// All events of one subscription are ordered relative to each other; nothing is ordered
/// across subscriptions. Refuses an event whose key or id is empty.
pub fn partition_key(event: &Event) -> Result<&str, KeyError> {
    event.validate()?;
    Ok(&event.subscription_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, sub: &str) -> Event {
        Event {
            event_id: id.into(),
            tenant_id: "acme".into(),
            subscription_id: sub.into(),
            resource_id: "order_1".into(),
            payload: serde_json::json!({"n": 1}),
        }
    }

    #[test]
    fn the_key_is_the_subscription() {
        assert_eq!(partition_key(&event("evt_1", "sub_42")), Ok("sub_42"));
    }

    #[test]
    fn empty_key_and_empty_id_are_refused() {
        assert_eq!(
            partition_key(&event("evt_1", "")),
            Err(KeyError::EmptyKey { event_id: "evt_1".into() })
        );
        let err = partition_key(&event("", "sub_1")).unwrap_err();
        assert!(err.to_string().contains("empty event id"), "{err}");
    }
}
