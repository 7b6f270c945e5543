//! TLS to targets: a target's `tls: {ca_file, cert_file, key_file}` makes the canary trust a
//! private CA and present a client certificate. The CA, the server's and the client's
//! certificates are generated here; the server on loopback requires the client certificate.

mod support;

use std::sync::Arc;

use llm_canary::client::{
    ClientConfig, Endpoint, Outcome, Prompt, StreamClient, StreamRequest, TlsFiles,
};
use llm_canary::config::{Api, Config, Dialect};
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// A TLS server on loopback that requires a client certificate from the CA and answers every
/// request with a short SSE completion.
async fn tls_server(pki: &Pki) -> std::net::SocketAddr {
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
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A handshake without a valid client certificate fails here.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                let head_end = loop {
                    match tls.read(&mut tmp).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + length {
                    match tls.read(&mut tmp).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                let _ = tls.write_all(&support::sse_ok("m", 4)).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_with_a_private_ca_and_a_client_certificate() {
    let pki = pki();
    let addr = tls_server(&pki).await;
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("ca.pem", &pki.ca_pem),
        ("client.pem", &pki.client.0),
        ("client.key", &pki.client.1),
    ] {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
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
    let metrics = Arc::new(llm_canary::export::metrics::Metrics::new(&[]));
    let recorder = Arc::new(llm_canary::schedule::Recorder::new(vec![metrics]));
    let runner = Arc::new(deployment.runner(&cfg, recorder, 5));
    let never = tokio_util::sync::CancellationToken::new();
    let plan = llm_canary::schedule::plan_cycle(&cfg).remove(0);
    let results = runner.run_step(&plan, 0, &never, &never).await;
    let m = &results[0].measurements;
    assert!(m.ok_requests >= 4 && m.errors == 0, "{:?}", m.outcomes);

    // Without the client certificate, or without the CA, the same server is not reached.
    let client = StreamClient::new(ClientConfig::default()).unwrap();
    let request = StreamRequest {
        request_id: "tls-1".into(),
        prompt: Prompt::Text("hi".into()),
        osl: 4,
    };
    let url = format!("https://{addr}");
    let ca_only = TlsFiles {
        ca_file: Some(dir.path().join("ca.pem")),
        ..TlsFiles::default()
    };
    let with_ca = Endpoint::new(&url, Api::Chat, "m", Dialect::Openai)
        .unwrap()
        .with_http_client(client.tls_client(&ca_only).unwrap());
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
    let err = client.tls_client(&missing).unwrap_err().to_string();
    assert!(err.contains("nope.pem"), "{err}");
    std::fs::write(dir.path().join("junk.pem"), "not a certificate").unwrap();
    let junk = TlsFiles {
        ca_file: Some(dir.path().join("junk.pem")),
        ..TlsFiles::default()
    };
    assert!(client.tls_client(&junk).is_err());
    deployment.stop().await;
}
