//! The running SLO engine: receives every steady-window request and every step result, keeps the
//! windows the SLOs read, evaluates every SLO periodically, publishes `llm_canary_slo_*`, logs
//! each state change and calls the state-change hooks (Kubernetes Events).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::time::Instant;

use super::verdict::{SloReading, SloState};
use crate::clock::unix_now;
use crate::measure::step::Counts;
use crate::model::{Finished, Phase, Sink, StepInfo, StepResult, TargetChange};
use crate::request::RequestLabels;

use super::baseline::{BaselineStore, Entry};
use super::eval::{self, Ctx, Folding, RequestSample, Side, StepRecord, StepSamples, Store};
use super::reading::{
    baseline_terms, data_times, empty_reading, evaluate_one, held_reason, side_json,
    undecided_reason, wants_of,
};
use super::state::{EngineState, SavedVerdict, StateBackend, VERSION};
use super::verdict::{Raw, Verdict, Weighed};
use super::{LabelDomain, SloDef, SloKind};

/// How often the daemon evaluates every SLO.
pub const EVALUATION_INTERVAL: Duration = Duration::from_secs(5);

/// Where the engine publishes every SLO's reading (the Prometheus registry: `llm_canary_slo_*`).
pub trait SloPublisher: Send + Sync {
    fn set_slo(&self, slo: &str, reading: &SloReading);
    fn remove_slo(&self, slo: &str);
    /// How old the newest data of the SLO's stalest selector is (`None`: no data).
    fn set_slo_data_age(&self, _slo: &str, _seconds: Option<f64>) {}
}

/// Called on every state change of an SLO (the Kubernetes integration posts an Event).
pub trait StateChangeHook: Send + Sync {
    fn on_state_change(&self, slo: &str, old: SloState, new: SloState, reading: &SloReading);
}

/// The last evaluation of one SLO, as `/api/v1/status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SloStatus {
    pub reading: SloReading,
    pub since_unix: f64,
    pub evaluated_unix: f64,
    /// Why the state is `insufficient_data`.
    pub reason: Option<String>,
    pub sides: Vec<Side>,
    /// A clear verdict waiting for `for`: the state and the seconds it has held.
    pub pending: Option<(SloState, f64)>,
    /// Seconds since the newest step of the SLO's stalest selector ended: how old the data the
    /// verdict reads is (held steps make it older than the window; see `eval::Store`).
    pub data_age_seconds: Option<f64>,
}

struct Inner {
    defs: Vec<SloDef>,
    domain: LabelDomain,
    store: Store,
    cycle_store: Store,
    baselines: BaselineStore,
    verdicts: HashMap<String, Verdict>,
    status: BTreeMap<String, SloStatus>,
}

/// The SLO engine shared by the recorder, the scheduler, the evaluation task and the status page.
pub struct SloEngine {
    inner: Mutex<Inner>,
    /// The step in progress's requests, committed when the step ends (unless it is degraded).
    pending: Mutex<Pending>,
    metrics: Option<Arc<dyn SloPublisher>>,
    hooks: RwLock<Vec<Arc<dyn StateChangeHook>>>,
    /// Where the state is saved; `None`: in memory only (the bench, tests).
    backend: RwLock<Option<Arc<dyn StateBackend>>>,
    clock: Mutex<ActiveClock>,
}

/// The step in progress's requests, folded per series as they finish.
#[derive(Debug, Default)]
struct Pending {
    /// What the stores of the current definitions read.
    folding: Arc<Folding>,
    series: HashMap<RequestLabels, StepSamples>,
    /// The definitions changed while the step was in progress: its requests before the change
    /// were folded for the old ones, so the step is left out of the new stores.
    straddled: bool,
}

/// The time the windows run on: time that passes while traffic is paused (an operator's pause,
/// quiet hours, a spent budget) does not count, so a pause leaves every window, held step,
/// pending `for` and data age exactly as it found them, and verdicts hold across it.
#[derive(Debug, Default)]
struct ActiveClock {
    paused_since: Option<Instant>,
    paused_total: Duration,
}

impl ActiveClock {
    fn now(&self) -> Instant {
        let now = Instant::now();
        let paused = self.paused_total
            + self
                .paused_since
                .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        now.checked_sub(paused).unwrap_or(now)
    }

    fn set_paused(&mut self, paused: bool) {
        match (paused, self.paused_since) {
            (true, None) => self.paused_since = Some(Instant::now()),
            (false, Some(since)) => {
                self.paused_total += Instant::now().saturating_duration_since(since);
                self.paused_since = None;
            }
            _ => {}
        }
    }
}

impl SloEngine {
    /// An engine for `defs`; `baselines` is the (possibly file-backed) baseline store.
    pub fn new(
        defs: Vec<SloDef>,
        domain: LabelDomain,
        baselines: BaselineStore,
        metrics: Option<Arc<dyn SloPublisher>>,
    ) -> SloEngine {
        let reads = wants_of(&defs);
        let (now, now_unix) = (Instant::now(), unix_now());
        let verdicts = defs
            .iter()
            .map(|d| (d.name.clone(), Verdict::new(now, now_unix)))
            .collect();
        let store = Store::sliding(reads.wants, reads.objective_sets.clone(), reads.keep);
        let cycle_store = Store::accumulating(reads.cycle_wants, reads.objective_sets);
        let pending = Pending {
            folding: Arc::new(Folding::of(&[&store, &cycle_store])),
            ..Pending::default()
        };
        let engine = SloEngine {
            inner: Mutex::new(Inner {
                store,
                cycle_store,
                defs,
                domain,
                baselines,
                verdicts,
                status: BTreeMap::new(),
            }),
            pending: Mutex::new(pending),
            metrics,
            hooks: RwLock::new(Vec::new()),
            backend: RwLock::new(None),
            clock: Mutex::new(ActiveClock::default()),
        };
        // Every SLO is visible from the start, as insufficient_data.
        engine.with(|inner| {
            if let Some(m) = &engine.metrics {
                for d in &inner.defs {
                    m.set_slo(&d.name, &empty_reading(SloState::InsufficientData));
                }
            }
        });
        engine
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Now on the windows' clock (see [`ActiveClock`]).
    fn now(&self) -> Instant {
        self.clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .now()
    }

    /// Traffic stopped (`true`) or resumed: the windows' clock stops and restarts with it.
    pub fn set_paused(&self, paused: bool) {
        self.clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_paused(paused);
    }

    /// Saves the state to `backend` from now on (after every step, cycle, verdict change and
    /// pin).
    pub fn persist_to(&self, backend: Arc<dyn StateBackend>) {
        *self.backend.write().unwrap_or_else(PoisonError::into_inner) = Some(backend);
    }

    /// The state to save: baselines, pins, verdicts and held steps.
    pub fn saved_state(&self) -> EngineState {
        let (now, now_unix) = (self.now(), unix_now());
        self.with(|inner| {
            let (terms, pinned) = inner.baselines.saved();
            let verdicts = inner
                .defs
                .iter()
                .filter_map(|d| {
                    let v = inner.verdicts.get(&d.name)?;
                    Some((
                        d.name.clone(),
                        SavedVerdict {
                            state: v.state.as_str().to_owned(),
                            since_unix: v.since_unix,
                            text: d.text(),
                        },
                    ))
                })
                .collect();
            EngineState {
                version: VERSION,
                terms,
                pinned,
                verdicts,
                held: inner.store.held(now, now_unix),
                saved_unix: now_unix,
            }
        })
    }

    /// Takes over a saved state (at start, or when this replica becomes the leader): baselines
    /// and pins, the verdict of every SLO whose definition is unchanged, and the held steps, so
    /// the next evaluation reads what the last one before the save did.
    pub fn restore(&self, state: &EngineState) {
        let (now, now_unix) = (self.now(), unix_now());
        self.with(|inner| {
            inner.baselines = BaselineStore::from_saved(state.terms.clone(), state.pinned.clone());
            for d in &inner.defs {
                let Some(saved) = state.verdicts.get(&d.name) else {
                    continue;
                };
                let Some(st) = SloState::ALL
                    .into_iter()
                    .find(|s| s.as_str() == saved.state)
                else {
                    continue;
                };
                if saved.text == d.text() {
                    inner.verdicts.insert(
                        d.name.clone(),
                        Verdict::restored(st, saved.since_unix, now, now_unix),
                    );
                }
            }
            inner.store.restore_held(&state.held, now, now_unix);
        });
    }

    /// Saves the state, where a backend is set.
    fn save(&self) {
        let backend = self
            .backend
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(b) = backend {
            b.save(self.saved_state().to_bytes());
        }
    }

    /// Freezes every baseline term's rolling value over `span` under `name`; returns how many
    /// terms had one.
    pub fn pin(&self, name: &str, span: Duration) -> usize {
        let n = self.with(|inner| inner.baselines.pin(name, unix_now(), span.as_secs_f64()));
        tracing::info!(baseline = name, terms = n, span = ?span, "baseline pinned");
        self.save();
        n
    }

    /// Removes the baseline pinned as `name`; whether there was one.
    pub fn unpin(&self, name: &str) -> bool {
        let removed = self.with(|inner| inner.baselines.unpin(name));
        if removed {
            tracing::info!(baseline = name, "pinned baseline removed");
            self.save();
        }
        removed
    }

    /// The pinned baselines and the rolling terms, as `/api/v1/baselines` shows them.
    pub fn baselines_json(&self) -> Json {
        self.with(|inner| {
            let pins: serde_json::Map<String, Json> = inner
                .baselines
                .pins()
                .iter()
                .map(|(name, p)| {
                    (
                        name.clone(),
                        json!({
                            "pinned_unix": p.pinned_unix,
                            "span_seconds": p.span_seconds,
                            "terms": p.values.iter().map(|(k, e)| (k.clone(), json!({"estimate": e.estimate, "lower": e.lower, "upper": e.upper}))).collect::<serde_json::Map<_, _>>(),
                        }),
                    )
                })
                .collect();
            let mut terms = serde_json::Map::new();
            for d in &inner.defs {
                let SloKind::Expr(c) = &d.kind else { continue };
                for (term, _) in baseline_terms(c) {
                    let key = eval::baseline_key(&d.name, &term);
                    terms.insert(key.clone(), json!({"cycles": inner.baselines.len(&key)}));
                }
            }
            json!({"pinned": pins, "terms": terms})
        })
    }

    /// Registers a hook called on every state change.
    pub fn add_hook(&self, hook: Arc<dyn StateChangeHook>) {
        self.hooks
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(hook);
    }

    /// The SLO names, in config order.
    pub fn names(&self) -> Vec<String> {
        self.with(|i| i.defs.iter().map(|d| d.name.clone()).collect())
    }

    /// Replaces the SLO set (a reload). SLOs whose definition is unchanged keep their state and
    /// windows; removed ones lose their series.
    pub fn set_definitions(&self, defs: Vec<SloDef>, domain: LabelDomain) {
        self.with(|inner| {
            if inner.defs == defs && inner.domain == domain {
                return;
            }
            let reads = wants_of(&defs);
            let (now, now_unix) = (self.now(), unix_now());
            let kept: Vec<&SloDef> = defs.iter().filter(|d| inner.defs.contains(d)).collect();
            let mut verdicts = HashMap::new();
            for d in &defs {
                let v = match kept.iter().any(|k| k.name == d.name) {
                    true => inner.verdicts.remove(&d.name),
                    false => None,
                };
                verdicts.insert(
                    d.name.clone(),
                    v.unwrap_or_else(|| Verdict::new(now, now_unix)),
                );
            }
            if let Some(m) = &self.metrics {
                for old in &inner.defs {
                    if !defs.iter().any(|d| d.name == old.name) {
                        m.remove_slo(&old.name);
                    }
                }
            }
            inner
                .status
                .retain(|name, _| kept.iter().any(|k| &k.name == name));
            let keys: Vec<String> = defs
                .iter()
                .filter_map(|d| match &d.kind {
                    SloKind::Expr(c) => Some(
                        baseline_terms(c)
                            .into_iter()
                            .map(|(v, _)| eval::baseline_key(&d.name, &v)),
                    ),
                    SloKind::BurnRate { .. } => None,
                })
                .flatten()
                .collect();
            inner.baselines.retain_keys(&keys);
            // New windows start empty; a changed window or selector needs fresh samples anyway.
            inner.store = Store::sliding(reads.wants, reads.objective_sets.clone(), reads.keep);
            inner.cycle_store = Store::accumulating(reads.cycle_wants, reads.objective_sets);
            let folding = Folding::of(&[&inner.store, &inner.cycle_store]);
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            if *pending.folding != folding {
                pending.straddled |= !pending.series.is_empty();
                pending.series.clear();
                pending.folding = Arc::new(folding);
            }
            drop(pending);
            inner.defs = defs;
            inner.domain = domain;
            inner.verdicts = verdicts;
        });
    }

    /// One steady-window request of a step in progress.
    pub fn observe(&self, labels: &RequestLabels, sample: RequestSample) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let Pending {
            folding, series, ..
        } = &mut *pending;
        match series.get_mut(labels) {
            Some(folded) => folded.add(&sample),
            None => {
                let mut folded = StepSamples::new(Arc::clone(folding), labels);
                folded.add(&sample);
                series.insert(labels.clone(), folded);
            }
        }
    }

    /// Bytes held by the step in progress's folded requests (their histograms' counters).
    #[cfg(test)]
    pub fn pending_memory_bytes(&self) -> usize {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.series.values().map(StepSamples::memory_bytes).sum()
    }

    /// One finished request, as the recorder sees it.
    /// A cancelled request is left out: the canary abandoned it, so it is neither a good nor a
    /// bad event of any SLO.
    pub fn observe_record(&self, req: &Finished<'_>) {
        if !req.sample.answered() {
            return;
        }
        self.observe(req.labels, RequestSample::of(req));
    }

    /// One request of the probe stream, which runs outside every step: committed at once as a
    /// one-request step of its series, so an SLO over `workload="probe"` sees it at its next
    /// evaluation, between steps and while they are paused. It adds no steady seconds (the
    /// probe's pace is its interval, not a rate of the target's) and no cost.
    pub fn observe_probe(&self, req: &Finished<'_>) {
        if !req.sample.answered() {
            return;
        }
        let now = self.now();
        let record = StepRecord {
            labels: req.labels.clone(),
            instance: format!("probe|{}", req.labels.target),
            at: now,
            at_unix: unix_now(),
            counts: Counts::of(&req.sample),
            steady_seconds: 0.0,
            cost_usd: None,
            good: BTreeMap::new(),
            saturated: false,
        };
        self.with(|inner| {
            // Under the stores' lock, which a reload holds while it changes the folding.
            let folding = Arc::clone(
                &self
                    .pending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .folding,
            );
            let mut samples = StepSamples::new(folding, req.labels);
            samples.add(&RequestSample::of(req));
            inner
                .cycle_store
                .commit(record.clone(), &samples, now, true);
            inner.store.commit(record, &samples, now, true);
        });
    }

    /// A step ended: its label sets' samples go into the windows unless the step was degraded
    /// (its schedule lag says it measured the canary, not the server), flagged when it was
    /// saturated (each SLO's `saturated_steps` reads them or not). A faulted step (more than
    /// `FAULTED_ERROR_RATIO` of its requests failed) keeps its counts (error ratio, throughput,
    /// goodput and burn rates see the fault) but gives no samples to the latency distributions:
    /// quantiles of a fault's few survivors are not a fair sample, so a fault shows as errors
    /// and thin data (`insufficient_data`, or the previous verdict), never as a latency verdict.
    pub fn step_finished(&self, results: &[StepResult]) {
        let (now, now_unix) = (self.now(), unix_now());
        let (mut pending, straddled) = {
            let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            (
                std::mem::take(&mut p.series),
                std::mem::replace(&mut p.straddled, false),
            )
        };
        if straddled {
            if !results.is_empty() {
                tracing::info!(
                    "the SLO definitions changed during this step: it is left out of SLO verdicts"
                );
            }
            return;
        }
        let flagged = |f: fn(&StepResult) -> bool| -> Vec<&str> {
            results
                .iter()
                .filter(|r| r.total && f(r))
                .map(|r| r.labels.target.as_str())
                .collect()
        };
        let degraded_targets = flagged(|r| r.measurements.degraded);
        let faulted_targets = flagged(|r| r.measurements.faulted);
        self.with(|inner| {
            for r in results.iter().filter(|r| !r.total) {
                let samples = pending.remove(&r.labels).unwrap_or_default();
                let m = &r.measurements;
                if m.degraded || degraded_targets.contains(&r.labels.target.as_str()) {
                    tracing::info!(step = %r.step, target = %r.labels.target, "degraded step left out of SLO verdicts");
                    continue;
                }
                let faulted = m.faulted || faulted_targets.contains(&r.labels.target.as_str());
                if faulted {
                    tracing::info!(step = %r.step, target = %r.labels.target, error_ratio = m.error_ratio, "faulted step: its latencies are left out of SLO distributions");
                }
                let record = StepRecord {
                    labels: r.labels.clone(),
                    instance: format!("{}|{}|{}", r.cycle, r.step, r.labels.target),
                    at: now,
                    at_unix: now_unix,
                    counts: m.counts(),
                    steady_seconds: r.steady_seconds,
                    cost_usd: m
                        .cost_per_million_tokens_usd
                        .map(|c| c * m.output_tokens as f64 / 1e6),
                    good: BTreeMap::new(),
                    saturated: m.saturated,
                };
                inner
                    .cycle_store
                    .commit(record.clone(), &samples, now, !faulted);
                inner.store.commit(record, &samples, now, !faulted);
            }
        });
        if !results.is_empty() {
            self.save();
        }
    }

    /// A cycle completed: every baseline term's value over the cycle is kept (and saved), and
    /// the cycle's accumulation starts over.
    pub fn cycle_finished(&self) {
        let (now, now_unix) = (self.now(), unix_now());
        self.with(|inner| {
            let mut entries = Vec::new();
            for d in &inner.defs {
                let SloKind::Expr(c) = &d.kind else { continue };
                // A cycle the SLO failed in does not teach its baseline (a regression must not
                // become the new normal), nor one whose run fails and waits for the next to
                // confirm it: a regression's first run must not vouch for its third.
                let failing = inner
                    .verdicts
                    .get(&d.name)
                    .is_some_and(|v| v.state == SloState::Fail || v.gate.waiting());
                for (term, _) in baseline_terms(c) {
                    let ctx = Ctx::of(d, &inner.cycle_store, &inner.baselines, &inner.domain, now, now_unix);
                    match eval::value(&ctx, &term) {
                        Ok(i) => entries.push((
                            eval::baseline_key(&d.name, &term),
                            Entry {
                                cycle_end_unix: now_unix,
                                estimate: i.estimate,
                                lower: i.lower,
                                upper: i.upper,
                                failing,
                            },
                        )),
                        Err(e) => tracing::info!(slo = %d.name, "no baseline from this cycle: {}", e.reason),
                    }
                }
            }
            for (key, entry) in entries {
                inner.baselines.record(&key, entry);
            }
            inner.cycle_store.clear();
        });
        self.save();
    }

    /// Evaluates every SLO now.
    pub fn evaluate_now(&self) -> Vec<(String, SloStatus)> {
        self.evaluate(self.now(), unix_now())
    }

    /// Judges every SLO on the one run measured so far: a bench's verdict. A bench has no next
    /// run to confirm a fail, so a clear fail is a fail here (the daemon's evaluations wait for
    /// a second failing run, docs/SLO.md "Run-to-run variation").
    pub fn judge_run(&self) -> Vec<(String, SloStatus)> {
        self.evaluate_gated(self.now(), unix_now(), false)
    }

    /// Evaluates every SLO at `now`: updates the verdicts, publishes the metrics, logs and calls
    /// the hooks on state changes. Returns each SLO's status.
    pub fn evaluate(&self, now: Instant, now_unix: f64) -> Vec<(String, SloStatus)> {
        self.evaluate_gated(now, now_unix, true)
    }

    /// [`Self::evaluate`], with a comparison's fail held for a second run when `gated`.
    fn evaluate_gated(&self, now: Instant, now_unix: f64, gated: bool) -> Vec<(String, SloStatus)> {
        let mut changes = Vec::new();
        let statuses = self.with(|inner| {
            let mut out = Vec::new();
            for d in &inner.defs {
                let ctx = Ctx::of(
                    d,
                    &inner.store,
                    &inner.baselines,
                    &inner.domain,
                    now,
                    now_unix,
                );
                let (raw, reading, sides, reason) = evaluate_one(&ctx, d);
                let (stalest, newest) = data_times(&inner.store, d);
                let data_age_seconds =
                    stalest.map(|at| now.saturating_duration_since(at).as_secs_f64());
                let verdict = inner
                    .verdicts
                    .entry(d.name.clone())
                    .or_insert_with(|| Verdict::new(now, now_unix));
                let raw = match d.kind {
                    SloKind::Expr(_) if gated => {
                        let weighed: Vec<Weighed> = sides
                            .iter()
                            .map(|s| Weighed {
                                margin: s.margin(),
                                violated: s.verdict == eval::Truth::False,
                                rolling: s.rolling,
                            })
                            .collect();
                        verdict.gate.apply(raw, newest, &weighed, verdict.state)
                    }
                    SloKind::Expr(_) | SloKind::BurnRate { .. } => raw,
                };
                let old = verdict.update(raw, d.for_, now, now_unix);
                // No verdict yet although the data suffices: say why, or the status would read
                // like an SLO waiting for samples. A change the gate holds back: say so too, or
                // a fail that does not page (a pass that does not reset) looks unexplained.
                let reason = reason.or_else(|| {
                    (verdict.state == SloState::InsufficientData && raw == Raw::Borderline)
                        .then(|| undecided_reason(&ctx, &verdict.gate))
                        .or_else(|| verdict.gate.held().map(|h| held_reason(&h)))
                });
                let reading = SloReading {
                    state: verdict.state,
                    ..reading
                };
                if let Some(old) = old {
                    changes.push((
                        d.name.clone(),
                        old,
                        verdict.state,
                        reading.clone(),
                        reason.clone(),
                    ));
                }
                let status = SloStatus {
                    reading,
                    since_unix: verdict.since_unix,
                    evaluated_unix: now_unix,
                    reason,
                    sides,
                    pending: verdict
                        .pending()
                        .map(|(s, at)| (s, now.saturating_duration_since(at).as_secs_f64())),
                    data_age_seconds,
                };
                inner.status.insert(d.name.clone(), status.clone());
                out.push((d.name.clone(), status));
            }
            out
        });
        if let Some(m) = &self.metrics {
            for (name, status) in &statuses {
                m.set_slo(name, &status.reading);
                m.set_slo_data_age(name, status.data_age_seconds);
            }
        }
        let hooks = self
            .hooks
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let changed = !changes.is_empty();
        for (name, old, new, reading, reason) in changes {
            let fmt = |v: Option<f64>| v.map(|v| format!("{v:.6}")).unwrap_or_else(|| "-".into());
            let line = format!(
                "SLO {name}: {} -> {} (value {} [{}, {}], threshold {}{})",
                old.as_str(),
                new.as_str(),
                fmt(reading.value),
                fmt(reading.value_lower),
                fmt(reading.value_upper),
                fmt(reading.threshold),
                reason.map(|r| format!("; {r}")).unwrap_or_default()
            );
            if new == SloState::Fail {
                tracing::warn!(slo = %name, old = old.as_str(), new = new.as_str(), "{line}");
            } else {
                tracing::info!(slo = %name, old = old.as_str(), new = new.as_str(), "{line}");
            }
            for h in &hooks {
                h.on_state_change(&name, old, new, &reading);
            }
        }
        if changed {
            self.save();
        }
        statuses
    }

    /// The current state of `slo`.
    pub fn state(&self, slo: &str) -> Option<SloState> {
        self.with(|i| i.verdicts.get(slo).map(|v| v.state))
    }

    /// The SLO part of `/api/v1/status`.
    pub fn status_json(&self) -> Json {
        self.with(|inner| {
            let list: Vec<Json> = inner
                .defs
                .iter()
                .map(|d| {
                    let st = inner.status.get(&d.name);
                    let verdict = inner.verdicts.get(&d.name);
                    let state = verdict.map(|v| v.state).unwrap_or(SloState::InsufficientData);
                    let num = |v: Option<f64>| v.filter(|x| x.is_finite());
                    json!({
                        "name": d.name,
                        "description": d.description,
                        "kind": match d.kind { SloKind::Expr(_) => "expr", SloKind::BurnRate { .. } => "burn_rate" },
                        "expr": d.text(),
                        "state": state.as_str(),
                        "since_unix": verdict.map(|v| v.since_unix),
                        "evaluated_unix": st.map(|s| s.evaluated_unix),
                        "value": st.and_then(|s| num(s.reading.value)),
                        "interval": st.map(|s| json!([num(s.reading.value_lower), num(s.reading.value_upper)])),
                        "threshold": st.and_then(|s| num(s.reading.threshold)),
                        "reason": st.and_then(|s| s.reason.clone()),
                        "comparisons": st.map(|s| s.sides.iter().map(side_json).collect::<Vec<_>>()).unwrap_or_default(),
                        "data_age_seconds": st.and_then(|s| s.data_age_seconds),
                        "pending": st.and_then(|s| s.pending.map(|(p, held)| json!({"state": p.as_str(), "held_seconds": held, "for_seconds": d.for_.as_secs_f64()}))),
                        "window_seconds": d.window.as_secs_f64(),
                        "min_samples": d.min_samples,
                        "saturated_steps": d.saturated_steps.as_str(),
                        "for_seconds": d.for_.as_secs_f64(),
                        "severity": format!("{:?}", d.severity).to_lowercase(),
                    })
                })
                .collect();
            Json::Array(list)
        })
    }
}

/// The engine reads steady-window requests only: warmup measures nothing.
impl Sink for SloEngine {
    /// A target that left takes its data with it: nothing of it is held any more.
    fn targets(&self, change: &TargetChange<'_>) {
        self.with(|inner| {
            for gone in change.removed {
                inner.store.forget_target(gone);
                inner.cycle_store.forget_target(gone);
            }
        });
    }

    fn request(&self, req: &Finished<'_>) {
        if req.phase == Phase::Steady {
            self.observe_record(req);
        }
    }

    fn request_outside_steps(&self, req: &Finished<'_>) {
        self.observe_probe(req);
    }

    /// A step cut short leaves its samples out of the windows.
    fn step_finished(&self, _step: &StepInfo, results: Option<&[StepResult]>) {
        SloEngine::step_finished(self, results.unwrap_or_default());
    }

    fn cycle_finished(&self, _cycle: u64) {
        SloEngine::cycle_finished(self);
    }

    fn paused(&self, state: &crate::model::PauseState) {
        self.set_paused(state.paused());
    }
}

/// Where the baselines of a config are kept: `LLM_CANARY_STATE_FILE`, else a file in the
/// temporary directory named after the config path (so two configs never share one).
pub fn default_state_file(config_path: Option<&std::path::Path>) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("LLM_CANARY_STATE_FILE") {
        return p.into();
    }
    let tag = match config_path {
        None => "demo".to_owned(),
        Some(p) => {
            let full = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
            // FNV-1a: a stable name from the path, without another dependency.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in full.to_string_lossy().bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            format!("{h:016x}")
        }
    };
    std::env::temp_dir().join(format!("llm-canary-baseline-{tag}.json"))
}

/// Evaluates every SLO each [`EVALUATION_INTERVAL`] until `stop` (a reload replaces the
/// definitions through [`SloEngine::set_definitions`]).
pub async fn run_evaluations(engine: Arc<SloEngine>, stop: tokio_util::sync::CancellationToken) {
    let mut tick = tokio::time::interval(EVALUATION_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        engine.evaluate_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Outcome, RequestRecord};
    use crate::config::{SaturatedSteps, ServingMode, Severity};
    use crate::export::metrics::Metrics;
    use crate::measure::step::StepAccumulator;
    use crate::model::RecordContext;
    use crate::slo::parse_condition;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use tokio::time::advance;

    const GAIN: &str =
        r#"p50(ttft{serving_mode="disaggregated"}) <= 0.8 * p50(ttft{serving_mode="aggregated"})"#;

    fn def(expr: &str, for_secs: u64) -> SloDef {
        SloDef {
            name: "gain".into(),
            description: None,
            kind: SloKind::Expr(parse_condition(expr).unwrap()),
            window: Duration::from_secs(120),
            min_samples: 50,
            for_: Duration::from_secs(for_secs),
            severity: Severity::Warning,
            saturated_steps: SaturatedSteps::Include,
            runbook_url: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }

    fn labels(mode: ServingMode) -> RequestLabels {
        let target = match mode {
            ServingMode::Aggregated => "agg",
            _ => "disagg",
        };
        RequestLabels::new(target, mode, "concurrency_sweep").with_concurrency(32)
    }

    fn result(mode: ServingMode, cycle: u64, requests: u64, degraded: bool) -> StepResult {
        let mut measurements = StepAccumulator::default().finish(
            Duration::from_secs(30),
            None,
            Duration::from_millis(50),
        );
        measurements.requests = requests;
        measurements.ok_requests = requests;
        measurements.degraded = degraded;
        let l = labels(mode);
        StepResult {
            cycle,
            step: "concurrency_sweep concurrency=32".into(),
            total: false,
            started_unix: 0.0,
            ended_unix: 0.0,
            steady_seconds: 30.0,
            measurements,
            labels: l,
            server: None,
            connections: None,
        }
    }

    /// One step of `n` requests per mode with TTFTs uniform in ±10 % around the given centres.
    /// An engine over `defs` with an in-memory baseline store and no metrics.
    fn in_memory_engine(defs: Vec<SloDef>) -> SloEngine {
        SloEngine::new(
            defs,
            LabelDomain::default(),
            BaselineStore::in_memory(),
            None,
        )
    }

    fn step(engine: &SloEngine, rng: &mut StdRng, n: u64, agg: f64, disagg: f64, degraded: bool) {
        saturated_step(engine, rng, n, agg, disagg, degraded, false);
    }

    /// [`step`], of a step that was saturated or not.
    fn saturated_step(
        engine: &SloEngine,
        rng: &mut StdRng,
        n: u64,
        agg: f64,
        disagg: f64,
        degraded: bool,
        saturated: bool,
    ) {
        observe_step(engine, rng, n, agg, disagg);
        finish_step(engine, n, degraded, saturated);
    }

    /// The requests of [`step`], without its end.
    fn observe_step(engine: &SloEngine, rng: &mut StdRng, n: u64, agg: f64, disagg: f64) {
        for (mode, centre) in [
            (ServingMode::Aggregated, agg),
            (ServingMode::Disaggregated, disagg),
        ] {
            for _ in 0..n {
                let ttft = centre * rng.random_range(0.9..1.1);
                engine.observe(
                    &labels(mode),
                    RequestSample {
                        ok: true,
                        ttft: Some(ttft),
                        latency: Some(ttft + 1.0),
                        ..RequestSample::default()
                    },
                );
            }
        }
    }

    /// The end of [`step`].
    fn finish_step(engine: &SloEngine, n: u64, degraded: bool, saturated: bool) {
        let mut results = [
            result(ServingMode::Aggregated, 0, n, degraded),
            result(ServingMode::Disaggregated, 0, n, degraded),
        ];
        for r in &mut results {
            r.measurements.saturated = saturated;
        }
        engine.step_finished(&results);
    }

    struct Recorded(Mutex<Vec<(String, SloState, SloState)>>);

    impl StateChangeHook for Recorded {
        fn on_state_change(&self, slo: &str, old: SloState, new: SloState, _: &SloReading) {
            self.0.lock().unwrap().push((slo.to_owned(), old, new));
        }
    }

    /// The first SLO's reason in the status ("" without one).
    fn reason(engine: &SloEngine) -> String {
        engine.status_json()[0]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn state(engine: &SloEngine) -> SloState {
        let statuses = engine.evaluate(Instant::now(), unix_now());
        statuses[0].1.reading.state
    }

    #[tokio::test(start_paused = true)]
    async fn clear_pass_then_clear_fail_after_for_and_borderline_holds() {
        let metrics = Arc::new(Metrics::new(&[]));
        let engine = SloEngine::new(
            vec![def(GAIN, 20)],
            LabelDomain::default(),
            BaselineStore::in_memory(),
            Some(metrics.clone()),
        );
        let hook = Arc::new(Recorded(Mutex::new(Vec::new())));
        engine.add_hook(hook.clone());
        let mut rng = StdRng::seed_from_u64(7);
        assert_eq!(state(&engine), SloState::InsufficientData);

        // Clear pass: disaggregated at half of aggregated. `for` 20 s delays the verdict.
        step(&engine, &mut rng, 200, 1.0, 0.5, false);
        assert_eq!(state(&engine), SloState::InsufficientData);
        advance(Duration::from_secs(10)).await;
        assert_eq!(state(&engine), SloState::InsufficientData);
        advance(Duration::from_secs(10)).await;
        assert_eq!(state(&engine), SloState::Pass);
        assert_eq!(metrics.slo_state("gain"), Some(SloState::Pass));
        let status = engine.status_json();
        assert_eq!(status[0]["state"], "pass");
        let (lo, hi) = (
            status[0]["interval"][0].as_f64().unwrap(),
            status[0]["interval"][1].as_f64().unwrap(),
        );
        let value = status[0]["value"].as_f64().unwrap();
        assert!(
            lo <= value && value <= hi && (0.45..0.55).contains(&value),
            "{status}"
        );
        assert!((status[0]["threshold"].as_f64().unwrap() - 0.8).abs() < 0.05);

        // Borderline: 0.8 × 1.0 against 0.8: the intervals overlap, the state holds.
        advance(Duration::from_secs(130)).await;
        step(&engine, &mut rng, 200, 1.0, 0.8, false);
        for _ in 0..10 {
            assert_eq!(state(&engine), SloState::Pass);
            advance(Duration::from_secs(5)).await;
        }
        let comparisons = &engine.status_json()[0]["comparisons"];
        assert_eq!(comparisons[0]["verdict"], "undecided", "{comparisons}");

        // Clear fail (a slow handoff): 1.3 against 0.8. One run alone is held back, however
        // long it is held (a fail needs two runs in a row).
        advance(Duration::from_secs(130)).await;
        step(&engine, &mut rng, 200, 1.0, 1.3, false);
        for _ in 0..10 {
            assert_eq!(state(&engine), SloState::Pass);
            advance(Duration::from_secs(5)).await;
        }
        // The next run fails too: still pass until `for` has passed.
        advance(Duration::from_secs(130)).await;
        step(&engine, &mut rng, 200, 1.0, 1.3, false);
        assert_eq!(state(&engine), SloState::Pass);
        advance(Duration::from_secs(19)).await;
        assert_eq!(state(&engine), SloState::Pass);
        advance(Duration::from_secs(1)).await;
        assert_eq!(state(&engine), SloState::Fail);
        assert_eq!(metrics.slo_state("gain"), Some(SloState::Fail));

        // The step leaves the window, and its run is held until the next one: the verdict stays
        // (a step runs once per cycle; docs/SLO.md, verdicts across the cycle).
        advance(Duration::from_secs(130)).await;
        assert_eq!(state(&engine), SloState::Fail);
        let age = engine.status_json()[0]["data_age_seconds"]
            .as_f64()
            .unwrap();
        assert!(age > 120.0, "held data {age} s old");

        // The targets leave: their data goes with them, and too little data is reported at once.
        let removed = ["agg".to_owned(), "disagg".to_owned()];
        Sink::targets(
            &engine,
            &TargetChange {
                now: &[],
                added: &[],
                removed: &removed,
            },
        );
        assert_eq!(state(&engine), SloState::InsufficientData);

        let changes = hook.0.lock().unwrap().clone();
        assert_eq!(
            changes,
            vec![
                ("gain".into(), SloState::InsufficientData, SloState::Pass),
                ("gain".into(), SloState::Pass, SloState::Fail),
                ("gain".into(), SloState::Fail, SloState::InsufficientData),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_slo_borderline_from_its_first_evaluation_says_why_it_has_no_verdict() {
        let engine = in_memory_engine(vec![def(GAIN, 0)]);
        let mut rng = StdRng::seed_from_u64(9);
        // 0.8 × 1.0 against 0.8: enough samples, overlapping intervals.
        step(&engine, &mut rng, 200, 1.0, 0.8, false);
        assert_eq!(state(&engine), SloState::InsufficientData);
        let status = &engine.status_json()[0];
        assert_eq!(status["comparisons"][0]["verdict"], "undecided", "{status}");
        let reason = status["reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("borderline"), "{status}");
        // A clear verdict replaces it.
        advance(Duration::from_secs(130)).await;
        step(&engine, &mut rng, 200, 1.0, 0.5, false);
        assert_eq!(state(&engine), SloState::Pass);
        assert!(engine.status_json()[0]["reason"].is_null());
    }

    #[tokio::test(start_paused = true)]
    async fn too_few_samples_and_degraded_steps_give_insufficient_data() {
        let engine = in_memory_engine(vec![def(GAIN, 0)]);
        let mut rng = StdRng::seed_from_u64(8);
        // 40 samples per side, 50 needed.
        step(&engine, &mut rng, 40, 1.0, 0.3, false);
        assert_eq!(state(&engine), SloState::InsufficientData);
        let why = reason(&engine);
        assert!(why.contains("40 samples, 50 needed"), "{why}");
        // A degraded step's samples never reach the windows.
        step(&engine, &mut rng, 400, 1.0, 0.3, true);
        assert_eq!(state(&engine), SloState::InsufficientData);
        // With `for` 0 a clear verdict applies at once.
        step(&engine, &mut rng, 40, 1.0, 0.3, false);
        assert_eq!(state(&engine), SloState::Pass);
    }

    /// Issue 19, item 4: an SLO reads every step, only the unsaturated ones, or only the
    /// saturated ones; each choice holds its own latest step once its window has emptied.
    #[tokio::test(start_paused = true)]
    async fn saturated_steps_are_read_left_out_or_read_alone_as_each_slo_says() {
        let engines: Vec<(SaturatedSteps, SloEngine)> = [
            SaturatedSteps::Include,
            SaturatedSteps::Exclude,
            SaturatedSteps::Only,
        ]
        .into_iter()
        .map(|steps| {
            let d = SloDef {
                saturated_steps: steps,
                ..def(GAIN, 0)
            };
            (steps, in_memory_engine(vec![d]))
        })
        .collect();
        let states = |expect: [SloState; 3]| {
            for ((steps, engine), want) in engines.iter().zip(expect) {
                assert_eq!(state(engine), want, "saturated_steps: {}", steps.as_str());
            }
        };
        let mut rng = StdRng::seed_from_u64(19);
        // Within capacity disaggregation wins.
        for (_, engine) in &engines {
            saturated_step(engine, &mut rng, 200, 1.0, 0.3, false, false);
        }
        use SloState::{Fail, InsufficientData, Pass};
        states([Pass, Pass, InsufficientData]);
        // Past the window, saturated steps where it loses: read by `include` and `only`; the
        // unsaturated step stays held for `exclude`. The first run alone is held back (a fail
        // needs two runs in a row); the second fails.
        advance(Duration::from_secs(200)).await;
        for (_, engine) in &engines {
            saturated_step(engine, &mut rng, 200, 1.0, 3.0, false, true);
        }
        states([Pass, Pass, InsufficientData]);
        advance(Duration::from_secs(10)).await;
        for (_, engine) in &engines {
            saturated_step(engine, &mut rng, 200, 1.0, 3.0, false, true);
        }
        states([Fail, Pass, Fail]);
        // And held across a restart of the engine, by its saved state.
        for (steps, engine) in &engines {
            let saved = EngineState::parse(&engine.saved_state().to_bytes()).unwrap();
            let restored = in_memory_engine(vec![SloDef {
                saturated_steps: *steps,
                ..def(GAIN, 0)
            }]);
            restored.restore(&saved);
            let want = if *steps == SaturatedSteps::Exclude {
                Pass
            } else {
                Fail
            };
            assert_eq!(
                state(&restored),
                want,
                "restored, saturated_steps: {}",
                steps.as_str()
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn burn_rate_slo_compares_the_bad_ratio_with_the_budget() {
        let burn = SloDef {
            name: "ttft-availability".into(),
            description: None,
            kind: SloKind::BurnRate {
                selector: crate::slo::parse_sli("ttft < 1s").unwrap().0,
                threshold: 1.0,
                objective: 90.0,
                period: crate::slo::DEFAULT_PERIOD,
            },
            window: Duration::from_secs(60),
            min_samples: 50,
            for_: Duration::ZERO,
            severity: Severity::Critical,
            saturated_steps: SaturatedSteps::Include,
            runbook_url: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        };
        let engine = in_memory_engine(vec![burn]);
        let mut rng = StdRng::seed_from_u64(9);
        // Every aggregated TTFT is under 1 s, every disaggregated one above: 50 % bad.
        step(&engine, &mut rng, 200, 0.5, 2.0, false);
        assert_eq!(state(&engine), SloState::Fail);
        let s = engine.status_json();
        assert!((s[0]["value"].as_f64().unwrap() - 0.5).abs() < 1e-9, "{s}");
        assert!((s[0]["threshold"].as_f64().unwrap() - 0.1).abs() < 1e-9);
        advance(Duration::from_secs(61)).await;
        step(&engine, &mut rng, 200, 0.5, 0.5, false);
        assert_eq!(state(&engine), SloState::Pass);
    }

    #[tokio::test(start_paused = true)]
    async fn baseline_compares_with_completed_cycles() {
        let expr = r#"p50(ttft{serving_mode="aggregated"}) <= 1.2 * baseline(p50(ttft{serving_mode="aggregated"}), 24h)"#;
        let engine = in_memory_engine(vec![def(expr, 0)]);
        let mut rng = StdRng::seed_from_u64(10);
        step(&engine, &mut rng, 200, 1.0, 1.0, false);
        // No completed cycle yet: no baseline; nor once the cycle that holds this run ended
        // (a run is never its own baseline).
        assert_eq!(state(&engine), SloState::InsufficientData);
        engine.cycle_finished();
        assert_eq!(state(&engine), SloState::InsufficientData);
        let why = reason(&engine);
        assert!(why.contains("no passing cycle before this run"), "{why}");
        // A 50 % regression against one past cycle: the deployment's modes may not have shown
        // yet, so no run can fail against it, and the reason says so.
        advance(Duration::from_secs(130)).await;
        step(&engine, &mut rng, 200, 1.5, 1.0, false);
        assert_eq!(state(&engine), SloState::InsufficientData);
        let why = reason(&engine);
        assert!(why.contains("1 past runs, 8 needed"), "{why}");
        engine.cycle_finished();
        // Steady runs teach the baseline its spread (the regressed cycle counts towards it, and
        // widens it while the runs are few)...
        for _ in 0..20 {
            advance(Duration::from_secs(130)).await;
            step(&engine, &mut rng, 200, 1.0, 1.0, false);
            assert_eq!(state(&engine), SloState::Pass);
            engine.cycle_finished();
        }
        // ...and then the regression fails at its second run.
        for want in [SloState::Pass, SloState::Fail] {
            advance(Duration::from_secs(130)).await;
            step(&engine, &mut rng, 200, 1.5, 1.0, false);
            assert_eq!(state(&engine), want);
            engine.cycle_finished();
        }
    }

    /// A steady deployment whose runs land in one of two modes (51 or 71 ms p50, each run's
    /// own interval a few percent wide) keeps the first verdict of its regression SLO through
    /// 60 cycles; a doubling still pages, at its second run, and resets at the first good one;
    /// so does a regression of the fast mode alone that brings it near the slow one.
    #[tokio::test(start_paused = true)]
    async fn a_bimodal_deployment_keeps_its_verdict_and_a_regression_still_pages() {
        let expr = r#"p50(ttft{serving_mode="aggregated"}) <= 1.2 * baseline(p50(ttft{serving_mode="aggregated"}), 24h)"#;
        let engine = in_memory_engine(vec![def(expr, 0)]);
        let hook = Arc::new(Recorded(Mutex::new(Vec::new())));
        engine.add_hook(hook.clone());
        let mut rng = StdRng::seed_from_u64(39);
        let run = |engine: &SloEngine, rng: &mut StdRng, factor: f64| {
            let centre = if rng.random_bool(0.5) { 0.071 } else { 0.051 };
            step(engine, rng, 200, centre * factor, 1.0, false);
            let states: Vec<SloState> = (0..4).map(|_| state(engine)).collect();
            engine.cycle_finished();
            *states.last().unwrap()
        };
        for _ in 0..60 {
            advance(Duration::from_secs(130)).await;
            run(&engine, &mut rng, 1.0);
        }
        let changes = hook.0.lock().unwrap().clone();
        assert_eq!(
            changes.iter().map(|(_, o, n)| (*o, *n)).collect::<Vec<_>>(),
            [(SloState::InsufficientData, SloState::Pass)],
            "{changes:?}"
        );
        let mut seen = Vec::new();
        for factor in [2.0, 2.0, 1.0] {
            advance(Duration::from_secs(130)).await;
            seen.push(run(&engine, &mut rng, factor));
        }
        assert_eq!(seen, [SloState::Pass, SloState::Fail, SloState::Pass]);
        // The fast mode 30 % slower (66 ms) lands nearer the slow mode's runs than its own:
        // held to the runs no slower than it, it still pages at its second run.
        let mut seen = Vec::new();
        for centre in [0.051 * 1.3, 0.051 * 1.3, 0.051] {
            advance(Duration::from_secs(130)).await;
            step(&engine, &mut rng, 200, centre, 1.0, false);
            let states: Vec<SloState> = (0..4).map(|_| state(&engine)).collect();
            engine.cycle_finished();
            seen.push(*states.last().unwrap());
        }
        assert_eq!(seen, [SloState::Pass, SloState::Fail, SloState::Pass]);
    }

    /// A bench measures one run and judges it: the daemon's evaluation holds that run's clear
    /// fail for a second run, a bench's judgement does not.
    #[tokio::test(start_paused = true)]
    async fn a_bench_judges_its_one_run_and_the_daemon_waits_for_the_second() {
        let daemon = in_memory_engine(vec![def(GAIN, 0)]);
        let bench = in_memory_engine(vec![def(GAIN, 0)]);
        let (mut a, mut b) = (StdRng::seed_from_u64(3), StdRng::seed_from_u64(3));
        advance(Duration::from_secs(10)).await;
        // Disaggregated as slow as aggregated: the gain fails clearly.
        step(&daemon, &mut a, 200, 0.5, 0.5, false);
        step(&bench, &mut b, 200, 0.5, 0.5, false);
        assert_eq!(state(&daemon), SloState::InsufficientData);
        let why = reason(&daemon);
        assert!(why.contains("next run"), "{why}");
        assert_eq!(bench.judge_run()[0].1.reading.state, SloState::Fail);
    }

    /// A p99 over runs of 170 samples: no run alone bounds it above, so the held runs are
    /// pooled and it decides at the third; until then the reason names the cause.
    #[tokio::test(start_paused = true)]
    async fn a_tail_quantile_pools_held_runs_until_it_can_be_bounded() {
        let expr = r#"p99(ttft{serving_mode="aggregated"}) <= 2s"#;
        let engine = in_memory_engine(vec![SloDef {
            window: Duration::from_secs(30),
            min_samples: 100,
            ..def(expr, 0)
        }]);
        let mut rng = StdRng::seed_from_u64(99);
        for run in 1..=3 {
            advance(Duration::from_secs(130)).await;
            step(&engine, &mut rng, 170, 0.5, 0.5, false);
            let st = state(&engine);
            let status = engine.status_json();
            if run < 3 {
                assert_eq!(st, SloState::InsufficientData, "run {run}: {status}");
                let reason = status[0]["reason"].as_str().unwrap_or_default();
                assert!(
                    reason.contains("≥ 368 samples")
                        && reason.contains(&format!("{} read", 170 * run)),
                    "run {run}: {reason}"
                );
            } else {
                assert_eq!(st, SloState::Pass, "run {run}: {status}");
            }
        }
    }

    /// Runs of 380 samples bound a p99 (368) but not `min_samples: 400`: the pool goes on to
    /// `min_samples`, so the SLO decides at the second run and keeps its verdict.
    #[tokio::test(start_paused = true)]
    async fn a_pooled_quantile_reads_up_to_min_samples() {
        let expr = r#"p99(ttft{serving_mode="aggregated"}) <= 2s"#;
        let engine = in_memory_engine(vec![SloDef {
            window: Duration::from_secs(30),
            min_samples: 400,
            ..def(expr, 0)
        }]);
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen = Vec::new();
        for _ in 0..4 {
            advance(Duration::from_secs(130)).await;
            step(&engine, &mut rng, 380, 0.5, 0.5, false);
            seen.push(state(&engine));
        }
        assert_eq!(
            seen,
            [
                SloState::InsufficientData,
                SloState::Pass,
                SloState::Pass,
                SloState::Pass
            ],
            "{}",
            engine.status_json()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_in_progress_holds_memory_fixed_by_the_definitions_not_by_its_requests() {
        let engine = in_memory_engine(vec![def(GAIN, 0)]);
        let l = labels(ServingMode::Aggregated);
        let sample = |i: u32| RequestSample {
            ok: true,
            ttft: Some(0.1 + f64::from(i % 1000) * 1e-4),
            latency: Some(1.0),
            ..RequestSample::default()
        };
        for i in 0..10 {
            engine.observe(&l, sample(i));
        }
        let ten = engine.pending_memory_bytes();
        // One histogram: the only measure the SLO reads (ttft), for the one series observed.
        assert!(ten > 0);
        for i in 10..100_000 {
            engine.observe(&l, sample(i));
        }
        assert_eq!(engine.pending_memory_bytes(), ten);
        finish_step(&engine, 100_000, false, false);
        assert_eq!(engine.pending_memory_bytes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_series_no_slo_reads_folds_no_histogram() {
        let agg_only = r#"p50(ttft{target="agg"}) < 1s"#;
        let engine = in_memory_engine(vec![def(agg_only, 0)]);
        let mut rng = StdRng::seed_from_u64(13);
        let sample = RequestSample {
            ok: true,
            ttft: Some(0.2),
            ..RequestSample::default()
        };
        for _ in 0..100 {
            engine.observe(&labels(ServingMode::Disaggregated), sample);
        }
        assert_eq!(engine.pending_memory_bytes(), 0, "disagg: no SLO reads it");
        engine.observe(&labels(ServingMode::Aggregated), sample);
        assert!(engine.pending_memory_bytes() > 0, "agg: the SLO reads it");
        finish_step(&engine, 100, false, false);
        // What is folded is what the SLO reads.
        step(&engine, &mut rng, 100, 0.5, 5.0, false);
        assert_eq!(state(&engine), SloState::Pass);
    }

    /// A probe of `target` sent at `t0` whose first (and only) token came `ttft` later.
    fn probe(engine: &SloEngine, target: &str, ttft: Duration, outcome: Outcome) {
        let labels = RequestLabels::new(target, ServingMode::Aggregated, "probe");
        let request = crate::client::StreamRequest {
            request_id: "p".into(),
            prompt: crate::client::Prompt::Text("hi".into()),
            osl: 1,
        };
        let ctx = RecordContext {
            target_index: 0,
            isl: 0,
            labels: &labels,
            phase: Phase::Steady,
            osl: 1,
            shared_prefix_tokens: 0,
            request: &request,
            goodput: crate::request::GoodputLimits {
                ttft: 2.0,
                itl: 0.1,
            },
        };
        let t0 = Instant::now();
        let mut rec = RequestRecord::new("p", t0, t0);
        rec.push_content(t0 + ttft, 1);
        rec.settle(outcome, t0 + ttft, None);
        Sink::request_outside_steps(engine, &crate::model::Finished::new(&ctx, &rec));
    }

    /// `probe-availability`: 90 % of the probes' TTFTs under 1 s.
    fn probe_availability() -> SloKind {
        SloKind::BurnRate {
            selector: crate::slo::parse_sli(r#"ttft{workload="probe"} < 1s"#)
                .unwrap()
                .0,
            threshold: 1.0,
            objective: 90.0,
            period: crate::slo::DEFAULT_PERIOD,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn probe_requests_reach_their_slos_at_once_without_a_step() {
        let availability = SloDef {
            name: "probe-availability".into(),
            kind: probe_availability(),
            min_samples: 5,
            ..def(GAIN, 0)
        };
        let engine = in_memory_engine(vec![availability]);
        let fast = Duration::from_millis(200);
        for _ in 0..4 {
            probe(&engine, "agg", fast, Outcome::Ok);
        }
        // A probe the canary cut short counts nowhere.
        probe(&engine, "agg", fast, Outcome::Cancelled);
        assert_eq!(state(&engine), SloState::InsufficientData);
        assert_eq!(reason(&engine), "4 requests in the window, 5 needed");
        // Enough good probes for the bad ratio's interval to sit below the 10 % budget.
        for _ in 4..40 {
            probe(&engine, "agg", fast, Outcome::Ok);
        }
        assert_eq!(state(&engine), SloState::Pass);
        // Probes are not folded into the step in progress, which would drop them at its end.
        assert_eq!(engine.pending_memory_bytes(), 0);
        // Slow and failed probes are bad events.
        for _ in 0..20 {
            probe(&engine, "agg", Duration::from_secs(3), Outcome::Ok);
            probe(&engine, "agg", fast, Outcome::Http5xx);
        }
        assert_eq!(state(&engine), SloState::Fail);
        let bad = engine.status_json()[0]["value"].as_f64().unwrap();
        assert!((bad - 40.0 / 80.0).abs() < 1e-9, "{bad}");
    }

    /// A burn-rate SLO's window is its own, however much longer than every comparison window:
    /// the step totals it reads are kept that long (they were kept only as long as the longest
    /// comparison window, which cut the availability SLO of the seed plan from 6 h to 1 h).
    #[tokio::test(start_paused = true)]
    async fn a_burn_rate_window_longer_than_every_comparison_window_is_read_whole() {
        let burn = SloDef {
            name: "probe-availability".into(),
            kind: probe_availability(),
            window: Duration::from_secs(600),
            min_samples: 50,
            ..def(GAIN, 0)
        };
        // The comparison SLO's window is 120 s.
        let engine = in_memory_engine(vec![def(GAIN, 0), burn]);
        let burn_state = |engine: &SloEngine| engine.evaluate(Instant::now(), 0.0)[1].1.clone();
        let (fast, slow) = (Duration::from_millis(200), Duration::from_secs(3));
        for _ in 0..60 {
            probe(&engine, "agg", slow, Outcome::Ok);
        }
        assert_eq!(burn_state(&engine).reading.state, SloState::Fail);
        // 200 s later, past the comparison window but inside the burn-rate one: the slow probes
        // still count, half of the 120 are bad.
        advance(Duration::from_secs(200)).await;
        for _ in 0..60 {
            probe(&engine, "agg", fast, Outcome::Ok);
        }
        let status = burn_state(&engine);
        assert_eq!(status.reading.state, SloState::Fail, "{status:?}");
        let bad = status.reading.value.unwrap();
        assert!((bad - 0.5).abs() < 1e-9, "{status:?}");
        // Once the slow probes are older than the burn-rate window, they leave it.
        advance(Duration::from_secs(450)).await;
        for _ in 0..10 {
            probe(&engine, "agg", fast, Outcome::Ok);
        }
        let status = burn_state(&engine);
        assert_eq!(status.reading.state, SloState::Pass, "{status:?}");
        assert!(status.reading.value.unwrap().abs() < 1e-9, "{status:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn probes_count_as_requests_but_not_towards_the_steps_rates() {
        let value = |expr: &str| {
            let engine = in_memory_engine(vec![def(expr, 0)]);
            let mut rng = StdRng::seed_from_u64(14);
            // 200 successful requests per mode in 30 steady seconds.
            step(&engine, &mut rng, 200, 0.5, 0.5, false);
            for outcome in [Outcome::Ok, Outcome::Http5xx] {
                for _ in 0..50 {
                    probe(&engine, "agg", Duration::from_millis(200), outcome);
                }
            }
            engine.evaluate(Instant::now(), 0.0);
            engine.status_json()[0]["value"].as_f64().unwrap()
        };
        let throughput = value(r#"throughput{target="agg"} > 1"#);
        assert!((throughput - 200.0 / 30.0).abs() < 1e-9, "{throughput}");
        let errors = value(r#"error_ratio{target="agg"} < 0.5"#);
        assert!((errors - 50.0 / 300.0).abs() < 1e-9, "{errors}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_that_straddles_a_change_of_what_the_slos_read_is_left_out_of_them() {
        let latency = r#"p50(latency{serving_mode="disaggregated"}) <= p50(latency{serving_mode="aggregated"})"#;
        let engine = in_memory_engine(vec![def(GAIN, 0)]);
        let mut rng = StdRng::seed_from_u64(12);
        // Half the step is folded for ttft; then the SLOs read latency instead.
        observe_step(&engine, &mut rng, 100, 1.0, 0.5);
        engine.set_definitions(vec![def(latency, 0)], LabelDomain::default());
        observe_step(&engine, &mut rng, 100, 1.0, 0.5);
        finish_step(&engine, 200, false, false);
        assert_eq!(state(&engine), SloState::InsufficientData);
        // The next step is folded for the new definitions from its start.
        step(&engine, &mut rng, 200, 1.0, 0.5, false);
        assert_eq!(state(&engine), SloState::Pass);

        // A change that reads the same (only `for`) keeps the step in progress.
        advance(Duration::from_secs(130)).await;
        observe_step(&engine, &mut rng, 100, 1.0, 0.5);
        engine.set_definitions(vec![def(latency, 1)], LabelDomain::default());
        observe_step(&engine, &mut rng, 100, 1.0, 0.5);
        finish_step(&engine, 200, false, false);
        // A clear pass at once, held for the new `for` of 1 s.
        assert_eq!(state(&engine), SloState::InsufficientData);
        assert!(engine.status_json()[0]["pending"]["state"] == "pass");
        advance(Duration::from_secs(1)).await;
        assert_eq!(state(&engine), SloState::Pass);
    }
}
