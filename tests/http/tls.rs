//! `https://` with the test CA of `testdata/tls` (see its gen.sh): trusted through a CA file it
//! works; without that CA the failure names the TLS reason.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use keyorder::deliver::DeliverError;
use keyorder::http::{HttpOptions, TlsConfig, TlsError};
use keyorder::worker::chain;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::server::{deliver, deliverer, serve_hyper, Counts};

fn tls_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tls").join(name)
}

/// An HTTPS server with the test certificate (localhost, 127.0.0.1) answering 204.
pub async fn https_server() -> (SocketAddr, Counts) {
    https_server_on("127.0.0.1:0").await
}

async fn https_server_on(bind: &str) -> (SocketAddr, Counts) {
    let certs = CertificateDer::pem_file_iter(tls_file("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(tls_file("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Counts::default();
    let c = counts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            c.connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (acceptor, c) = (acceptor.clone(), c.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                serve_hyper(TokioIo::new(tls), |_| (204, vec![]), c, Default::default()).await;
            });
        }
    });
    (addr, counts)
}

#[tokio::test]
async fn https_with_the_private_ca_works_and_keeps_the_connection() {
    let (addr, counts) = https_server().await;
    let tls = TlsConfig::with_ca_file(&tls_file("ca.pem")).unwrap();
    let options = HttpOptions { tls: Some(tls), ..HttpOptions::default() };
    for host in ["localhost", "127.0.0.1"] {
        let mut d = deliverer(&format!("https://{host}:{}/hook", addr.port()), options.clone());
        for n in 0..3 {
            deliver(&mut d, n).await.unwrap_or_else(|e| panic!("https to {host}: {e}"));
        }
    }
    assert_eq!(counts.requests(), 6);
    assert_eq!(counts.connections(), 2, "one TLS connection per deliverer");
}

#[tokio::test]
async fn https_with_a_certificate_from_another_ca_fails_clearly() {
    let (addr, _) = https_server().await;
    let url = format!("https://localhost:{}/hook", addr.port());
    let other = TlsConfig::with_ca_file(&tls_file("other-ca.pem")).unwrap();
    for tls in [Some(other), None] {
        let mut d = deliverer(&url, HttpOptions { tls, ..HttpOptions::default() });
        let err = deliver(&mut d, 1).await.unwrap_err();
        assert!(matches!(err, DeliverError::Tls { .. }), "{err:?}");
        let text = chain(&err);
        let expected = format!(
            "TLS handshake with localhost:{} failed: invalid peer certificate: UnknownIssuer",
            addr.port()
        );
        assert_eq!(text, expected);
        assert!(!err.may_be_processing(), "nothing was sent");
    }
}

#[tokio::test]
async fn https_to_an_address_the_certificate_lacks_fails_clearly() {
    // Linux routes all of 127/8 to loopback: 127.0.0.2 reaches a wildcard listener, but the
    // certificate names only localhost and 127.0.0.1.
    let (addr, _) = https_server_on("0.0.0.0:0").await;
    let tls = TlsConfig::with_ca_file(&tls_file("ca.pem")).unwrap();
    let options = HttpOptions { tls: Some(tls), ..HttpOptions::default() };
    let mut d = deliverer(&format!("https://127.0.0.2:{}/", addr.port()), options);
    let err = deliver(&mut d, 1).await.unwrap_err();
    let text = chain(&err);
    let prefix =
        format!("TLS handshake with 127.0.0.2:{} failed: invalid peer certificate: ", addr.port());
    assert!(text.starts_with(&prefix), "{text}");
    assert!(text.contains("not valid for name \"127.0.0.2\""), "{text}");
}

#[test]
fn ca_files_must_hold_certificates() {
    let dir = std::env::temp_dir().join(format!("keyorder-http-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = TlsConfig::with_ca_file(&dir.join("missing.pem")).unwrap_err();
    assert!(matches!(missing, TlsError::Read { .. }), "{missing:?}");
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "no certificates here\n").unwrap();
    let none = TlsConfig::with_ca_file(&empty).unwrap_err();
    assert!(matches!(none, TlsError::NoCertificates { .. }), "{none:?}");
    assert!(none.to_string().contains("contains no PEM certificate"), "{none}");
    let key_only = TlsConfig::with_ca_file(&tls_file("server.key")).unwrap_err();
    assert!(matches!(key_only, TlsError::NoCertificates { .. }), "{key_only:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
