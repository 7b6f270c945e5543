//! A real Prometheus (Debian's `prometheus`) on loopback, scraping given targets and evaluating
//! rule files, queried through its HTTP API.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::Proc;

/// Debian's Prometheus on a free loopback port, scraping `targets` every second and evaluating
/// `rule_files`.
pub struct Prometheus {
    pub proc: Proc,
    pub url: String,
}

impl Prometheus {
    pub fn start(dir: &Path, targets: &[(&str, SocketAddr)], rule_files: &[PathBuf]) -> Prometheus {
        let port = super::free_port();
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
        super::eventually(expr, limit, || async {
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
