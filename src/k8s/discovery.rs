//! Discovery of NVIDIA Dynamo deployments as targets: watches DynamoGraphDeployments
//! (`nvidia.com/v1alpha1`) and their Pods in the configured namespaces and publishes the target
//! set every time it changes, so targets appear and disappear while the daemon runs.
//!
//! One target per deployment that has a frontend Pod: traffic goes to the `<dgd>-frontend`
//! Service on the frontend's `http` port, and the serving mode is disaggregated when the
//! deployment has a `subComponentType: prefill` service. The target's server metrics are every
//! `/metrics` of the deployment's Pods: each frontend Pod's `http` port (Dynamo's frontend and KV
//! router serve theirs beside the API), each worker Pod's `system` port (the workers' own and the
//! engine's), and KVBM's port on workers that run it (a container port named `kvbm`, or
//! `DYN_KVBM_METRICS=true` with `DYN_KVBM_METRICS_PORT`, default 6880).

use std::collections::BTreeMap;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::keys;
use crate::config::ServingMode;

/// Pod label naming the DynamoGraphDeployment a Pod belongs to.
pub const DGD_NAME_LABEL: &str = "nvidia.com/dynamo-graph-deployment-name";
/// Pod label with the component type: `frontend`, `worker` (or `prefill` / `decode`), ...
pub const COMPONENT_TYPE_LABEL: &str = "nvidia.com/dynamo-component-type";

/// The component types of Pods that run an engine.
const WORKER_TYPES: [&str; 3] = ["worker", "prefill", "decode"];

/// KVBM's metrics port when `DYN_KVBM_METRICS` is on and `DYN_KVBM_METRICS_PORT` is unset.
const DEFAULT_KVBM_METRICS_PORT: i32 = 6880;

/// The DynamoGraphDeployment resource.
pub fn dgd_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nvidia.com", "v1alpha1", "DynamoGraphDeployment"),
        "dynamographdeployments",
    )
}

/// What discovery reads from the cluster besides the objects themselves.
#[derive(Debug, Clone, Default)]
pub struct DiscoveryOptions {
    pub namespaces: Vec<String>,
    /// Label selector on the DynamoGraphDeployments.
    pub label_selector: Option<String>,
    /// Only deployments set to `llm-canary.io/enabled: "true"` become targets.
    pub opt_in: bool,
}

/// One discovered target.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredTarget {
    /// The `target` label value.
    pub name: String,
    pub namespace: String,
    /// The DynamoGraphDeployment's name.
    pub deployment: String,
    pub deployment_uid: Option<String>,
    pub mode: ServingMode,
    /// `http://<dgd>-frontend.<namespace>.svc:<port>`.
    pub url: String,
    pub model: String,
    pub cost_per_hour_usd: Option<f64>,
    /// `http://<worker pod IP>:<system port>/metrics` of every worker Pod with an IP.
    pub server_metrics: Vec<String>,
}

impl DiscoveredTarget {
    /// The DynamoGraphDeployment, the object Events about this target are posted on.
    pub fn reference(&self) -> ObjectReference {
        let r = dgd_resource();
        ObjectReference {
            api_version: Some(r.api_version),
            kind: Some(r.kind),
            name: Some(self.deployment.clone()),
            namespace: Some(self.namespace.clone()),
            uid: self.deployment_uid.clone(),
            ..ObjectReference::default()
        }
    }

    /// The target as the config would state it, so it resolves like a static target.
    pub fn to_config(&self) -> crate::config::TargetConfig {
        use crate::config::{Api as TargetApi, At, Dialect, TargetConfig};
        TargetConfig {
            name: At::dflt(self.name.clone()),
            serving_mode: self.mode,
            url: Some(At::dflt(self.url.clone())),
            model: self.model.clone(),
            api: TargetApi::default(),
            dialect: Dialect::Dynamo,
            length_control: None,
            api_key_env: None,
            api_key_file: None,
            server_metrics: self
                .server_metrics
                .iter()
                .map(|u| At::dflt(u.clone()))
                .collect(),
            cost_per_hour_usd: self.cost_per_hour_usd.map(At::dflt),
            max_input_tokens: None,
            simulated: None,
            tls: None,
            request: Default::default(),
            budget: Default::default(),
            goodput: None,
        }
    }
}

/// A label or annotation value of a DynamoGraphDeployment (labels win).
fn setting<'a>(obj: &'a DynamicObject, key: &str) -> Option<&'a str> {
    obj.labels()
        .get(key)
        .or_else(|| obj.annotations().get(key))
        .map(String::as_str)
}

/// Whether the deployment has a service with `subComponentType: prefill`.
pub fn serving_mode(dgd: &DynamicObject) -> ServingMode {
    let prefill = dgd.data["spec"]["services"]
        .as_object()
        .is_some_and(|services| {
            services
                .values()
                .any(|s| s["subComponentType"].as_str() == Some("prefill"))
        });
    if prefill {
        ServingMode::Disaggregated
    } else {
        ServingMode::Aggregated
    }
}

fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Failed" | "Succeeded"))
}

fn container_port(pod: &Pod, name: &str) -> Option<i32> {
    pod.spec.as_ref()?.containers.iter().find_map(|c| {
        c.ports
            .as_ref()?
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port)
    })
}

/// The port of KVBM's `/metrics` on `pod`: a container port named `kvbm`, or the port its
/// environment turns on (`DYN_KVBM_METRICS=true`, `DYN_KVBM_METRICS_PORT` or 6880). Values from
/// a ConfigMap or Secret are not resolved; such a Pod needs the named port.
fn kvbm_port(pod: &Pod) -> Option<i32> {
    container_port(pod, "kvbm").or_else(|| {
        pod.spec.as_ref()?.containers.iter().find_map(|c| {
            let env = c.env.as_ref()?;
            let value = |name: &str| {
                env.iter()
                    .find(|e| e.name == name)
                    .and_then(|e| e.value.as_deref())
            };
            let on = value("DYN_KVBM_METRICS")
                .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1"));
            on.then(|| {
                value("DYN_KVBM_METRICS_PORT")
                    .and_then(|p| p.trim().parse().ok())
                    .unwrap_or(DEFAULT_KVBM_METRICS_PORT)
            })
        })
    })
}

/// `http://<pod IP>:<port>/metrics`, for a Pod with an IP.
fn metrics_url(pod: &Pod, port: i32) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    Some(format!("http://{ip}:{port}/metrics"))
}

/// The Dynamo operator's frontend port when the Pod does not name one.
const DEFAULT_FRONTEND_PORT: i32 = 8000;

/// The targets the deployments and Pods describe, sorted by name. Names are the deployment's name
/// (or its `llm-canary.io/target-name`); a name found in several namespaces gets `.<namespace>`.
pub fn targets_from(
    dgds: &[DynamicObject],
    pods: &[Pod],
    opts: &DiscoveryOptions,
) -> Vec<DiscoveredTarget> {
    let mut out = Vec::new();
    for dgd in dgds {
        let enabled = setting(dgd, keys::ENABLED);
        let wanted = if opts.opt_in {
            enabled == Some("true")
        } else {
            enabled != Some("false")
        };
        let (Some(name), Some(ns)) = (dgd.metadata.name.as_deref(), dgd.namespace()) else {
            continue;
        };
        if !wanted || dgd.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let ns_ref = ns.as_str();
        let of_dgd = |components: &'static [&'static str]| {
            pods.iter().filter(move |p| {
                p.namespace().as_deref() == Some(ns_ref)
                    && p.labels().get(DGD_NAME_LABEL).map(String::as_str) == Some(name)
                    && p.labels()
                        .get(COMPONENT_TYPE_LABEL)
                        .is_some_and(|c| components.contains(&c.as_str()))
                    && is_live(p)
            })
        };
        // No frontend Pod: nothing answers behind the Service yet (or any more).
        let Some(frontend) = of_dgd(&["frontend"]).min_by_key(|p| p.name_any()) else {
            continue;
        };
        let port = container_port(frontend, "http").unwrap_or(DEFAULT_FRONTEND_PORT);
        let frontends = of_dgd(&["frontend"]).filter_map(|p| {
            metrics_url(
                p,
                container_port(p, "http").unwrap_or(DEFAULT_FRONTEND_PORT),
            )
        });
        let workers = of_dgd(&WORKER_TYPES).flat_map(|p| {
            [container_port(p, "system"), kvbm_port(p)]
                .into_iter()
                .flatten()
                .filter_map(|port| metrics_url(p, port))
        });
        let mut server_metrics: Vec<String> = frontends.chain(workers).collect();
        server_metrics.sort();
        server_metrics.dedup();
        out.push(DiscoveredTarget {
            name: setting(dgd, keys::TARGET_NAME).unwrap_or(name).to_owned(),
            namespace: ns.clone(),
            deployment: name.to_owned(),
            deployment_uid: dgd.metadata.uid.clone(),
            mode: serving_mode(dgd),
            url: format!("http://{name}-frontend.{ns}.svc:{port}"),
            model: setting(dgd, keys::MODEL).unwrap_or("auto").to_owned(),
            cost_per_hour_usd: setting(dgd, keys::COST_PER_HOUR_USD)
                .and_then(|c| c.trim().parse().ok())
                .filter(|c: &f64| c.is_finite() && *c >= 0.0),
            server_metrics,
        });
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for t in &out {
        *counts.entry(t.name.clone()).or_default() += 1;
    }
    for t in &mut out {
        if counts[&t.name] > 1 {
            t.name = format!("{}.{}", t.name, t.namespace);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Objects of one kind and namespace as the watcher last listed and updated them.
struct Cache<K> {
    live: BTreeMap<String, K>,
    /// Objects of a relist in progress; they replace `live` when it completes.
    relist: BTreeMap<String, K>,
}

impl<K: kube::Resource + Clone> Cache<K> {
    fn new() -> Self {
        Cache {
            live: BTreeMap::new(),
            relist: BTreeMap::new(),
        }
    }

    /// Applies one watch event; true when the live set changed.
    fn apply(&mut self, event: Event<K>) -> bool {
        match event {
            Event::Apply(o) => {
                self.live.insert(o.name_any(), o);
                true
            }
            Event::Delete(o) => self.live.remove(&o.name_any()).is_some(),
            Event::Init => {
                self.relist.clear();
                false
            }
            Event::InitApply(o) => {
                self.relist.insert(o.name_any(), o);
                false
            }
            Event::InitDone => {
                self.live = std::mem::take(&mut self.relist);
                true
            }
        }
    }
}

/// One watch event; boxed, as Pods and deployments differ in size by kilobytes.
enum Update {
    Dgd(usize, Box<Event<DynamicObject>>),
    Pod(usize, Box<Event<Pod>>),
}

/// Watches the deployments and their Pods until `stop`; the receiver holds the current targets
/// (empty until the first lists complete) and changes only when the target set does.
pub fn start(
    client: Client,
    opts: DiscoveryOptions,
    stop: CancellationToken,
    tasks: &TaskTracker,
) -> watch::Receiver<Vec<DiscoveredTarget>> {
    let (tx, rx) = watch::channel(Vec::new());
    let resource = dgd_resource();
    let mut streams = Vec::new();
    for (i, ns) in opts.namespaces.iter().enumerate() {
        let dgds: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
        let mut dgd_cfg = watcher::Config::default();
        if let Some(sel) = &opts.label_selector {
            dgd_cfg = dgd_cfg.labels(sel);
        }
        streams.push(
            watcher::watcher(dgds, dgd_cfg)
                .default_backoff()
                .map(move |e| e.map(|e| Update::Dgd(i, Box::new(e))))
                .boxed(),
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod_cfg = watcher::Config::default().labels(DGD_NAME_LABEL);
        streams.push(
            watcher::watcher(pods, pod_cfg)
                .default_backoff()
                .map(move |e| e.map(|e| Update::Pod(i, Box::new(e))))
                .boxed(),
        );
    }
    tasks.spawn(async move {
        let mut dgds: Vec<Cache<DynamicObject>> =
            opts.namespaces.iter().map(|_| Cache::new()).collect();
        let mut pods: Vec<Cache<Pod>> = opts.namespaces.iter().map(|_| Cache::new()).collect();
        let mut updates = futures_util::stream::select_all(streams);
        loop {
            let update = tokio::select! {
                _ = stop.cancelled() => return,
                u = updates.next() => u,
            };
            let changed = match update {
                None => return,
                Some(Err(e)) => {
                    // The backoff retries; the last known targets stay meanwhile.
                    tracing::warn!(error = %e, "Kubernetes watch failed; retrying");
                    false
                }
                Some(Ok(Update::Dgd(i, e))) => dgds[i].apply(*e),
                Some(Ok(Update::Pod(i, e))) => pods[i].apply(*e),
            };
            if !changed {
                continue;
            }
            let all_dgds: Vec<DynamicObject> =
                dgds.iter().flat_map(|c| c.live.values().cloned()).collect();
            let all_pods: Vec<Pod> = pods.iter().flat_map(|c| c.live.values().cloned()).collect();
            let targets = targets_from(&all_dgds, &all_pods, &opts);
            tx.send_if_modified(|current| {
                if *current == targets {
                    return false;
                }
                tracing::info!(
                    targets = ?targets.iter().map(|t| format!("{} ({}, {})", t.name, t.mode.as_str(), t.url)).collect::<Vec<_>>(),
                    "discovered targets changed"
                );
                *current = targets;
                true
            });
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgd(yaml: &str, ns: &str) -> DynamicObject {
        let mut o: DynamicObject = serde_saphyr::from_str(yaml).unwrap();
        o.metadata.namespace = Some(ns.into());
        o
    }

    fn pod(ns: &str, name: &str, dgd: &str, component: &str, ip: &str) -> Pod {
        let port = if component == "frontend" {
            ("http", 8000)
        } else {
            ("system", 9090)
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "labels": {
                DGD_NAME_LABEL: dgd, COMPONENT_TYPE_LABEL: component}},
            "spec": {"containers": [{"name": "main", "ports": [{"name": port.0, "containerPort": port.1}]}]},
            "status": {"phase": "Running", "podIP": ip}
        }))
        .unwrap()
    }

    const AGG: &str = include_str!("../../tests/testdata/dynamo/vllm-agg.yaml");
    const DISAGG: &str = include_str!("../../tests/testdata/dynamo/vllm-disagg.yaml");

    #[test]
    fn modes_urls_and_worker_metrics_from_the_example_deployments() {
        let dgds = [dgd(AGG, "dynamo"), dgd(DISAGG, "dynamo")];
        let pods = [
            pod(
                "dynamo",
                "vllm-agg-frontend-0",
                "vllm-agg",
                "frontend",
                "10.0.0.1",
            ),
            pod(
                "dynamo",
                "vllm-agg-worker-0",
                "vllm-agg",
                "worker",
                "10.0.0.2",
            ),
            pod(
                "dynamo",
                "vllm-disagg-frontend-0",
                "vllm-disagg",
                "frontend",
                "10.0.1.1",
            ),
            pod(
                "dynamo",
                "vllm-disagg-prefill-0",
                "vllm-disagg",
                "worker",
                "10.0.1.3",
            ),
            pod(
                "dynamo",
                "vllm-disagg-decode-0",
                "vllm-disagg",
                "worker",
                "10.0.1.2",
            ),
        ];
        let t = targets_from(&dgds, &pods, &DiscoveryOptions::default());
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].name.as_str(), t[0].mode),
            ("vllm-agg", ServingMode::Aggregated)
        );
        assert_eq!(t[0].url, "http://vllm-agg-frontend.dynamo.svc:8000");
        // The frontend's own /metrics (its KV router's too) and every worker's system port.
        assert_eq!(
            t[0].server_metrics,
            [
                "http://10.0.0.1:8000/metrics",
                "http://10.0.0.2:9090/metrics"
            ]
        );
        assert_eq!(
            (t[1].name.as_str(), t[1].mode),
            ("vllm-disagg", ServingMode::Disaggregated)
        );
        assert_eq!(
            t[1].server_metrics,
            [
                "http://10.0.1.1:8000/metrics",
                "http://10.0.1.2:9090/metrics",
                "http://10.0.1.3:9090/metrics"
            ]
        );
        assert_eq!(
            t[1].reference().kind.as_deref(),
            Some("DynamoGraphDeployment")
        );
    }

    #[test]
    fn the_deploy_guide_deployments_become_agg_and_disagg() {
        let dgds = [
            serde_saphyr::from_str(include_str!("../../examples/k8s/dynamo-agg.yaml")).unwrap(),
            serde_saphyr::from_str::<DynamicObject>(include_str!(
                "../../examples/k8s/dynamo-disagg.yaml"
            ))
            .unwrap(),
        ];
        let ns = "dynamo-workload";
        let pods = [
            pod(ns, "a", "qwen3-agg", "frontend", "10.0.0.1"),
            pod(ns, "d", "qwen3-disagg", "frontend", "10.0.0.2"),
        ];
        let t = targets_from(&dgds, &pods, &DiscoveryOptions::default());
        let got: Vec<_> = t
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.mode,
                    t.cost_per_hour_usd,
                    t.model.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "agg",
                    ServingMode::Aggregated,
                    Some(16.39),
                    "Qwen/Qwen3-30B-A3B-FP8"
                ),
                (
                    "disagg",
                    ServingMode::Disaggregated,
                    Some(21.63),
                    "Qwen/Qwen3-30B-A3B-FP8"
                )
            ]
        );
        assert_eq!(
            t[1].url,
            "http://qwen3-disagg-frontend.dynamo-workload.svc:8000"
        );
    }

    #[test]
    fn kvbm_ports_and_prefill_decode_typed_workers_are_scraped() {
        let dgds = [dgd(DISAGG, "dynamo")];
        let with = |mut p: Pod, f: &dyn Fn(&mut k8s_openapi::api::core::v1::Container)| {
            f(&mut p.spec.as_mut().unwrap().containers[0]);
            p
        };
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| k8s_openapi::api::core::v1::EnvVar {
                    name: (*k).into(),
                    value: Some((*v).into()),
                    ..Default::default()
                })
                .collect::<Vec<_>>()
        };
        let pods = [
            pod("dynamo", "f", "vllm-disagg", "frontend", "10.0.1.1"),
            // The operator's newer component types, KVBM on by its environment (default port).
            with(
                pod("dynamo", "p", "vllm-disagg", "prefill", "10.0.1.3"),
                &|c| c.env = Some(env(&[("DYN_KVBM_METRICS", "true")])),
            ),
            // KVBM on another port, by its environment.
            with(
                pod("dynamo", "d", "vllm-disagg", "decode", "10.0.1.2"),
                &|c| {
                    c.env = Some(env(&[
                        ("DYN_KVBM_METRICS", "1"),
                        ("DYN_KVBM_METRICS_PORT", "7000"),
                    ]))
                },
            ),
            // A named `kvbm` port wins; KVBM's metrics off: no port.
            with(
                pod("dynamo", "w", "vllm-disagg", "worker", "10.0.1.4"),
                &|c| {
                    c.ports.as_mut().unwrap().push(
                        serde_json::from_value(
                            serde_json::json!({"name": "kvbm", "containerPort": 6881}),
                        )
                        .unwrap(),
                    );
                    c.env = Some(env(&[("DYN_KVBM_METRICS", "false")]));
                },
            ),
            with(
                pod("dynamo", "x", "vllm-disagg", "worker", "10.0.1.5"),
                &|c| c.env = Some(env(&[("DYN_KVBM_METRICS", "false")])),
            ),
        ];
        let t = targets_from(&dgds, &pods, &DiscoveryOptions::default());
        assert_eq!(
            t[0].server_metrics,
            [
                "http://10.0.1.1:8000/metrics",
                "http://10.0.1.2:7000/metrics",
                "http://10.0.1.2:9090/metrics",
                "http://10.0.1.3:6880/metrics",
                "http://10.0.1.3:9090/metrics",
                "http://10.0.1.4:6881/metrics",
                "http://10.0.1.4:9090/metrics",
                "http://10.0.1.5:9090/metrics"
            ]
        );
    }

    #[test]
    fn no_frontend_pod_no_target() {
        let dgds = [dgd(AGG, "dynamo")];
        let pods = [pod("dynamo", "w", "vllm-agg", "worker", "10.0.0.2")];
        assert!(targets_from(&dgds, &pods, &DiscoveryOptions::default()).is_empty());
    }

    #[test]
    fn opt_in_opt_out_and_target_name() {
        let mut a = dgd(AGG, "dynamo");
        let pods = [pod("dynamo", "f", "vllm-agg", "frontend", "10.0.0.1")];
        a.annotations_mut()
            .insert(keys::ENABLED.into(), "false".into());
        assert!(targets_from(&[a.clone()], &pods, &DiscoveryOptions::default()).is_empty());
        let opt_in = DiscoveryOptions {
            opt_in: true,
            ..DiscoveryOptions::default()
        };
        a.annotations_mut().remove(keys::ENABLED);
        assert!(targets_from(&[a.clone()], &pods, &opt_in).is_empty());
        a.labels_mut().insert(keys::ENABLED.into(), "true".into());
        a.annotations_mut()
            .insert(keys::TARGET_NAME.into(), "agg".into());
        a.annotations_mut()
            .insert(keys::COST_PER_HOUR_USD.into(), "65.54".into());
        let t = targets_from(&[a], &pods, &opt_in);
        assert_eq!(t[0].name, "agg");
        assert_eq!(t[0].deployment, "vllm-agg");
        assert_eq!(t[0].cost_per_hour_usd, Some(65.54));
        assert_eq!(
            t[0].to_config().cost_per_hour_usd.map(|c| c.value),
            Some(65.54)
        );
    }

    #[test]
    fn same_name_in_two_namespaces_is_qualified() {
        let dgds = [dgd(AGG, "a"), dgd(AGG, "b")];
        let pods = [
            pod("a", "f", "vllm-agg", "frontend", "10.0.0.1"),
            pod("b", "f", "vllm-agg", "frontend", "10.0.0.2"),
        ];
        let names: Vec<String> = targets_from(&dgds, &pods, &DiscoveryOptions::default())
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, ["vllm-agg.a", "vllm-agg.b"]);
    }
}
