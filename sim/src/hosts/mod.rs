//! The simulated hosts. Each is a factory (`Fn() -> Future`), so the simulator can restart it; state
//! that must survive a restart is passed in from outside the factory.

pub mod clock;
pub mod deliverer;
pub mod endpoint;
pub mod producer;
pub mod store;
pub mod store_client;
pub mod worker;

use std::cell::RefCell;
use std::rc::Rc;

use turmoil_net::shim::tokio::net::TcpListener;

/// A server's listening socket, held outside its process (as a supervisor or the
/// postmaster holds it): bound at the first start and kept across crashes and restarts, so a
/// restart needs no rebind while connections of the dead process are still closing. A
/// connection made while the server is down is accepted by the kernel and waits in the
/// backlog until the next start takes it.
#[derive(Clone, Default)]
pub struct HeldListener(Rc<RefCell<Option<Rc<TcpListener>>>>);

impl HeldListener {
    /// The socket listening on `port` of every address of the current host, bound on the
    /// first call.
    pub async fn get(&self, port: u16) -> std::io::Result<Rc<TcpListener>> {
        if let Some(l) = self.0.borrow().as_ref() {
            return Ok(l.clone());
        }
        let bound = Rc::new(TcpListener::bind(("0.0.0.0", port)).await?);
        *self.0.borrow_mut() = Some(bound.clone());
        Ok(bound)
    }
}
