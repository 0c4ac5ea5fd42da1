//! keyorder: per-key ordered, partitioned webhook delivery that can be proven.
//!
//! **The sans-IO contract.** The core of this crate ([`routing`], [`drain`], [`retry`],
//! [`lease`], [`check`]) is fully deterministic: it does no networking or storage IO, never
//! reads a clock (time is passed in as [`Time`]) and never draws from a global random source
//! (jitter comes from a generator seeded by the caller). The same inputs give the same
//! outputs, which is what lets the simulation replay any run from its seed.
//!
//! **The ordering contract.** Events with equal [`partition_key`]s are delivered in enqueue
//! order; nothing else is ordered. A key is routed by
//! `u64::from_be_bytes(BLAKE2b(key, digest_size = 8)) % count`, byte-for-byte the reference
//! Python routing. A partition has one reader (a lease), one delivery in flight, and a bounded
//! number of attempts at its head before the head is dead-lettered.
//!
//! The drivers (the async worker, the PostgreSQL and SQLite stores, the simulation) feed the
//! machines inputs and carry out their actions; see [`drain::Drain`] for the call order.

// The store conformance suite (tests/conformance) names this crate `keyorder`; the worker's unit
// tests run it against their in-memory store.
#[cfg(test)]
extern crate self as keyorder;

pub mod address_policy;
pub mod check;
pub mod clock;
pub mod deliver;
pub mod drain;
pub mod endpoints;
pub mod html;
pub mod http;
mod ids;
pub mod key;
pub mod layout;
pub mod lease;
pub mod liveness;
pub mod metrics;
pub mod plan;
pub mod repartition;
pub mod retry;
pub mod routing;
pub mod store;
pub mod worker;

pub use ids::{Epoch, PartitionId, Seq, Time};
pub use key::{partition_key, Event, KeyError};
pub use routing::{partition_for, route_many, Overrides, PartitionCount, Router, RoutingError};

/// The Rust examples of the README and the guide, compiled and run by `cargo test` as
/// doctests, so that they keep compiling against this crate.
#[cfg(doctest)]
pub mod doc_examples {
    #[doc = include_str!("../README.md")]
    pub struct Readme;

    #[doc = include_str!("../docs/guide/producing.md")]
    pub struct Producing;
}
