//! The TLS of an `https://` target's connections: the platform's roots, or the target's own CA
//! bundle and client certificate, as one rustls config that both the measurement transport
//! ([`super::transport`]) and the target's other HTTP clients (the model lookup) use, so a request and
//! a lookup trust the same certificates.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::ClientError;

/// TLS material for one target, read from files (a private CA, an optional client certificate).
#[derive(Clone, Default)]
pub struct TlsFiles {
    /// PEM bundle of the CA certificates to trust; they replace the platform's roots for this
    /// target, so a private CA cannot be bypassed by a public one.
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate (chain) and its PEM private key, for mutual TLS.
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Paths only: key material never reaches a log.
        f.debug_struct("TlsFiles")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

/// A client TLS config with an identity of its own: connections made with different configs
/// (another CA, another client certificate) are never pooled together.
pub struct TargetTls {
    config: Arc<rustls::ClientConfig>,
    id: u64,
}

impl std::fmt::Debug for TargetTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetTls").field("id", &self.id).finish()
    }
}

impl TargetTls {
    fn new(mut config: rustls::ClientConfig) -> Arc<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // The measurement transport speaks HTTP/1.1 only; a server that would pick h2 for a
        // client that names nothing must not.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(TargetTls {
            config: Arc::new(config),
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        })
    }

    pub(super) fn config(&self) -> &Arc<rustls::ClientConfig> {
        &self.config
    }

    /// Tells connections of this config apart from those of another in the pool.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// A reqwest client builder that uses this config (the target's model lookup).
    pub fn reqwest_builder(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        builder.tls_backend_preconfigured((*self.config).clone())
    }

    /// The config of `https://` targets without TLS settings of their own: the platform's
    /// roots (the same verifier reqwest uses), no client certificate. Built once.
    pub fn platform() -> Result<Arc<TargetTls>, ClientError> {
        static PLATFORM: OnceLock<Result<Arc<TargetTls>, String>> = OnceLock::new();
        PLATFORM
            .get_or_init(|| {
                use rustls_platform_verifier::BuilderVerifierExt;
                let config = builder()
                    .and_then(|b| b.with_platform_verifier())
                    .map_err(|e| e.to_string())?
                    .with_no_client_auth();
                Ok(TargetTls::new(config))
            })
            .clone()
            .map_err(ClientError::Tls)
    }

    /// The config of a target with TLS settings of its own. Files are read now, so a missing or
    /// malformed one fails at start-up (or reload), never at request time.
    pub fn from_files(files: &TlsFiles) -> Result<Arc<TargetTls>, ClientError> {
        let pem_error = |path: &Path, what, message: String| ClientError::TlsPem {
            path: path.display().to_string(),
            what,
            message,
        };
        let certs = |path: &Path| -> Result<Vec<CertificateDer<'static>>, ClientError> {
            let pem = read(path)?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pem_error(path, "certificate", e.to_string()))?;
            if certs.is_empty() {
                return Err(pem_error(
                    path,
                    "certificate",
                    "no certificate found".into(),
                ));
            }
            Ok(certs)
        };
        let tls_error = |e: rustls::Error| ClientError::Tls(e.to_string());
        let wants_client_cert = match &files.ca_file {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certs(ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| pem_error(ca, "certificate", e.to_string()))?;
                }
                builder().map_err(tls_error)?.with_root_certificates(roots)
            }
            None => {
                use rustls_platform_verifier::BuilderVerifierExt;
                builder()
                    .and_then(|b| b.with_platform_verifier())
                    .map_err(tls_error)?
            }
        };
        let config = match (&files.cert_file, &files.key_file) {
            (Some(cert), Some(key)) => {
                let chain = certs(cert)?;
                let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
                    .map_err(|e| pem_error(key, "private key", e.to_string()))?;
                wants_client_cert
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| pem_error(cert, "certificate and key", e.to_string()))?
            }
            _ => wants_client_cert.with_no_client_auth(),
        };
        Ok(TargetTls::new(config))
    }
}

/// A config builder on ring, the provider this crate links, with its safe default versions.
fn builder()
-> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>, rustls::Error> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
}

fn read(path: &Path) -> Result<Vec<u8>, ClientError> {
    crate::files::read_bounded(path, crate::files::MAX_PEM_BYTES).map_err(|e| {
        ClientError::TlsFile {
            path: path.display().to_string(),
            source: match e {
                crate::files::FileError::Io(source) => source,
                other => std::io::Error::other(other.to_string()),
            },
        }
    })
}
