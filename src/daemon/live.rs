//! The setup in force and its reload: on SIGHUP, `POST /-/reload` or a change of the file, the
//! new file is loaded and validated completely (SLOs compiled); the targets it adds or changes
//! are started, and only then are the configured targets swapped (from the next step), the
//! SLO definitions replaced (from the next evaluation) and the plan taken (from the next
//! cycle). A bad file, or a target that cannot start, changes nothing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::DaemonError;
use crate::client::StreamClient;
use crate::config::TargetConfig;
use crate::export::http::{HttpError, ReloadFuture, ReloadHook};
use crate::export::metrics::Metrics;
use crate::k8s::events::SloEvents;
use crate::model::{Finished, Sink, TargetChange};
use crate::schedule::{Target, TargetSet};
use crate::scrape::ScrapeTarget;
use crate::setup::Setup;
use crate::sim::SimHandle;
use crate::slo::SloEngine;
use crate::targets::start_target;

/// How often the config file is checked for changes (a third way to reload, besides SIGHUP and
/// `POST /-/reload`; a Kubernetes ConfigMap update arrives this way).
pub const CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// One configured target in force: its config (to tell what a reload changed), how the runner
/// sees it, and its embedded simulator.
pub(super) struct LiveTarget {
    name: String,
    config: TargetConfig,
    key: String,
    target: Arc<Target>,
    sim: Option<SimHandle>,
    /// Started by the reload in progress (rolled back if the reload fails).
    fresh: bool,
}

impl LiveTarget {
    pub(super) fn new(config: &TargetConfig, target: Arc<Target>, sim: Option<SimHandle>) -> Self {
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

/// What identifies a target's setup: its config without positions. Its serialisation masks the
/// values of `request.headers` (they may be credentials), so a change of one alone is told by a
/// hash of them.
fn target_key(t: &TargetConfig) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (name, value) in &t.request.headers.0 {
        (name.as_str(), value.as_str()).hash(&mut h);
    }
    format!(
        "{}#{:x}",
        serde_json::to_string(t).unwrap_or_default(),
        h.finish()
    )
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

/// The configured targets and their server-metrics endpoints, as the schedule reads them.
pub(super) fn target_set(targets: &[LiveTarget]) -> TargetSet {
    TargetSet {
        targets: targets.iter().map(|t| Arc::clone(&t.target)).collect(),
        scrape: targets
            .iter()
            .filter_map(|t| ScrapeTarget::for_target(&t.config, t.target.endpoint.url()))
            .collect(),
    }
}

/// Keeps the PrometheusRule of `prometheus_rule` equal to the rules of the setup in force,
/// written only while this replica may send (the leader's rules win).
pub(super) struct RulesPublisher {
    pub(super) rules: crate::k8s::rules::ManagedRules,
    pub(super) leadership: Option<watch::Receiver<crate::schedule::Leadership>>,
}

impl RulesPublisher {
    pub(super) async fn publish(&self, setup: &Setup) {
        if self
            .leadership
            .as_ref()
            .is_some_and(|l| !l.borrow().is_active())
        {
            return;
        }
        let text = crate::slo::rules::generate(
            &setup.slos,
            &setup.domain,
            &setup.rules_options(),
            &setup.label(),
            crate::slo::rules::Format::Rules,
        );
        match self.rules.publish(&text).await {
            Ok(()) => tracing::info!(slos = setup.slos.len(), "PrometheusRule updated"),
            Err(e) => tracing::warn!("cannot update the PrometheusRule: {e}"),
        }
    }
}

/// The setup in force and what a reload changes.
pub(super) struct Live {
    setup: Mutex<Arc<Setup>>,
    metrics: Arc<Metrics>,
    client: StreamClient,
    targets: Mutex<Vec<LiveTarget>>,
    /// The configured targets, as the schedule re-reads them at every step.
    statics: watch::Sender<TargetSet>,
    /// Simulators of removed targets: a request of theirs may still be in flight when the
    /// reload swaps them out, so they stop when the schedule moves on (see the `Sink` impl).
    retired: Mutex<Vec<SimHandle>>,
    tasks: TaskTracker,
    slo: Arc<SloEngine>,
    events: Option<Arc<SloEvents>>,
    rules: Option<Arc<RulesPublisher>>,
    /// One reload at a time (SIGHUP, `POST /-/reload` and the file watch may coincide).
    reloading: tokio::sync::Mutex<()>,
    /// Hash of the file's content as last loaded or rejected: the file watch reloads on change.
    loaded_hash: Mutex<Option<u64>>,
    gate: Arc<crate::schedule::gate::Gate>,
    /// The runner's budget, whose limits a reload replaces.
    budget: Mutex<Option<Arc<crate::schedule::budget::Budget>>>,
    /// Configured targets that could not be started; retried by `retry_failed`.
    failed: Mutex<Vec<crate::targets::TargetFailure>>,
}

/// How often targets that failed to start are tried again.
const RETRY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// What a reload reaches besides the setup and the targets.
pub(super) struct LiveParts {
    pub(super) metrics: Arc<Metrics>,
    pub(super) client: StreamClient,
    pub(super) slo: Arc<SloEngine>,
    pub(super) events: Option<Arc<SloEvents>>,
    pub(super) rules: Option<Arc<RulesPublisher>>,
    pub(super) tasks: TaskTracker,
    pub(super) gate: Arc<crate::schedule::gate::Gate>,
    pub(super) budget: Option<Arc<crate::schedule::budget::Budget>>,
}

impl Live {
    /// The daemon's state after start-up; `targets` are the configured ones, started.
    pub(super) fn new(
        setup: Arc<Setup>,
        targets: Vec<LiveTarget>,
        parts: LiveParts,
    ) -> (Live, watch::Receiver<TargetSet>) {
        let LiveParts {
            metrics,
            client,
            slo,
            events,
            rules,
            tasks,
            gate,
            budget,
        } = parts;
        let (statics, rx) = watch::channel(target_set(&targets));
        let loaded_hash = setup
            .path
            .as_deref()
            .and_then(|p| crate::files::read_bounded(p, crate::files::MAX_CONFIG_BYTES).ok())
            .map(|b| content_hash(&b));
        let live = Live {
            setup: Mutex::new(setup),
            metrics,
            client,
            targets: Mutex::new(targets),
            statics,
            retired: Mutex::new(Vec::new()),
            tasks,
            slo,
            events,
            rules,
            reloading: tokio::sync::Mutex::new(()),
            loaded_hash: Mutex::new(loaded_hash),
            gate,
            budget: Mutex::new(budget),
            failed: Mutex::new(Vec::new()),
        };
        (live, rx)
    }

    /// The budget a reload's limits go to (the runner's, made after the rest).
    pub(super) fn set_budget(&self, budget: Arc<crate::schedule::budget::Budget>) {
        *lock(&self.budget) = Some(budget);
    }

    /// The configured targets that could not be started at start-up.
    pub(super) fn set_failed(&self, failed: Vec<crate::targets::TargetFailure>) {
        *lock(&self.failed) = failed;
    }

    /// Each configured target that could not be started, and why (for `/api/v1/status`).
    pub(super) fn failed(&self) -> Vec<(String, String)> {
        lock(&self.failed)
            .iter()
            .map(|f| (f.name.clone(), f.error.clone()))
            .collect()
    }

    /// Retries the targets that failed at start-up every [`RETRY_INTERVAL`] until `stop`; one
    /// that starts joins the target set from the next step (in the config's order). A reload
    /// replaces the set of failed targets with its own outcome.
    pub(super) async fn retry_failed(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RETRY_INTERVAL) => {}
                _ = stop.cancelled() => return,
            }
            if lock(&self.failed).is_empty() {
                continue;
            }
            // No reload meanwhile: it decides the target set.
            let _one = self.reloading.lock().await;
            let setup = self.setup();
            let failed = std::mem::take(&mut *lock(&self.failed));
            let mut still = Vec::new();
            for f in failed {
                let Some(t) = setup.config.targets.get(f.config_index) else {
                    continue;
                };
                if *t.name != f.name {
                    continue;
                }
                match start_target(t, setup.base_dir(), &self.client).await {
                    Ok((target, sim)) => {
                        tracing::info!(target = %f.name, "target started after failing at start-up");
                        let mut targets = lock(&self.targets);
                        targets.push(LiveTarget::new(t, target, sim));
                        targets.sort_by_key(|l| {
                            setup.config.targets.iter().position(|c| *c.name == l.name)
                        });
                        self.statics.send_replace(target_set(&targets));
                    }
                    Err(e) => {
                        tracing::warn!(target = %f.name, error = %e, "target still cannot start; retrying");
                        still.push(crate::targets::TargetFailure {
                            error: e.to_string(),
                            ..f
                        });
                    }
                }
            }
            lock(&self.failed).extend(still);
        }
    }

    pub(super) fn setup(&self) -> Arc<Setup> {
        Arc::clone(&lock(&self.setup))
    }

    /// Re-reads the config file and applies it; a bad file, or a new target that cannot be
    /// started, leaves the running config untouched.
    pub(super) async fn reload(&self) -> Result<String, DaemonError> {
        let _one = self.reloading.lock().await;
        let current = self.setup();
        let result = match &current.path {
            None => Ok("the embedded demo config has nothing to reload".to_owned()),
            Some(path) => {
                if let Ok(bytes) = crate::files::read_bounded(path, crate::files::MAX_CONFIG_BYTES)
                {
                    *lock(&self.loaded_hash) = Some(content_hash(&bytes));
                }
                match Setup::load(path) {
                    Ok(new) => self
                        .apply(new)
                        .await
                        .map(|m| format!("reloaded {}: {m}", path.display())),
                    Err(e) => Err(e.into()),
                }
            }
        };
        self.metrics.record_config_reload(result.is_ok());
        match &result {
            Ok(m) => tracing::info!("{m}"),
            // One record per problem, each on its line.
            Err(e) => {
                for line in e.to_string().lines() {
                    tracing::error!("reload rejected, the old config keeps running: {line}");
                }
            }
        }
        result
    }

    /// Starts the targets `new` adds or changes, then swaps the target set, the SLOs and the
    /// setup; on any failure stops what it started and keeps everything as it was.
    async fn apply(&self, new: Setup) -> Result<String, DaemonError> {
        let before = self.setup();
        let mut old = std::mem::take(&mut *lock(&self.targets));
        let mut next: Vec<LiveTarget> = Vec::new();
        let mut failure = None;
        for t in &new.config.targets {
            let key = target_key(t);
            if let Some(i) = old.iter().position(|o| o.name == *t.name && o.key == key) {
                next.push(old.remove(i));
                continue;
            }
            match start_target(t, new.base_dir(), &self.client).await {
                Ok((target, sim)) => next.push(LiveTarget {
                    fresh: true,
                    ..LiveTarget::new(t, target, sim)
                }),
                Err(e) => {
                    failure = Some(e);
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
            old.sort_by_key(|t| before.config.targets.iter().position(|c| *c.name == t.name));
            *lock(&self.targets) = old;
            return Err(e.into());
        }
        let names = |v: &[&LiveTarget]| {
            v.iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let added: Vec<&LiveTarget> = next
            .iter()
            .filter(|t| t.fresh && !old.iter().any(|o| o.name == t.name))
            .collect();
        let changed: Vec<&LiveTarget> = next
            .iter()
            .filter(|t| t.fresh && old.iter().any(|o| o.name == t.name))
            .collect();
        let removed: Vec<&LiveTarget> = old
            .iter()
            .filter(|o| !next.iter().any(|t| t.name == o.name))
            .collect();
        let mut msg = format!(
            "{} target(s); added [{}], changed [{}], removed [{}] from the next step; the new plan applies from the next cycle",
            next.len(),
            names(&added),
            names(&changed),
            names(&removed),
        );
        let needs_restart = restart_only_changes(&before, &new);
        if !needs_restart.is_empty() {
            msg.push_str(&format!(
                "; changes to {} apply on restart",
                needs_restart.join(", ")
            ));
        }
        lock(&self.retired).extend(old.into_iter().filter_map(|t| t.sim));
        for t in &mut next {
            t.fresh = false;
        }
        self.slo
            .set_definitions(new.slos.clone(), new.domain.clone());
        if let Some(events) = &self.events {
            events.set_slos(&new.slos);
        }
        self.statics.send_replace(target_set(&next));
        // The new config decides: nothing of the old one's failures is retried.
        lock(&self.failed).clear();
        *lock(&self.targets) = next;
        super::apply_gate_config(&self.gate, &new);
        if let Some(budget) = lock(&self.budget).as_ref() {
            budget.set_limits(&new.config);
        }
        let port = crate::export::HttpLimits::default().max_connections as u64;
        crate::targets::warn_on_descriptors(&new.config, port);
        let new = Arc::new(new);
        *lock(&self.setup) = Arc::clone(&new);
        if let Some(rules) = &self.rules {
            rules.publish(&new).await;
        }
        Ok(msg)
    }

    /// Stops every simulator, those in force and the retired ones, once no reload is running
    /// (so none it starts is left behind).
    pub(super) async fn stop_sims(&self) {
        let _one = self.reloading.lock().await;
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

    /// Reloads when the config file's content changes (checked every [`CONFIG_POLL_INTERVAL`]).
    /// A file that does not change is not reloaded again, so a bad one is reported once.
    pub(super) async fn watch_file(self: Arc<Self>, stop: CancellationToken) {
        let Some(path): Option<PathBuf> = self.setup().path.clone() else {
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CONFIG_POLL_INTERVAL) => {}
                _ = stop.cancelled() => return,
            }
            // A file being replaced may be missing for a moment: that is no change.
            let read = {
                let path = path.clone();
                tokio::task::spawn_blocking(move || {
                    crate::files::read_bounded(&path, crate::files::MAX_CONFIG_BYTES)
                })
            };
            let Ok(Ok(bytes)) = read.await else {
                continue;
            };
            let hash = content_hash(&bytes);
            if *lock(&self.loaded_hash) != Some(hash) {
                tracing::info!(path = %path.display(), "config file changed: reloading");
                let _ = self.reload().await;
            }
        }
    }
}

/// The sections a reload does not apply (they are read once at start-up).
fn restart_only_changes(before: &Setup, new: &Setup) -> Vec<&'static str> {
    fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
        serde_json::to_value(a).ok() == serde_json::to_value(b).ok()
    }
    let (b, n) = (&before.config, &new.config);
    [
        ("export", !same(&b.export, &n.export)),
        ("discovery", !same(&b.discovery, &n.discovery)),
        (
            "tokenizer",
            b.tokenizer.as_deref() != n.tokenizer.as_deref(),
        ),
        ("client", !same(&b.client, &n.client)),
    ]
    .into_iter()
    .filter(|(_, changed)| *changed)
    .map(|(name, _)| name)
    .collect()
}

/// The schedule has moved on to a new target set: no request of a removed target is in flight
/// any more, so the simulators of the targets a reload removed may stop.
impl Sink for Live {
    fn request(&self, _: &Finished<'_>) {}

    fn targets(&self, _change: &TargetChange<'_>) {
        for sim in std::mem::take(&mut *lock(&self.retired)) {
            self.tasks.spawn(sim.shutdown());
        }
    }
}

/// `POST /-/reload`.
pub(super) struct Reload(pub(super) Arc<Live>);

impl ReloadHook for Reload {
    fn reload(&self) -> ReloadFuture {
        let live = Arc::clone(&self.0);
        Box::pin(async move {
            live.reload()
                .await
                .map_err(|e| HttpError::Reload(Box::new(e)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::target_key;
    use crate::config::TargetConfig;

    fn target(yaml: &str) -> TargetConfig {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn a_changed_header_value_changes_the_target() {
        let base = "{name: a, serving_mode: aggregated, url: 'http://127.0.0.1:1'";
        let one = target(&format!("{base}, request: {{headers: {{X-Key: one}}}}}}"));
        let two = target(&format!("{base}, request: {{headers: {{X-Key: two}}}}}}"));
        assert_ne!(target_key(&one), target_key(&two));
        assert_eq!(target_key(&one), target_key(&one.clone()));
        assert!(
            !target_key(&one).contains("one"),
            "the value stays out of the key"
        );
    }
}
