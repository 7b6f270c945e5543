//! Discovery, leader election and Events against a mock Kubernetes API server (no cluster),
//! driven by scenarios: the example DynamoGraphDeployments appear, change mode and disappear;
//! the Lease is held, lost, regained, fenced during an API outage and released; an SLO failure
//! posts an Event on the right object.

mod kube_support;
mod support;

use std::time::Duration;

use kube_support::{MockApi, collection};
use llm_canary::config::ServingMode;
use llm_canary::k8s::discovery::{self, DiscoveredTarget, DiscoveryOptions};
use llm_canary::k8s::events::{EventTarget, SloEvents};
use llm_canary::k8s::lease::{self, Leadership, LeaseSettings};
use llm_canary::k8s::{Identity, keys};
use llm_canary::slo::StateChangeHook;
use llm_canary::slo::{SloReading, SloState};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const NS: &str = "dynamo";
/// Bounds every wait; scenarios finish far sooner.
const PATIENCE: Duration = Duration::from_secs(15);
/// Short enough for a quick test, long enough that a loaded CI machine renews in time (the fence
/// trips half a grace, 1 s, after a renewal is due).
const LEASE: Duration = Duration::from_secs(6);

fn dgds() -> String {
    collection("nvidia.com/v1alpha1", NS, "dynamographdeployments")
}
fn pods() -> String {
    collection("v1", NS, "pods")
}

/// An example DynamoGraphDeployment from tests/testdata/dynamo, placed in the namespace.
fn example(file: &str) -> Value {
    let text = std::fs::read_to_string(format!(
        "{}/tests/testdata/dynamo/{file}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut v: Value = serde_saphyr::from_str(&text).unwrap();
    v["metadata"]["namespace"] = json!(NS);
    v
}

/// A Pod as the Dynamo operator labels it.
fn pod(name: &str, dgd: &str, component: &str, ip: &str) -> Value {
    let (port, number) = if component == "frontend" {
        ("http", 8000)
    } else {
        ("system", 9090)
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {
            "nvidia.com/dynamo-graph-deployment-name": dgd,
            "nvidia.com/dynamo-component-type": component}},
        "spec": {"containers": [{"name": "main", "image": "x",
                 "ports": [{"name": port, "containerPort": number}]}]},
        "status": {"phase": "Running", "podIP": ip}
    })
}

/// Creates or replaces that Pod.
fn put_pod(api: &MockApi, name: &str, dgd: &str, component: &str, ip: &str) {
    api.put(&pods(), pod(name, dgd, component, ip));
}

async fn until<T: Clone>(
    rx: &mut watch::Receiver<T>,
    what: &str,
    pred: impl FnMut(&T) -> bool,
) -> T {
    match tokio::time::timeout(PATIENCE, rx.wait_for(pred)).await {
        Ok(Ok(v)) => v.clone(),
        Ok(Err(_)) => panic!("{what}: sender gone"),
        Err(_) => panic!(
            "{what}: not within {PATIENCE:?}; last {:?}",
            std::any::type_name::<T>()
        ),
    }
}

fn summary(targets: &[DiscoveredTarget]) -> Vec<(String, ServingMode)> {
    targets.iter().map(|t| (t.name.clone(), t.mode)).collect()
}

#[tokio::test]
async fn discovery_follows_deployments_live() {
    let api = MockApi::new();
    let stop = CancellationToken::new();
    let mut rx = discovery::start(
        api.client(),
        DiscoveryOptions {
            namespaces: vec![NS.into()],
            ..DiscoveryOptions::default()
        },
        stop.clone(),
        &TaskTracker::new(),
    );

    // The aggregated example appears with its Pods.
    api.put(&dgds(), example("vllm-agg.yaml"));
    put_pod(
        &api,
        "vllm-agg-frontend-0",
        "vllm-agg",
        "frontend",
        "10.0.0.1",
    );
    put_pod(&api, "vllm-agg-worker-0", "vllm-agg", "worker", "10.0.0.2");
    let t = until(&mut rx, "agg appears", |t| {
        t.len() == 1 && t[0].server_metrics.len() == 2
    })
    .await;
    assert_eq!(
        summary(&t),
        [("vllm-agg".to_owned(), ServingMode::Aggregated)]
    );
    assert_eq!(t[0].url, "http://vllm-agg-frontend.dynamo.svc:8000");
    // The frontend's own /metrics (Dynamo's frontend and KV router) and the worker's.
    assert_eq!(
        t[0].server_metrics,
        [
            "http://10.0.0.1:8000/metrics",
            "http://10.0.0.2:9090/metrics"
        ]
    );
    assert!(
        t[0].reference().uid.is_some(),
        "Events need the deployment's uid"
    );

    // The disaggregated example appears: its frontend, prefill and decode workers, all scraped.
    api.put(&dgds(), example("vllm-disagg.yaml"));
    put_pod(
        &api,
        "vllm-disagg-frontend-0",
        "vllm-disagg",
        "frontend",
        "10.0.1.1",
    );
    put_pod(
        &api,
        "vllm-disagg-prefill-0",
        "vllm-disagg",
        "worker",
        "10.0.1.2",
    );
    put_pod(
        &api,
        "vllm-disagg-decode-0",
        "vllm-disagg",
        "worker",
        "10.0.1.3",
    );
    let t = until(&mut rx, "disagg appears", |t| {
        t.len() == 2 && t[1].server_metrics.len() == 3
    })
    .await;
    assert_eq!(
        summary(&t),
        [
            ("vllm-agg".to_owned(), ServingMode::Aggregated),
            ("vllm-disagg".to_owned(), ServingMode::Disaggregated)
        ]
    );

    // The aggregated deployment gains a prefill service: it is disaggregated now.
    let mut agg = example("vllm-agg.yaml");
    agg["spec"]["services"]["prefill"] =
        json!({"componentType": "worker", "subComponentType": "prefill", "replicas": 1});
    api.put(&dgds(), agg.clone());
    until(&mut rx, "agg changes mode", |t| {
        t.iter()
            .any(|t| t.name == "vllm-agg" && t.mode == ServingMode::Disaggregated)
    })
    .await;

    // Opting out takes a deployment away; a new target name renames it.
    let mut disagg = example("vllm-disagg.yaml");
    disagg["metadata"]["annotations"] = json!({ keys::ENABLED: "false" });
    api.put(&dgds(), disagg);
    let t = until(&mut rx, "disagg opts out", |t| t.len() == 1).await;
    assert_eq!(t[0].name, "vllm-agg");
    agg["metadata"]["annotations"] = json!({ keys::TARGET_NAME: "agg" });
    api.put(&dgds(), agg);
    until(&mut rx, "agg renamed", |t| {
        t.len() == 1 && t[0].name == "agg"
    })
    .await;

    // The frontend Pod goes, then the deployment: no target left.
    api.delete(&pods(), "vllm-agg-frontend-0");
    until(&mut rx, "no frontend, no target", |t| t.is_empty()).await;
    put_pod(
        &api,
        "vllm-agg-frontend-1",
        "vllm-agg",
        "frontend",
        "10.0.0.9",
    );
    until(&mut rx, "frontend back", |t| t.len() == 1).await;
    api.delete(&dgds(), "vllm-agg");
    until(&mut rx, "deployment deleted", |t| t.is_empty()).await;
    stop.cancel();
}

fn leases() -> String {
    collection("coordination.k8s.io/v1", "monitoring", "leases")
}

fn settings(identity: &str, sharding: bool) -> LeaseSettings {
    LeaseSettings::new("llm-canary", "monitoring", identity, LEASE, sharding).unwrap()
}

/// The leadership of a replica `identity` electing through `api` until `stop`.
async fn elect(
    api: &MockApi,
    identity: &str,
    sharding: bool,
    stop: &CancellationToken,
) -> watch::Receiver<Leadership> {
    lease::elect(
        api.client(),
        settings(identity, sharding),
        stop.clone(),
        &TaskTracker::new(),
    )
    .await
    .unwrap()
}

/// Two replicas, `canary-a` and `canary-b`, electing through one API server until `stop`.
async fn two_replicas(
    sharding: bool,
    stop: &CancellationToken,
) -> (watch::Receiver<Leadership>, watch::Receiver<Leadership>) {
    let api = MockApi::new();
    let a = elect(&api, "canary-a", sharding, stop).await;
    let b = elect(&api, "canary-b", sharding, stop).await;
    (a, b)
}

/// Whether `done` holds within [`PATIENCE`], polling.
async fn within_patience(mut done: impl FnMut() -> bool) -> bool {
    support::within(PATIENCE, || {
        let ok = done();
        async move { ok.then_some(()) }
    })
    .await
    .is_some()
}

/// Another replica takes the Lease (its renewal `ago` seconds back).
fn taken_by(api: &MockApi, holder: &str, ago: f64) {
    let mut lease = api.get(&leases(), "llm-canary").expect("the Lease exists");
    let renewed =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs_f64(ago);
    lease["spec"]["holderIdentity"] = json!(holder);
    lease["spec"]["renewTime"] = json!(format!(
        "{:.6}",
        renewed.display_with_offset(k8s_openapi::jiff::tz::Offset::UTC)
    ));
    lease["spec"]["leaseDurationSeconds"] = json!(2);
    api.put(&leases(), lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_held_lost_fenced_regained_and_released() {
    let api = MockApi::new();
    let stop = CancellationToken::new();
    let mut rx = elect(&api, "canary-0", false, &stop).await;

    // Held: the Lease is created and names this replica.
    until(&mut rx, "acquire", |l| *l == Leadership::Leading).await;
    let lease = api.get(&leases(), "llm-canary").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "canary-0");

    // Lost: another replica holds it now; traffic stops within one lease period.
    taken_by(&api, "canary-1", 0.0);
    let lost = tokio::time::timeout(LEASE, rx.wait_for(|l| *l == Leadership::Standby))
        .await
        .is_ok();
    assert!(lost, "still leading a lease period after losing the Lease");

    // Regained: the other replica stops renewing; once its Lease expires this one takes over.
    until(&mut rx, "regain after expiry", |l| {
        *l == Leadership::Leading
    })
    .await;
    assert_eq!(
        api.get(&leases(), "llm-canary").unwrap()["spec"]["holderIdentity"],
        "canary-0"
    );

    // Fenced: the API server is unreachable, so renewals fail; the fence stops traffic before
    // the Lease could expire for the others.
    api.set_failing(true);
    let fenced = tokio::time::timeout(LEASE, rx.wait_for(|l| *l == Leadership::Standby))
        .await
        .is_ok();
    assert!(
        fenced,
        "kept sending through an API outage longer than the lease duration"
    );
    api.set_failing(false);
    until(&mut rx, "leading again after the outage", |l| {
        *l == Leadership::Leading
    })
    .await;

    // Released on stop, so a standby takes over at once.
    stop.cancel();
    until(&mut rx, "standby on stop", |l| *l == Leadership::Standby).await;
    let released = within_patience(|| {
        api.get(&leases(), "llm-canary").unwrap()["spec"]["holderIdentity"].is_null()
    })
    .await;
    assert!(released, "the Lease is not released on stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_replica_leads() {
    let stop = CancellationToken::new();
    let (mut a, mut b) = two_replicas(false, &stop).await;
    // Whichever wins, the other stays standby while the winner renews (two lease periods).
    let winner_a = tokio::select! {
        _ = a.wait_for(|l| *l == Leadership::Leading) => true,
        _ = b.wait_for(|l| *l == Leadership::Leading) => false,
    };
    let (leader, standby) = if winner_a { (&a, &mut b) } else { (&b, &mut a) };
    let both = tokio::time::timeout(LEASE, standby.wait_for(|l| *l != Leadership::Standby))
        .await
        .is_ok();
    assert!(!both, "two replicas led at once");
    assert_eq!(*leader.borrow(), Leadership::Leading);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_split_the_targets() {
    let stop = CancellationToken::new();
    let (mut a, mut b) = two_replicas(true, &stop).await;
    let two = |l: &Leadership| matches!(l, Leadership::Shard { members, .. } if members.len() == 2);
    let la = until(&mut a, "a sees both members", two).await;
    let lb = until(&mut b, "b sees both members", two).await;
    let targets: Vec<String> = (0..20).map(|i| format!("dgd-{i}")).collect();
    for t in &targets {
        assert!(
            la.sends_to(t) != lb.sends_to(t),
            "{t} must have exactly one sender"
        );
    }
    assert!(targets.iter().any(|t| la.sends_to(t)) && targets.iter().any(|t| lb.sends_to(t)));
    stop.cancel();
}

#[tokio::test]
async fn slo_state_changes_post_events_on_the_deployment_or_the_pod() {
    let api = MockApi::new();
    let identity = Identity {
        name: "canary-0".into(),
        namespace: "monitoring".into(),
        pod_uid: Some("pod-uid".into()),
    };
    let hook = SloEvents::start(
        api.client(),
        &identity,
        CancellationToken::new(),
        &TaskTracker::new(),
    );
    let cfg: llm_canary::config::Config = serde_saphyr::from_str(
        r#"
targets: []
discovery: { kubernetes: {} }
slos:
  - name: ttft-p99-disaggregated
    expr: p99(ttft{serving_mode="disaggregated"}) <= 2s
  - name: disagg-ttft-gain
    expr: p50(ttft{serving_mode="disaggregated"}) <= 0.8 * p50(ttft{serving_mode="aggregated"})
"#,
    )
    .unwrap();
    hook.set_slos(&llm_canary::slo::compile_all(&cfg).unwrap());
    let disagg = DiscoveredTarget {
        name: "vllm-disagg".into(),
        namespace: NS.into(),
        deployment: "vllm-disagg".into(),
        deployment_uid: Some("dgd-uid".into()),
        mode: ServingMode::Disaggregated,
        url: "http://vllm-disagg-frontend.dynamo.svc:8000".into(),
        model: "auto".into(),
        cost_per_hour_usd: None,
        server_metrics: vec![],
    };
    hook.set_targets(vec![
        EventTarget {
            name: "vllm-agg".into(),
            mode: ServingMode::Aggregated,
            object: None,
        },
        EventTarget {
            name: "vllm-disagg".into(),
            mode: ServingMode::Disaggregated,
            object: Some(disagg.reference()),
        },
    ]);
    let reading = SloReading {
        state: SloState::Fail,
        value: Some(2.4),
        threshold: Some(2.0),
        value_lower: Some(2.2),
        value_upper: Some(2.6),
    };
    hook.on_state_change(
        "ttft-p99-disaggregated",
        SloState::Pass,
        SloState::Fail,
        &reading,
    );
    hook.on_state_change(
        "disagg-ttft-gain",
        SloState::InsufficientData,
        SloState::Pass,
        &SloReading {
            state: SloState::Pass,
            ..reading.clone()
        },
    );

    let posted = |ns: &str| api.list(&collection("events.k8s.io/v1", ns, "events"));
    let got = within_patience(|| !posted(NS).is_empty() && !posted("monitoring").is_empty()).await;
    assert!(
        got,
        "Events not posted: {:?} {:?}",
        posted(NS),
        posted("monitoring")
    );
    let on_dgd = &posted(NS)[0];
    assert_eq!(on_dgd["reason"], "SloFailing");
    assert_eq!(on_dgd["type"], "Warning");
    assert_eq!(on_dgd["regarding"]["kind"], "DynamoGraphDeployment");
    assert_eq!(on_dgd["regarding"]["name"], "vllm-disagg");
    assert_eq!(on_dgd["regarding"]["uid"], "dgd-uid");
    assert_eq!(
        on_dgd["reportingController"],
        llm_canary::k8s::events::CONTROLLER
    );
    assert!(on_dgd["note"].as_str().unwrap().contains("pass -> fail"));
    let on_pod = &posted("monitoring")[0];
    assert_eq!(on_pod["reason"], "SloPassing");
    assert_eq!(on_pod["type"], "Normal");
    assert_eq!(on_pod["regarding"]["kind"], "Pod");
    assert_eq!(on_pod["regarding"]["name"], "canary-0");
}
