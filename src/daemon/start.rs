//! The daemon's start, phase by phase: the port, the targets, the services beside the schedule,
//! the wiring of the sinks and the runner, the HTTP surface, and the schedule itself. `run`
//! calls them in this order; each phase hands the next what it built.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::live::{Live, LiveParts, LiveTarget, Reload, RulesPublisher};
use super::{
    CurrentTargets, DaemonError, PauseControl, Status, probe_target, reload_on_hangup, slo_engine,
    state_backend, take_over_on_leading,
};
use crate::export::http::{AppState, HttpServer, Lifecycle, Readiness, bind_listener};
use crate::export::metrics::Metrics;
use crate::export::otlp::OtlpExporter;
use crate::k8s::KubeParts;
use crate::k8s::events::SloEvents;
use crate::k8s::traffic::DiscoveredTargets;
use crate::model::Sink;
use crate::probe::ProbeReport;
use crate::schedule::gate::Gate;
use crate::schedule::{Board, Runner, Scheduler, TargetSet, TargetSource};
use crate::scrape::ServerMetricsSink;
use crate::setup::Setup;
use crate::shutdown::Shutdown;
use crate::slo::SloEngine;
use crate::slo::state::StateBackend;
use crate::targets::{Deployment, TargetFailure};

/// The preflight reports of the started targets, as they come in.
pub(super) type Preflight = Arc<RwLock<Vec<ProbeReport>>>;

/// Binds the HTTP surface's port (`listen`, or the config's `export.listen`).
pub(super) async fn bind(
    setup: &Setup,
    listen: Option<SocketAddr>,
) -> Result<TcpListener, DaemonError> {
    let addr = listen.unwrap_or_else(|| setup.config.export.listen.parse().expect("validated"));
    let listener = bind_listener(addr).map_err(|source| DaemonError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| DaemonError::Bind { addr, source })?;
    tracing::info!("listening on {local}");
    Ok(listener)
}

/// The configured targets as started: the deployment (its simulators handed over to the live
/// targets), the live targets, those that failed, and the preflight reports that fill in beside
/// the first steps.
pub(super) struct Started {
    pub(super) deployment: Deployment,
    pub(super) live_targets: Vec<LiveTarget>,
    pub(super) failed: Vec<TargetFailure>,
    pub(super) probes: Preflight,
}

/// Starts every target on its own, one model lookup each: a target that fails (a `/v1/models`
/// that never answers, a key it refuses) neither delays nor stops the others; it is reported and
/// retried in the background (`Live::retry_failed`). `None` when a signal ended the start.
pub(super) async fn start_targets(
    setup: &Setup,
    metrics: &Arc<Metrics>,
    shutdown: &Shutdown,
) -> Result<Option<Started>, DaemonError> {
    let cfg = &setup.config;
    crate::targets::warn_on_descriptors(
        cfg,
        crate::export::HttpLimits::default().max_connections as u64,
    );
    let (mut deployment, failed) = tokio::select! {
        started = Deployment::start_partial(cfg, setup.base_dir(), 1) => started?,
        _ = shutdown.stop_sending().cancelled() => {
            tracing::info!("stopped while starting the targets");
            return Ok(None);
        }
    };
    for f in &failed {
        metrics.set_target_up(&f.name, false);
    }
    let probes = spawn_preflight(setup, &deployment, metrics, shutdown);
    let mut sims: Vec<_> = std::mem::take(&mut deployment.sims)
        .into_iter()
        .map(Some)
        .collect();
    let live_targets = deployment
        .config_index
        .iter()
        .map(|&i| &cfg.targets[i])
        .zip(&deployment.targets)
        .zip(&deployment.sim_of)
        .map(|((c, t), s)| LiveTarget::new(c, Arc::clone(t), s.and_then(|i| sims[i].take())))
        .collect();
    Ok(Some(Started {
        deployment,
        live_targets,
        failed,
        probes,
    }))
}

/// The preflight of every started target, beside the first steps (docs/DESIGN.md §2).
fn spawn_preflight(
    setup: &Setup,
    deployment: &Deployment,
    metrics: &Arc<Metrics>,
    shutdown: &Shutdown,
) -> Preflight {
    let probes = Arc::new(RwLock::new(Vec::new()));
    let configs = deployment
        .config_index
        .iter()
        .map(|&i| &setup.config.targets[i]);
    for (t, sim) in configs.zip(&deployment.sim_of) {
        let url = match sim {
            Some(i) => deployment.sims[*i].base_url(),
            None => t.url.as_ref().map(|u| u.value.clone()).unwrap_or_default(),
        };
        shutdown.spawn(probe_target(
            t.clone(),
            url,
            setup.base_dir().to_owned(),
            deployment.client.clone(),
            Arc::clone(metrics),
            Arc::clone(&probes),
        ));
    }
    probes
}

/// What runs beside the schedule and needs no target: the OTLP push, the cluster's parts, the
/// SLO engine with its state, the Events it posts and the rules it publishes.
pub(super) struct Services {
    pub(super) otlp: Option<Arc<OtlpExporter>>,
    pub(super) kube: Option<KubeParts>,
    pub(super) backend: Arc<dyn StateBackend>,
    pub(super) slo: Arc<SloEngine>,
    pub(super) events: Option<Arc<SloEvents>>,
    pub(super) rules: Option<Arc<RulesPublisher>>,
}

pub(super) async fn start_services(
    setup: &Setup,
    metrics: &Arc<Metrics>,
    shutdown: &Shutdown,
) -> Result<Services, DaemonError> {
    let cfg = &setup.config;
    let otlp = match &cfg.export.otlp {
        Some(o) => {
            let exporter = OtlpExporter::start(o, Vec::new()).await?;
            tracing::info!(endpoint = %*o.endpoint, interval = ?o.interval.0, spans = o.spans, "OTLP export on");
            Some(Arc::new(exporter))
        }
        None => None,
    };
    // In a cluster: discovery, leader election, Events and the state ConfigMap (docs/DESIGN.md §9).
    let kube = match &cfg.discovery {
        Some(d) => Some(KubeParts::start(&d.kubernetes, shutdown).await?),
        None => None,
    };
    let backend = state_backend(setup, kube.as_ref());
    let slo = Arc::new(slo_engine(setup, metrics, backend.clone()).await);
    let events = kube.as_ref().and_then(|k| k.events.clone());
    if let Some(events) = &events {
        events.set_slos(&setup.slos);
        slo.add_hook(events.clone());
    }
    let rules = kube.as_ref().and_then(|k| {
        k.rules.clone().map(|rules| {
            Arc::new(RulesPublisher {
                rules,
                leadership: k.leadership.clone(),
            })
        })
    });
    if let Some(r) = &rules {
        r.publish(setup).await;
    }
    Ok(Services {
        otlp,
        kube,
        backend,
        slo,
        events,
        rules,
    })
}

/// The live config and the consumers of the schedule's data, put together.
pub(super) struct Wired {
    pub(super) live: Arc<Live>,
    /// The configured targets, as a reload changes them.
    pub(super) statics: watch::Receiver<TargetSet>,
    pub(super) board: Arc<Board>,
    pub(super) current: Arc<CurrentTargets>,
    pub(super) runner: Arc<Runner>,
}

/// The live config over the started targets (reloads, retries of failed targets, SIGHUP, a
/// leader's take-over), and the runner assembled with every sink, in the order they hear of a
/// request: OTLP, /metrics, the SLO engine, the status board, the current targets, the live
/// config, Events.
pub(super) fn wire(
    setup: &Arc<Setup>,
    started: &mut Started,
    services: &Services,
    (metrics, gate): (&Arc<Metrics>, &Arc<Gate>),
    hangups: Option<tokio::sync::mpsc::UnboundedReceiver<()>>,
    shutdown: &Shutdown,
) -> Wired {
    let deployment = &started.deployment;
    let (live, statics) = Live::new(
        Arc::clone(setup),
        std::mem::take(&mut started.live_targets),
        LiveParts {
            metrics: Arc::clone(metrics),
            client: deployment.client.clone(),
            slo: Arc::clone(&services.slo),
            events: services.events.clone(),
            rules: services.rules.clone(),
            tasks: shutdown.tracker().clone(),
            gate: Arc::clone(gate),
            budget: None,
        },
    );
    let live = Arc::new(live);
    live.set_failed(std::mem::take(&mut started.failed));
    spawn_live_tasks(&live, services, hangups, shutdown);
    let board = Arc::new(Board::default());
    let current = Arc::new(CurrentTargets(RwLock::new(
        deployment.targets.iter().map(|t| t.info()).collect(),
    )));
    let mut sinks: Vec<Arc<dyn Sink>> = Vec::new();
    if let Some(o) = &services.otlp {
        sinks.push(o.clone());
    }
    sinks.push(metrics.clone());
    sinks.push(services.slo.clone());
    sinks.push(board.clone());
    sinks.push(current.clone());
    sinks.push(live.clone());
    if let Some(e) = &services.events {
        sinks.push(e.clone());
    }
    let runner = deployment.assemble(&setup.config, sinks);
    live.set_budget(Arc::clone(&runner.budget));
    Wired {
        live,
        statics,
        board,
        current,
        runner,
    }
}

/// The live config's background work: retrying failed targets, reloading on SIGHUP, and taking
/// over the SLO state and rules when this replica becomes the leader.
fn spawn_live_tasks(
    live: &Arc<Live>,
    services: &Services,
    hangups: Option<tokio::sync::mpsc::UnboundedReceiver<()>>,
    shutdown: &Shutdown,
) {
    shutdown.spawn(Arc::clone(live).retry_failed(shutdown.service()));
    if let Some(hangups) = hangups {
        shutdown.spawn(reload_on_hangup(
            hangups,
            Arc::clone(live),
            shutdown.clone(),
        ));
    }
    if let Some(leadership) = services.kube.as_ref().and_then(|k| k.leadership.clone()) {
        shutdown.spawn(take_over_on_leading(
            leadership,
            Arc::clone(&services.slo),
            services.backend.clone(),
            services.rules.clone(),
            Arc::clone(live),
            shutdown.service(),
        ));
    }
}

/// Serves the HTTP surface on `listener` (and the lifecycle endpoints where enabled), watches
/// the config file and evaluates the SLOs; returns the readiness the schedule sets once it runs.
pub(super) fn serve(
    listener: TcpListener,
    setup: &Setup,
    wired: &Wired,
    services: &Services,
    (metrics, gate, probes): (&Arc<Metrics>, &Arc<Gate>, Preflight),
    shutdown: &Shutdown,
) -> Result<Readiness, DaemonError> {
    let slo = &services.slo;
    let state = AppState::new(
        Arc::clone(metrics),
        Arc::new(Status {
            board: Arc::clone(&wired.board),
            targets: Arc::clone(&wired.current),
            live: Arc::clone(&wired.live),
            slo: Arc::clone(slo),
            probes,
        }),
    )
    .with_baselines(slo.clone());
    let state = match lifecycle(setup, &wired.live, gate)? {
        Some(l) => state.with_lifecycle(l),
        None => state,
    };
    let readiness = state.readiness();
    let local = listener.local_addr().ok();
    let server = HttpServer::from_listener(listener, state);
    shutdown.spawn(server.serve(shutdown.service()));
    if let Some(local) = local {
        let base = browsable(local);
        tracing::info!(
            "open {base}/ for the status page; {base}/metrics, {base}/api/v1/status for the data"
        );
    }
    shutdown.spawn(Arc::clone(&wired.live).watch_file(shutdown.service()));
    shutdown.spawn(crate::slo::engine::run_evaluations(
        Arc::clone(slo),
        shutdown.service(),
    ));
    Ok(readiness)
}

/// `http://ADDR` for a browser on this host: an address that listens on every interface
/// (`0.0.0.0`, `::`) is reached on loopback.
fn browsable(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// The lifecycle endpoints (`/-/reload`, `/-/pause`, `/-/resume`, baseline pins) where the
/// config enables them, with their token.
fn lifecycle(
    setup: &Setup,
    live: &Arc<Live>,
    gate: &Arc<Gate>,
) -> Result<Option<Lifecycle>, DaemonError> {
    let export = &setup.config.export;
    if !export.lifecycle {
        return Ok(None);
    }
    let token = match &export.lifecycle_token_file {
        // Validated with the config; read again here as the file may have changed since.
        Some(f) => Some(
            crate::config::read_token(&setup.base_dir().join(f.as_str()))
                .map_err(DaemonError::Token)?,
        ),
        None => None,
    };
    tracing::info!(
        token = token.is_some(),
        "lifecycle endpoints on: /-/reload, /-/pause, /-/resume, baseline pins"
    );
    Ok(Some(Lifecycle {
        reload: Arc::new(Reload(Arc::clone(live))),
        pause: Arc::new(PauseControl(Arc::clone(gate))),
        token,
    }))
}

/// The scheduler over the configured targets (a reload replaces them) and, in a cluster, the
/// discovered ones, gated by leader election and the pause annotation; the probe stream beside
/// it, on the targets it publishes.
pub(super) fn scheduler(
    setup: &Setup,
    wired: &Wired,
    kube: Option<KubeParts>,
    (metrics, gate): (&Arc<Metrics>, &Arc<Gate>),
    client: &crate::client::StreamClient,
    shutdown: &Shutdown,
) -> Scheduler {
    let cfg = &setup.config;
    let mut sets = vec![wired.statics.clone()];
    let mut leadership = None;
    if let Some(k) = kube {
        if let Some(deployment) = k.pause_annotation {
            shutdown.spawn(crate::k8s::pause::watch_annotation(
                deployment,
                Arc::clone(gate),
                shutdown.service(),
            ));
        }
        if let Some(discovered) = k.discovered {
            let resolver = DiscoveredTargets {
                discovered,
                client: client.clone(),
                base_dir: setup.base_dir().to_owned(),
                events: k.events,
            };
            sets.push(resolver.spawn(shutdown.service(), shutdown.tracker()));
        }
        leadership = k.leadership;
    }
    let (published, probed) = watch::channel(Vec::new());
    if cfg.probe_stream.enabled {
        let runner = &wired.runner;
        let stream = crate::schedule::ProbeStream {
            client: runner.client.clone(),
            budget: Arc::clone(&runner.budget),
            recorder: Arc::clone(&runner.recorder),
            tokens: Arc::clone(&runner.tokens),
            gate: Arc::clone(gate),
            config: cfg.probe_stream.clone(),
            goodput: runner.goodput,
            run_salt: rand::random(),
        };
        shutdown.spawn(stream.run(probed, shutdown.stop_sending().clone()));
    }
    let server_metrics: Arc<dyn ServerMetricsSink> = metrics.clone();
    Scheduler::new(
        Arc::clone(&wired.runner),
        TargetSource::new(sets, leadership),
        Some(server_metrics),
        cfg.export.server_metrics_interval.0,
    )
    .with_gate(Arc::clone(gate))
    .with_target_watch(published)
}

#[cfg(test)]
mod tests {
    use super::browsable;

    #[test]
    fn a_browser_is_pointed_at_an_address_it_can_open() {
        let url = |a: &str| browsable(a.parse().unwrap());
        assert_eq!(url("127.0.0.1:9464"), "http://127.0.0.1:9464");
        assert_eq!(url("0.0.0.0:9464"), "http://127.0.0.1:9464");
        assert_eq!(url("[::]:9464"), "http://[::1]:9464");
        assert_eq!(url("[fd00::7]:80"), "http://[fd00::7]:80");
        assert_eq!(url("10.1.2.3:9464"), "http://10.1.2.3:9464");
    }
}
