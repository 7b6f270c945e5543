//! Kubernetes integration (docs/DESIGN.md §9): discovery of Dynamo deployments as targets, Lease-based
//! leader election (or sharding) that gates who sends traffic, and Events on SLO state changes.
//! The module is named `k8s` so that it never shadows the `kube` crate.

pub mod discovery;
pub mod events;
pub mod lease;
pub mod pause;
pub mod rules;
pub mod state;
pub mod traffic;

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;

/// Labels and annotations a DynamoGraphDeployment may carry to steer the canary.
pub mod keys {
    /// `"true"` opts a deployment in (required with `opt_in: true`); `"false"` opts it out.
    pub const ENABLED: &str = "llm-canary.io/enabled";
    /// The `target` label value to use instead of the deployment's name.
    pub const TARGET_NAME: &str = "llm-canary.io/target-name";
    /// The model to request instead of `auto` (the first id of `GET /v1/models`).
    pub const MODEL: &str = "llm-canary.io/model";
    /// What the deployment costs per hour in USD, for `llm_canary_step_cost_per_million_tokens_usd`.
    pub const COST_PER_HOUR_USD: &str = "llm-canary.io/cost-per-hour-usd";
}

/// Errors of the Kubernetes integration.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("no Kubernetes client configuration (in-cluster or kubeconfig): {0}")]
    Config(String),
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error("Lease `{lease}`: {message}")]
    Lease { lease: String, message: String },
    #[error("leader election: {0}")]
    Settings(String),
    /// The rules to publish as a PrometheusRule are not a YAML document.
    #[error("generated rules: {0}")]
    GeneratedRules(serde_saphyr::Error),
    /// The PrometheusRule object could not be built from the rules.
    #[error(transparent)]
    RuleObject(serde_json::Error),
    /// Writing the PrometheusRule failed, as the API says it.
    #[error(transparent)]
    RuleWrite(kube::Error),
}

impl KubeError {
    /// A bounded label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            KubeError::Config(_) => "config",
            KubeError::Api(_) => "api",
            KubeError::Lease { .. } => "lease",
            KubeError::Settings(_) => "settings",
            KubeError::GeneratedRules(_) | KubeError::RuleObject(_) | KubeError::RuleWrite(_) => {
                "rules"
            }
        }
    }
}

/// Who this replica is: the Pod the chart runs it in (downward API), or the host outside a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The Lease holder identity and the Events' reporting instance.
    pub name: String,
    pub namespace: String,
    /// The Pod's UID, so Events about the canary itself attach to this very Pod.
    pub pod_uid: Option<String>,
}

impl Identity {
    /// From `POD_NAME`, `POD_NAMESPACE` and `POD_UID` (set by the chart), else the host name and
    /// the client's default namespace.
    pub fn from_env(default_namespace: &str) -> Identity {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Identity {
            name: var("POD_NAME")
                .or_else(|| var("HOSTNAME"))
                .unwrap_or_else(|| "llm-canary".to_owned()),
            namespace: var("POD_NAMESPACE").unwrap_or_else(|| default_namespace.to_owned()),
            pod_uid: var("POD_UID"),
        }
    }

    /// The canary's own Pod, the object Events about cross-mode SLOs are posted on.
    pub fn pod_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(self.name.clone()),
            namespace: Some(self.namespace.clone()),
            uid: self.pod_uid.clone(),
            ..ObjectReference::default()
        }
    }
}

/// What the daemon runs in a cluster: discovery, leader election and Events, as configured.
pub struct KubeParts {
    pub discovered: Option<tokio::sync::watch::Receiver<Vec<discovery::DiscoveredTarget>>>,
    pub leadership: Option<tokio::sync::watch::Receiver<lease::Leadership>>,
    pub events: Option<std::sync::Arc<events::SloEvents>>,
    /// The SLO state's ConfigMap (`state_configmap`).
    pub state: Option<std::sync::Arc<state::ConfigMapState>>,
    /// The PrometheusRule the daemon keeps (`prometheus_rule`).
    pub rules: Option<rules::ManagedRules>,
    /// The Deployment whose annotation pauses the traffic (`pause_annotation_on`).
    pub pause_annotation: Option<pause::PauseAnnotation>,
}

impl KubeParts {
    /// Connects and starts what `cfg` asks for; everything stops with the run's services (the
    /// Lease is released then), and the run's shutdown awaits its tasks.
    pub async fn start(
        cfg: &crate::config::KubeDiscovery,
        shutdown: &crate::shutdown::Shutdown,
    ) -> Result<KubeParts, KubeError> {
        let client = client().await?;
        Self::start_with(client, cfg, shutdown).await
    }

    /// As [`KubeParts::start`], with a given client (tests pass one to a mock API server).
    pub async fn start_with(
        client: kube::Client,
        cfg: &crate::config::KubeDiscovery,
        shutdown: &crate::shutdown::Shutdown,
    ) -> Result<KubeParts, KubeError> {
        let stop = shutdown.service();
        let identity = Identity::from_env(client.default_namespace());
        let discovered = cfg.dynamo_graph_deployments.then(|| {
            let opts = discovery::DiscoveryOptions {
                namespaces: watched_namespaces(cfg, &identity.namespace),
                label_selector: cfg.label_selector.clone(),
                opt_in: cfg.opt_in,
            };
            tracing::info!(namespaces = ?opts.namespaces, selector = ?opts.label_selector, opt_in = opts.opt_in, "watching DynamoGraphDeployments");
            discovery::start(client.clone(), opts, stop.clone(), shutdown.tracker())
        });
        let leadership = match &cfg.leader_election {
            Some(le) => {
                let settings = lease::LeaseSettings::new(
                    &le.lease_name,
                    le.namespace.as_deref().unwrap_or(&identity.namespace),
                    &identity.name,
                    le.lease_duration.0,
                    le.sharding,
                )?;
                tracing::info!(lease = %settings.held_lease(), namespace = %settings.namespace, identity = %settings.identity, sharding = settings.sharding, "leader election on");
                Some(
                    lease::elect(client.clone(), settings, stop.clone(), shutdown.tracker())
                        .await?,
                )
            }
            None => None,
        };
        let events = cfg.events.then(|| {
            events::SloEvents::start(client.clone(), &identity, stop.clone(), shutdown.tracker())
        });
        let state = cfg.state_configmap.as_ref().map(|name| {
            tracing::info!(configmap = %**name, namespace = %identity.namespace, "SLO state kept in a ConfigMap");
            std::sync::Arc::new(state::ConfigMapState::start(
                client.clone(),
                &identity.namespace,
                name,
                leadership.clone(),
                stop.clone(),
                shutdown.tracker(),
            ))
        });
        let rules = cfg.prometheus_rule.as_ref().map(|r| {
            rules::ManagedRules::new(
                client.clone(),
                &identity.namespace,
                &r.name,
                r.labels.clone(),
            )
        });
        let pause_annotation = cfg
            .pause_annotation_on
            .as_ref()
            .map(|name| pause::PauseAnnotation::new(client.clone(), &identity.namespace, name));
        Ok(KubeParts {
            discovered,
            leadership,
            events,
            state,
            rules,
            pause_annotation,
        })
    }
}

/// A client from the in-cluster service account or the local kubeconfig.
pub async fn client() -> Result<kube::Client, KubeError> {
    // kube's TLS uses rustls; the process-wide provider is ring, as for the measurement client.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let config = kube::Config::infer()
        .await
        .map_err(|e| KubeError::Config(e.to_string()))?;
    kube::Client::try_from(config).map_err(KubeError::Api)
}

/// The namespaces discovery watches: the configured ones, else the canary's own.
pub fn watched_namespaces(cfg: &crate::config::KubeDiscovery, own: &str) -> Vec<String> {
    let mut out: Vec<String> = cfg
        .namespaces
        .iter()
        .chain(cfg.namespace.iter())
        .cloned()
        .collect();
    if out.is_empty() {
        out.push(own.to_owned());
    }
    out.sort();
    out.dedup();
    out
}

/// Lease timing from the configured duration: renew with a third of it to spare, and never
/// shorter than the 2 s the Lease API's whole seconds allow with a grace below the duration.
pub fn lease_timing(duration: Duration) -> Result<(u64, u64), KubeError> {
    let secs = duration.as_secs();
    if secs < 2 {
        return Err(KubeError::Settings(format!(
            "lease_duration must be at least 2s, got {duration:?}"
        )));
    }
    let grace = (secs / 3).max(1);
    Ok((secs, grace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_timing_keeps_grace_below_duration() {
        assert_eq!(lease_timing(Duration::from_secs(15)).unwrap(), (15, 5));
        assert_eq!(lease_timing(Duration::from_secs(2)).unwrap(), (2, 1));
        assert!(lease_timing(Duration::from_millis(1500)).is_err());
    }

    #[test]
    fn own_namespace_when_none_configured() {
        let mut cfg = crate::config::KubeDiscovery {
            namespaces: vec![],
            namespace: None,
            dynamo_graph_deployments: true,
            label_selector: None,
            opt_in: false,
            events: true,
            leader_election: None,
            state_configmap: None,
            prometheus_rule: None,
            pause_annotation_on: None,
        };
        assert_eq!(watched_namespaces(&cfg, "monitoring"), ["monitoring"]);
        cfg.namespaces = vec!["b".into(), "a".into()];
        cfg.namespace = Some("a".into());
        assert_eq!(watched_namespaces(&cfg, "monitoring"), ["a", "b"]);
    }
}
