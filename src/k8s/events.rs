//! Kubernetes Events (`events.k8s.io/v1`) on SLO state changes: the SLO engine calls the hook
//! synchronously, the hook queues the Event and a task posts it through kube-runtime's
//! `Recorder` (which also folds repeats into a series). The Event goes on the DynamoGraphDeployment
//! of the one target an SLO reads, or on the canary's own Pod when an SLO compares targets or
//! reads a static one.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ServingMode;
use crate::model::{Finished, Sink, TargetChange};
use crate::slo::{SloDef, StateChangeHook, matcher_accepts};
use crate::slo::{SloReading, SloState};

/// Events waiting to be posted; beyond this the newest are dropped (and logged), so a stuck API
/// server never grows the daemon's memory.
const QUEUE: usize = 256;

/// The `reportingController` of every Event.
pub const CONTROLLER: &str = "llm-canary.io/canary";

/// A target as Events see it: its serving mode and, when discovered, its deployment.
#[derive(Debug, Clone)]
pub struct EventTarget {
    pub name: String,
    pub mode: ServingMode,
    pub object: Option<ObjectReference>,
}

/// The `target` / `serving_mode` matchers of each selector of one SLO.
type Scope = Vec<Vec<crate::slo::ast::Matcher>>;

/// The state-change hook that posts Events.
pub struct SloEvents {
    queue: mpsc::Sender<(ObjectReference, Event)>,
    own_pod: ObjectReference,
    targets: RwLock<Vec<EventTarget>>,
    /// The DynamoGraphDeployment of each discovered target, by target name.
    objects: RwLock<BTreeMap<String, ObjectReference>>,
    scopes: RwLock<BTreeMap<String, Scope>>,
}

impl SloEvents {
    /// Starts the posting task, a task of `tasks` (the run's tracker): at `stop` the queue
    /// closes, what is in it is still posted, and the task ends. Events about the canary itself
    /// go on `own_pod`.
    pub fn start(
        client: Client,
        identity: &super::Identity,
        stop: CancellationToken,
        tasks: &TaskTracker,
    ) -> Arc<SloEvents> {
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: CONTROLLER.into(),
                instance: Some(identity.name.clone()),
            },
        );
        Self::with_poster(identity.pod_reference(), tasks, move |mut rx| async move {
            let mut stopping = std::pin::pin!(stop.cancelled_owned());
            let mut closed = false;
            loop {
                let (regarding, event) = tokio::select! {
                    next = rx.recv() => match next {
                        Some(queued) => queued,
                        None => return,
                    },
                    () = &mut stopping, if !closed => {
                        // Nothing more is queued; what is queued already still goes out.
                        rx.close();
                        closed = true;
                        continue;
                    }
                };
                if let Err(e) = recorder.publish(&event, &regarding).await {
                    tracing::warn!(error = %e, reason = %event.reason, object = ?regarding.name, "cannot post Kubernetes Event");
                }
            }
        })
    }

    fn with_poster<F, Fut>(
        own_pod: ObjectReference,
        tasks: &TaskTracker,
        poster: F,
    ) -> Arc<SloEvents>
    where
        F: FnOnce(mpsc::Receiver<(ObjectReference, Event)>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (queue, rx) = mpsc::channel(QUEUE);
        tasks.spawn(poster(rx));
        Arc::new(SloEvents {
            queue,
            own_pod,
            targets: RwLock::new(Vec::new()),
            objects: RwLock::new(BTreeMap::new()),
            scopes: RwLock::new(BTreeMap::new()),
        })
    }

    /// The SLOs in force (at start and after a reload).
    pub fn set_slos(&self, defs: &[SloDef]) {
        let scopes = defs
            .iter()
            .map(|d| {
                let selectors = d.selectors();
                let scope = selectors
                    .into_iter()
                    .map(|s| {
                        s.matchers
                            .iter()
                            .filter(|m| m.label == "target" || m.label == "serving_mode")
                            .cloned()
                            .collect()
                    })
                    .collect();
                (d.name.clone(), scope)
            })
            .collect();
        *self.scopes.write().unwrap_or_else(PoisonError::into_inner) = scopes;
    }

    /// The objects of the discovered targets (their DynamoGraphDeployments), by target name.
    pub fn set_objects(&self, objects: BTreeMap<String, ObjectReference>) {
        *self.objects.write().unwrap_or_else(PoisonError::into_inner) = objects;
    }

    /// The targets being measured now.
    pub fn set_targets(&self, targets: Vec<EventTarget>) {
        *self.targets.write().unwrap_or_else(PoisonError::into_inner) = targets;
    }

    /// The object an Event about `slo` goes on: the deployment of the single target it reads,
    /// else the canary's Pod.
    pub fn regarding(&self, slo: &str) -> ObjectReference {
        let scopes = self.scopes.read().unwrap_or_else(PoisonError::into_inner);
        let targets = self.targets.read().unwrap_or_else(PoisonError::into_inner);
        let Some(scope) = scopes.get(slo) else {
            return self.own_pod.clone();
        };
        let read: Vec<&EventTarget> = targets
            .iter()
            .filter(|t| {
                scope.iter().any(|matchers| {
                    matchers.iter().all(|m| {
                        let value = if m.label == "target" {
                            t.name.as_str()
                        } else {
                            t.mode.as_str()
                        };
                        matcher_accepts(m, value)
                    })
                })
            })
            .collect();
        match read.as_slice() {
            [one] => one.object.clone().unwrap_or_else(|| self.own_pod.clone()),
            _ => self.own_pod.clone(),
        }
    }
}

/// The Event for one state change.
pub fn event_for(slo: &str, old: SloState, new: SloState, reading: &SloReading) -> Event {
    let reason = match new {
        SloState::Pass => "SloPassing",
        SloState::Fail => "SloFailing",
        SloState::InsufficientData => "SloInsufficientData",
    };
    let mut note = format!("SLO {slo}: {} -> {}", old.as_str(), new.as_str());
    if let Some(v) = reading.value {
        note.push_str(&format!("; value {v:.6}"));
        if let (Some(lo), Some(hi)) = (reading.value_lower, reading.value_upper) {
            note.push_str(&format!(" (95% CI {lo:.6} to {hi:.6})"));
        }
    }
    if let Some(t) = reading.threshold {
        note.push_str(&format!("; threshold {t:.6}"));
    }
    Event {
        type_: if new == SloState::Fail {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note),
        action: "EvaluateSlo".into(),
        secondary: None,
    }
}

/// The targets being measured, as the schedule reports them.
impl Sink for SloEvents {
    fn request(&self, _: &Finished<'_>) {}

    fn targets(&self, change: &TargetChange<'_>) {
        let targets = {
            let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
            change
                .now
                .iter()
                .map(|t| EventTarget {
                    name: t.name.clone(),
                    mode: t.serving_mode,
                    object: objects.get(&t.name).cloned(),
                })
                .collect()
        };
        self.set_targets(targets);
    }
}

impl StateChangeHook for SloEvents {
    fn on_state_change(&self, slo: &str, old: SloState, new: SloState, reading: &SloReading) {
        let regarding = self.regarding(slo);
        if self
            .queue
            .try_send((regarding, event_for(slo, old, new, reading)))
            .is_err()
        {
            tracing::warn!(slo, "Kubernetes Event queue full or closed; Event dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn defs(yaml: &str) -> Vec<SloDef> {
        let cfg: Config = serde_saphyr::from_str(yaml).unwrap();
        crate::slo::compile_all(&cfg).unwrap()
    }

    #[tokio::test]
    async fn single_target_slo_goes_on_its_deployment_cross_mode_on_the_pod() {
        let own = ObjectReference {
            kind: Some("Pod".into()),
            name: Some("canary-0".into()),
            ..ObjectReference::default()
        };
        let events = SloEvents::with_poster(own.clone(), &TaskTracker::new(), |_rx| async {});
        events.set_slos(&defs(
            r#"
targets: []
slos:
  - name: disagg-ttft
    expr: p99(ttft{serving_mode="disaggregated"}) <= 2s
  - name: gain
    expr: p50(ttft{serving_mode="disaggregated"}) <= 0.8 * p50(ttft{serving_mode="aggregated"})
"#,
        ));
        let dgd = ObjectReference {
            kind: Some("DynamoGraphDeployment".into()),
            name: Some("vllm-disagg".into()),
            ..ObjectReference::default()
        };
        events.set_targets(vec![
            EventTarget {
                name: "vllm-agg".into(),
                mode: ServingMode::Aggregated,
                object: None,
            },
            EventTarget {
                name: "vllm-disagg".into(),
                mode: ServingMode::Disaggregated,
                object: Some(dgd.clone()),
            },
        ]);
        assert_eq!(events.regarding("disagg-ttft"), dgd);
        assert_eq!(events.regarding("gain"), own);
        assert_eq!(events.regarding("unknown"), own);
    }

    #[test]
    fn failure_is_a_warning_with_the_reading() {
        let e = event_for(
            "x",
            SloState::Pass,
            SloState::Fail,
            &SloReading {
                state: SloState::Fail,
                value: Some(2.5),
                threshold: Some(2.0),
                value_lower: Some(2.4),
                value_upper: Some(2.6),
            },
        );
        assert_eq!(e.type_, EventType::Warning);
        assert_eq!(e.reason, "SloFailing");
        let note = e.note.unwrap();
        assert!(
            note.contains("pass -> fail") && note.contains("threshold 2.000000"),
            "{note}"
        );
    }
}
