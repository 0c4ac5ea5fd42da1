//! The connector seam: how a deliverer resolves a target's host name and opens a byte stream
//! to one of its addresses. Production uses [`TcpConnector`] (the system resolver and tokio's
//! TCP); the simulation plugs in its own network, so every simulated delivery runs the rest of
//! [`super::HttpDeliverer`] (the address policy, TLS, hyper, the reuse and resend rules)
//! unchanged.

use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite};

/// Resolves names and opens connections for a deliverer. Each call stands alone: a connector
/// keeps no connection of its own.
pub trait Connector: Clone + Debug + 'static {
    /// A connected byte stream.
    type Stream: AsyncRead + AsyncWrite + Unpin + 'static;

    /// Every address `host` resolves to, with `port`, in the resolver's order.
    fn resolve(
        &self,
        host: &str,
        port: u16,
    ) -> impl Future<Output = std::io::Result<Vec<SocketAddr>>>;

    /// A stream connected to `addr`, with Nagle's algorithm off where the stream has one.
    fn connect(&self, addr: SocketAddr) -> impl Future<Output = std::io::Result<Self::Stream>>;
}

/// The operating system's resolver and TCP, through tokio.
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    type Stream = tokio::net::TcpStream;

    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }

    async fn connect(&self, addr: SocketAddr) -> std::io::Result<Self::Stream> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        Ok(tcp)
    }
}
