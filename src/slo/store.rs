//! The measurements the SLOs read: a step in progress's requests folded per series until it
//! ends, each step's totals, and the per-series sliding HDR windows of the distributions some SLO
//! wants, with the held latest steps that keep a verdict steady across the cycle and across
//! restarts.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ast::*;
use super::state::{Held, HeldSeries, HeldStep};
use crate::config::SaturatedSteps;
use crate::measure::step::Counts;
use crate::measure::window::{SlidingWindow, ValueScale, WindowConfig, WindowSnapshot};
use crate::model::Finished;
use crate::request::RequestLabels;

/// One request's measurements, kept until its step ends (a degraded step's are dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestSample {
    pub ok: bool,
    pub ttft: Option<f64>,
    pub itl: Option<f64>,
    pub latency: Option<f64>,
    pub server_ttft: Option<f64>,
    pub prefill_time: Option<f64>,
    pub prefill_wait: Option<f64>,
    pub kv_transfer: Option<f64>,
}

impl RequestSample {
    /// What the SLOs read of one finished request: the client's timings, and the server's own
    /// where it sent them (in milliseconds; a negative or non-finite one is left out).
    pub fn of(req: &Finished<'_>) -> RequestSample {
        let s = &req.sample;
        let ms = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0).map(|x| x / 1000.0);
        let timing = req.record.server_timing.as_ref();
        RequestSample {
            ok: s.outcome.is_ok(),
            ttft: s.ttft,
            itl: s.itl,
            latency: Some(s.latency),
            server_ttft: ms(timing.and_then(|t| t.ttft_ms)),
            prefill_time: ms(timing.and_then(|t| t.prefill_time_ms)),
            prefill_wait: ms(timing.and_then(|t| t.prefill_wait_time_ms)),
            kv_transfer: ms(timing.and_then(|t| t.kv_transfer_estimated_latency_ms)),
        }
    }

    /// The request's value of a distribution measure (successful requests only).
    pub fn get(&self, m: Measure) -> Option<f64> {
        if !self.ok {
            return None;
        }
        match m {
            Measure::Ttft => self.ttft,
            Measure::Itl => self.itl,
            Measure::Latency => self.latency,
            Measure::ServerTtft => self.server_ttft,
            Measure::PrefillTime => self.prefill_time,
            Measure::PrefillWait => self.prefill_wait,
            Measure::KvTransfer => self.kv_transfer,
            _ => None,
        }
    }

    /// AIPerf's goodput: a request is good when it succeeded and every objective holds.
    pub fn is_good(&self, objectives: &[Objective]) -> bool {
        self.ok
            && objectives
                .iter()
                .all(|o| self.get(o.measure).is_some_and(|v| v <= o.seconds))
    }
}

/// What a step in progress keeps of each request for the stores: the distribution measures
/// some store reads, each with the matchers of the series it is read from, and the objective
/// sets whose good requests some store counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folding {
    measures: Vec<(Measure, Vec<Vec<Matcher>>)>,
    objective_sets: Vec<Vec<Objective>>,
}

impl Folding {
    /// What `stores` read, together.
    pub fn of(stores: &[&Store]) -> Folding {
        let mut f = Folding::default();
        for store in stores {
            for w in &store.wants {
                let readers = match f.measures.iter_mut().find(|(m, _)| *m == w.measure) {
                    Some((_, readers)) => readers,
                    None => {
                        f.measures.push((w.measure, Vec::new()));
                        &mut f.measures.last_mut().expect("just pushed").1
                    }
                };
                if !readers.contains(&w.matchers) {
                    readers.push(w.matchers.clone());
                }
            }
            for set in &store.objective_sets {
                if !f.objective_sets.contains(set) {
                    f.objective_sets.push(set.clone());
                }
            }
        }
        f
    }
}

/// One series' requests of a step in progress, folded as they finish: a histogram per measure
/// of the [`Folding`] that some SLO reads from this series, made at its first value, and the good
/// requests per objective set. Its size is fixed by the SLO definitions, whatever the step's
/// length or request rate, so a long step at a high rate costs no more memory than a short one.
#[derive(Debug, Clone, Default)]
pub struct StepSamples {
    folding: Arc<Folding>,
    /// Per measure of the folding: whether an SLO reads it from this series.
    read: Vec<bool>,
    values: Vec<Option<WindowSnapshot>>,
    good: Vec<u64>,
}

impl StepSamples {
    /// The samples of the series `labels`, folded for `folding`.
    pub fn new(folding: Arc<Folding>, labels: &RequestLabels) -> StepSamples {
        StepSamples {
            read: folding
                .measures
                .iter()
                .map(|(_, readers)| readers.iter().any(|m| labels_match(labels, m)))
                .collect(),
            values: vec![None; folding.measures.len()],
            good: vec![0; folding.objective_sets.len()],
            folding,
        }
    }

    /// Folds one finished request in.
    pub fn add(&mut self, sample: &RequestSample) {
        let measures = self.folding.measures.iter().zip(&self.read);
        for (((measure, _), read), slot) in measures.zip(&mut self.values) {
            if let Some(v) = sample.get(*measure).filter(|_| *read) {
                slot.get_or_insert_with(|| WindowSnapshot::empty(ValueScale::SECONDS))
                    .record(v);
            }
        }
        for (set, good) in self.folding.objective_sets.iter().zip(&mut self.good) {
            *good += u64::from(sample.is_good(set));
        }
    }

    /// The values of `measure`; `None` when no request had one or the folding leaves it out.
    pub fn values(&self, measure: Measure) -> Option<&WindowSnapshot> {
        let i = self
            .folding
            .measures
            .iter()
            .position(|(m, _)| *m == measure)?;
        self.values[i].as_ref()
    }

    /// The good requests of objective set `set`; `None` when the folding leaves it out.
    pub fn good(&self, set: &[Objective]) -> Option<u64> {
        let i = self
            .folding
            .objective_sets
            .iter()
            .position(|s| s.as_slice() == set)?;
        Some(self.good[i])
    }

    /// Bytes held by the histograms' counters.
    pub fn memory_bytes(&self) -> usize {
        self.values
            .iter()
            .flatten()
            .map(WindowSnapshot::memory_bytes)
            .sum()
    }
}

/// The key of a set of goodput objectives (also a burn-rate SLI): its canonical text.
pub fn objectives_key(objectives: &[Objective]) -> String {
    objectives
        .iter()
        .map(|o| format!("{}<={}", o.measure.name(), format_duration(o.seconds)))
        .collect::<Vec<_>>()
        .join(",")
}

/// What one step measured for one target and label set, as the scalar measures read it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub labels: RequestLabels,
    /// `cycle|step|target`: label sets of one step instance share its steady time.
    pub instance: String,
    pub at: Instant,
    /// When it was committed, on the wall clock cycles are stamped with (`clock::unix_now`).
    pub at_unix: f64,
    pub counts: Counts,
    pub steady_seconds: f64,
    /// Cost of the step's output in USD, where the target has a price.
    pub cost_usd: Option<f64>,
    /// Good requests per objective set ([`objectives_key`]).
    pub good: BTreeMap<String, u64>,
    /// The step was saturated (the server fell behind its open-loop arrivals).
    pub saturated: bool,
}

/// The value of a label by name.
pub fn label_value<'a>(labels: &'a RequestLabels, name: &str) -> &'a str {
    labels.get(name)
}

/// Whether a series' labels satisfy every matcher.
pub fn labels_match(labels: &RequestLabels, matchers: &[Matcher]) -> bool {
    matchers
        .iter()
        .all(|m| super::matcher_accepts(m, label_value(labels, &m.label)))
}

/// A distribution an SLO reads: which measure, over which series, over which window, from which
/// steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Want {
    pub measure: Measure,
    pub matchers: Vec<Matcher>,
    pub window: Duration,
    pub steps: SaturatedSteps,
    /// The samples a tail quantile read from it needs to be bounded (p99: 368); a series that
    /// holds fewer pools its earlier runs up to that. 0: no tail quantile is read.
    pub pool: u64,
}

/// A window holds the steps one choice of [`SaturatedSteps`] reads, so that each choice holds
/// its own latest step when its window empties.
type WindowKey = (RequestLabels, Measure, Duration, SaturatedSteps);

/// Slots per window: as `measure::window`'s default, the slot count trades memory for how
/// smoothly samples leave the window.
const SLOTS: usize = 6;

/// Runs a series keeps for a tail quantile to pool, the latest included: the most a p99 over
/// runs of about 50 samples needs to be bounded.
const POOL_RUNS: usize = 8;

/// One series' distribution of one measure: its sliding window, and the samples of its latest
/// step, held for as long as the series exists; for a tail quantile also the runs before it.
#[derive(Debug)]
struct Series {
    window: SlidingWindow,
    latest: WindowSnapshot,
    /// When the latest step ended.
    latest_at: Option<Instant>,
    /// The samples a tail quantile read from it needs (`Want::pool`); 0 keeps no earlier runs.
    pool: u64,
    /// The runs before the latest, newest first, with when they ended.
    earlier: VecDeque<(Instant, WindowSnapshot)>,
}

impl Series {
    fn new(window: SlidingWindow, latest: WindowSnapshot, pool: u64) -> Series {
        Series {
            window,
            latest,
            latest_at: None,
            pool,
            earlier: VecDeque::new(),
        }
    }

    /// What a lookup reads at `now`: the steps inside `window`, or the latest, held; then, while
    /// fewer than `need` samples, the runs before them, newest first (a tail quantile pools
    /// runs until it can be bounded).
    fn read(&self, now: Instant, window: Duration, need: u64) -> WindowSnapshot {
        let inside = self.window.snapshot(now);
        let held = inside.is_empty();
        let mut read = if held { self.latest.clone() } else { inside };
        for (at, run) in &self.earlier {
            if read.count() >= need {
                break;
            }
            // Runs still inside the window are read already.
            if held || now.saturating_duration_since(*at) > window {
                // Same scale by construction.
                let _ = read.merge(run);
            }
        }
        read
    }
}

/// The measurements the SLOs read: per-series sliding windows of the distributions some SLO
/// wants (memory is spent only on those), and the recent step totals.
///
/// **Held steps.** A step of the cycle runs once per cycle, and a window shorter than the cycle
/// (or a pause) would leave it empty between runs, so verdicts would flap with the cycle's
/// position. So every lookup reads, per series, the steps that ended inside the window, or, when
/// none did, the series' latest step however old: data only ever leaves an SLO by being
/// replaced with newer data (or with its target). [`Store::newest`] says how old the data is.
#[derive(Debug)]
pub struct Store {
    wants: Vec<Want>,
    objective_sets: Vec<Vec<Objective>>,
    windows: HashMap<WindowKey, Series>,
    steps: VecDeque<StepRecord>,
    /// The latest step of every series, saturated and not, kept after it leaves `steps`.
    latest: HashMap<(RequestLabels, bool), StepRecord>,
    /// Step totals older than this are dropped.
    keep: Duration,
    /// `Some(w)`: one window per series that never rotates (a cycle's accumulation for
    /// baselines); every lookup uses it whatever window is asked for.
    fixed: Option<Duration>,
}

/// A window long enough that nothing in it expires within a cycle.
const CYCLE_SPAN: Duration = Duration::from_secs(400 * 86_400);

impl Store {
    /// A store of sliding windows for `wants`, counting good requests for `objective_sets`, that
    /// keeps step totals for `keep`: the longest window any lookup may ask for (a burn-rate
    /// SLO's reads totals only, so it is not among the wants' windows).
    pub fn sliding(wants: Vec<Want>, objective_sets: Vec<Vec<Objective>>, keep: Duration) -> Store {
        let keep = wants.iter().map(|w| w.window).fold(keep, Duration::max);
        Store::empty(wants, objective_sets, keep, None)
    }

    /// A store that accumulates everything until it is cleared (one cycle).
    pub fn accumulating(wants: Vec<Want>, objective_sets: Vec<Vec<Objective>>) -> Store {
        let wants = wants
            .into_iter()
            .map(|w| Want {
                window: CYCLE_SPAN,
                ..w
            })
            .collect();
        Store::empty(wants, objective_sets, CYCLE_SPAN, Some(CYCLE_SPAN))
    }

    fn empty(
        wants: Vec<Want>,
        objective_sets: Vec<Vec<Objective>>,
        keep: Duration,
        fixed: Option<Duration>,
    ) -> Store {
        Store {
            wants,
            objective_sets,
            windows: HashMap::new(),
            steps: VecDeque::new(),
            latest: HashMap::new(),
            keep,
            fixed,
        }
    }

    /// Forgets every sample (a new cycle starts).
    pub fn clear(&mut self) {
        self.windows.clear();
        self.steps.clear();
        self.latest.clear();
    }

    /// Forgets every series of `target` (it left the target set): its data no longer holds.
    pub fn forget_target(&mut self, target: &str) {
        self.windows
            .retain(|(labels, ..), _| labels.target != target);
        self.steps.retain(|r| r.labels.target != target);
        self.latest.retain(|(labels, _), _| labels.target != target);
    }

    /// When the newest step `steps` reads of a series matching `matchers` ended, if any.
    pub fn newest(&self, matchers: &[Matcher], steps: SaturatedSteps) -> Option<Instant> {
        self.newest_step(matchers, steps).map(|r| r.at)
    }

    /// The newest step `steps` reads of a series matching `matchers`, if any.
    pub fn newest_step(&self, matchers: &[Matcher], steps: SaturatedSteps) -> Option<&StepRecord> {
        self.latest
            .values()
            .filter(|r| steps.accepts(r.saturated) && labels_match(&r.labels, matchers))
            .max_by_key(|r| r.at)
    }

    /// The latest step of the series `labels` that `steps` reads.
    fn latest_read(&self, labels: &RequestLabels, steps: SaturatedSteps) -> Option<&StepRecord> {
        [false, true]
            .into_iter()
            .filter(|s| steps.accepts(*s))
            .filter_map(|s| self.latest.get(&(labels.clone(), s)))
            .max_by_key(|r| r.at)
    }

    fn key_window(&self, w: Duration) -> Duration {
        self.fixed.unwrap_or(w)
    }

    /// Adds a finished, non-degraded step of one series: its requests' samples into the wanted
    /// windows, and its totals (with good-request counts) into the step list.
    /// With `distributions` false (a faulted step) the samples only count towards goodput and
    /// burn-rate SLIs, not towards the latency windows. `samples` were folded for this store's
    /// definitions (an objective set it leaves out would count no good request).
    pub fn commit(
        &mut self,
        mut record: StepRecord,
        samples: &StepSamples,
        now: Instant,
        distributions: bool,
    ) {
        let mut targets: HashMap<(Measure, Duration, SaturatedSteps), u64> = HashMap::new();
        for w in self.wants.iter().filter(|_| distributions) {
            if w.steps.accepts(record.saturated) && labels_match(&record.labels, &w.matchers) {
                let pool = targets.entry((w.measure, w.window, w.steps)).or_default();
                *pool = (*pool).max(w.pool);
            }
        }
        for ((measure, window, steps), pool) in targets {
            let key = (record.labels.clone(), measure, window, steps);
            let slots = if self.fixed.is_some() { 1 } else { SLOTS };
            let series = match self.windows.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let config = WindowConfig {
                        window,
                        slots,
                        scale: ValueScale::SECONDS,
                    };
                    match SlidingWindow::new(config, now) {
                        Ok(w) => e.insert(Series::new(
                            w,
                            WindowSnapshot::empty(ValueScale::SECONDS),
                            pool,
                        )),
                        // Only a zero window fails, which validation rejects.
                        Err(_) => continue,
                    }
                }
            };
            let previous = std::mem::replace(
                &mut series.latest,
                WindowSnapshot::empty(ValueScale::SECONDS),
            );
            if let Some(at) = series
                .latest_at
                .filter(|_| series.pool > 0 && !previous.is_empty())
            {
                series.earlier.push_front((at, previous));
                series.earlier.truncate(POOL_RUNS - 1);
            }
            series.latest_at = Some(now);
            series.latest = match samples.values(measure) {
                Some(values) => {
                    series
                        .window
                        .add(values, now)
                        .expect("step samples and windows are both in seconds");
                    values.clone()
                }
                None => WindowSnapshot::empty(ValueScale::SECONDS),
            };
        }
        for set in &self.objective_sets {
            let good = samples.good(set).unwrap_or(0);
            record.good.insert(objectives_key(set), good);
        }
        record.at = now;
        self.latest
            .insert((record.labels.clone(), record.saturated), record.clone());
        self.steps.push_back(record);
        while let Some(front) = self.steps.front() {
            if now.saturating_duration_since(front.at) > self.keep {
                self.steps.pop_front();
            } else {
                break;
            }
        }
    }

    /// The merged samples of `measure` over every series matching `matchers`, in `window`, of
    /// the steps `steps` reads; a series with fewer than `need` samples there adds its earlier
    /// runs while it has them (tail quantiles, [`Want::pool`]).
    pub fn distribution(
        &self,
        measure: Measure,
        matchers: &[Matcher],
        window: Duration,
        steps: SaturatedSteps,
        now: Instant,
        need: u64,
    ) -> WindowSnapshot {
        let window = self.key_window(window);
        let mut merged = WindowSnapshot::empty(ValueScale::SECONDS);
        for ((labels, m, w, s), series) in &self.windows {
            if *m == measure && *w == window && *s == steps && labels_match(labels, matchers) {
                // A step's samples are recorded at its end, so they leave the window together:
                // an empty window means the latest step has left it, and it is held.
                // Same scale by construction.
                let _ = merged.merge(&series.read(now, window, need));
            }
        }
        merged
    }

    /// Totals of the steps `steps` reads of matching series that ended within `window`, and of
    /// the latest such step of each matching series that has none there (held).
    pub fn totals(
        &self,
        matchers: &[Matcher],
        window: Duration,
        steps: SaturatedSteps,
        now: Instant,
    ) -> Totals {
        let mut t = Totals::default();
        let mut instances: HashMap<&str, f64> = HashMap::new();
        let inside: Vec<&StepRecord> = self
            .steps
            .iter()
            .filter(|r| self.fixed.is_some() || now.saturating_duration_since(r.at) <= window)
            .filter(|r| steps.accepts(r.saturated) && labels_match(&r.labels, matchers))
            .collect();
        let seen: HashSet<&RequestLabels> = inside.iter().map(|r| &r.labels).collect();
        let mut held: HashMap<&RequestLabels, &StepRecord> = HashMap::new();
        for r in self.latest.values() {
            if seen.contains(&r.labels)
                || !steps.accepts(r.saturated)
                || !labels_match(&r.labels, matchers)
            {
                continue;
            }
            let newest = held.entry(&r.labels).or_insert(r);
            if r.at > newest.at {
                *newest = r;
            }
        }
        for r in inside.into_iter().chain(held.into_values()) {
            t.counts.add(&r.counts);
            if r.steady_seconds > 0.0 {
                t.timed.add(&r.counts);
                for (k, g) in &r.good {
                    *t.timed_good.entry(k.clone()).or_default() += g;
                }
            }
            if let Some(c) = r.cost_usd {
                t.cost_usd += c;
                t.priced_tokens += r.counts.output_tokens;
            }
            for (k, g) in &r.good {
                *t.good.entry(k.clone()).or_default() += g;
            }
            let secs = instances.entry(r.instance.as_str()).or_default();
            *secs = secs.max(r.steady_seconds);
        }
        t.steady_seconds = instances.values().sum();
        t
    }

    /// The latest step of every series, to save (`slo::state`); instants as Unix times.
    pub fn held(&self, now: Instant, now_unix: f64) -> Held {
        let unix = |at: Instant| now_unix - now.saturating_duration_since(at).as_secs_f64();
        let map = |l: &RequestLabels| -> BTreeMap<String, String> {
            l.pairs()
                .into_iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let mut series: Vec<HeldSeries> = self
            .windows
            .iter()
            .filter(|(_, s)| !s.latest.is_empty())
            .filter_map(|((labels, measure, window, steps), s)| {
                let at = self.latest_read(labels, *steps)?.at;
                Some(HeldSeries {
                    labels: map(labels),
                    measure: measure.name().to_owned(),
                    window_seconds: window.as_secs_f64(),
                    saturated_steps: *steps,
                    at_unix: unix(at),
                    values: s.latest.to_units(),
                })
            })
            .collect();
        series.sort_by(|a, b| {
            (&a.labels, &a.measure, a.saturated_steps).cmp(&(
                &b.labels,
                &b.measure,
                b.saturated_steps,
            ))
        });
        let mut steps: Vec<HeldStep> = self
            .latest
            .values()
            .map(|r| HeldStep {
                labels: map(&r.labels),
                instance: r.instance.clone(),
                // The wall clock's reading at the commit, which baseline cycles are compared
                // with (the same as the monotonic age from now, but for clock steps).
                at_unix: r.at_unix,
                requests: r.counts.requests,
                ok: r.counts.ok,
                errors: r.counts.errors,
                prompt_tokens: r.counts.prompt_tokens,
                cached_tokens: r.counts.cached_tokens,
                output_tokens: r.counts.output_tokens,
                steady_seconds: r.steady_seconds,
                cost_usd: r.cost_usd,
                good: r.good.clone(),
                saturated: r.saturated,
            })
            .collect();
        steps.sort_by(|a, b| (&a.labels, a.saturated).cmp(&(&b.labels, b.saturated)));
        Held { series, steps }
    }

    /// Restores saved latest steps as held data: each one the SLOs still want, with its age kept.
    pub fn restore_held(&mut self, held: &Held, now: Instant, now_unix: f64) {
        let instant = |at_unix: f64| {
            let age = Duration::from_secs_f64((now_unix - at_unix).max(0.0));
            now.checked_sub(age).unwrap_or(now)
        };
        let labels = |m: &BTreeMap<String, String>| {
            RequestLabels::from_pairs(m.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        };
        for h in &held.steps {
            let record = StepRecord {
                labels: labels(&h.labels),
                instance: h.instance.clone(),
                at: instant(h.at_unix),
                at_unix: h.at_unix,
                counts: Counts {
                    requests: h.requests,
                    ok: h.ok,
                    errors: h.errors,
                    prompt_tokens: h.prompt_tokens,
                    cached_tokens: h.cached_tokens,
                    output_tokens: h.output_tokens,
                },
                steady_seconds: h.steady_seconds,
                cost_usd: h.cost_usd,
                good: h.good.clone(),
                saturated: h.saturated,
            };
            self.latest
                .insert((record.labels.clone(), record.saturated), record);
        }
        for h in &held.series {
            let Some(measure) = Measure::by_name(&h.measure) else {
                continue;
            };
            let window = self.key_window(Duration::from_secs_f64(h.window_seconds));
            let l = labels(&h.labels);
            let steps = h.saturated_steps;
            let Some(pool) = self
                .wants
                .iter()
                .filter(|w| {
                    w.measure == measure
                        && w.window == window
                        && w.steps == steps
                        && labels_match(&l, &w.matchers)
                })
                .map(|w| w.pool)
                .max()
            else {
                continue;
            };
            let slots = if self.fixed.is_some() { 1 } else { SLOTS };
            let config = WindowConfig {
                window,
                slots,
                scale: ValueScale::SECONDS,
            };
            let Ok(sliding) = SlidingWindow::new(config, now) else {
                continue;
            };
            let mut series = Series::new(
                sliding,
                WindowSnapshot::from_units(ValueScale::SECONDS, &h.values),
                pool,
            );
            series.latest_at = Some(instant(h.at_unix));
            self.windows.insert((l, measure, window, steps), series);
        }
    }
}

/// Sums over matching steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    pub counts: Counts,
    /// The counts and good requests of the steps that have steady seconds, which rates divide:
    /// the probe stream's requests have none.
    pub timed: Counts,
    pub timed_good: BTreeMap<String, u64>,
    pub cost_usd: f64,
    pub priced_tokens: u64,
    pub steady_seconds: f64,
    pub good: BTreeMap<String, u64>,
}
