//! The TLS of an `https://` target's connections: the platform's roots, or the target's own CA
//! bundle and client certificate, as one rustls config that both the measurement transport
//! ([`super::transport`]) and the target's other HTTP clients (the model lookup) use, so a request and
//! a lookup trust the same certificates.
//!
//! A certificate of `ca_file` that a server presents as its own, byte for byte, is accepted
//! (pinned) although it is a CA certificate: `openssl req -x509` makes a self-signed certificate
//! with `basicConstraints CA:TRUE`, which webpki refuses as a server's (`CaUsedAsEndEntity`), and
//! operators hand that very certificate to the canary as the one to trust. Everything else is
//! still checked: its validity period (before webpki looks at the CA flag), the server's name,
//! and the handshake's signature by its key.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

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
                let pinned = certs(ca)?;
                for cert in &pinned {
                    roots
                        .add(cert.clone())
                        .map_err(|e| pem_error(ca, "certificate", e.to_string()))?;
                }
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| pem_error(ca, "certificate", e.to_string()))?;
                builder()
                    .map_err(tls_error)?
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(PinningVerifier { webpki, pinned }))
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

/// The verifier of a target with a `ca_file`: webpki's, with the trusted certificates as roots,
/// and a certificate of the file presented as the server's own accepted where webpki's only
/// objection is that it is a CA certificate (see the module's documentation).
#[derive(Debug)]
struct PinningVerifier {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    /// The certificates of `ca_file`, as they are in it.
    pinned: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for PinningVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verdict {
            Err(e)
                if is_ca_used_as_end_entity(&e)
                    && self
                        .pinned
                        .iter()
                        .any(|c| c.as_ref() == end_entity.as_ref()) =>
            {
                // webpki checked the validity period before the CA flag; the name is checked
                // here, the handshake's signature by the key in `verify_tls1x_signature`.
                let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_name(&parsed, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            verdict => verdict,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Whether webpki refused a certificate for being a CA certificate presented as a server's own
/// (rustls carries that error as text only).
fn is_ca_used_as_end_entity(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(CertificateError::Other(other))
            if other.to_string() == "CaUsedAsEndEntity"
    )
}

/// What to do when a server presented a CA certificate as its own and it was refused.
const CA_AS_SERVER_ADVICE: &str = "the server presented a CA certificate (basicConstraints \
    CA:TRUE, as `openssl req -x509` makes by default) as its own: put exactly that certificate \
    in the target's `tls.ca_file` to trust it as it is, or better give the server a certificate \
    signed by a CA and put the CA in `tls.ca_file`: `openssl req -x509 -newkey rsa:2048 -nodes \
    -days 365 -subj /CN=canary-ca -keyout ca.key -out ca.pem`, then `openssl req -newkey \
    rsa:2048 -nodes -subj /CN=HOST -addext subjectAltName=DNS:HOST -keyout server.key -out \
    server.csr` and `openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
    -days 365 -copy_extensions copy -out server.pem` (HOST: the name in the target's URL; \
    subjectAltName=IP:ADDRESS for an address)";

/// The advice for an error whose cause (at any depth, or inside an I/O error) is a CA
/// certificate a server presented as its own and that was refused; `None` for any other error.
pub(super) fn ca_as_server_advice(
    error: &(dyn std::error::Error + 'static),
) -> Option<&'static str> {
    let mut at = Some(error);
    while let Some(e) = at {
        // An I/O error shows its inner error but gives as its source that error's source.
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .map(|inner| inner as &(dyn std::error::Error + 'static));
        let refused = [Some(e), inner]
            .into_iter()
            .flatten()
            .filter_map(|e| e.downcast_ref::<rustls::Error>())
            .any(is_ca_used_as_end_entity);
        if refused {
            return Some(CA_AS_SERVER_ADVICE);
        }
        at = e.source();
    }
    None
}

/// `": <advice>"` for a TLS error that has [`ca_as_server_advice`], else nothing.
pub(super) fn advice_suffix(error: &std::io::Error) -> String {
    ca_as_server_advice(error).map_or_else(String::new, |advice| format!(": {advice}"))
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
