//! The PrometheusRule the daemon keeps (`discovery.kubernetes.prometheus_rule`): the rules
//! `llm-canary rules` generates for the config in force, written by the replica that may send
//! at start, after every reload and when it becomes the leader, so a changed SLO never leaves a
//! stale rule behind.

use std::collections::BTreeMap;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use super::KubeError;

/// `monitoring.coreos.com/v1` PrometheusRule.
pub fn prometheus_rule_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "PrometheusRule"),
        "prometheusrules",
    )
}

/// Where the rules go.
#[derive(Debug, Clone)]
pub struct ManagedRules {
    api: Api<DynamicObject>,
    name: String,
    labels: BTreeMap<String, String>,
}

impl ManagedRules {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        labels: BTreeMap<String, String>,
    ) -> ManagedRules {
        ManagedRules {
            api: Api::namespaced_with(client, namespace, &prometheus_rule_resource()),
            name: name.to_owned(),
            labels,
        }
    }

    /// Writes `rules` (a `groups:` rule file, as `llm-canary rules` prints it) as the object's
    /// spec: a merge patch, or the object created when absent.
    pub async fn publish(&self, rules: &str) -> Result<(), KubeError> {
        let spec: serde_json::Value =
            serde_saphyr::from_str(rules).map_err(KubeError::GeneratedRules)?;
        let mut labels = self.labels.clone();
        labels.insert("app.kubernetes.io/name".into(), "llm-canary".into());
        labels.insert("app.kubernetes.io/component".into(), "slo-rules".into());
        let object = serde_json::json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": self.name, "labels": labels},
            "spec": spec,
        });
        match self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&object))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let obj: DynamicObject =
                    serde_json::from_value(object).map_err(KubeError::RuleObject)?;
                self.api
                    .create(&PostParams::default(), &obj)
                    .await
                    .map(|_| ())
                    .map_err(KubeError::RuleWrite)
            }
            Err(e) => Err(KubeError::RuleWrite(e)),
        }
    }
}
