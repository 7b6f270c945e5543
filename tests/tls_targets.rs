//! TLS to targets: a target's `tls: {ca_file, cert_file, key_file}` makes the canary trust a
//! private CA and present a client certificate; a step's TLS connections are opened (handshake
//! included) and timed before its clock starts, kept alive and reused, also after the server's
//! TLS 1.3 session tickets, and one the server closed while idle is not reused. The CA, the
//! server's and the client's certificates are generated here; the server on loopback (rustls)
//! requires the client certificate.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use llm_canary::client::{
    ClientConfig, Endpoint, Outcome, Prompt, StreamClient, StreamRequest, TargetTls, TlsFiles,
};
use llm_canary::config::{Api, Config, Dialect};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use tokio::io::AsyncWriteExt;
use tokio_rustls::rustls;

struct Pki {
    ca_pem: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |purpose: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        p.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca_pem,
        server: leaf(ExtendedKeyUsagePurpose::ServerAuth),
        client: leaf(ExtendedKeyUsagePurpose::ClientAuth),
    }
}

/// How the test server ends each exchange.
#[derive(Clone, Copy, PartialEq)]
enum Ending {
    /// `connection: close`, then a TLS close.
    Close,
    /// Keep-alive: the connection waits for the next request.
    KeepAlive,
    /// Keep-alive announced, then closed (close_notify and FIN) right after the response, as a
    /// server's idle timeout would: a client must not send its next request there.
    SilentClose,
}

/// What the server saw: handshakes completed (the server's session tickets written with them)
/// and exchanges answered, with a notification after each.
#[derive(Default)]
struct Seen {
    handshakes: AtomicUsize,
    answered: AtomicUsize,
    changed: tokio::sync::Notify,
}

impl Seen {
    async fn until(&self, what: impl Fn(&Seen) -> bool) {
        loop {
            let changed = self.changed.notified();
            if what(self) {
                return;
            }
            changed.await;
        }
    }
}

/// A TLS server on loopback that requires a client certificate from the CA and answers every
/// request with a short SSE completion, ending each exchange as `ending` says.
async fn tls_server(pki: &Pki, ending: Ending) -> (std::net::SocketAddr, Arc<Seen>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(pki.server.0.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(pki.server.1.as_bytes()).unwrap(),
        )
        .unwrap();
    // TLS 1.3 session tickets follow every handshake (rustls sends them by default): bytes an
    // idle client connection receives that are not a response.
    assert!(config.send_tls13_tickets > 0);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let server_seen = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = Arc::clone(&server_seen);
            tokio::spawn(async move {
                // A handshake without a valid client certificate fails here. Once it returns,
                // the session tickets are written.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                seen.handshakes.fetch_add(1, Ordering::SeqCst);
                seen.changed.notify_waiters();
                let mut buf = Vec::new();
                loop {
                    if support::read_request(&mut tls, &mut buf).await.is_none() {
                        return;
                    }
                    let mut reply = support::sse_ok("m", 4);
                    if ending != Ending::Close {
                        let text = String::from_utf8(reply).unwrap();
                        reply = text.replace("connection: close\r\n", "").into_bytes();
                    }
                    if tls.write_all(&reply).await.is_err() || tls.flush().await.is_err() {
                        return;
                    }
                    if ending != Ending::KeepAlive {
                        let _ = tls.shutdown().await;
                    }
                    seen.answered.fetch_add(1, Ordering::SeqCst);
                    seen.changed.notify_waiters();
                    if ending != Ending::KeepAlive {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

fn write_pki(pki: &Pki, dir: &std::path::Path) -> TlsFiles {
    for (name, text) in [
        ("ca.pem", &pki.ca_pem),
        ("client.pem", &pki.client.0),
        ("client.key", &pki.client.1),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    TlsFiles {
        ca_file: Some(dir.join("ca.pem")),
        cert_file: Some(dir.join("client.pem")),
        key_file: Some(dir.join("client.key")),
    }
}

fn request(id: &str) -> StreamRequest {
    StreamRequest {
        request_id: id.into(),
        prompt: Prompt::Text("hi".into()),
        osl: 4,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_with_a_private_ca_and_a_client_certificate() {
    let pki = pki();
    let (addr, seen) = tls_server(&pki, Ending::KeepAlive).await;
    let dir = tempfile::tempdir().unwrap();
    write_pki(&pki, dir.path());
    // Through the config, as the daemon resolves targets (paths relative to the config).
    let cfg = Config::parse(
        &format!(
            r#"
targets:
  - name: private
    serving_mode: aggregated
    url: "https://{addr}"
    model: m
    dialect: openai
    tls: {{ ca_file: ca.pem, cert_file: client.pem, key_file: client.key }}
time_scale: 0.01
workloads:
  concurrency_sweep: {{ levels: [2], isl: 32, osl: 4, step: 100s, warmup: 10s }}
"#
        ),
        "tls.yaml",
        dir.path(),
    )
    .unwrap();
    let deployment = llm_canary::targets::Deployment::start(&cfg, dir.path())
        .await
        .unwrap();
    // Start-up asks `/v1/models` for the model's context length, over a connection of its own.
    let at_start = seen.handshakes.load(Ordering::SeqCst);
    let metrics = Arc::new(llm_canary::export::metrics::Metrics::new(&[]));
    let recorder = Arc::new(llm_canary::schedule::Recorder::new(vec![metrics]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 5));
    let never = tokio_util::sync::CancellationToken::new();
    let plan = llm_canary::schedule::plan_cycle(&cfg).remove(0);
    let results = runner.run_step(&plan, 0, &never, &never).await;
    let m = &results[0].measurements;
    assert!(m.ok_requests >= 4 && m.errors == 0, "{:?}", m.outcomes);
    // The step's two workers got their connections, handshake included, before its clock
    // started, timed as the target's connect figure; every request reused them.
    let connections = results[0].connections.as_ref().expect("connections opened");
    assert_eq!(connections.opened, 2, "{connections:?}");
    assert!(connections.connect_max_seconds > 0.0);
    assert_eq!(seen.handshakes.load(Ordering::SeqCst) - at_start, 2);
    assert!(seen.answered.load(Ordering::SeqCst) >= 4);

    // Without the client certificate, or without the CA, the same server is not reached.
    let client = StreamClient::new(ClientConfig::default()).unwrap();
    let request = request("tls-1");
    let url = format!("https://{addr}");
    let ca_only = TlsFiles {
        ca_file: Some(dir.path().join("ca.pem")),
        ..TlsFiles::default()
    };
    let with_ca = Endpoint::new(&url, Api::Chat, "m", Dialect::Openai)
        .unwrap()
        .with_tls(TargetTls::from_files(&ca_only).unwrap())
        .unwrap();
    let plain = Endpoint::new(&url, Api::Chat, "m", Dialect::Openai).unwrap();
    for endpoint in [with_ca, plain] {
        let rec = client
            .send(&endpoint, &request, tokio::time::Instant::now())
            .await;
        assert!(
            matches!(rec.outcome, Outcome::Connect | Outcome::StreamTruncated),
            "{:?}: {:?}",
            rec.outcome,
            rec.error
        );
    }
    // A missing or broken file fails when the target is set up, naming the file.
    let missing = TlsFiles {
        ca_file: Some(dir.path().join("nope.pem")),
        ..TlsFiles::default()
    };
    let err = TargetTls::from_files(&missing).unwrap_err().to_string();
    assert!(err.contains("nope.pem"), "{err}");
    std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
    let junk = TlsFiles {
        ca_file: Some(dir.path().join("junk.pem")),
        ..TlsFiles::default()
    };
    assert!(TargetTls::from_files(&junk).is_err());
    deployment.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tls_connections_survive_session_tickets_and_a_closed_one_is_not_reused() {
    let pki = pki();
    let dir = tempfile::tempdir().unwrap();
    let tls = TargetTls::from_files(&write_pki(&pki, dir.path())).unwrap();
    let client = StreamClient::new(ClientConfig::default()).unwrap();

    // Three connections opened ahead; the server's tickets reach them while they are idle.
    let (addr, seen) = tls_server(&pki, Ending::KeepAlive).await;
    let endpoint = Endpoint::new(&format!("https://{addr}"), Api::Chat, "m", Dialect::Openai)
        .unwrap()
        .with_tls(Arc::clone(&tls))
        .unwrap();
    let done = client.prewarm(&endpoint, 3, 2).await;
    assert_eq!((done.opened, done.error), (3, None));
    seen.until(|s| s.handshakes.load(Ordering::SeqCst) == 3)
        .await;
    for i in 0..6 {
        let rec = client
            .send(
                &endpoint,
                &request(&format!("k{i}")),
                tokio::time::Instant::now(),
            )
            .await;
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        // A reused connection: no connect inside this request's TTFT.
        assert_eq!(rec.connect, None);
    }
    assert_eq!(
        seen.handshakes.load(Ordering::SeqCst),
        3,
        "every request reused one"
    );

    // A server that closes right after answering: the idle connection it closed is seen as
    // closed, and the next request opens (and times) a new one instead of failing on it.
    let (addr, seen) = tls_server(&pki, Ending::SilentClose).await;
    let endpoint = Endpoint::new(&format!("https://{addr}"), Api::Chat, "m", Dialect::Openai)
        .unwrap()
        .with_tls(tls)
        .unwrap();
    for i in 0..3 {
        let rec = client
            .send(
                &endpoint,
                &request(&format!("c{i}")),
                tokio::time::Instant::now(),
            )
            .await;
        assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);
        assert!(
            rec.connect.is_some(),
            "request {i} opened its own connection"
        );
        seen.until(|s| s.answered.load(Ordering::SeqCst) == i + 1)
            .await;
    }
    assert_eq!(seen.handshakes.load(Ordering::SeqCst), 3);
}

/// A self-signed certificate as `openssl req -x509` makes it (`basicConstraints CA:TRUE`) for
/// `names`, valid until `not_after`: its PEM and its key's.
fn self_signed_ca(names: &[&str], not_after: (i32, u8, u8)) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A TLS server on loopback presenting `cert` (no client certificate asked) that answers each
/// request with a short SSE completion and closes.
async fn server_presenting(cert: &(String, String)) -> std::net::SocketAddr {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.0.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(cert.1.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                if support::read_request(&mut tls, &mut buf).await.is_some() {
                    let _ = tls.write_all(&support::sse_ok("m", 4)).await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    addr
}

/// One request to `addr` trusting `ca_pem` as the target's `ca_file`.
async fn send_trusting(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> llm_canary::client::RequestRecord {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca_pem).unwrap();
    let files = TlsFiles {
        ca_file: Some(dir.path().join("ca.pem")),
        ..TlsFiles::default()
    };
    let endpoint = Endpoint::new(&format!("https://{addr}"), Api::Chat, "m", Dialect::Openai)
        .unwrap()
        .with_tls(TargetTls::from_files(&files).unwrap())
        .unwrap();
    let client = StreamClient::new(ClientConfig::default()).unwrap();
    client
        .send(&endpoint, &request("pinned"), tokio::time::Instant::now())
        .await
}

/// The certificate `openssl req -x509` makes is a CA certificate, which webpki refuses as a
/// server's own (`CaUsedAsEndEntity`). Put in `ca_file`, that exact certificate is trusted as the
/// server's (pinned) — still only for its names and its validity period; any other CA
/// certificate a server presents is refused with what to do, openssl commands included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_server_certificate_in_ca_file_is_pinned() {
    let cert = self_signed_ca(&["127.0.0.1"], (4000, 1, 1));
    let addr = server_presenting(&cert).await;
    let rec = send_trusting(addr, &cert.0).await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);

    // Among other certificates of the bundle, too.
    let other = self_signed_ca(&["127.0.0.1"], (4000, 1, 1));
    let rec = send_trusting(addr, &format!("{}{}", other.0, cert.0)).await;
    assert_eq!(rec.outcome, Outcome::Ok, "{:?}", rec.error);

    // Another self-signed CA certificate than the one in `ca_file`: refused, saying what to do.
    let rec = send_trusting(addr, &other.0).await;
    assert_eq!(rec.outcome, Outcome::Connect, "{:?}", rec.error);
    let error = rec.error.unwrap_or_default();
    assert!(
        error.contains("presented a CA certificate")
            && error.contains("tls.ca_file")
            && error.contains("openssl x509 -req"),
        "{error}"
    );

    // Pinned, but for another name, or expired: refused as webpki would.
    let elsewhere = self_signed_ca(&["canary.example"], (4000, 1, 1));
    let addr = server_presenting(&elsewhere).await;
    let rec = send_trusting(addr, &elsewhere.0).await;
    assert_eq!(rec.outcome, Outcome::Connect, "{:?}", rec.error);
    let error = rec.error.unwrap_or_default();
    assert!(error.contains("not valid for name"), "{error}");

    let expired = self_signed_ca(&["127.0.0.1"], (2001, 1, 1));
    let addr = server_presenting(&expired).await;
    let rec = send_trusting(addr, &expired.0).await;
    assert_eq!(rec.outcome, Outcome::Connect, "{:?}", rec.error);
    let error = rec.error.unwrap_or_default();
    assert!(error.to_ascii_lowercase().contains("expired"), "{error}");
}
