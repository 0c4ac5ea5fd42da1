//! The simulated hosts. Each is a factory (`Fn() -> Future`), so the simulator can restart it; state
//! that must survive a restart is passed in from outside the factory.

pub mod deliverer;
pub mod endpoint;
pub mod producer;
pub mod store;
pub mod store_client;
pub mod worker;

use std::time::Duration;

use turmoil_net::shim::tokio::net::TcpListener;

/// How long a restarted server waits for its port to come free before it gives up.
const BIND_PATIENCE: Duration = Duration::from_secs(600);

/// Listens on `port` of every address of the current host. turmoil-net has no
/// `SO_REUSEADDR`, so a restarted server's port stays taken while connections of its previous
/// process are still closing; it waits for them, retrying every millisecond, as a server
/// without that option must.
pub(crate) async fn listen(port: u16) -> std::io::Result<TcpListener> {
    let mut waited = Duration::ZERO;
    loop {
        match TcpListener::bind(("0.0.0.0", port)).await {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && waited < BIND_PATIENCE => {
                tokio::time::sleep(Duration::from_millis(1)).await;
                waited += Duration::from_millis(1);
            }
            other => return other,
        }
    }
}
