//! Harness of the interop tests (shared by the Dynamo suite: the cache folder, CI detection).
//! For vLLM: the cached vLLM CPU venv (made by
//! `scripts/interop/install-vllm.sh`), the tiny random-weight models (built by
//! `scripts/interop/build-models.py`), and a server on a free loopback port: vLLM's OpenAI server
//! (started by `scripts/interop/serve-vllm.sh`) or `transformers serve` from the same venv, ready
//! once `GET /health` answers 200.
//!
//! Outside CI a missing venv skips the tests (`crate::skip`); in CI it fails them.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::free_port;
use crate::support::http::{http_client, scrape};

/// Only one vLLM server at a time: each one wants both cores of a small machine.
pub static ONE_SERVER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Longest a server may take to answer `/health` (about 50 s on an idle 2-core machine; the
/// machine may be shared with a parallel build).
pub const HEALTHY_WITHIN: Duration = Duration::from_secs(600);

/// `~/.cache/llm-canary/NAME`, where `scripts/test` caches the engines' venvs and models.
pub fn home_cache(name: &str) -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/llm-canary").join(name)
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The vLLM venv, or `None` (after a loud message) when it is not installed outside CI. In CI a
/// missing venv is a failure: `scripts/test` installs it before the tests run.
pub fn vllm_venv() -> Option<PathBuf> {
    let venv = std::env::var_os("LLM_CANARY_VLLM_VENV")
        .map_or_else(|| home_cache("vllm-venv"), PathBuf::from);
    if venv.join(".llm-canary-ready").is_file() {
        return Some(venv);
    }
    let message = format!(
        "vLLM interop tests need the vLLM CPU venv at {} (not installed). \
         Install it with `scripts/interop/install-vllm.sh` (about 7 minutes, 6 GB), \
         or run everything with `scripts/interop/run.sh`.",
        venv.display()
    );
    crate::skip::missing_tool(&message);
    None
}

/// The folder of the tiny models, built (idempotently) with the venv's Python.
pub fn tiny_models(venv: &Path) -> PathBuf {
    let dir = std::env::var_os("LLM_CANARY_INTEROP_MODELS")
        .map_or_else(|| home_cache("interop-models"), PathBuf::from);
    let status = Command::new(venv.join("bin/python"))
        .arg(repo().join("scripts/interop/build-models.py"))
        .arg(&dir)
        .status()
        .expect("run scripts/interop/build-models.py");
    assert!(status.success(), "building the tiny models failed");
    dir
}

/// What a test against a server needs first: the venv, its turn among the servers (held while
/// the guard lives), and the folder of the tiny model `model`; `None` when the venv is missing
/// outside CI (the test is skipped, loudly).
pub async fn prepare(
    model: &str,
) -> Option<(PathBuf, tokio::sync::MutexGuard<'static, ()>, PathBuf)> {
    let venv = vllm_venv()?;
    let turn = ONE_SERVER_AT_A_TIME.lock().await;
    let model_dir = tiny_models(&venv).join(model);
    Some((venv, turn, model_dir))
}

/// A serving engine's child process (in its own process group, with the processes it spawns,
/// such as vLLM's engine core), killed when dropped.
pub struct Server {
    child: Child,
    pub engine: String,
    pub base_url: String,
    pub model_name: String,
    pub log: PathBuf,
}

impl Server {
    /// Starts vLLM (`serve-vllm.sh MODEL_DIR PORT EXTRA...`) and waits until `/health` answers.
    pub async fn vllm(venv: &Path, model_dir: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        let mut cmd = Command::new(repo().join("scripts/interop/serve-vllm.sh"));
        cmd.arg(model_dir)
            .arg(port.to_string())
            .args(extra)
            .env("LLM_CANARY_VLLM_VENV", venv);
        Server::start(cmd, "vllm", model_dir, port).await
    }

    /// Starts `transformers serve` (from the same venv) with the model preloaded, on the CPU.
    pub async fn transformers(venv: &Path, model_dir: &Path) -> Server {
        let port = free_port();
        let mut cmd = Command::new(venv.join("bin/transformers"));
        cmd.args(["serve", "--host", "127.0.0.1", "--device", "cpu", "--port"])
            .arg(port.to_string())
            .arg(model_dir)
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("OMP_NUM_THREADS", "2");
        Server::start(cmd, "transformers", model_dir, port).await
    }

    async fn start(mut cmd: Command, engine: &str, model_dir: &Path, port: u16) -> Server {
        let logs = repo().join("target/interop-logs");
        std::fs::create_dir_all(&logs).unwrap();
        let model_name = model_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let log = logs.join(format!("{engine}-{model_name}-{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {engine}: {e}"));
        let mut server = Server {
            child,
            engine: engine.to_owned(),
            base_url: format!("http://127.0.0.1:{port}"),
            model_name,
            log,
        };
        server.wait_healthy().await;
        server
    }

    async fn wait_healthy(&mut self) {
        let http = http_client(Some(Duration::from_secs(2)));
        let url = format!("{}/health", self.base_url);
        let started = tokio::time::Instant::now();
        let (child, log) = (&mut self.child, &self.log);
        let healthy = crate::support::within(HEALTHY_WITHIN, || {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "the server exited ({status}) before it was healthy; log {}:\n{}",
                    log.display(),
                    log_tail(log, 60)
                );
            }
            let probe = http.get(&url).send();
            async move { probe.await.ok()?.status().is_success().then_some(()) }
        })
        .await;
        assert!(
            healthy.is_some(),
            "{} not healthy within {HEALTHY_WITHIN:?}; log {}:\n{}",
            self.engine,
            self.log.display(),
            self.log_tail(60)
        );
        eprintln!(
            "{} serving {} at {} healthy after {:.0} s",
            self.engine,
            self.model_name,
            self.base_url,
            started.elapsed().as_secs_f64()
        );
    }

    /// The last `n` lines of the server's log.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(&self.log, n)
    }

    /// Kills the server and its engine process at once (SIGKILL to the process group), as a
    /// crash would, and reaps it.
    pub fn kill(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        scrape(&http_client(None), &self.base_url).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `n` lines of the log at `path`.
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
