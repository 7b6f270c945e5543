//! The label sets of the exported families other than the per-request ones (which are
//! `request::RequestLabels`), and the SLO state set that keeps exactly one state per SLO at 1.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;

use crate::request::{Outcome, RequestLabels, StepLabels};
use crate::slo::SloState;

/// The coarse per-request counters' labels of a request.
pub(super) fn mode_labels(l: &RequestLabels) -> ModeLabels {
    ModeLabels {
        target: l.target.clone(),
        serving_mode: l.serving_mode.clone(),
        workload: l.workload.clone(),
    }
}

/// Request labels plus `outcome` (`ok` or an error kind).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    #[prometheus(flatten)]
    pub request: RequestLabels,
    pub outcome: Outcome,
}

/// Step labels plus `quantile`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepQuantileLabels {
    #[prometheus(flatten)]
    pub step: StepLabels,
    pub quantile: String,
}

/// `target`, `serving_mode`, `workload`: the coarse per-request counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub target: String,
    pub serving_mode: String,
    pub workload: String,
}

/// `target`, `serving_mode`, `workload` and `reason`: requests built but not sent.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    pub target: String,
    pub serving_mode: String,
    pub workload: String,
    pub reason: String,
}

/// `target`, `serving_mode`: the server's own per-request timing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetModeLabels {
    pub target: String,
    pub serving_mode: String,
}

/// `target` only: server-side and target health series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    pub target: String,
}

/// `target`, `workload`: the schedule lag histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetWorkloadLabels {
    pub target: String,
    pub workload: String,
}

/// `reason`: why traffic is paused (`operator`, `schedule`, `budget`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// `target`, `workload`, `action`: what the traffic budget did to steps.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetStepLabels {
    pub target: String,
    pub workload: String,
    pub action: String,
}

/// `scope`: a target's budget, or `all`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    pub scope: String,
}

/// `scope`, `limit`: one configured budget limit.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLimitLabels {
    pub scope: String,
    pub limit: String,
}

/// `slo`: the SLO value gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SloLabels {
    pub slo: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VersionLabels {
    pub version: String,
}

/// `llm_canary_slo_state`: one state per SLO, encoded as a gauge per `state` with exactly one at 1.
/// Holding the state as one value (not three gauges) means no scrape can see two states at 1 or
/// none, which three separately set gauges would allow between the two writes.
#[derive(Debug, Clone, Default)]
pub(super) struct SloStateSet {
    states: Arc<RwLock<BTreeMap<String, SloState>>>,
}

impl SloStateSet {
    pub(super) fn set(&self, slo: &str, state: SloState) {
        let mut states = self.states.write().unwrap_or_else(PoisonError::into_inner);
        states.insert(slo.to_owned(), state);
    }

    pub(super) fn remove(&self, slo: &str) {
        let mut states = self.states.write().unwrap_or_else(PoisonError::into_inner);
        states.remove(slo);
    }

    pub(super) fn get(&self, slo: &str) -> Option<SloState> {
        let states = self.states.read().unwrap_or_else(PoisonError::into_inner);
        states.get(slo).copied()
    }
}

impl EncodeMetric for SloStateSet {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let states = self.states.read().unwrap_or_else(PoisonError::into_inner);
        for (slo, current) in states.iter() {
            for state in SloState::ALL {
                let labels = [("slo", slo.as_str()), ("state", state.as_str())];
                let value: i64 = if state == *current { 1 } else { 0 };
                encoder.encode_family(&labels)?.encode_gauge(&value)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }

    fn is_empty(&self) -> bool {
        let states = self.states.read().unwrap_or_else(PoisonError::into_inner);
        states.is_empty()
    }
}
