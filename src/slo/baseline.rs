//! Baselines from the target's own past: each `baseline(expr, span)` term keeps the value of
//! `expr` in every completed cycle, and `baseline(expr, "name")` reads a baseline frozen
//! ("pinned") under a name, e.g. the last good release. A cycle in which the SLO was failing
//! is kept but does not count towards the rolling baseline: a regression that lasts a day never
//! becomes the new normal. The engine saves all of it (`slo::state`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::measure::stats::Interval;

/// Past runs a rolling baseline term needs before a run can fail against it (docs/SLO.md,
/// "Run-to-run variation"): with fewer, the deployment's modes may not have shown yet. Eight runs
/// of a deployment with a slow mode one run in five show it with 83 % probability, and a false
/// page then needs that mode's first two runs in a row.
pub const MIN_BASELINE_RUNS: usize = 8;

/// How much worse than a run a past run may be and still count as no worse in
/// [`BaselineStore::nearest`], as a share of the run's value: more than a mode's own jitter
/// from run to run (±3 % in the steady deployments measured, docs/SLO.md), much less than a
/// regression the SLOs are written for (10–20 %).
pub const NO_WORSE_SLACK: f64 = 0.05;

/// Entries older than this are dropped: the longest baseline span anyone should need.
const MAX_AGE_SECONDS: f64 = 8.0 * 86_400.0;
/// Cap on the entries kept per term (a 1-minute cycle for 8 days would be 11 520).
const MAX_ENTRIES: usize = 4096;

/// Which way of a baseline term's value is a regression: the side of the comparison it is on
/// says (`p50 <= 1.1 * baseline(p50, 24h)`: a higher p50).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Worse {
    Higher,
    Lower,
}

impl Worse {
    pub fn flipped(self) -> Worse {
        match self {
            Worse::Higher => Worse::Lower,
            Worse::Lower => Worse::Higher,
        }
    }
}

/// One cycle's value of a baseline term.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub cycle_end_unix: f64,
    pub estimate: f64,
    pub lower: f64,
    pub upper: f64,
    /// The SLO was failing when the cycle ended: kept, but not part of the rolling baseline.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failing: bool,
}

impl Entry {
    pub fn interval(&self) -> Interval {
        Interval {
            estimate: self.estimate,
            lower: self.lower,
            upper: self.upper,
        }
    }
}

/// A baseline frozen under a name: every term's rolling baseline at the moment of pinning.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pinned {
    pub pinned_unix: f64,
    /// The span the rolling baselines were taken over.
    pub span_seconds: f64,
    pub values: BTreeMap<String, Entry>,
}

/// Per-cycle values of every baseline term, keyed by `slo|expression`, and the pinned ones.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BaselineStore {
    terms: BTreeMap<String, Vec<Entry>>,
    pinned: BTreeMap<String, Pinned>,
}

impl BaselineStore {
    /// An empty store.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A store holding saved terms and pinned baselines.
    pub fn from_saved(
        terms: BTreeMap<String, Vec<Entry>>,
        pinned: BTreeMap<String, Pinned>,
    ) -> Self {
        BaselineStore { terms, pinned }
    }

    /// The terms and pinned baselines, to save.
    pub fn saved(&self) -> (BTreeMap<String, Vec<Entry>>, BTreeMap<String, Pinned>) {
        (self.terms.clone(), self.pinned.clone())
    }

    /// Adds one cycle's value of `key` and drops old entries.
    pub fn record(&mut self, key: &str, entry: Entry) {
        let list = self.terms.entry(key.to_owned()).or_default();
        list.push(entry);
        let newest = entry.cycle_end_unix;
        list.retain(|e| newest - e.cycle_end_unix <= MAX_AGE_SECONDS);
        if list.len() > MAX_ENTRIES {
            let extra = list.len() - MAX_ENTRIES;
            list.drain(..extra);
        }
    }

    /// Drops the terms not in `keep` (SLOs removed or changed by a reload); pinned baselines
    /// stay, as a reload may bring the SLO back.
    pub fn retain_keys(&mut self, keep: &[String]) {
        self.terms.retain(|k, _| keep.contains(k));
    }

    /// The rolling baseline of `key` at `now_unix`: the mean of the per-cycle values (and of
    /// their bounds) of the passing cycles that ended in the last `span_seconds`; `None` without
    /// any.
    pub fn lookup(&self, key: &str, now_unix: f64, span_seconds: f64) -> Option<Interval> {
        let entries: Vec<&Entry> = self
            .terms
            .get(key)?
            .iter()
            .filter(|e| !e.failing && now_unix - e.cycle_end_unix <= span_seconds)
            .collect();
        if entries.is_empty() {
            return None;
        }
        let n = entries.len() as f64;
        let mean = |f: fn(&Entry) -> f64| entries.iter().map(|e| f(e)).sum::<f64>() / n;
        Some(Interval {
            estimate: mean(|e| e.estimate),
            lower: mean(|e| e.lower),
            upper: mean(|e| e.upper),
        })
    }

    /// The rolling baseline a run that ended at `run_end_unix`, whose value of `key` is
    /// `now_value`, is judged against, with how many cycles the span holds before the run
    /// (failing ones included); `None` when no earlier episode is in the span.
    ///
    /// The cycles are those that ended before the run, in the `span_seconds` up to
    /// `span_end_unix` (now, or an offset ago). Each passing cycle is an episode of its own, and
    /// each streak of cycles the SLO failed in (or held a first failing run in) one episode; the
    /// streak that goes on up to the run is left out. The baseline is the cycle closest to
    /// `now_value` from the second episode closest to it (the closest when there is only one):
    ///
    /// - close to runs, not to their mean: a deployment with modes (a batch phase, a cache
    ///   state) has runs in each, and a run is a regression only when it is far from the runs
    ///   the deployment has had, not from their average (docs/SLO.md, "Run-to-run variation");
    /// - two episodes vouch: one stray run (a restart's, one taken while too few runs were known
    ///   to judge it) never hides a regression, and a regression, however long, never vouches
    ///   for itself while it lasts. A slowness that went away and came back in two episodes is
    ///   a mode of the deployment, and its third return does not page;
    /// - from the runs no worse than this one, where the comparison says which way is worse
    ///   (`worse`; all runs when none is): a run is judged against the closest run it did not
    ///   regress from. Without that, a slow drift or a regression of the fast mode that brings
    ///   runs about halfway to the slow mode is judged against the slow mode and passes; with
    ///   it, each mode is held to its own runs however far it moves. A run worse by less than
    ///   [`NO_WORSE_SLACK`] counts as no worse: the first run of a mode at the better end of
    ///   its jitter is still judged against its mode. When no run is that good (the best run
    ///   yet), the closest of all.
    pub fn nearest(
        &self,
        key: &str,
        span_end_unix: f64,
        span_seconds: f64,
        run_end_unix: f64,
        now_value: f64,
        worse: Option<Worse>,
    ) -> Option<(Entry, usize)> {
        let entries = self.terms.get(key)?;
        // Entries are kept in time order: those before the run are a prefix.
        let before = entries.partition_point(|e| e.cycle_end_unix < run_end_unix);
        let entries = &entries[..before];
        let in_span =
            |e: &Entry| (0.0..=span_seconds).contains(&(span_end_unix - e.cycle_end_unix));
        let known = entries.iter().filter(|e| in_span(e)).count();
        let streak = entries
            .iter()
            .rposition(|e| !e.failing)
            .map_or(0, |i| i + 1);
        let mut episode = 0;
        let mut candidates: Vec<(usize, &Entry)> = Vec::new();
        for (i, e) in entries[..streak].iter().enumerate() {
            if !e.failing || i == 0 || !entries[i - 1].failing {
                episode = i;
            }
            if in_span(e) && e.estimate.is_finite() {
                candidates.push((episode, e));
            }
        }
        let slack = NO_WORSE_SLACK * now_value.abs();
        let no_worse = |e: &Entry| match worse {
            Some(Worse::Higher) => e.estimate <= now_value + slack,
            Some(Worse::Lower) => e.estimate >= now_value - slack,
            None => true,
        };
        if candidates.iter().any(|(_, e)| no_worse(e)) {
            candidates.retain(|(_, e)| no_worse(e));
        }
        candidates.sort_by(|(_, a), (_, b)| {
            (a.estimate - now_value)
                .abs()
                .total_cmp(&(b.estimate - now_value).abs())
        });
        let (first, closest) = *candidates.first()?;
        let second = candidates
            .iter()
            .find(|(ep, _)| *ep != first)
            .map(|(_, e)| *e);
        let vouching = match second {
            Some(e) => e,
            None if !closest.failing => closest,
            None => return None,
        };
        Some((*vouching, known))
    }

    /// The value of `key` in the baseline pinned as `name`.
    pub fn pinned(&self, name: &str, key: &str) -> Option<Interval> {
        self.pinned.get(name)?.values.get(key).map(Entry::interval)
    }

    /// Freezes every term's rolling baseline over `span_seconds` under `name` (replacing a pin of
    /// that name); returns how many terms had a baseline to freeze.
    pub fn pin(&mut self, name: &str, now_unix: f64, span_seconds: f64) -> usize {
        let values: BTreeMap<String, Entry> = self
            .terms
            .keys()
            .filter_map(|key| {
                let i = self.lookup(key, now_unix, span_seconds)?;
                Some((
                    key.clone(),
                    Entry {
                        cycle_end_unix: now_unix,
                        estimate: i.estimate,
                        lower: i.lower,
                        upper: i.upper,
                        failing: false,
                    },
                ))
            })
            .collect();
        let n = values.len();
        self.pinned.insert(
            name.to_owned(),
            Pinned {
                pinned_unix: now_unix,
                span_seconds,
                values,
            },
        );
        n
    }

    /// Removes the pin `name`; whether there was one.
    pub fn unpin(&mut self, name: &str) -> bool {
        self.pinned.remove(name).is_some()
    }

    /// The pinned baselines.
    pub fn pins(&self) -> &BTreeMap<String, Pinned> {
        &self.pinned
    }

    /// Cycles kept for `key`.
    pub fn len(&self, key: &str) -> usize {
        self.terms.get(key).map_or(0, Vec::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(at: f64, v: f64) -> Entry {
        Entry {
            cycle_end_unix: at,
            estimate: v,
            lower: v - 0.1,
            upper: v + 0.1,
            failing: false,
        }
    }

    #[test]
    fn the_rolling_baseline_ages_out_and_skips_failing_cycles() {
        let mut store = BaselineStore::in_memory();
        assert_eq!(store.lookup("k", 1000.0, 86_400.0), None);
        store.record("k", entry(1000.0, 1.0));
        store.record("k", entry(2000.0, 2.0));
        let b = store.lookup("k", 2000.0, 86_400.0).unwrap();
        assert!((b.estimate - 1.5).abs() < 1e-12 && (b.lower - 1.4).abs() < 1e-12);
        // Only cycles inside the span count.
        let recent = store
            .lookup("k", 2000.0 + 86_400.0 - 500.0, 86_400.0)
            .unwrap();
        assert!((recent.estimate - 2.0).abs() < 1e-12);
        assert_eq!(store.lookup("k", 1e9, 86_400.0), None);
        // A regressed cycle is kept but does not move the baseline.
        store.record(
            "k",
            Entry {
                failing: true,
                ..entry(3000.0, 9.0)
            },
        );
        assert_eq!(store.len("k"), 3);
        let b = store.lookup("k", 3000.0, 86_400.0).unwrap();
        assert!((b.estimate - 1.5).abs() < 1e-12, "{b:?}");
    }

    #[test]
    fn a_run_is_judged_against_the_second_closest_episode() {
        let mut store = BaselineStore::in_memory();
        assert_eq!(store.nearest("k", 0.0, 86_400.0, 0.0, 1.0, None), None);
        // A bimodal deployment: 160 or 230 ms from run to run; one 300 ms run failed, one
        // stray 400 ms run passed.
        let runs = [0.162, 0.234, 0.165, 0.300, 0.231, 0.400, 0.160, 0.228];
        for (i, v) in runs.into_iter().enumerate() {
            store.record(
                "k",
                Entry {
                    failing: v == 0.300,
                    ..entry(1000.0 * (i + 1) as f64, v)
                },
            );
        }
        // A run that ended at 8500 s, after every cycle.
        let near = |v: f64| {
            store
                .nearest("k", 9000.0, 86_400.0, 8500.0, v, None)
                .unwrap()
        };
        // Each mode is judged against its own runs, a run between them against the closer.
        assert_eq!(near(0.1615).0.estimate, 0.160);
        assert_eq!(near(0.233).0.estimate, 0.231);
        assert_eq!(near(0.190).0.estimate, 0.162);
        // A lone run, failed or not, does not vouch for another.
        assert_eq!(near(0.300).0.estimate, 0.234);
        assert_eq!(near(0.410).0.estimate, 0.300);
        assert_eq!(near(0.1605).0, entry(1000.0, 0.162));
        assert_eq!(near(0.1605).1, 8);
        // The cycle that holds the run (it ended at 7500 s, inside the cycle that ended at
        // 8000 s) is left out.
        let inside = store
            .nearest("k", 9000.0, 86_400.0, 7500.0, 0.228, None)
            .unwrap();
        assert_eq!((inside.0.estimate, inside.1), (0.234, 7));
        // A span that ended an offset ago: the 3 000 s up to 5 000 s.
        let offset = store
            .nearest("k", 5000.0, 3000.0, 8500.0, 0.228, None)
            .unwrap();
        assert_eq!((offset.0.estimate, offset.1), (0.234, 4));
        // Runs older than the span leave it; one passing run is its own best.
        assert_eq!(store.nearest("k", 1e9, 86_400.0, 1e9, 0.2, None), None);
        let last = store
            .nearest("k", 7500.0 + 86_400.0, 86_400.0, 1e9, 0.2, None)
            .unwrap();
        assert_eq!((last.0.estimate, last.1), (0.228, 1));
    }

    #[test]
    fn a_run_is_judged_against_the_closest_run_it_did_not_regress_from() {
        let mut store = BaselineStore::in_memory();
        // Bimodal: 160 or 230 ms from run to run.
        for (i, v) in [0.160, 0.231, 0.165, 0.228, 0.162, 0.234]
            .into_iter()
            .enumerate()
        {
            store.record("k", entry(1000.0 * (i + 1) as f64, v));
        }
        let near = |v: f64, worse: Option<Worse>| {
            store
                .nearest("k", 1e4, 86_400.0, 1e4, v, worse)
                .unwrap()
                .0
                .estimate
        };
        // The fast mode 20 % slower is nearer the slow mode than the fast one; held to the
        // runs no slower than it, it is judged against the fast mode, which it fails.
        assert_eq!(near(0.199, None), 0.231);
        assert_eq!(near(0.199, Some(Worse::Higher)), 0.162);
        // Where lower is worse (a throughput), against the runs no lower.
        assert_eq!(near(0.199, Some(Worse::Lower)), 0.231);
        // A steady run of either mode is judged against its own mode, the fastest run of the
        // slow mode yet too: runs worse by less than a mode's jitter count as no worse.
        assert_eq!(near(0.2305, Some(Worse::Higher)), 0.228);
        assert_eq!(near(0.1615, Some(Worse::Higher)), 0.160);
        assert_eq!(near(0.226, Some(Worse::Higher)), 0.231);
        // The best run yet has no run it did not regress from: the closest of all.
        assert_eq!(near(0.150, Some(Worse::Higher)), 0.162);
    }

    #[test]
    fn a_regression_never_vouches_for_itself_and_a_mode_back_twice_is_known() {
        let mut store = BaselineStore::in_memory();
        let mut at = 0.0;
        let mut add = |store: &mut BaselineStore, v: f64, failing: bool| {
            at += 1000.0;
            store.record(
                "k",
                Entry {
                    failing,
                    ..entry(at, v)
                },
            );
        };
        let near = |store: &BaselineStore| store.nearest("k", 1e6, 1e6, 1e6, 0.2, None).unwrap().0;
        for _ in 0..5 {
            add(&mut store, 0.16, false);
        }
        // A slowness the SLO fails on, however long, is judged against the runs before it.
        for _ in 0..3 {
            add(&mut store, 0.2, true);
            assert_eq!(near(&store).estimate, 0.16);
        }
        // Once it went away, its streak is one episode: alone, it vouches for nothing.
        add(&mut store, 0.16, false);
        assert_eq!(near(&store).estimate, 0.16);
        // Back a second time: two episodes, and its third return is a known mode.
        add(&mut store, 0.2, true);
        add(&mut store, 0.2, true);
        assert_eq!(near(&store).estimate, 0.16);
        add(&mut store, 0.16, false);
        assert_eq!(near(&store).estimate, 0.2);
        // Only a failing streak in the span: no baseline.
        let mut lone = BaselineStore::in_memory();
        lone.record(
            "k",
            Entry {
                failing: true,
                ..entry(1.0, 0.2)
            },
        );
        lone.record(
            "k",
            Entry {
                failing: true,
                ..entry(2.0, 0.2)
            },
        );
        assert_eq!(lone.nearest("k", 3.0, 10.0, 3.0, 0.2, None), None);
    }

    #[test]
    fn a_pin_freezes_the_rolling_baseline_under_a_name() {
        let mut store = BaselineStore::in_memory();
        store.record("k", entry(1000.0, 1.0));
        store.record("k", entry(2000.0, 3.0));
        assert_eq!(store.pin("release-1", 2000.0, 86_400.0), 1);
        store.record("k", entry(3000.0, 10.0));
        let pinned = store.pinned("release-1", "k").unwrap();
        assert!((pinned.estimate - 2.0).abs() < 1e-12, "{pinned:?}");
        assert!(store.lookup("k", 3000.0, 86_400.0).unwrap().estimate > 4.0);
        assert_eq!(store.pinned("release-2", "k"), None);
        let (terms, pins) = store.saved();
        let again = BaselineStore::from_saved(terms, pins);
        assert_eq!(again, store);
        assert!(store.unpin("release-1") && !store.unpin("release-1"));
    }
}
