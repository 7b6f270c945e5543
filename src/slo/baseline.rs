//! Baselines from the target's own past: each `baseline(expr, span)` term keeps the value of
//! `expr` in every completed cycle, and `baseline(expr, "name")` reads a baseline frozen
//! ("pinned") under a name, e.g. the last good release. A cycle in which the SLO was failing
//! is kept but does not count towards the rolling baseline: a regression that lasts a day never
//! becomes the new normal. The engine saves all of it (`slo::state`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::measure::stats::{Interval, t_999};

/// Past runs a baseline term needs before its run-to-run range can be told: with fewer, a
/// comparison with it cannot fail (docs/SLO.md, "Run-to-run variation"). Eight runs of a
/// deployment with a slow mode one run in five show it with 83 % probability, and a false page
/// then needs that mode's first two runs in a row.
pub const MIN_SPREAD_RUNS: usize = 8;

/// Entries older than this are dropped: the longest baseline span anyone should need.
const MAX_AGE_SECONDS: f64 = 8.0 * 86_400.0;
/// Cap on the entries kept per term (a 1-minute cycle for 8 days would be 11 520).
const MAX_ENTRIES: usize = 4096;

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
    fn interval(&self) -> Interval {
        Interval {
            estimate: self.estimate,
            lower: self.lower,
            upper: self.upper,
        }
    }
}

/// How one baseline term's value moved from run to run: every cycle in the span, failing ones
/// included (a run the SLO failed in still shows how far runs move).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunSpread {
    pub runs: usize,
    pub mean: f64,
    /// The sample standard deviation of the runs' values.
    pub sd: f64,
}

impl RunSpread {
    /// The two-sided 99.8 % prediction interval of the next run's value under the runs so far
    /// (mean ± t₉₉.₉ · sd · √(1 + 1/n)): a run outside it moved more than runs move.
    pub fn prediction(&self) -> (f64, f64) {
        let n = self.runs as f64;
        let half = t_999(self.runs.saturating_sub(1)) * self.sd * (1.0 + 1.0 / n).sqrt();
        (self.mean - half, self.mean + half)
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

    /// How `key` moved over the cycles that ended in the last `span_seconds` before the newest
    /// one, failing ones included, less the ⌊n/20⌋ highest and lowest; `None` without any.
    ///
    /// The newest cycle is left out: it is either the run being judged (held until its step
    /// runs again) or the run before it, the first of the two a fail needs, and a regression's
    /// first run must not widen the range its second is judged against.
    pub fn spread(&self, key: &str, now_unix: f64, span_seconds: f64) -> Option<RunSpread> {
        let entries = self.terms.get(key)?;
        let before_newest = &entries[..entries.len().saturating_sub(1)];
        let mut values: Vec<f64> = before_newest
            .iter()
            .filter(|e| now_unix - e.cycle_end_unix <= span_seconds && e.estimate.is_finite())
            .map(|e| e.estimate)
            .collect();
        if values.is_empty() {
            return None;
        }
        // A 5 % trimmed spread: one stray run (an outage's, a restart's) does not widen the
        // range for a day; a mode that runs keep returning to is many runs, and stays.
        values.sort_by(f64::total_cmp);
        let trim = values.len() / 20;
        let values = &values[trim..values.len() - trim];
        let (mean, sd) = crate::measure::stats::mean_sd(values)?;
        Some(RunSpread {
            runs: values.len(),
            mean,
            sd,
        })
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
    fn the_run_spread_counts_failing_runs_and_predicts_the_next() {
        let mut store = BaselineStore::in_memory();
        assert_eq!(store.spread("k", 0.0, 86_400.0), None);
        // A bimodal deployment: 51 or 71 ms from run to run; one run failed.
        for (i, v) in [0.051, 0.071, 0.051, 0.071].into_iter().enumerate() {
            store.record(
                "k",
                Entry {
                    failing: i == 3,
                    ..entry(1000.0 * (i + 1) as f64, v)
                },
            );
        }
        // The newest run is the one judged (or the first of two): left out of its own range.
        store.record("k", entry(5000.0, 0.5));
        let s = store.spread("k", 5000.0, 86_400.0).unwrap();
        assert_eq!(s.runs, 4);
        assert!((s.mean - 0.061).abs() < 1e-12, "{s:?}");
        let (lo, hi) = s.prediction();
        // Both modes are runs like the others; four runs leave the range wide (t at 3 degrees
        // of freedom), and it narrows as runs accrue.
        assert!(lo < 0.051 && hi > 0.071 && hi < 0.2, "{lo} {hi}");
        for i in 5..33 {
            store.record("k", entry(1000.0 * (i + 1) as f64, [0.051, 0.071][i % 2]));
        }
        let (_, hi) = store.spread("k", 33_000.0, 86_400.0).unwrap().prediction();
        assert!(hi > 0.071 && hi < 0.071 * 1.5, "{hi}");
        // Identical runs: any other value is outside.
        let mut flat = BaselineStore::in_memory();
        for i in 0..5 {
            flat.record("k", entry(i as f64, 0.05));
        }
        let (lo, hi) = flat.spread("k", 5.0, 86_400.0).unwrap().prediction();
        assert_eq!((lo, hi), (0.05, 0.05));
        // Runs older than the span leave it.
        assert_eq!(store.spread("k", 1e9, 86_400.0), None);
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
