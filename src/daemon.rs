//! The `run` daemon: binds the HTTP surface, starts embedded simulators, resolves targets,
//! drives the schedule forever, reloads the config on SIGHUP, `POST /-/reload` or a change of
//! the file (targets added, changed or removed between steps, the plan from the next cycle), and
//! shuts down on SIGTERM with a bounded drain (a second signal exits at once).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::client::StreamClient;
use crate::config::{Config, TargetConfig};
use crate::export::http::{AppState, HttpServer, ReloadFuture, ReloadHook, StatusSource};
use crate::export::metrics::Metrics;
use crate::export::otlp::{OtlpExporter, OtlpTarget};
use crate::k8s::traffic::StaticTargets;
use crate::model::Sink;
use crate::schedule::{Board, Recorder, Target, plan_cycle};
use crate::scrape::ScrapeTarget;
use crate::sim::SimHandle;
use crate::targets::{Deployment, start_target};

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
    #[error(transparent)]
    Targets(#[from] crate::targets::TargetError),
    #[error("server metrics: {0}")]
    Scrape(#[from] crate::scrape::ScrapeError),
    #[error("OTLP: {0}")]
    Otlp(#[from] crate::export::otlp::OtlpError),
    #[error("Kubernetes: {0}")]
    Kube(#[from] crate::k8s::KubeError),
}

/// How often the config file is checked for changes (a third way to reload, besides SIGHUP and
/// `POST /-/reload`; a Kubernetes ConfigMap update arrives this way).
pub const CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// One target in force: its config (to tell what a reload changed), how the runner sees it, and
/// its embedded simulator.
struct LiveTarget {
    name: String,
    config: TargetConfig,
    key: String,
    target: Arc<Target>,
    sim: Option<SimHandle>,
    /// Started by the reload in progress (rolled back if the reload fails).
    fresh: bool,
}

impl LiveTarget {
    fn new(config: &TargetConfig, target: Arc<Target>, sim: Option<SimHandle>) -> Self {
        LiveTarget {
            name: config.name.value.clone(),
            key: target_key(config),
            config: config.clone(),
            target,
            sim,
            fresh: false,
        }
    }
}

/// What identifies a target's setup: its config without positions.
fn target_key(t: &TargetConfig) -> String {
    serde_json::to_string(t).unwrap_or_default()
}

/// The config in force and where it came from (for reloads).
struct Live {
    config: Mutex<Config>,
    path: Option<PathBuf>,
    metrics: Arc<Metrics>,
    base_dir: PathBuf,
    client: StreamClient,
    targets: Mutex<Vec<LiveTarget>>,
    /// The configured targets, as the schedule re-reads them at every step.
    statics: watch::Sender<StaticTargets>,
    /// Simulators of removed targets; the schedule stops them between steps, once no request
    /// of theirs can be in flight.
    retired: Arc<Mutex<Vec<SimHandle>>>,
    /// One reload at a time (SIGHUP, `POST /-/reload` and the file watch may coincide).
    reloading: tokio::sync::Mutex<()>,
    /// Hash of the file's content as last loaded or rejected: the file watch reloads on change.
    loaded_hash: Mutex<Option<u64>>,
}

fn content_hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Live {
    fn config(&self) -> Config {
        lock(&self.config).clone()
    }

    /// Re-reads the config file and applies it; a bad file, or a new target that cannot be
    /// started, leaves the running config untouched.
    async fn reload(&self) -> Result<String, String> {
        let _one = self.reloading.lock().await;
        let result = match &self.path {
            None => Ok("the embedded demo config has nothing to reload".to_owned()),
            Some(path) => {
                if let Ok(bytes) = std::fs::read(path) {
                    *lock(&self.loaded_hash) = Some(content_hash(&bytes));
                }
                match Config::load(path) {
                    Ok(new) => self
                        .apply(new)
                        .await
                        .map(|m| format!("reloaded {}: {m}", path.display())),
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        self.metrics.record_config_reload(result.is_ok());
        match &result {
            Ok(m) => tracing::info!("{m}"),
            Err(e) => tracing::error!("reload rejected, the old config keeps running:\n{e}"),
        }
        result
    }

    /// Starts the targets `new` adds or changes, then swaps the target set and the config;
    /// on any failure stops what it started and keeps everything as it was.
    async fn apply(&self, new: Config) -> Result<String, String> {
        let mut old = std::mem::take(&mut *lock(&self.targets));
        let mut next: Vec<LiveTarget> = Vec::new();
        let mut failure = None;
        for t in &new.targets {
            let key = target_key(t);
            if let Some(i) = old.iter().position(|o| o.name == *t.name && o.key == key) {
                next.push(old.remove(i));
                continue;
            }
            match start_target(t, &self.base_dir, &self.client).await {
                Ok((target, sim)) => next.push(LiveTarget {
                    fresh: true,
                    ..LiveTarget::new(t, target, sim)
                }),
                Err(e) => {
                    failure = Some(e.to_string());
                    break;
                }
            }
        }
        if let Some(e) = failure {
            for t in next {
                if t.fresh {
                    if let Some(sim) = t.sim {
                        sim.shutdown().await;
                    }
                } else {
                    old.push(t);
                }
            }
            let order = self.config();
            old.sort_by_key(|t| order.targets.iter().position(|c| *c.name == t.name));
            *lock(&self.targets) = old;
            return Err(e);
        }
        let added: Vec<&str> = next
            .iter()
            .filter(|t| t.fresh && !old.iter().any(|o| o.name == t.name))
            .map(|t| t.name.as_str())
            .collect();
        let changed: Vec<&str> = next
            .iter()
            .filter(|t| t.fresh && old.iter().any(|o| o.name == t.name))
            .map(|t| t.name.as_str())
            .collect();
        let removed: Vec<&str> = old
            .iter()
            .filter(|o| !next.iter().any(|t| t.name == o.name))
            .map(|o| o.name.as_str())
            .collect();
        let mut msg = format!(
            "{} target(s); added [{}], changed [{}], removed [{}] from the next step; the new plan applies from the next cycle",
            next.len(),
            added.join(", "),
            changed.join(", "),
            removed.join(", ")
        );
        let before = self.config();
        let restart_only = [
            (
                "export",
                serde_json::to_value(&before.export).ok() != serde_json::to_value(&new.export).ok(),
            ),
            (
                "discovery",
                serde_json::to_value(&before.discovery).ok()
                    != serde_json::to_value(&new.discovery).ok(),
            ),
            (
                "tokenizer",
                before.tokenizer.as_deref() != new.tokenizer.as_deref(),
            ),
            (
                "client",
                serde_json::to_value(&before.client).ok() != serde_json::to_value(&new.client).ok(),
            ),
        ];
        let needs_restart: Vec<&str> = restart_only
            .iter()
            .filter(|(_, c)| *c)
            .map(|(n, _)| *n)
            .collect();
        if !needs_restart.is_empty() {
            msg.push_str(&format!(
                "; changes to {} apply on restart",
                needs_restart.join(", ")
            ));
        }
        for t in old {
            if let Some(sim) = t.sim {
                lock(&self.retired).push(sim);
            }
        }
        for t in &mut next {
            t.fresh = false;
        }
        self.statics.send_replace(static_targets(&next));
        *lock(&self.targets) = next;
        *lock(&self.config) = new;
        Ok(msg)
    }

    /// Stops every simulator, those in force and the retired ones.
    async fn stop_sims(&self) {
        let mut sims: Vec<SimHandle> = std::mem::take(&mut *lock(&self.retired));
        sims.extend(
            std::mem::take(&mut *lock(&self.targets))
                .into_iter()
                .filter_map(|t| t.sim),
        );
        for sim in sims {
            sim.shutdown().await;
        }
    }
}

/// The configured targets and their server-metrics endpoints, for the schedule.
fn static_targets(targets: &[LiveTarget]) -> StaticTargets {
    StaticTargets {
        targets: targets.iter().map(|t| Arc::clone(&t.target)).collect(),
        scrape: targets
            .iter()
            .filter_map(|t| ScrapeTarget::for_target(&t.config, t.target.endpoint.url()))
            .collect(),
    }
}

/// Reloads when the config file's content changes (checked every [`CONFIG_POLL_INTERVAL`]). A
/// file that does not change is not reloaded again, so a bad one is reported once.
async fn watch_config_file(live: Arc<Live>, stop: CancellationToken) {
    let Some(path) = live.path.clone() else {
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CONFIG_POLL_INTERVAL) => {}
            _ = stop.cancelled() => return,
        }
        // A file being replaced may be missing for a moment: that is no change.
        let Ok(bytes) = tokio::fs::read(&path).await else {
            continue;
        };
        let hash = content_hash(&bytes);
        if *lock(&live.loaded_hash) != Some(hash) {
            tracing::info!(path = %path.display(), "config file changed: reloading");
            let _ = live.reload().await;
        }
    }
}

struct Reload(Arc<Live>);

impl ReloadHook for Reload {
    fn reload(&self) -> ReloadFuture {
        let live = Arc::clone(&self.0);
        Box::pin(async move { live.reload().await })
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
        Some(metrics.clone()),
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

    let soft_stop = CancellationToken::new();
    let hard_stop = CancellationToken::new();
    // Installed before the (possibly slow) start so a signal during it is a drain, not a kill.
    let (live_tx, live_rx) = tokio::sync::oneshot::channel::<Arc<Live>>();
    spawn_signal_handlers(live_rx, soft_stop.clone(), hard_stop.clone());

    let mut deployment = Deployment::start(&cfg, &base_dir).await?;
    for t in &deployment.targets {
        metrics.set_target_up(&t.name, true);
    }
    let mut sims: Vec<Option<SimHandle>> = std::mem::take(&mut deployment.sims)
        .into_iter()
        .map(Some)
        .collect();
    let live_targets: Vec<LiveTarget> = cfg
        .targets
        .iter()
        .zip(&deployment.targets)
        .zip(&deployment.sim_of)
        .map(|((c, t), s)| LiveTarget::new(c, Arc::clone(t), s.and_then(|i| sims[i].take())))
        .collect();
    let (statics_tx, statics_rx) = watch::channel(static_targets(&live_targets));
    let retired = Arc::new(Mutex::new(Vec::new()));
    let live = Arc::new(Live {
        config: Mutex::new(cfg.clone()),
        loaded_hash: Mutex::new(
            config_path
                .as_deref()
                .and_then(|p| std::fs::read(p).ok())
                .map(|b| content_hash(&b)),
        ),
        path: config_path.clone(),
        metrics: Arc::clone(&metrics),
        base_dir: base_dir.clone(),
        client: deployment.client.clone(),
        targets: Mutex::new(live_targets),
        statics: statics_tx,
        retired: Arc::clone(&retired),
        reloading: tokio::sync::Mutex::new(()),
    });
    let _ = live_tx.send(Arc::clone(&live));

    let otlp = match &cfg.export.otlp {
        Some(o) => {
            let targets = deployment
                .targets
                .iter()
                .map(|t| {
                    OtlpTarget::new(
                        &t.name,
                        t.endpoint.api(),
                        t.endpoint.model(),
                        t.endpoint.url(),
                    )
                })
                .collect();
            let exporter = OtlpExporter::start(o, targets).await?;
            tracing::info!(endpoint = %*o.endpoint, interval = ?o.interval.0, spans = o.spans, "OTLP export on");
            Some(Arc::new(exporter))
        }
        None => None,
    };
    let slo = Arc::new(slo_engine(&cfg, config_path.as_deref(), &metrics));
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
    let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
    if let Some(o) = &otlp {
        sinks.push(o.clone());
    }
    sinks.push(metrics.clone());
    sinks.push(slo.clone());
    let recorder = Arc::new(Recorder::new(sinks));
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
    let shutdown_http = CancellationToken::new();
    let http = tokio::spawn(server.serve(shutdown_http.clone()));
    let watch_stop = CancellationToken::new();
    tokio::spawn(watch_config_file(Arc::clone(&live), watch_stop.clone()));

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
    // One schedule for every setup: it re-reads the target set at every step, so a reload (and,
    // in a cluster, discovery and leader election) changes targets between steps.
    let (discovered, leadership, events) = match kube {
        Some(k) => (k.discovered, k.leadership, k.events),
        None => (None, None, None),
    };
    crate::k8s::traffic::GatedSchedule {
        static_targets: statics_rx,
        discovered,
        leadership,
        runner: Arc::clone(&runner),
        board: Arc::clone(&board),
        metrics: Arc::clone(&metrics),
        events,
        current: current_targets,
        scrape_interval: cfg.export.server_metrics_interval.0,
        base_dir: base_dir.clone(),
        retired_sims: retired,
    }
    .run_forever(plan, pause, &soft_stop, &hard_stop)
    .await;
    kube_stop.cancel();
    watch_stop.cancel();
    tracing::info!("schedule stopped; shutting down");
    shutdown_http.cancel();
    let _ = http.await;
    slo_stop.cancel();
    if let Some(otlp) = otlp {
        otlp.shutdown().await;
    }
    // A reload in progress finishes first, so no simulator it starts is left behind.
    let _one = live.reloading.lock().await;
    live.stop_sims().await;
    deployment.stop().await;
    tracing::info!("shutdown complete");
    Ok(())
}

/// SIGTERM/SIGINT: stop sending and drain (bounded by [`SHUTDOWN_DRAIN`]); a second one exits at
/// once. SIGHUP: reload (once the daemon has started; before, it is ignored with a warning).
fn spawn_signal_handlers(
    live: tokio::sync::oneshot::Receiver<Arc<Live>>,
    soft_stop: CancellationToken,
    hard_stop: CancellationToken,
) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::spawn(async move {
        let mut live = live;
        let mut started: Option<Arc<Live>> = None;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = hup.recv() => {
                    if started.is_none() {
                        started = live.try_recv().ok();
                    }
                    match &started {
                        // Off the signal loop, so a second SIGTERM is heard during a long reload.
                        Some(l) => {
                            let l = Arc::clone(l);
                            tokio::spawn(async move { let _ = l.reload().await; });
                        }
                        None => tracing::warn!("SIGHUP before the daemon started: ignored"),
                    }
                    continue;
                }
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
