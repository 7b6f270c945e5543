//! The `run` daemon: binds the HTTP surface, starts embedded simulators, resolves targets,
//! drives the schedule forever, reloads the plan on SIGHUP / `POST /-/reload`, and shuts down
//! on SIGTERM with a bounded drain (a second signal exits at once).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::client::{ApiKey, ClientConfig, Endpoint, StreamClient};
use crate::config::{Config, ConfigError, TargetConfig};
use crate::export::http::{AppState, HttpServer, ReloadFuture, ReloadHook, StatusSource};
use crate::export::metrics::Metrics;
use crate::export::otlp::{OtlpExporter, OtlpTarget};
use crate::export::scrape::{ScrapeTarget, ServerScraper};
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
    #[error("server metrics: {0}")]
    Scrape(#[from] crate::export::scrape::ScrapeError),
    #[error("OTLP: {0}")]
    Otlp(#[from] crate::export::otlp::OtlpError),
    #[error("Kubernetes: {0}")]
    Kube(#[from] crate::k8s::KubeError),
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
            targets.push(Arc::new(resolve_at(t, &url, base_dir).await?));
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

/// A target with a `url` (configured or discovered) as the runner sees it: model `auto`
/// resolved, API key loaded.
pub async fn resolve_target(t: &TargetConfig, base_dir: &Path) -> Result<Target, DaemonError> {
    let url = t
        .url
        .as_ref()
        .map(|u| u.value.clone())
        .ok_or_else(|| DaemonError::Target {
            target: t.name.value.clone(),
            message: "no url".into(),
        })?;
    resolve_at(t, &url, base_dir).await
}

async fn resolve_at(t: &TargetConfig, url: &str, base_dir: &Path) -> Result<Target, DaemonError> {
    let fail = |message: String| DaemonError::Target {
        target: t.name.value.clone(),
        message,
    };
    let model = resolve_model(t, url).await.map_err(fail)?;
    let mut endpoint = Endpoint::new(url, t.api, model, t.dialect)?
        .with_length_control(t.length_control())
        .with_nvext(t.dialect.supports_nvext());
    if let Some(key) = api_key(t, base_dir).map_err(fail)? {
        endpoint = endpoint.with_api_key(&key)?;
    }
    Ok(Target {
        name: t.name.value.clone(),
        mode: t.serving_mode,
        endpoint,
        cost_per_hour_usd: t.cost_per_hour_usd.as_ref().map(|c| c.value),
    })
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
                let body: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
                    format!("{url}: not JSON ({e}); set `model:` on the target to the served model name instead of `auto`")
                })?;
                return body["data"][0]["id"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("{url} lists no models; set `model:` on the target to the served model name instead of `auto`"));
            }
            // Up, but unable to list its models (`transformers serve` answers 500 when it serves
            // a model by path): waiting would not help. Only gateway and overload statuses of a
            // deployment still starting are retried.
            Ok(r) if !matches!(r.status().as_u16(), 429 | 502..=504) => {
                return Err(format!(
                    "{url} answered {}; set `model:` on the target to the served model name instead of `auto`",
                    r.status()
                ));
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
    /// The targets measured now (discovery and leader election change them).
    targets: Arc<RwLock<Vec<Arc<Target>>>>,
    live: Arc<Live>,
    slo: Arc<crate::slo::SloEngine>,
}

/// The SLO engine of `cfg`, with its baselines in the state file (in memory if it cannot be
/// read).
fn slo_engine(
    cfg: &Config,
    config_path: Option<&Path>,
    metrics: &Arc<Metrics>,
) -> crate::slo::SloEngine {
    use crate::slo::baseline::BaselineStore;
    let defs = crate::slo::compile_all(cfg).unwrap_or_else(|e| {
        // Validation compiled every SLO already; this only guards against a mismatch.
        tracing::error!("SLOs not evaluated: {e}");
        Vec::new()
    });
    let path = crate::slo::engine::default_state_file(config_path);
    let baselines = BaselineStore::open(&path).unwrap_or_else(|e| {
        tracing::warn!("{e}; starting with no baselines");
        BaselineStore::in_memory()
    });
    tracing::info!(slos = defs.len(), state_file = %path.display(), "SLO engine ready");
    crate::slo::SloEngine::new(
        defs,
        crate::slo::LabelDomain::of(cfg),
        baselines,
        Some(Arc::clone(metrics)),
    )
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
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|t| json!({"name": t.name, "serving_mode": t.mode.as_str(), "url": t.endpoint.url().as_str(), "model": t.endpoint.model()}))
            .collect();
        v["slos"] = self.slo.status_json();
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
    // Every SLO latency threshold becomes an exact bucket bound, so the generated rules'
    // `le` selectors hit a bucket (fixed for the process: histograms survive reloads).
    let thresholds = crate::slo::latency_thresholds(&cfg);
    let metrics = Arc::new(Metrics::new(&thresholds));
    metrics.record_config_reload(true);
    let config_path_for_state = config_path.clone();
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
    let otlp = match &cfg.export.otlp {
        Some(o) => {
            let targets = deployment
                .targets
                .iter()
                .map(|t| OtlpTarget::new(t.endpoint.api(), t.endpoint.model(), t.endpoint.url()))
                .collect();
            let exporter = OtlpExporter::start(o, targets).await?;
            tracing::info!(endpoint = %*o.endpoint, interval = ?o.interval.0, spans = o.spans, "OTLP export on");
            Some(Arc::new(exporter))
        }
        None => None,
    };
    let slo = Arc::new(slo_engine(&cfg, config_path_for_state.as_deref(), &metrics));
    // In a cluster: discovery, leader election and Events (DESIGN §9).
    let kube_stop = CancellationToken::new();
    let kube = match &cfg.discovery {
        Some(d) => Some(crate::k8s::KubeParts::start(&d.kubernetes, kube_stop.clone()).await?),
        None => None,
    };
    if let Some(events) = kube.as_ref().and_then(|k| k.events.clone()) {
        events.set_slos(&crate::slo::compile_all(&cfg).unwrap_or_default());
        slo.add_hook(events);
    }
    let recorder = Recorder::new(Arc::clone(&metrics), None).with_observer(slo.clone());
    let recorder = Arc::new(match &otlp {
        Some(o) => recorder.with_otlp(Arc::clone(o)),
        None => recorder,
    });
    // Server metrics: the configured endpoints, and every embedded simulator's own `/metrics`.
    let scrape_targets: Vec<ScrapeTarget> = cfg
        .targets
        .iter()
        .zip(&deployment.targets)
        .filter_map(|(c, t)| ScrapeTarget::for_target(c, t.endpoint.url()))
        .collect();
    let scrape_stop = CancellationToken::new();
    // With Kubernetes the gated schedule scrapes the targets this replica sends to.
    let server_metrics = if scrape_targets.is_empty() || kube.is_some() {
        None
    } else {
        let scraper = Arc::new(ServerScraper::new(
            scrape_targets.clone(),
            Arc::clone(&metrics),
        )?);
        tokio::spawn(
            Arc::clone(&scraper).run(cfg.export.server_metrics_interval.0, scrape_stop.clone()),
        );
        Some(scraper)
    };
    let runner = Arc::new(deployment.runner(&cfg, recorder, rand::random()));
    let board = Arc::new(Board::default());
    let current_targets = Arc::new(RwLock::new(deployment.targets.clone()));
    let state = AppState::new(
        Arc::clone(&metrics),
        Arc::new(Status {
            board: Arc::clone(&board),
            targets: Arc::clone(&current_targets),
            live: Arc::clone(&live),
            slo: Arc::clone(&slo),
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
        server_metrics,
    };
    board.announce(&plan_cycle(&cfg));
    let slo_stop = CancellationToken::new();
    let slo_live = Arc::clone(&live);
    tokio::spawn(crate::slo::engine::run_evaluations(
        Arc::clone(&slo),
        move || {
            let cfg = slo_live.config();
            crate::slo::compile_all(&cfg)
                .ok()
                .map(|defs| (defs, crate::slo::LabelDomain::of(&cfg)))
        },
        slo_stop.clone(),
    ));
    readiness.set_ready();
    let plan_live = Arc::clone(&live);
    let pause_live = Arc::clone(&live);
    let plan = move || plan_cycle(&plan_live.config());
    let pause = move || pause_live.config().schedule.cycle_pause.0;
    match kube {
        None => {
            scheduler.runner.calibrate(&hard_stop).await;
            scheduler
                .run_forever(plan, pause, &soft_stop, &hard_stop)
                .await;
        }
        Some(k) => {
            crate::k8s::traffic::GatedSchedule {
                static_targets: deployment.targets.clone(),
                static_scrape: scrape_targets,
                discovered: k.discovered,
                leadership: k.leadership,
                runner: Arc::clone(&scheduler.runner),
                board: Arc::clone(&board),
                metrics: Arc::clone(&metrics),
                events: k.events,
                current: current_targets,
                scrape_interval: cfg.export.server_metrics_interval.0,
                base_dir: base_dir.clone(),
            }
            .run_forever(plan, pause, &soft_stop, &hard_stop)
            .await;
        }
    }
    kube_stop.cancel();
    tracing::info!("schedule stopped; shutting down");
    shutdown_http.cancel();
    let _ = http.await;
    scrape_stop.cancel();
    slo_stop.cancel();
    if let Some(otlp) = otlp {
        otlp.shutdown().await;
    }
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
