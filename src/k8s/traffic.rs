//! The daemon's schedule: the cycle of steps as `Scheduler::run_forever` runs it, but the target
//! set is re-read at every step start (the configured targets, which a reload changes, plus the
//! discovered ones this replica owns) and, in a cluster, traffic flows only while leader election
//! lets this replica send. A target that leaves the set has its metric label sets removed (and
//! its embedded simulator stopped); losing the Lease ends the step in progress at once (requests
//! in flight get the drain grace) and waits for the next term.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::discovery::DiscoveredTarget;
use super::events::{EventTarget, SloEvents};
use super::lease::Leadership;
use crate::export::metrics::Metrics;
use crate::schedule::{Board, Runner, Scheduler, StepPlan, Target};
use crate::scrape::{ScrapeTarget, ServerScraper};

/// The configured targets (always measured while this replica sends) and their server-metrics
/// endpoints; a reload sends a new set.
#[derive(Debug, Clone, Default)]
pub struct StaticTargets {
    pub targets: Vec<Arc<Target>>,
    pub scrape: Vec<ScrapeTarget>,
}

/// Everything the gated schedule needs.
pub struct GatedSchedule {
    pub static_targets: watch::Receiver<StaticTargets>,
    pub discovered: Option<watch::Receiver<Vec<DiscoveredTarget>>>,
    /// `None`: no election, this replica always sends to every target.
    pub leadership: Option<watch::Receiver<Leadership>>,
    /// The runner of the static targets; its client, prompt state and recorder are shared by the
    /// runner of every step.
    pub runner: Arc<Runner>,
    pub board: Arc<Board>,
    pub metrics: Arc<Metrics>,
    pub events: Option<Arc<SloEvents>>,
    /// The targets measured now, for `/api/v1/status`.
    pub current: Arc<RwLock<Vec<Arc<Target>>>>,
    pub scrape_interval: Duration,
    /// Relative paths of discovered targets resolve against this (API key files).
    pub base_dir: PathBuf,
    /// Simulators of targets a reload removed, stopped at the next step boundary.
    pub retired_sims: Arc<Mutex<Vec<crate::sim::SimHandle>>>,
}

/// The live target set of this replica and what hangs off it.
struct Active {
    resolved: BTreeMap<String, (DiscoveredTarget, Arc<Target>)>,
    mine: Vec<Arc<Target>>,
    scraper: Option<Arc<ServerScraper>>,
    scraper_stop: CancellationToken,
    calibrated: bool,
}

impl GatedSchedule {
    fn leadership(&self) -> Leadership {
        self.leadership
            .as_ref()
            .map(|l| l.borrow().clone())
            .unwrap_or(Leadership::Leading)
    }

    /// Resolves newly discovered targets and recomputes this replica's share; publishes the
    /// change (metrics, status, Events, server-metrics scraping).
    async fn refresh(&self, active: &mut Active) {
        // Between steps no request of a removed target is in flight: its simulator may go.
        let retired = std::mem::take(
            &mut *self
                .retired_sims
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for sim in retired {
            tokio::spawn(sim.shutdown());
        }
        let statics = self.static_targets.borrow().clone();
        let discovered = self
            .discovered
            .as_ref()
            .map(|d| d.borrow().clone())
            .unwrap_or_default();
        active
            .resolved
            .retain(|name, (d, _)| discovered.iter().any(|n| n.name == *name && n == d));
        for d in &discovered {
            if active.resolved.contains_key(&d.name) {
                continue;
            }
            match crate::targets::resolve_target(
                &d.to_config(),
                &self.base_dir,
                &self.runner.client,
            )
            .await
            {
                Ok(t) => {
                    active
                        .resolved
                        .insert(d.name.clone(), (d.clone(), Arc::new(t)));
                }
                Err(e) => {
                    tracing::warn!(target = %d.name, error = %e, "discovered target not reachable yet; retrying at the next step")
                }
            }
        }
        let leadership = self.leadership();
        let mine: Vec<Arc<Target>> = statics
            .targets
            .iter()
            .chain(active.resolved.values().map(|(_, t)| t))
            .filter(|t| leadership.sends_to(&t.name))
            .cloned()
            .collect();
        let names = |v: &[Arc<Target>]| v.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        if names(&mine) == names(&active.mine)
            && mine
                .iter()
                .zip(&active.mine)
                .all(|(a, b)| Arc::ptr_eq(a, b))
        {
            return;
        }
        for gone in active
            .mine
            .iter()
            .filter(|t| !mine.iter().any(|m| m.name == t.name))
        {
            tracing::info!(target = %gone.name, "target removed; its series are dropped");
            self.metrics.remove_target(&gone.name);
        }
        // A new target is up until its first request says otherwise; the others keep what
        // their last request said.
        for t in mine
            .iter()
            .filter(|t| !active.mine.iter().any(|m| m.name == t.name))
        {
            self.metrics.set_target_up(&t.name, true);
        }
        if let Some(events) = &self.events {
            events.set_targets(
                mine.iter()
                    .map(|t| EventTarget {
                        name: t.name.clone(),
                        mode: t.mode,
                        object: active.resolved.get(&t.name).map(|(d, _)| d.reference()),
                    })
                    .collect(),
            );
        }
        let scrape: Vec<ScrapeTarget> = statics
            .scrape
            .iter()
            .filter(|s| mine.iter().any(|t| t.name == s.name))
            .cloned()
            .chain(
                active
                    .resolved
                    .values()
                    .filter(|(d, _)| {
                        mine.iter().any(|t| t.name == d.name) && !d.server_metrics.is_empty()
                    })
                    .map(|(d, _)| ScrapeTarget {
                        name: d.name.clone(),
                        urls: d.server_metrics.clone(),
                    }),
            )
            .collect();
        active.scraper_stop.cancel();
        active.scraper_stop = CancellationToken::new();
        active.scraper = if scrape.is_empty() {
            None
        } else {
            match ServerScraper::new(scrape, self.metrics.clone()) {
                Ok(s) => {
                    let s = Arc::new(s);
                    tokio::spawn(
                        Arc::clone(&s).run(self.scrape_interval, active.scraper_stop.clone()),
                    );
                    Some(s)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "server metrics not scraped");
                    None
                }
            }
        };
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = mine.clone();
        active.mine = mine;
    }

    fn runner_for(&self, targets: Vec<Arc<Target>>) -> Runner {
        let r = &self.runner;
        Runner {
            targets,
            client: r.client.clone(),
            tokens: Arc::clone(&r.tokens),
            overhead: Arc::clone(&r.overhead),
            recorder: Arc::clone(&r.recorder),
            seed: r.seed,
            run_salt: r.run_salt,
            drain_grace: r.drain_grace,
            max_lag_p99: r.max_lag_p99,
            pairing: r.pairing,
        }
    }

    /// Waits until this replica may send and has a target, or `soft_stop`.
    async fn wait_for_work(&mut self, active: &mut Active, soft_stop: &CancellationToken) {
        loop {
            // Seen before reading, so a change after this point wakes the wait below.
            if let Some(l) = &mut self.leadership {
                l.mark_unchanged();
            }
            if let Some(d) = &mut self.discovered {
                d.mark_unchanged();
            }
            self.static_targets.mark_unchanged();
            self.refresh(active).await;
            if !active.mine.is_empty() || soft_stop.is_cancelled() {
                return;
            }
            let leadership = self.leadership.clone();
            let discovered = self.discovered.clone();
            let statics = Some(self.static_targets.clone());
            tokio::select! {
                _ = soft_stop.cancelled() => return,
                _ = changed(leadership) => {}
                _ = changed(discovered) => {}
                _ = changed(statics) => {}
            }
        }
    }

    /// Runs cycles until `soft_stop`, like `Scheduler::run_forever`, re-reading the targets at
    /// every step and pausing while this replica may not send.
    pub async fn run_forever(
        mut self,
        plan: impl Fn() -> Vec<StepPlan>,
        cycle_pause: impl Fn() -> Duration,
        soft_stop: &CancellationToken,
        hard_stop: &CancellationToken,
    ) {
        let mut active = Active {
            resolved: BTreeMap::new(),
            mine: Vec::new(),
            scraper: None,
            scraper_stop: CancellationToken::new(),
            calibrated: false,
        };
        let mut cycle = 0u64;
        'cycles: while !soft_stop.is_cancelled() {
            let steps = plan();
            self.board.announce(&steps);
            for step in &steps {
                self.wait_for_work(&mut active, soft_stop).await;
                if soft_stop.is_cancelled() {
                    break 'cycles;
                }
                let runner = Arc::new(self.runner_for(active.mine.clone()));
                if !active.calibrated {
                    runner.calibrate(hard_stop).await;
                    active.calibrated = true;
                }
                // This step's own stop: the daemon's, or the end of this replica's turn.
                let term_soft = soft_stop.child_token();
                let term_hard = hard_stop.child_token();
                let guard = self.leadership.clone().map(|l| {
                    let (soft, hard) = (term_soft.clone(), term_hard.clone());
                    let drain = runner.drain_grace;
                    tokio::spawn(async move {
                        let mut l = l;
                        let _ = l.wait_for(|s| !s.is_active()).await;
                        tracing::warn!("this replica may no longer send: stopping the step");
                        soft.cancel();
                        tokio::time::sleep(drain).await;
                        hard.cancel();
                    })
                });
                let scheduler = Scheduler {
                    runner,
                    board: Arc::clone(&self.board),
                    server_metrics: active.scraper.clone(),
                };
                scheduler.step(step, cycle, &term_soft, &term_hard).await;
                if let Some(g) = guard {
                    g.abort();
                }
                if term_soft.is_cancelled() && !soft_stop.is_cancelled() {
                    // Lost the Lease: start the cycle afresh in the next term.
                    self.refresh(&mut active).await;
                    continue 'cycles;
                }
            }
            self.board.cycle_done();
            self.runner.recorder.cycle_finished();
            cycle += 1;
            tokio::select! {
                _ = tokio::time::sleep(cycle_pause()) => {}
                _ = soft_stop.cancelled() => break,
            }
        }
        active.scraper_stop.cancel();
    }
}

/// Resolves when the watched value changes; never when there is nothing to watch.
async fn changed<T>(rx: Option<watch::Receiver<T>>) {
    match rx {
        Some(mut rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}
