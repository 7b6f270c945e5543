//! The `run` daemon: binds the HTTP surface, starts embedded simulators, resolves targets,
//! drives the schedule forever, reloads the config on SIGHUP, `POST /-/reload` or a change of
//! the file ([`live`]), and shuts down on SIGTERM with a bounded drain (a second signal exits at
//! once).

mod live;
mod start;

use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde_json::json;

use crate::export::http::{PauseHook, StatusSource};
use crate::export::metrics::Metrics;
use crate::export::otlp::OtlpExporter;
use crate::model::{Finished, Sink, TargetChange, TargetInfo};
use crate::probe::ProbeReport;
use crate::schedule::gate::{Gate, Switch, SystemClock};
use crate::schedule::{Board, plan_cycle};
use crate::setup::Setup;
use crate::shutdown::{OnSignal, Shutdown};
use crate::slo::SloEngine;
use crate::slo::baseline::BaselineStore;
use crate::slo::state::{EngineState, FileBackend, StateBackend};
use crate::targets::Deployment;
use live::{Live, RulesPublisher};

pub use live::CONFIG_POLL_INTERVAL;

/// Longest a shutdown waits for in-flight requests before cutting them (they count as `timeout`).
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);

/// Longest the services (HTTP surface, watches, discovery, the Lease) get to stop once the
/// schedule has drained.
const SERVICES_STOP: Duration = Duration::from_secs(10);

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
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("OTLP: {0}")]
    Otlp(#[from] crate::export::otlp::OtlpError),
    #[error("Kubernetes: {0}")]
    Kube(#[from] crate::k8s::KubeError),
    #[error("export.lifecycle_token_file: {0}")]
    Token(crate::config::TokenError),
}

/// The targets measured now, as the schedule reports them (discovery, leader election and
/// reloads change them), for `/api/v1/status`.
struct CurrentTargets(RwLock<Vec<TargetInfo>>);

impl Sink for CurrentTargets {
    fn request(&self, _: &Finished<'_>) {}

    fn targets(&self, change: &TargetChange<'_>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = change.now.to_vec();
    }
}

struct Status {
    board: Arc<Board>,
    targets: Arc<CurrentTargets>,
    live: Arc<Live>,
    slo: Arc<SloEngine>,
    probes: Arc<RwLock<Vec<ProbeReport>>>,
}

/// Probes `t` at `url` once, logs and publishes the result.
async fn probe_target(
    t: crate::config::TargetConfig,
    url: String,
    base_dir: std::path::PathBuf,
    client: crate::client::StreamClient,
    metrics: Arc<Metrics>,
    probes: Arc<RwLock<Vec<ProbeReport>>>,
) {
    let report = crate::probe::probe(&t, &url, &base_dir, &client).await;
    let ok = report.verdict == crate::probe::Verdict::Ok;
    metrics.set_probe(&report.target, ok);
    let line = crate::probe::render_line(&report);
    if ok {
        tracing::info!("{line}");
    } else {
        tracing::warn!("{line}");
    }
    probes
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .push(report);
}

impl StatusSource for Status {
    fn status_json(&self) -> serde_json::Value {
        let setup = self.live.setup();
        let cfg = &setup.config;
        let mut v = self.board.status_json();
        v["version"] = json!(env!("CARGO_PKG_VERSION"));
        v["config"] = json!(
            setup
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "<embedded demo>".into())
        );
        v["time_scale"] = json!(*cfg.time_scale);
        v["cycle"] = json!(cfg.cycle());
        let activity = self.board.target_activity();
        v["targets"] = self
            .targets
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|t| json!({"name": t.name, "serving_mode": t.serving_mode.as_str(), "url": t.url, "model": t.model, "activity": activity.get(&t.name)}))
            .collect();
        // Configured targets that could not be started (retried every 30 s), and why.
        v["failed_targets"] = self
            .live
            .failed()
            .into_iter()
            .map(|(name, error)| json!({"name": name, "error": error}))
            .collect();
        v["slos"] = self.slo.status_json();
        v["probes"] = json!(*self.probes.read().unwrap_or_else(PoisonError::into_inner));
        v
    }
}

/// Where the SLO engine's state is kept: the ConfigMap of `state_configmap` in a cluster, else a
/// file (`LLM_CANARY_STATE_FILE`, or the temp directory, named after the config path).
fn state_backend(setup: &Setup, kube: Option<&crate::k8s::KubeParts>) -> Arc<dyn StateBackend> {
    match kube.and_then(|k| k.state.clone()) {
        Some(cm) => cm,
        None => Arc::new(FileBackend::new(&crate::slo::engine::default_state_file(
            setup.path.as_deref(),
        ))),
    }
}

/// Loads the saved SLO state from `backend` into `engine` (an unreadable state starts empty).
async fn restore_state(engine: &SloEngine, backend: &dyn StateBackend) {
    match backend.load().await.and_then(|b| match b {
        Some(bytes) => EngineState::parse(&bytes).map(Some),
        None => Ok(None),
    }) {
        Ok(Some(state)) => {
            engine.restore(&state);
            tracing::info!(from = %backend.describe(), verdicts = state.verdicts.len(), baseline_terms = state.terms.len(), pinned = state.pinned.len(), "SLO state restored");
        }
        Ok(None) => tracing::info!(at = %backend.describe(), "no saved SLO state yet"),
        Err(e) => tracing::warn!("SLO state not restored ({e}); starting with none"),
    }
}

/// The SLO engine of `setup`, its saved state restored and kept in `backend`.
async fn slo_engine(
    setup: &Setup,
    metrics: &Arc<Metrics>,
    backend: Arc<dyn StateBackend>,
) -> SloEngine {
    let engine = SloEngine::new(
        setup.slos.clone(),
        setup.domain.clone(),
        BaselineStore::in_memory(),
        Some(metrics.clone()),
    );
    restore_state(&engine, backend.as_ref()).await;
    tracing::info!(slos = setup.slos.len(), state = %backend.describe(), "SLO engine ready");
    engine.persist_to(backend);
    engine
}

/// Runs the daemon until SIGTERM/SIGINT. `setup` is already validated.
pub async fn run(setup: Setup, listen: Option<SocketAddr>) -> Result<(), DaemonError> {
    let setup = Arc::new(setup);
    for w in setup.warning_lines() {
        tracing::warn!("{w}");
    }
    // Installed before the port is bound and announced, so a signal at any moment after
    // "listening on" (and during the possibly slow start) is a drain, not a kill.
    let shutdown = Shutdown::new();
    let hangups = shutdown.on_signals(OnSignal::Drain(SHUTDOWN_DRAIN));
    let listener = start::bind(&setup, listen).await?;
    // Every SLO latency threshold becomes an exact bucket bound (fixed for the process:
    // histograms survive reloads).
    let metrics = Arc::new(Metrics::with_resolution(
        &setup.latency_thresholds(),
        setup.config.export.resolution,
    ));
    metrics.record_config_reload(true);
    // When traffic may go: the config's windows and pause, and the operators' switches.
    let gate = Arc::new(Gate::new(Arc::new(SystemClock)));
    apply_gate_config(&gate, &setup);

    let Some(mut started) = start::start_targets(&setup, &metrics, &shutdown).await? else {
        return Ok(());
    };
    let mut services = start::start_services(&setup, &metrics, &shutdown).await?;
    let parts = (&metrics, &gate);
    let wired = start::wire(&setup, &mut started, &services, parts, hangups, &shutdown);
    let probes = Arc::clone(&started.probes);
    let readiness = start::serve(
        listener,
        &setup,
        &wired,
        &services,
        (&metrics, &gate, probes),
        &shutdown,
    )?;
    let client = started.deployment.client.clone();
    let kube = services.kube.take();
    let mut scheduler = start::scheduler(&setup, &wired, kube, parts, &client, &shutdown);
    readiness.set_ready();
    let (plan_live, pause_live) = (Arc::clone(&wired.live), Arc::clone(&wired.live));
    scheduler
        .run(
            move || plan_cycle(&plan_live.setup().config),
            move || pause_live.setup().config.schedule.cycle_pause.0,
            None,
            &shutdown,
        )
        .await;
    tracing::info!("schedule stopped; shutting down");
    stop(&shutdown, services.otlp, &wired.live, started.deployment).await;
    Ok(())
}

/// The end of a run, once the schedule returned: every service stops and every task is awaited
/// (bounded), the OTLP pipeline flushes, and the simulators stop.
async fn stop(
    shutdown: &Shutdown,
    otlp: Option<Arc<OtlpExporter>>,
    live: &Live,
    deployment: Deployment,
) {
    if !shutdown.finish(SERVICES_STOP).await {
        tracing::warn!(bound = ?SERVICES_STOP, "some services did not stop in time");
    }
    if let Some(otlp) = otlp {
        otlp.shutdown().await;
    }
    live.stop_sims().await;
    deployment.stop().await;
    tracing::info!("shutdown complete");
}

/// The gate's part of the config: the `schedule.active` windows and `schedule.paused`.
pub(crate) fn apply_gate_config(gate: &Gate, setup: &Setup) {
    let schedule = &setup.config.schedule;
    // Validated with the config.
    gate.set_windows(schedule.active.as_ref().and_then(|a| a.compile().ok()));
    gate.set(
        Switch::Config,
        schedule
            .paused
            .then(|| "schedule.paused: true in the config".to_owned()),
    );
}

/// `POST /-/pause` and `POST /-/resume`: the HTTP switch of the gate.
struct PauseControl(Arc<Gate>);

impl PauseControl {
    fn state(&self) -> serde_json::Value {
        let s = self.0.state();
        json!({
            "paused": !s.open(),
            "by": s.operator.iter().map(|(w, note)| json!({"source": w.as_str(), "note": note})).collect::<Vec<_>>(),
            "in_window": s.in_window,
        })
    }
}

impl PauseHook for PauseControl {
    fn pause(&self, note: String) -> serde_json::Value {
        self.0.set(Switch::Http, Some(note));
        self.state()
    }

    fn resume(&self) -> serde_json::Value {
        self.0.set(Switch::Http, None);
        self.state()
    }
}

/// A replica that becomes the leader continues from the state its predecessor saved (it loads
/// it as its first steps start) and writes its PrometheusRule.
async fn take_over_on_leading(
    mut leadership: tokio::sync::watch::Receiver<crate::schedule::Leadership>,
    slo: Arc<SloEngine>,
    backend: Arc<dyn StateBackend>,
    rules: Option<Arc<RulesPublisher>>,
    live: Arc<Live>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut was_active = leadership.borrow_and_update().is_active();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            r = leadership.changed() => if r.is_err() { return },
        }
        let active = leadership.borrow_and_update().is_active();
        if active && !was_active {
            tracing::info!("leading now: taking over the saved SLO state");
            restore_state(&slo, backend.as_ref()).await;
            if let Some(r) = &rules {
                r.publish(&live.setup()).await;
            }
        }
        was_active = active;
    }
}

/// Reloads on every SIGHUP once the daemon has started; those that came before it started are
/// ignored, each with a warning. Each reload runs on its own task, so a SIGTERM during a long
/// reload is heard.
async fn reload_on_hangup(
    mut hangups: tokio::sync::mpsc::UnboundedReceiver<()>,
    live: Arc<Live>,
    shutdown: Shutdown,
) {
    while hangups.try_recv().is_ok() {
        tracing::warn!("SIGHUP before the daemon started: ignored");
    }
    let service = shutdown.service();
    loop {
        tokio::select! {
            Some(()) = hangups.recv() => {
                let live = Arc::clone(&live);
                shutdown.spawn(async move {
                    let _ = live.reload().await;
                });
            }
            _ = service.cancelled() => return,
        }
    }
}
