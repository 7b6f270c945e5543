//! The configuration schema (docs/DESIGN.md §3): every key, its type and the benchmark plan's defaults.
//! Unknown keys are errors everywhere (`deny_unknown_fields`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::at::{At, Dur};
use super::request::RequestOptions;
use super::target::{Api, Dialect, LengthControl, ServingMode};
use super::workloads::{Workloads, s0};

/// The keys a config file may have at its top, in the order of [`Config`]'s fields (a test
/// holds the two together).
pub const TOP_LEVEL_KEYS: [&str; 14] = [
    "targets",
    "discovery",
    "tokenizer",
    "time_scale",
    "seed",
    "client",
    "budget",
    "goodput",
    "probe_stream",
    "workloads",
    "schedule",
    "slos",
    "export",
    "alerting",
];

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub targets: Vec<TargetConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<Discovery>,
    /// Path to a `tokenizer.json` or a model directory holding one; absent = built-in approximation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<At<String>>,
    /// Multiplies every workload duration (steps, warmups, think times); the demo uses a small value.
    #[serde(default = "one")]
    pub time_scale: At<f64>,
    /// Seed of every random choice (prompts, samplers); the same seed gives the same request stream.
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default)]
    pub client: ClientConfig,
    /// A ceiling on the canary's load on all targets together (each target has its own too).
    #[serde(default, skip_serializing_if = "Budget::is_empty")]
    pub budget: Budget,
    /// What makes a request good, for goodput (a target may have its own).
    #[serde(default)]
    pub goodput: Goodput,
    /// One short request per target every `interval`, next to the load (`workload="probe"`).
    #[serde(default)]
    pub probe_stream: ProbeStreamConfig,
    #[serde(default)]
    pub workloads: Workloads,
    #[serde(default)]
    pub schedule: Schedule,
    /// SLO definitions; their expressions are parsed by the SLO engine.
    #[serde(default)]
    pub slos: Vec<SloConfig>,
    #[serde(default)]
    pub export: Export,
    #[serde(default)]
    pub alerting: Alerting,
}

fn one() -> At<f64> {
    At::dflt(1.0)
}

/// A request is *good* when it succeeded and its TTFT and ITL are within these (AIPerf's and
/// vLLM bench's goodput: every objective must hold). The defaults are the benchmark plan's own
/// absolute objectives (`examples/seed-plan.yaml`: TTFT p99 ≤ 2 s, ITL p99 ≤ 100 ms at
/// concurrency 32), applied per request.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Goodput {
    #[serde(default = "goodput_ttft")]
    pub ttft: At<Dur>,
    #[serde(default = "goodput_itl")]
    pub itl: At<Dur>,
}

fn goodput_ttft() -> At<Dur> {
    At::dflt(Dur::secs(2))
}
fn goodput_itl() -> At<Dur> {
    At::dflt(Dur::millis(100))
}

impl Default for Goodput {
    fn default() -> Self {
        Goodput {
            ttft: goodput_ttft(),
            itl: goodput_itl(),
        }
    }
}

/// The probe stream (docs/DESIGN.md §5): the daemon sends one short request per target every
/// `interval`, all the time (between steps too), outside any step's concurrency, reported under
/// `workload="probe"`. Not scaled by `time_scale`; `bench` does not send it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeStreamConfig {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "probe_interval")]
    pub interval: At<Dur>,
    /// Prompt tokens of a probe.
    #[serde(default = "probe_isl")]
    pub isl: At<u32>,
    /// Output tokens of a probe: one is enough for TTFT and availability.
    #[serde(default = "probe_osl")]
    pub osl: At<u32>,
    /// Keep probing in quiet hours (`schedule.active`); an operator's pause always stops it.
    #[serde(default)]
    pub in_quiet_hours: bool,
}

fn probe_interval() -> At<Dur> {
    At::dflt(Dur::secs(20))
}
fn probe_isl() -> At<u32> {
    At::dflt(64)
}
fn probe_osl() -> At<u32> {
    At::dflt(1)
}

impl Default for ProbeStreamConfig {
    fn default() -> Self {
        ProbeStreamConfig {
            enabled: true,
            interval: probe_interval(),
            isl: probe_isl(),
            osl: probe_osl(),
            in_quiet_hours: false,
        }
    }
}

impl Goodput {
    /// The limits in seconds, as the step accumulators judge requests.
    pub fn limits(&self) -> crate::request::GoodputLimits {
        crate::request::GoodputLimits {
            ttft: self.ttft.0.as_secs_f64(),
            itl: self.itl.0.as_secs_f64(),
        }
    }
}
fn default_seed() -> u64 {
    0x11c4_2a2e
}

/// One serving deployment to measure: a URL, or an embedded simulator.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// The `target` label value.
    pub name: At<String>,
    pub serving_mode: ServingMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<At<String>>,
    /// `auto` = the first id listed by `GET /v1/models`.
    #[serde(default = "auto")]
    pub model: String,
    #[serde(default)]
    pub api: Api,
    #[serde(default)]
    pub dialect: Dialect,
    /// Overrides the dialect's preset of length-control fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length_control: Option<LengthControl>,
    /// Environment variable holding the API key (never logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<At<String>>,
    /// File holding the API key (e.g. a mounted Secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<At<String>>,
    /// Prometheus endpoints of the server's own metrics (vllm:, dynamo_, kvbm_).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_metrics: Vec<At<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour_usd: Option<At<f64>>,
    /// The most tokens one request may hold, prompt plus `max_tokens`, for a server whose
    /// `/v1/models` does not report its context length (or to lower it): the smaller of both
    /// bounds the requests; one above it is skipped, never sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_input_tokens: Option<At<u32>>,
    /// Instead of `url`: an embedded simulator started in-process on loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated: Option<At<super::sim::SimSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// A ceiling on the canary's load on this target.
    #[serde(default, skip_serializing_if = "Budget::is_empty")]
    pub budget: Budget,
    /// This target's goodput definition, instead of the top-level `goodput`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<Goodput>,
    /// Body fields and headers added to every request of this target.
    #[serde(default, skip_serializing_if = "RequestOptions::is_empty")]
    pub request: RequestOptions,
}

/// A ceiling on the canary's own load (docs/DESIGN.md §5), any subset of the three. The scheduler
/// skips a step that would need more streams than `max_inflight`, paces sends to `max_rps`, and
/// stops sending once `max_output_tokens_per_hour` output tokens went out in the last hour.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<At<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rps: Option<At<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens_per_hour: Option<At<u64>>,
}

impl Budget {
    pub fn is_empty(&self) -> bool {
        self.max_inflight.is_none()
            && self.max_rps.is_none()
            && self.max_output_tokens_per_hour.is_none()
    }
}

fn auto() -> String {
    "auto".to_owned()
}

impl TargetConfig {
    /// The length-control fields to send: the override, else the dialect's preset.
    pub fn length_control(&self) -> LengthControl {
        self.length_control
            .unwrap_or_else(|| self.dialect.length_control())
    }
}

/// TLS to a target: a private CA and an optional client certificate.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<At<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<At<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<At<String>>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Discovery {
    pub kubernetes: KubeDiscovery,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KubeDiscovery {
    /// Namespaces to watch; empty = the canary's own namespace.
    #[serde(default)]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default = "yes")]
    pub dynamo_graph_deployments: bool,
    /// Label selector on the DynamoGraphDeployments to measure (e.g. `team=inference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// Only DynamoGraphDeployments labelled or annotated `llm-canary.io/enabled: "true"` become
    /// targets; otherwise every one does except those set to `"false"`.
    #[serde(default)]
    pub opt_in: bool,
    /// A Kubernetes Event on the DynamoGraphDeployment (or the canary's Pod) per SLO state change.
    #[serde(default = "yes")]
    pub events: bool,
    /// Several replicas coordinate through a Lease: one sends traffic, or each a share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_election: Option<LeaderElection>,
    /// A ConfigMap (in the canary's namespace) for the SLO engine's state: baselines, pinned
    /// baselines, verdicts and held steps survive a reschedule, an upgrade and a failover. The
    /// leader writes it; absent = a file (`LLM_CANARY_STATE_FILE`, else the temp directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_configmap: Option<At<String>>,
    /// A PrometheusRule (in the canary's namespace) that the leader keeps equal to
    /// `llm-canary rules` for the config in force, rewritten after every reload: no stale rules
    /// after an SLO changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus_rule: Option<ManagedRule>,
    /// The canary's own Deployment (in its namespace): its annotation `llm-canary.io/paused:
    /// "true"` pauses the traffic of every replica without a restart, and removing it (or
    /// `"false"`) resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_annotation_on: Option<At<String>>,
}

/// The PrometheusRule the daemon keeps.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ManagedRule {
    pub name: At<String>,
    /// Labels on the object (kube-prometheus-stack selects rules by its `release` label).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

fn yes() -> bool {
    true
}

/// Leader election over a `coordination.k8s.io/v1` Lease.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LeaderElection {
    #[serde(default = "lease_name")]
    pub lease_name: String,
    /// Namespace of the Lease; absent = the canary's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// How long a lease holds without renewal; a replica that cannot renew stops sending
    /// before this runs out.
    #[serde(default = "lease_duration")]
    pub lease_duration: At<Dur>,
    /// Every replica sends traffic to a share of the targets instead of one replica to all.
    #[serde(default)]
    pub sharding: bool,
}

fn lease_name() -> String {
    "llm-canary".to_owned()
}
fn lease_duration() -> At<Dur> {
    At::dflt(Dur::secs(15))
}

/// How the client talks to targets.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    #[serde(default = "connect_timeout")]
    pub connect_timeout: At<Dur>,
    /// Whole-request limit; a request still running then counts as `timeout`. The default fits
    /// the default step (120 s): a request can never outlive its step's drain anyway.
    #[serde(default = "request_timeout")]
    pub request_timeout: At<Dur>,
    /// From the send to the first token: a server that accepts and then stays silent (or sends
    /// only its headers) fails here, as `timeout`, instead of at the step's end.
    #[serde(default = "first_token_timeout")]
    pub first_token_timeout: At<Dur>,
    /// The longest silence inside a stream once tokens flow: a stream that stalls fails here, as
    /// `timeout`, with when it stalled.
    #[serde(default = "stall_timeout")]
    pub stall_timeout: At<Dur>,
    /// How long an idle kept-alive connection stays open for reuse. Keep it below the idle
    /// timeout of any proxy or load balancer in front of the target (e.g. 60 s on a cloud load
    /// balancer), so the canary never reuses a connection the other side is closing.
    #[serde(default = "pool_idle_timeout")]
    pub pool_idle_timeout: At<Dur>,
    /// Largest SSE line or event accepted from a server, in bytes.
    #[serde(default = "max_event_bytes")]
    pub max_event_bytes: At<u64>,
    /// A header on every request (`Name: value`) so the serving side (its metrics, logs,
    /// autoscalers) can tell the canary's traffic from users'; `""` sends none.
    #[serde(default = "marker_header")]
    pub marker_header: At<String>,
    /// The OpenAI `user` field of every request body, for the same purpose; `""` sends none.
    #[serde(default = "marker_user")]
    pub user: At<String>,
}

/// The default traffic marker (docs/DESIGN.md §4).
pub const DEFAULT_MARKER_HEADER: &str = "X-Canary: llm-canary";
pub const DEFAULT_MARKER_USER: &str = "llm-canary";
/// How long an idle kept-alive connection is kept unless `client.pool_idle_timeout` says.
pub const DEFAULT_POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

fn connect_timeout() -> At<Dur> {
    At::dflt(Dur::secs(5))
}
fn request_timeout() -> At<Dur> {
    At::dflt(Dur::secs(120))
}
fn first_token_timeout() -> At<Dur> {
    At::dflt(Dur::secs(60))
}
fn stall_timeout() -> At<Dur> {
    At::dflt(Dur::secs(30))
}
fn pool_idle_timeout() -> At<Dur> {
    At::dflt(Dur(DEFAULT_POOL_IDLE_TIMEOUT))
}
fn max_event_bytes() -> At<u64> {
    At::dflt(1 << 20)
}
fn marker_header() -> At<String> {
    At::dflt(DEFAULT_MARKER_HEADER.to_owned())
}
fn marker_user() -> At<String> {
    At::dflt(DEFAULT_MARKER_USER.to_owned())
}

/// Why `client.marker_header` is not a header the client can send.
#[derive(Debug, Error)]
pub enum MarkerError {
    #[error("write `Name: value`, e.g. `X-Canary: llm-canary`")]
    NoColon,
    #[error("`{0}` is not a header name")]
    Name(String),
    #[error("`{0}` is set by the client itself")]
    Reserved(http::HeaderName),
    #[error("the value has characters a header cannot carry")]
    Value,
}

impl ClientConfig {
    /// `marker_header` as a header name and value; `None` when it is `""`.
    pub fn marker(&self) -> Result<Option<(http::HeaderName, http::HeaderValue)>, MarkerError> {
        let text = self.marker_header.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let Some((name, value)) = text.split_once(':') else {
            return Err(MarkerError::NoColon);
        };
        let name = http::HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| MarkerError::Name(name.trim().to_owned()))?;
        // The headers the client sets itself, which a marker must not replace.
        if super::request::owned_header(name.as_str()).is_some() {
            return Err(MarkerError::Reserved(name));
        }
        let value = http::HeaderValue::from_str(value.trim()).map_err(|_| MarkerError::Value)?;
        Ok(Some((name, value)))
    }

    /// `user` when it is not `""`.
    pub fn marker_user(&self) -> Option<&str> {
        Some(self.user.as_str()).filter(|u| !u.is_empty())
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: connect_timeout(),
            request_timeout: request_timeout(),
            first_token_timeout: first_token_timeout(),
            stall_timeout: stall_timeout(),
            pool_idle_timeout: pool_idle_timeout(),
            max_event_bytes: max_event_bytes(),
            marker_header: marker_header(),
            user: marker_user(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pairing {
    /// Every target gets the same prompts at the same time.
    #[default]
    Simultaneous,
    /// Targets are driven one after another with the same prompts.
    Sequential,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    #[serde(default)]
    pub pairing: Pairing,
    /// Workload order of one cycle; default: every configured workload in the document's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cycle: Vec<At<String>>,
    /// How long requests still in flight at a step's end may finish before they count as `timeout`.
    #[serde(default = "drain_grace")]
    pub drain_grace: At<Dur>,
    /// A step whose schedule lag p99 exceeds this is marked degraded (it measured the canary).
    #[serde(default = "max_lag_p99")]
    pub max_lag_p99: At<Dur>,
    /// Pause between cycles.
    #[serde(default = "s0")]
    pub cycle_pause: At<Dur>,
    /// When traffic may be sent; absent = always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<ActiveWindows>,
    /// Start with traffic paused (an operator resumes it, or a reload with `false`).
    #[serde(default)]
    pub paused: bool,
}

/// The times traffic may be sent (quiet hours are the rest), in one time zone.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveWindows {
    /// An IANA time zone (`Europe/Berlin`, `America/New_York`); default UTC.
    #[serde(default = "utc")]
    pub time_zone: At<String>,
    pub windows: Vec<Window>,
}

fn utc() -> At<String> {
    At::dflt("UTC".to_owned())
}

/// One window: on each of `days`, from `from` to `to` local time; `to` at or before `from`
/// ends on the next day (`22:00`-`06:00`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// `mon` ... `sun`; absent = every day.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<At<String>>,
    /// `HH:MM`; default `00:00`.
    #[serde(default = "midnight")]
    pub from: At<String>,
    /// `HH:MM` (`24:00` = the end of the day); default `24:00`.
    #[serde(default = "end_of_day")]
    pub to: At<String>,
}

fn midnight() -> At<String> {
    At::dflt("00:00".to_owned())
}
fn end_of_day() -> At<String> {
    At::dflt("24:00".to_owned())
}

fn drain_grace() -> At<Dur> {
    At::dflt(Dur::secs(30))
}
fn max_lag_p99() -> At<Dur> {
    At::dflt(Dur::millis(50))
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            pairing: Pairing::default(),
            cycle: Vec::new(),
            drain_grace: drain_grace(),
            max_lag_p99: max_lag_p99(),
            cycle_pause: s0(),
            active: None,
            paused: false,
        }
    }
}

/// An alert's `severity` label, as kube-prometheus-stack's Alertmanager routes them. `page` and
/// `ticket` are accepted as the older names of `critical` and `warning`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    #[serde(alias = "page")]
    Critical,
    #[default]
    #[serde(alias = "ticket")]
    Warning,
    Info,
}

impl Severity {
    /// The `severity` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// Which steps an `expr` SLO reads, by whether the step was **saturated** (an open-loop step
/// whose server fell behind the arrivals, docs/METRICS.md "Saturation"): every step, those that
/// were not (the server's latency within its capacity), or only those that were (how it
/// behaves past it). Closed-loop steps are never saturated.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SaturatedSteps {
    #[default]
    Include,
    Exclude,
    Only,
}

impl SaturatedSteps {
    pub fn as_str(self) -> &'static str {
        match self {
            SaturatedSteps::Include => "include",
            SaturatedSteps::Exclude => "exclude",
            SaturatedSteps::Only => "only",
        }
    }

    /// Whether a step that was (or was not) saturated is read.
    pub fn accepts(self, saturated: bool) -> bool {
        match self {
            SaturatedSteps::Include => true,
            SaturatedSteps::Exclude => !saturated,
            SaturatedSteps::Only => saturated,
        }
    }
}

/// What every generated alert carries, so Alertmanager can route it.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Alerting {
    /// Labels on every alert (e.g. `cluster`, `team`); an SLO's own `labels` win.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, At<String>>,
    /// Where runbooks live: an alert's `runbook_url` is this plus the page and anchor of the
    /// project's docs it names (`SLO.md#when-an-slo-fails`); absent = `docs/` of the project.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook_base_url: Option<At<String>>,
}

/// One SLO: a comparison expression (`expr`) or a burn-rate objective (`objective` + `sli`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SloConfig {
    pub name: At<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expr: Option<At<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<At<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sli: Option<At<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<At<Dur>>,
    #[serde(default = "slo_window")]
    pub window: At<Dur>,
    #[serde(default = "min_samples")]
    pub min_samples: At<u64>,
    #[serde(default = "s0", rename = "for")]
    pub for_: At<Dur>,
    #[serde(default)]
    pub severity: Severity,
    /// Which steps an `expr` SLO reads by saturation (burn-rate SLOs count every request).
    #[serde(default)]
    pub saturated_steps: At<SaturatedSteps>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook_url: Option<String>,
    /// Labels on this SLO's alerts (over `alerting.labels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, At<String>>,
    /// Annotations on this SLO's alerts (over the generated ones of the same name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

fn slo_window() -> At<Dur> {
    At::dflt(Dur::secs(30 * 60))
}
fn min_samples() -> At<u64> {
    At::dflt(100)
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Export {
    #[serde(default = "listen")]
    pub listen: At<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp: Option<Otlp>,
    /// How often the servers' own `/metrics` are scraped.
    #[serde(default = "s15")]
    pub server_metrics_interval: At<Dur>,
    /// Whether the endpoints that change the daemon's state are served (`POST /-/reload`,
    /// `/-/pause`, `/-/resume`, baseline pins), as Prometheus' `--web.enable-lifecycle`: off by
    /// default, so a reachable port cannot steer the canary.
    #[serde(default, alias = "reload_endpoint")]
    pub lifecycle: bool,
    /// A file holding a token (e.g. a mounted Secret) that those endpoints then require as
    /// `Authorization: Bearer <token>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle_token_file: Option<At<String>>,
    /// `standard` (a few thousand series for the seed plan) or `high` (every request label,
    /// ~124 buckets per histogram: tens of thousands), docs/METRICS.md "Series budget".
    #[serde(default)]
    pub resolution: Resolution,
}

/// How finely `/metrics` exports the latencies (docs/METRICS.md, "Series budget").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// A few hundred series per target: a dozen 1-2.5-5 buckets per histogram, histograms and
    /// counters by step, the step gauges' p50 and p99 (with confidence intervals on every step).
    #[default]
    Standard,
    /// Everything by request labels (turn, ISL bucket), ~124 buckets per histogram, p50, p90 and
    /// p99 with confidence intervals everywhere: tens of thousands of series.
    High,
}

fn listen() -> At<String> {
    At::dflt("127.0.0.1:9464".to_owned())
}
fn s15() -> At<Dur> {
    At::dflt(Dur::secs(15))
}

impl Default for Export {
    fn default() -> Self {
        Export {
            listen: listen(),
            otlp: None,
            server_metrics_interval: s15(),
            lifecycle: false,
            lifecycle_token_file: None,
            resolution: Resolution::Standard,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum OtlpProtocol {
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    #[serde(rename = "grpc")]
    Grpc,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Otlp {
    pub endpoint: At<String>,
    #[serde(default)]
    pub protocol: At<OtlpProtocol>,
    #[serde(default = "s15")]
    pub interval: At<Dur>,
    /// One span per request, with TTFT as an event.
    #[serde(default)]
    pub spans: bool,
}
