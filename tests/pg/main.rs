//! Tests against a real PostgreSQL 15 server that the tests start themselves (see harness).

mod endpoint;
mod harness;
mod util;

mod cli;
mod compat;
mod crash;
mod leases;
mod online;
mod ordering;
mod poison;
