//! The SLO engine's state in a ConfigMap, so baselines, pins and verdicts survive a reschedule,
//! a `helm upgrade` and a failover. Only a replica that may send (the leader, or every replica
//! without an election) writes it, in the background and newest first; a replica that becomes
//! the leader reads it before its first step (the daemon calls [`ConfigMapState::load`] then).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::schedule::Leadership;
use crate::slo::SloError;
use crate::slo::state::{BoxFuture, MAX_STATE_BYTES, StateBackend};

/// The ConfigMap key that holds the state document.
pub const KEY: &str = "slo-state.json";

/// A ConfigMap holding the state, written by a background task.
pub struct ConfigMapState {
    api: Api<ConfigMap>,
    name: String,
    namespace: String,
    leadership: Option<watch::Receiver<Leadership>>,
    pending: watch::Sender<Option<Vec<u8>>>,
}

impl ConfigMapState {
    /// The state in ConfigMap `namespace/name`; saves are written while `leadership` (if any)
    /// lets this replica send, until `stop`.
    pub fn start(
        client: Client,
        namespace: &str,
        name: &str,
        leadership: Option<watch::Receiver<Leadership>>,
        stop: CancellationToken,
        tasks: &TaskTracker,
    ) -> ConfigMapState {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let (pending, mut rx) = watch::channel(None::<Vec<u8>>);
        let writer_api = api.clone();
        let writer_name = name.to_owned();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    r = rx.changed() => if r.is_err() { break },
                }
                let bytes = rx.borrow_and_update().clone();
                if let Some(bytes) = bytes
                    && let Err(e) = write(&writer_api, &writer_name, bytes).await
                {
                    tracing::warn!(configmap = %writer_name, "cannot save the SLO state: {e}");
                }
            }
            // A save queued at the very end still goes out.
            let last = rx.borrow().clone();
            if let Some(bytes) = last {
                let _ = write(&writer_api, &writer_name, bytes).await;
            }
        });
        ConfigMapState {
            api,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            leadership,
            pending,
        }
    }

    fn may_write(&self) -> bool {
        self.leadership
            .as_ref()
            .is_none_or(|l| l.borrow().is_active())
    }
}

/// Writes the document: a merge patch of the one key, or the ConfigMap created when absent.
async fn write(api: &Api<ConfigMap>, name: &str, bytes: Vec<u8>) -> Result<(), kube::Error> {
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let patch = serde_json::json!({"data": {KEY: text}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.to_owned()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/name".to_owned(),
                        "llm-canary".to_owned(),
                    )])),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(KEY.to_owned(), text)])),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

impl StateBackend for ConfigMapState {
    fn describe(&self) -> String {
        format!("configmap {}/{}", self.namespace, self.name)
    }

    fn load(&self) -> BoxFuture<'_, Result<Option<Vec<u8>>, SloError>> {
        Box::pin(async move {
            let cm = self
                .api
                .get_opt(&self.name)
                .await
                .map_err(|e| SloError::StateUnreadable {
                    place: self.describe(),
                    source: Box::new(e),
                })?;
            let text = cm.and_then(|c| c.data).and_then(|d| d.get(KEY).cloned());
            match text {
                Some(t) if t.len() > MAX_STATE_BYTES => Err(SloError::StateTooLarge {
                    place: self.describe(),
                    max: MAX_STATE_BYTES,
                }),
                Some(t) => Ok(Some(t.into_bytes())),
                None => Ok(None),
            }
        })
    }

    fn save(&self, bytes: Vec<u8>) {
        if self.may_write() {
            self.pending.send_replace(Some(bytes));
        }
    }
}
