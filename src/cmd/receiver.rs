//! A benchmark receiver: a hyper HTTP/1.1 keep-alive server on 127.0.0.1 (plain, or TLS with
//! the test certificate of `testdata/tls`) that answers `204` to every request and counts them.
//! It runs on its own OS thread with its own runtime, so it does not share the worker's.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use keyorder::http::TlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The test CA (test-only key material, see `testdata/tls/README.md`).
const CA: &[u8] = include_bytes!("../../testdata/tls/ca.pem");
const CERT: &[u8] = include_bytes!("../../testdata/tls/server.pem");
const KEY: &[u8] = include_bytes!("../../testdata/tls/server.key");

/// A running receiver; dropping it stops it.
pub(crate) struct Receiver {
    addr: SocketAddr,
    tls: bool,
    requests: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Starts a receiver on a free loopback port; with `tls`, it speaks HTTPS as `localhost`.
    pub(crate) fn start(tls: bool) -> anyhow::Result<Receiver> {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the receiver")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let acceptor = if tls { Some(acceptor()?) } else { None };
        let requests = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let counter = requests.clone();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name("receiver".into()).spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else { return };
                tokio::select! {
                    biased;
                    _ = stopped => {}
                    () = accept(listener, acceptor, counter) => {}
                }
            })
        })?;
        Ok(Receiver { addr, tls, requests, stop: Some(stop), thread: Some(thread) })
    }

    /// The URL to deliver to: `http://127.0.0.1:port/` or `https://localhost:port/`.
    pub(crate) fn url(&self) -> String {
        match self.tls {
            false => format!("http://{}/hook", self.addr),
            true => format!("https://localhost:{}/hook", self.addr.port()),
        }
    }

    /// Requests answered so far.
    pub(crate) fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// A client TLS configuration trusting the receiver's (test) CA.
    pub(crate) fn client_tls() -> anyhow::Result<TlsConfig> {
        let ca = CertificateDer::from_pem_slice(CA).context("the embedded test CA")?;
        Ok(TlsConfig::new(&[ca])?)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn acceptor() -> anyhow::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_slice_iter(CERT).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(KEY)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

async fn accept(listener: TcpListener, tls: Option<TlsAcceptor>, requests: Arc<AtomicU64>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let (tls, requests) = (tls.clone(), requests.clone());
        tokio::spawn(async move {
            match tls {
                None => serve(TokioIo::new(stream), requests).await,
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        serve(TokioIo::new(stream), requests).await;
                    }
                }
            }
        });
    }
}

async fn serve<I>(io: I, requests: Arc<AtomicU64>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
        let requests = requests.clone();
        async move {
            // Read the body, as a real endpoint would, before answering.
            req.into_body().collect().await?;
            requests.fetch_add(1, Ordering::Relaxed);
            let mut reply = Response::new(Empty::<Bytes>::new());
            *reply.status_mut() = hyper::StatusCode::NO_CONTENT;
            Ok::<_, hyper::Error>(reply)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
}
