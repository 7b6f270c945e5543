//! The `run` daemon: binds the HTTP surface, starts embedded simulators, resolves targets,
//! drives the schedule forever, reloads the plan on SIGHUP / `POST /-/reload`, and shuts down
//! on SIGTERM with a bounded drain (a second signal exits at once).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::client::{ApiKey, ClientConfig, Endpoint, StreamClient};
use crate::config::{Config, ConfigError, TargetConfig};
use crate::export::http::{AppState, HttpServer, ReloadFuture, ReloadHook, StatusSource};
use crate::export::metrics::Metrics;
use crate::schedule::{Board, Recorder, Runner, Scheduler, Target, plan_cycle};
use crate::sim::SimHandle;
use crate::workload::prompt::OverheadLearner;
use crate::workload::tokenizer::TokenModel;

/// Longest a shutdown waits for in-flight requests before cutting them (they count as `timeout`).
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("target `{target}`: {message}")]
    Target { target: String, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("client: {0}")]
    Client(#[from] crate::client::ClientError),
}

/// Everything `run` and `bench` need to send traffic: the started simulators and the targets.
pub struct Deployment {
    pub targets: Vec<Arc<Target>>,
    pub sims: Vec<SimHandle>,
    pub client: StreamClient,
    pub tokens: Arc<TokenModel>,
}

impl Deployment {
    /// Starts the embedded simulators and resolves every target (model `auto`, API keys).
    pub async fn start(cfg: &Config, base_dir: &Path) -> Result<Deployment, DaemonError> {
        let tokens = Arc::new(
            TokenModel::load(
                cfg.tokenizer
                    .as_ref()
                    .map(|t| base_dir.join(t.as_str()))
                    .as_deref(),
            )
            .map_err(|e| DaemonError::Tokenizer(e.to_string()))?,
        );
        let client = StreamClient::new(ClientConfig {
            connect_timeout: cfg.client.connect_timeout.0,
            request_timeout: cfg.client.request_timeout.0,
            max_event_bytes: *cfg.client.max_event_bytes as usize,
            ..ClientConfig::default()
        })?;
        let client = if tokens.is_exact() {
            client.with_token_counter(tokens.clone())
        } else {
            client
        };
        let mut sims = Vec::new();
        let mut targets = Vec::new();
        for t in &cfg.targets {
            let fail = |message: String| DaemonError::Target {
                target: t.name.value.clone(),
                message,
            };
            let url = match (&t.url, &t.simulated) {
                (Some(u), _) => u.value.clone(),
                (None, Some(spec)) => {
                    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
                    let sim = crate::sim::start(spec.value.clone(), t.serving_mode, loopback)
                        .await
                        .map_err(|e| fail(e.to_string()))?;
                    tracing::info!(target = %*t.name, mode = t.serving_mode.as_str(), url = %sim.base_url(), "simulator started");
                    let url = sim.base_url();
                    sims.push(sim);
                    url
                }
                (None, None) => return Err(fail("no url".into())),
            };
            let model = resolve_model(t, &url).await.map_err(fail)?;
            let mut endpoint = Endpoint::new(&url, t.api, model, t.dialect)?
                .with_length_control(t.length_control())
                .with_nvext(t.dialect.supports_nvext());
            if let Some(key) = api_key(t, base_dir).map_err(fail)? {
                endpoint = endpoint.with_api_key(&key)?;
            }
            targets.push(Arc::new(Target {
                name: t.name.value.clone(),
                mode: t.serving_mode,
                endpoint,
                cost_per_hour_usd: t.cost_per_hour_usd.as_ref().map(|c| c.value),
            }));
        }
        Ok(Deployment {
            targets,
            sims,
            client,
            tokens,
        })
    }

    /// The step runner for `cfg` over these targets; `run_salt` keeps earlier runs' caches out.
    pub fn runner(&self, cfg: &Config, recorder: Arc<Recorder>, run_salt: u64) -> Runner {
        Runner {
            targets: self.targets.clone(),
            client: self.client.clone(),
            tokens: Arc::clone(&self.tokens),
            overhead: Arc::new(OverheadLearner::new()),
            recorder,
            seed: cfg.seed,
            run_salt,
            drain_grace: cfg.schedule.drain_grace.0,
            max_lag_p99: cfg.schedule.max_lag_p99.0,
            pairing: cfg.schedule.pairing,
        }
    }

    /// Stops the embedded simulators.
    pub async fn stop(self) {
        for sim in self.sims {
            sim.shutdown().await;
        }
    }
}

/// The model to ask for: as configured, or the first id of `GET /v1/models` for `auto`.
async fn resolve_model(t: &TargetConfig, base: &str) -> Result<String, String> {
    if t.model != "auto" {
        return Ok(t.model.clone());
    }
    let url = format!("{}/v1/models", base.trim_end_matches('/'));
    let http = crate::client::http_client_builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    // A deployment that is still starting answers after a while: try for about half a minute.
    let mut last = String::new();
    for attempt in 0..15 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        match http.get(&url).send().await {
            Ok(r) if r.status().is_success() => {
                let bytes = r.bytes().await.map_err(|e| format!("{url}: {e}"))?;
                let body: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|e| format!("{url}: not JSON: {e}"))?;
                return body["data"][0]["id"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("{url} lists no models; set `model:` on the target to the served model name instead of `auto`"));
            }
            Ok(r) => last = format!("{url} answered {}", r.status()),
            Err(e) => last = format!("{url}: {e}"),
        }
    }
    Err(format!(
        "{last}; set `model:` on the target to skip the lookup"
    ))
}

fn api_key(t: &TargetConfig, base_dir: &Path) -> Result<Option<ApiKey>, String> {
    if let Some(var) = &t.api_key_env {
        return std::env::var(var.as_str())
            .map(|k| Some(ApiKey::new(k.trim())))
            .map_err(|_| format!("environment variable `{}` (api_key_env) is not set", **var));
    }
    if let Some(file) = &t.api_key_file {
        let path = base_dir.join(file.as_str());
        return std::fs::read_to_string(&path)
            .map(|k| Some(ApiKey::new(k.trim())))
            .map_err(|e| format!("cannot read api_key_file {}: {e}", path.display()));
    }
    Ok(None)
}

/// With a real tokenizer the client counts the tokens of every chunk instead of assuming one.
impl crate::client::TokenCounter for TokenModel {
    fn count(&self, text: &str) -> usize {
        TokenModel::count(self, text)
    }
}

/// The config in force and where it came from (for reloads).
struct Live {
    config: Mutex<Config>,
    path: Option<PathBuf>,
    metrics: Arc<Metrics>,
}

impl Live {
    fn config(&self) -> Config {
        self.config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Re-reads the config file; a bad file leaves the running config untouched.
    fn reload(&self) -> Result<String, String> {
        let result = match &self.path {
            None => Ok("the embedded demo config has nothing to reload".to_owned()),
            Some(path) => match Config::load(path) {
                Ok(new) => {
                    let old = self.config();
                    let targets_changed = serde_json::to_value(&old.targets).ok()
                        != serde_json::to_value(&new.targets).ok();
                    *self.config.lock().unwrap_or_else(PoisonError::into_inner) = new;
                    let mut msg = format!(
                        "reloaded {}; the new plan applies from the next cycle",
                        path.display()
                    );
                    if targets_changed {
                        msg.push_str("; target changes need a restart in this version");
                    }
                    Ok(msg)
                }
                Err(e) => Err(e.to_string()),
            },
        };
        self.metrics.record_config_reload(result.is_ok());
        match &result {
            Ok(m) => tracing::info!("{m}"),
            Err(e) => tracing::error!("reload rejected, the old config keeps running:\n{e}"),
        }
        result
    }
}

struct Reload(Arc<Live>);

impl ReloadHook for Reload {
    fn reload(&self) -> ReloadFuture {
        let live = Arc::clone(&self.0);
        Box::pin(async move { live.reload() })
    }
}

struct Status {
    board: Arc<Board>,
    targets: Vec<Arc<Target>>,
    live: Arc<Live>,
}

impl StatusSource for Status {
    fn status_json(&self) -> serde_json::Value {
        let cfg = self.live.config();
        let mut v = self.board.status_json();
        v["version"] = json!(env!("CARGO_PKG_VERSION"));
        v["config"] = json!(
            self.live
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "<embedded demo>".into())
        );
        v["time_scale"] = json!(*cfg.time_scale);
        v["cycle"] = json!(cfg.cycle());
        v["targets"] = self
            .targets
            .iter()
            .map(|t| json!({"name": t.name, "serving_mode": t.mode.as_str(), "url": t.endpoint.url().as_str(), "model": t.endpoint.model()}))
            .collect();
        v["slos"] = json!([]);
        v
    }
}

/// Runs the daemon until SIGTERM/SIGINT. `cfg` is already validated.
pub async fn run(
    cfg: Config,
    config_path: Option<PathBuf>,
    listen: Option<SocketAddr>,
) -> Result<(), DaemonError> {
    let addr = listen.unwrap_or_else(|| cfg.export.listen.parse().expect("validated"));
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| DaemonError::Bind { addr, source })?;
    tracing::info!("listening on {local}");

    let base_dir = config_path
        .as_deref()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."))
        .to_owned();
    let thresholds: Vec<f64> = Vec::new();
    let metrics = Arc::new(Metrics::new(&thresholds));
    metrics.record_config_reload(true);
    let live = Arc::new(Live {
        config: Mutex::new(cfg.clone()),
        path: config_path,
        metrics: Arc::clone(&metrics),
    });

    let shutdown_http = CancellationToken::new();
    let soft_stop = CancellationToken::new();
    let hard_stop = CancellationToken::new();
    spawn_signal_handlers(Arc::clone(&live), soft_stop.clone(), hard_stop.clone());

    let deployment = Deployment::start(&cfg, &base_dir).await?;
    for t in &deployment.targets {
        metrics.set_target_up(&t.name, true);
    }
    let recorder = Arc::new(Recorder::new(Arc::clone(&metrics), None));
    let runner = Arc::new(deployment.runner(&cfg, recorder, rand::random()));
    let board = Arc::new(Board::default());
    let state = AppState::new(
        Arc::clone(&metrics),
        Arc::new(Status {
            board: Arc::clone(&board),
            targets: deployment.targets.clone(),
            live: Arc::clone(&live),
        }),
    );
    let state = if cfg.export.reload_endpoint {
        state.with_reload(Arc::new(Reload(Arc::clone(&live))))
    } else {
        state
    };
    let readiness = state.readiness();
    let server = HttpServer::from_listener(listener, state);
    let http = tokio::spawn(server.serve(shutdown_http.clone()));

    let scheduler = Scheduler {
        runner,
        board: Arc::clone(&board),
    };
    board.announce(&plan_cycle(&cfg));
    readiness.set_ready();
    scheduler.runner.calibrate(&hard_stop).await;
    let plan_live = Arc::clone(&live);
    let pause_live = Arc::clone(&live);
    scheduler
        .run_forever(
            move || plan_cycle(&plan_live.config()),
            move || pause_live.config().schedule.cycle_pause.0,
            &soft_stop,
            &hard_stop,
        )
        .await;
    tracing::info!("schedule stopped; shutting down");
    shutdown_http.cancel();
    let _ = http.await;
    deployment.stop().await;
    tracing::info!("shutdown complete");
    Ok(())
}

/// SIGTERM/SIGINT: stop sending and drain (bounded by [`SHUTDOWN_DRAIN`]); a second one exits at
/// once. SIGHUP: reload.
fn spawn_signal_handlers(
    live: Arc<Live>,
    soft_stop: CancellationToken,
    hard_stop: CancellationToken,
) {
    use tokio::signal::unix::{SignalKind, signal};
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = hup.recv() => { let _ = live.reload(); continue; }
            }
            if soft_stop.is_cancelled() {
                tracing::warn!("second signal: exiting now");
                std::process::exit(130);
            }
            tracing::info!(drain = ?SHUTDOWN_DRAIN, "signal received: draining in-flight requests");
            soft_stop.cancel();
            let hard = hard_stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(SHUTDOWN_DRAIN).await;
                hard.cancel();
            });
        }
    });
}

/// Reports a config error; used by the CLI.
pub fn config_error_exit(e: &ConfigError) -> i32 {
    eprintln!("{e}");
    2
}
