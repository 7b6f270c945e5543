//! Shared helpers of the integration tests: the daemon as a child process (its `listening on`
//! line gives the address), a real Prometheus (Debian's `prometheus`) on loopback, and polling
//! with a deadline — tests synchronise on conditions, never on fixed sleeps.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Polls `probe` every 100 ms until it returns `Some`, or panics with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A child process killed when dropped, with its stderr kept in a log file.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `llm-canary run [--config FILE] --listen 127.0.0.1:0`; returns the process and its address.
pub fn start_daemon(config: Option<&Path>, dir: &Path) -> (Proc, SocketAddr) {
    start_daemon_with(config, dir, true, &[])
}

/// Like [`start_daemon`]; `listen: false` leaves the address to the config's `export.listen`, and
/// `env` is added to the daemon's environment (`RUST_LOG` among them overrides `info`).
pub fn start_daemon_with(
    config: Option<&Path>,
    dir: &Path,
    listen: bool,
    env: &[(&str, &str)],
) -> (Proc, SocketAddr) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_llm-canary"));
    cmd.arg("run");
    if listen {
        cmd.arg("--listen").arg("127.0.0.1:0");
    }
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let log = dir.join("daemon.log");
    cmd.env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start llm-canary");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let log_path = log.clone();
    std::thread::spawn(move || {
        use std::io::Write;
        let mut out = std::fs::File::create(&log_path).unwrap();
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(out, "{line}");
            if !sent && let Some(addr) = line.split("listening on ").nth(1) {
                if let Ok(a) = addr.trim().parse::<SocketAddr>() {
                    let _ = tx.send(a);
                    sent = true;
                }
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the daemon logs `listening on ADDR`");
    (Proc { child, log }, addr)
}

/// Debian's Prometheus on a free loopback port, scraping `targets` every second and evaluating
/// `rule_files`.
pub struct Prometheus {
    pub proc: Proc,
    pub url: String,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Prometheus {
    pub fn start(dir: &Path, targets: &[(&str, SocketAddr)], rule_files: &[PathBuf]) -> Prometheus {
        let port = free_port();
        let mut cfg = String::from("global: { scrape_interval: 1s, evaluation_interval: 1s }\n");
        if !rule_files.is_empty() {
            cfg.push_str("rule_files:\n");
            for r in rule_files {
                cfg.push_str(&format!("  - {}\n", r.display()));
            }
        }
        cfg.push_str("scrape_configs:\n");
        for (job, addr) in targets {
            cfg.push_str(&format!(
                "  - job_name: {job}\n    static_configs: [{{ targets: [\"{addr}\"] }}]\n"
            ));
        }
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, cfg).unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("Debian's `prometheus` is installed (scripts/test installs it)");
        Prometheus {
            proc: Proc { child, log },
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// An instant query; `Err` carries Prometheus's error message.
    pub async fn query(&self, expr: &str) -> Result<Vec<serde_json::Value>, String> {
        let url = format!("{}/api/v1/query", self.url);
        let resp = llm_canary::client::http_client_builder()
            .build()
            .unwrap()
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("query={}", urlencode(expr)))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: serde_json::Value =
            serde_json::from_slice(&resp.bytes().await.map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        Ok(body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// Waits until `expr` returns at least one series.
    pub async fn wait_for(&self, expr: &str, limit: Duration) -> Vec<serde_json::Value> {
        eventually(expr, limit, || async {
            self.query(expr).await.ok().filter(|r| !r.is_empty())
        })
        .await
    }
}

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// What [`raw_server`] answers to one request.
pub enum RawReply {
    /// These bytes (head and body), then the connection closes.
    Bytes(Vec<u8>),
    /// `head`, then `chunk` over and over until the client goes away (a server that streams
    /// forever, or one endless line).
    Endless { head: Vec<u8>, chunk: Vec<u8> },
}

/// An HTTP/1.1 server on loopback that answers every request with `reply(request head)` and
/// keeps every request head it saw (to check what the client sent). Each connection serves one
/// request.
pub async fn raw_server(
    reply: impl Fn(&str) -> RawReply + Send + Sync + 'static,
) -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&heads);
    let reply = std::sync::Arc::new(reply);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let reply = std::sync::Arc::clone(&reply);
            let seen = std::sync::Arc::clone(&seen);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                // The head, then as much body as Content-Length says.
                let head_end = loop {
                    let Ok(n) = stream.read(&mut tmp).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                while buf.len() < head_end + length {
                    match stream.read(&mut tmp).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                seen.lock().unwrap().push(head.clone());
                match reply(&head) {
                    RawReply::Bytes(b) => {
                        let _ = stream.write_all(&b).await;
                    }
                    RawReply::Endless { head, chunk } => {
                        if stream.write_all(&head).await.is_err() {
                            return;
                        }
                        while stream.write_all(&chunk).await.is_ok() {}
                    }
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, heads)
}

/// A complete SSE chat-completion response of `tokens` one-word chunks, with usage.
pub fn sse_ok(model: &str, tokens: usize) -> Vec<u8> {
    let mut body = String::new();
    for i in 0..tokens {
        let chunk = serde_json::json!({"id": "r1", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": {"content": format!("w{i} ")}, "finish_reason": null}]});
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    let last = serde_json::json!({"id": "r1", "object": "chat.completion.chunk", "model": model, "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": tokens}});
    body.push_str(&format!("data: {last}\n\ndata: [DONE]\n\n"));
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
