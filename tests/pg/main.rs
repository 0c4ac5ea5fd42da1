//! Tests against a real PostgreSQL 15 server that the tests start themselves (see harness).

mod endpoint;
#[path = "../conformance/mod.rs"]
mod conformance;
mod harness;
mod util;

mod cli;
mod compat;
mod conformance_pg;
mod crash;
mod leases;
mod online;
mod ordering;
mod poison;
