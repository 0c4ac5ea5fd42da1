//! The simulated hosts. Each is a factory (`Fn() -> Future`), so the simulator can restart it; state
//! that must survive a restart is passed in from outside the factory.

pub mod endpoint;
pub mod producer;
pub mod store;
pub mod worker;
