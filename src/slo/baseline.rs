//! Baselines from the target's own past: each `baseline(expr, span)` keeps the value of `expr`
//! in every completed cycle, in memory and in a small JSON state file, so a restarted daemon
//! still compares against yesterday.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::SloError;
use super::eval::Interval;

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
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    terms: BTreeMap<String, Vec<Entry>>,
}

/// Per-cycle values of every baseline term, keyed by `slo|expression`.
#[derive(Debug, Default)]
pub struct BaselineStore {
    path: Option<PathBuf>,
    terms: BTreeMap<String, Vec<Entry>>,
}

impl BaselineStore {
    /// An in-memory store.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Loads `path` if it exists (a missing file is an empty store); later records save to it.
    pub fn open(path: &Path) -> Result<Self, SloError> {
        let fail = |message: String| SloError::State {
            path: path.display().to_string(),
            message,
        };
        let terms = match std::fs::read(path) {
            Ok(bytes) => {
                let state: StateFile =
                    serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))?;
                if state.version != 1 {
                    return Err(fail(format!("unknown version {}", state.version)));
                }
                state.terms
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(fail(e.to_string())),
        };
        Ok(Self {
            path: Some(path.to_owned()),
            terms,
        })
    }

    /// Adds one cycle's value of `key`, drops old entries and saves the file (atomically: a
    /// crash leaves the previous file).
    pub fn record(&mut self, key: &str, entry: Entry) -> Result<(), SloError> {
        let list = self.terms.entry(key.to_owned()).or_default();
        list.push(entry);
        let newest = entry.cycle_end_unix;
        list.retain(|e| newest - e.cycle_end_unix <= MAX_AGE_SECONDS);
        if list.len() > MAX_ENTRIES {
            let extra = list.len() - MAX_ENTRIES;
            list.drain(..extra);
        }
        self.save()
    }

    /// Drops the terms not in `keep` (SLOs removed or changed by a reload).
    pub fn retain_keys(&mut self, keep: &[String]) {
        self.terms.retain(|k, _| keep.contains(k));
    }

    fn save(&self) -> Result<(), SloError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let fail = |message: String| SloError::State {
            path: path.display().to_string(),
            message,
        };
        let state = StateFile {
            version: 1,
            terms: self.terms.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&state).map_err(|e| fail(e.to_string()))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).map_err(|e| fail(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| fail(e.to_string()))
    }

    /// The baseline of `key` at `now_unix`: the mean of the per-cycle values (and of their
    /// bounds) of the cycles that ended in the last `span_seconds`; `None` without any.
    pub fn lookup(&self, key: &str, now_unix: f64, span_seconds: f64) -> Option<Interval> {
        let entries: Vec<&Entry> = self
            .terms
            .get(key)?
            .iter()
            .filter(|e| now_unix - e.cycle_end_unix <= span_seconds)
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
        }
    }

    #[test]
    fn baseline_survives_a_restart_and_ages_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join("baseline.json");
        let mut store = BaselineStore::open(&path).unwrap();
        assert_eq!(store.lookup("k", 1000.0, 86_400.0), None);
        store.record("k", entry(1000.0, 1.0)).unwrap();
        store.record("k", entry(2000.0, 2.0)).unwrap();

        let reopened = BaselineStore::open(&path).unwrap();
        let b = reopened.lookup("k", 2000.0, 86_400.0).unwrap();
        assert!((b.estimate - 1.5).abs() < 1e-12 && (b.lower - 1.4).abs() < 1e-12);
        // Only cycles inside the span count.
        let recent = reopened
            .lookup("k", 2000.0 + 86_400.0 - 500.0, 86_400.0)
            .unwrap();
        assert!((recent.estimate - 2.0).abs() < 1e-12);
        assert_eq!(reopened.lookup("k", 1e9, 86_400.0), None);
        assert_eq!(reopened.len("k"), 2);

        std::fs::write(&path, "{not json").unwrap();
        assert!(BaselineStore::open(&path).is_err());
    }
}
