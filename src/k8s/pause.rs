//! Pausing from the cluster (`discovery.kubernetes.pause_annotation_on`): a watch on the
//! canary's own Deployment whose `llm-canary.io/paused` annotation is the gate's annotation
//! switch. `kubectl annotate deployment/llm-canary llm-canary.io/paused=true` pauses every
//! replica without a restart (the annotation is on the Deployment, not its Pod template, so
//! nothing rolls); `=false` or removing it resumes.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::schedule::gate::{Gate, Switch};

/// The annotation that pauses the traffic.
pub const PAUSED: &str = "llm-canary.io/paused";

/// The Deployment whose annotation is watched.
#[derive(Clone)]
pub struct PauseAnnotation {
    pub api: Api<Deployment>,
    pub name: String,
}

impl PauseAnnotation {
    pub fn new(client: Client, namespace: &str, name: &str) -> PauseAnnotation {
        PauseAnnotation {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
        }
    }
}

/// What the annotation's value asks for: `None` (absent, empty or `false`) runs, anything else
/// pauses with the value as its note.
pub fn requested_pause(value: Option<&str>) -> Option<String> {
    let v = value?.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("false") {
        return None;
    }
    Some(format!("{PAUSED}={v} on the Deployment"))
}

/// Follows the Deployment's annotation into the gate until `stop`. A watch that fails (no
/// RBAC, the API server away) keeps the last state and retries with backoff.
pub async fn watch_annotation(target: PauseAnnotation, gate: Arc<Gate>, stop: CancellationToken) {
    tracing::info!(deployment = %target.name, annotation = PAUSED, "watching the pause annotation");
    let config = watcher::Config::default().fields(&format!("metadata.name={}", target.name));
    let stream = watcher::watcher(target.api.clone(), config);
    let stream = kube::runtime::WatchStreamExt::default_backoff(stream);
    futures_util::pin_mut!(stream);
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = stream.next() => e,
        };
        match event {
            Some(Ok(Event::Apply(d) | Event::InitApply(d))) if d.name_any() == target.name => {
                let value = d.annotations().get(PAUSED).map(String::as_str);
                gate.set(Switch::Annotation, requested_pause(value));
            }
            Some(Ok(Event::Delete(d))) if d.name_any() == target.name => {
                gate.set(Switch::Annotation, None);
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::warn!(deployment = %target.name, "pause annotation watch: {e}");
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn false_empty_or_absent_runs_anything_else_pauses() {
        for runs in [None, Some(""), Some("false"), Some(" FALSE ")] {
            assert_eq!(requested_pause(runs), None, "{runs:?}");
        }
        assert_eq!(
            requested_pause(Some("true")).as_deref(),
            Some("llm-canary.io/paused=true on the Deployment")
        );
        assert!(
            requested_pause(Some("release 1.4"))
                .unwrap()
                .contains("release 1.4")
        );
    }
}
