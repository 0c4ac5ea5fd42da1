//! The TLS client configuration of `https://` targets: the webpki (Mozilla) roots plus any
//! private CA from a PEM file, ALPN `http/1.1`, rustls with the ring provider (no OpenSSL).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The CA file could not be read.
    #[error("cannot read CA file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The CA file is not PEM, or a certificate in it is malformed.
    #[error("CA file {} is not valid PEM", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The CA file holds no `CERTIFICATE` block.
    #[error("CA file {} contains no PEM certificate (-----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificates {
        /// The file.
        path: PathBuf,
    },
    /// A certificate was refused as a trust anchor.
    #[error("CA file {}: a certificate cannot be used as a root: {source}", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// Why rustls refused it.
        #[source]
        source: rustls::Error,
    },
}

/// A shared rustls client configuration; cloning shares it.
#[derive(Clone, Debug)]
pub struct TlsConfig(pub(crate) Arc<ClientConfig>);

impl TlsConfig {
    /// Trusts the webpki roots plus `extra` (for example a private CA).
    pub fn new(extra: &[CertificateDer<'static>]) -> Result<Self, rustls::Error> {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for cert in extra {
            roots.add(cert.clone())?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self(Arc::new(config)))
    }

    /// Trusts the webpki roots only.
    pub fn webpki() -> Self {
        match Self::new(&[]) {
            Ok(config) => config,
            // ring supports the default protocol versions, and no extra root can be refused.
            Err(e) => unreachable!("the default TLS configuration is valid: {e}"),
        }
    }

    /// Trusts the webpki roots plus every certificate in the PEM file `path`.
    pub fn with_ca_file(path: &Path) -> Result<Self, TlsError> {
        let pem = std::fs::read(path)
            .map_err(|source| TlsError::Read { path: path.to_owned(), source })?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| TlsError::Pem { path: path.to_owned(), source })?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificates { path: path.to_owned() });
        }
        Self::new(&certs)
            .map_err(|source| TlsError::BadCertificate { path: path.to_owned(), source })
    }
}
