//! Tests against a real PostgreSQL 15 server that the tests start themselves (see harness).

#[path = "../skip/mod.rs"]
mod skip;

mod bouncer;
#[path = "../conformance/mod.rs"]
mod conformance;
mod endpoint;
mod harness;
mod policy_case;
mod util;

mod address_policy;
mod admin_locks;
mod cli;
mod compat;
mod conformance_pg;
mod crash;
mod failover;
mod leases;
mod liveness;
mod metrics;
mod online;
mod ordering;
mod poison;
mod pooler;
mod routing;
