//! Tests of the SQLite store: the command line on real files (bad input is exit 2 and leaves the
//! file untouched), the store conformance suite, and two worker processes on one file with one
//! of them stopped past its lease expiry.

#[path = "../skip/mod.rs"]
mod skip;

#[path = "../pg/endpoint.rs"]
mod endpoint;

#[path = "../pg/policy_case.rs"]
mod policy_case;

#[path = "../conformance/mod.rs"]
mod conformance;

mod address_policy;
mod check;
mod cli;
mod durability;
mod endpoints;
mod fixture;
mod lease_clock;
mod logs;
mod metrics;
mod routing;
mod sigstop;
mod skips;
mod stopped_writer;
mod threads;
