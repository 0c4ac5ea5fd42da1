//! Simulation tests, one binary: determinism, sweeps that must pass,
//! the broken-design catalogue, saved regressions, trace snapshots, and the store conformance
//! suite on the simulated store.

// Tests that cannot run here are reported as not run (tests/skip), shared by path.
#[path = "../../../tests/skip/mod.rs"]
mod skip;

// The store conformance suite every store runs (tests/sqlite, tests/pg), shared by path.
#[path = "../../../tests/conformance/mod.rs"]
mod conformance_suite;

mod catalogue;
mod conformance;
mod determinism;
mod fixtures;
mod html;
mod parking;
mod regressions;
mod rehearsal;
mod shards;
mod snapshots;
mod sweeps;
