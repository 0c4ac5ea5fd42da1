//! keyorder-sim: deterministic simulation of keyorder's delivery design.
//!
//! A run is a pure function of (scenario, seed): simulated hosts on one executor (a store with
//! PostgreSQL's lease and visibility semantics, the production worker loop, endpoints,
//! producers; [`simulator`]), faults applied by the driver between runs of the hosts, and the
//! checker's verdict on the recorded history. No wall clock, thread or hash-map order reaches the
//! run; the trace hash proves it. [`rehearsal`] runs an operator's repartition plan the same way.
#![forbid(unsafe_code)]

pub mod breaks;
pub mod control;
pub mod faults;
mod generate;
pub mod hosts;
pub mod model;
pub(crate) mod protocol;
pub mod regression;
pub mod rehearsal;
pub mod run;
pub mod scenario;
pub mod shrink;
pub mod simulator;
pub mod sweep;
pub mod trace;
mod triggers;

pub use breaks::Break;
pub use run::{run, RunError, RunOutcome};
pub use scenario::{Scenario, Size};
