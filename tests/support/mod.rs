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
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_llm-canary"));
    cmd.arg("run").arg("--listen").arg("127.0.0.1:0");
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    let log = dir.join("daemon.log");
    let mut child = cmd
        .env("RUST_LOG", "info")
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
