//! Simulation tests, one binary (as turmoil's own tests): determinism, sweeps that must pass,
//! saved regressions, and trace snapshots.

mod catalogue;
mod determinism;
mod fixtures;
mod html;
mod plan;
mod regressions;
mod snapshots;
mod sweeps;
