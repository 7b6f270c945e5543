//! What the SLO engine keeps across a restart and a failover: the per-cycle baseline values and
//! the pinned baselines, every SLO's verdict (so a firing alert does not fall silent for `for`
//! after a restart), and the held latest step of every series the SLOs read (so the first
//! evaluation after a restart reads what the last one before it did). One JSON document, kept
//! by a [`StateBackend`]: a file, or in a cluster a ConfigMap that the leader writes.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use super::SloError;
use super::baseline::{Entry, Pinned};

/// The current format; version 1 files (baselines only) load as well.
pub const VERSION: u32 = 2;

/// Largest state document read: a few hundred KB in practice.
pub const MAX_STATE_BYTES: usize = 16 << 20;

/// The saved state of an engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineState {
    pub version: u32,
    /// Per-cycle values of every baseline term, keyed by `slo|expression`.
    #[serde(default)]
    pub terms: BTreeMap<String, Vec<Entry>>,
    /// Baselines frozen under a name.
    #[serde(default)]
    pub pinned: BTreeMap<String, Pinned>,
    /// Every SLO's verdict, keyed by SLO name.
    #[serde(default)]
    pub verdicts: BTreeMap<String, SavedVerdict>,
    /// The latest step of every series the SLOs read.
    #[serde(default)]
    pub held: Held,
    /// When it was saved (Unix seconds).
    #[serde(default)]
    pub saved_unix: f64,
}

/// One SLO's verdict as saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedVerdict {
    /// `pass`, `fail` or `insufficient_data`.
    pub state: String,
    pub since_unix: f64,
    /// The SLO's canonical text: a verdict is restored only for the same definition.
    pub text: String,
}

/// Held steps (see `eval::Store`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Held {
    /// Latest-step distributions: one per (series, measure, window).
    #[serde(default)]
    pub series: Vec<HeldSeries>,
    /// Latest-step totals: one per series.
    #[serde(default)]
    pub steps: Vec<HeldStep>,
}

/// The samples of a series' latest step for one measure and window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldSeries {
    /// The eight request labels as (name, value), non-empty ones only.
    pub labels: BTreeMap<String, String>,
    /// The measure's name (`ttft`, `itl`, …).
    pub measure: String,
    pub window_seconds: f64,
    /// The steps the window reads (saved before this existed: every step).
    #[serde(default)]
    pub saturated_steps: crate::config::SaturatedSteps,
    /// When the step ended (Unix seconds).
    pub at_unix: f64,
    /// (value in microseconds, count) pairs.
    pub values: Vec<(u64, u64)>,
}

/// The totals of a series' latest step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldStep {
    pub labels: BTreeMap<String, String>,
    pub instance: String,
    pub at_unix: f64,
    pub requests: u64,
    pub ok: u64,
    pub errors: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub steady_seconds: f64,
    pub cost_usd: Option<f64>,
    #[serde(default)]
    pub good: BTreeMap<String, u64>,
    /// The step was saturated (saved before this existed: not).
    #[serde(default)]
    pub saturated: bool,
}

impl EngineState {
    /// Parses a saved document (either version).
    pub fn parse(bytes: &[u8]) -> Result<EngineState, SloError> {
        let state: EngineState = serde_json::from_slice(bytes).map_err(SloError::StateJson)?;
        if state.version != 1 && state.version != VERSION {
            return Err(SloError::StateVersion(state.version));
        }
        Ok(state)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A boxed future, for the object-safe [`StateBackend`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where the engine's state is kept.
pub trait StateBackend: Send + Sync {
    /// Where, for messages: a path or `configmap NAMESPACE/NAME`.
    fn describe(&self) -> String;

    /// The saved document, `None` when nothing was saved yet.
    fn load(&self) -> BoxFuture<'_, Result<Option<Vec<u8>>, SloError>>;

    /// Saves `bytes` (the newest save wins; a backend may write in the background and must not
    /// block the caller for long). Failures are logged by the backend, never fatal.
    fn save(&self, bytes: Vec<u8>);
}

/// The state in a file, written atomically (a crash leaves the previous file).
#[derive(Debug, Clone)]
pub struct FileBackend {
    path: PathBuf,
}

impl FileBackend {
    pub fn new(path: &Path) -> FileBackend {
        FileBackend {
            path: path.to_owned(),
        }
    }

    fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &self.path)
    }
}

impl StateBackend for FileBackend {
    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn load(&self) -> BoxFuture<'_, Result<Option<Vec<u8>>, SloError>> {
        Box::pin(async move {
            use std::io::Read;
            let unreadable = |e: std::io::Error| SloError::StateUnreadable {
                place: self.describe(),
                source: Box::new(e),
            };
            let file = match std::fs::File::open(&self.path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(unreadable(e)),
            };
            let mut bytes = Vec::new();
            file.take(MAX_STATE_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(unreadable)?;
            if bytes.len() > MAX_STATE_BYTES {
                return Err(SloError::StateTooLarge {
                    place: self.describe(),
                    max: MAX_STATE_BYTES,
                });
            }
            Ok(Some(bytes))
        })
    }

    fn save(&self, bytes: Vec<u8>) {
        if let Err(e) = self.write(&bytes) {
            tracing::warn!(path = %self.path.display(), "cannot save the SLO state: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_round_trips_and_a_version_1_file_loads() {
        let dir = tempfile::tempdir().unwrap();
        let backend = FileBackend::new(&dir.path().join("state").join("slo.json"));
        assert_eq!(backend.load().await.unwrap(), None);
        let mut state = EngineState {
            version: VERSION,
            saved_unix: 5.0,
            ..EngineState::default()
        };
        state.verdicts.insert(
            "x".into(),
            SavedVerdict {
                state: "fail".into(),
                since_unix: 1.0,
                text: "p50(ttft) < 1s".into(),
            },
        );
        backend.save(state.to_bytes());
        let loaded = EngineState::parse(&backend.load().await.unwrap().unwrap()).unwrap();
        assert_eq!(loaded, state);
        let v1 = br#"{"version":1,"terms":{"k":[{"cycle_end_unix":1.0,"estimate":2.0,"lower":1.5,"upper":2.5}]}}"#;
        let old = EngineState::parse(v1).unwrap();
        assert_eq!(old.terms["k"][0].estimate, 2.0);
        assert!(EngineState::parse(br#"{"version":9}"#).is_err());
        assert!(EngineState::parse(b"{not json").is_err());
    }
}
