//! The targets of a run: the one place that starts the embedded simulators and resolves each
//! configured (or discovered) target into what the runner sends to: its URL, TLS client, model
//! (`auto` asks `/v1/models`) and API key. `run`, `bench` and discovery all start here.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::client::{ApiKey, ClientConfig, Endpoint, StreamClient};
use crate::config::{Config, TargetConfig};
use crate::model::Sink;
use crate::schedule::{Recorder, Runner, Target, TargetSet};
use crate::scrape::ScrapeTarget;
use crate::sim::SimHandle;
use crate::workload::prompt::OverheadLearner;
use crate::workload::tokenizer::TokenModel;

/// Errors of starting or resolving a target.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("target `{target}`: {message}")]
    Target { target: String, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("client: {0}")]
    Client(#[from] crate::client::ClientError),
}

impl TargetError {
    /// A problem of the configured target `t`.
    fn of(t: &TargetConfig, message: String) -> TargetError {
        TargetError::Target {
            target: t.name.value.clone(),
            message,
        }
    }
}

/// Everything `run` and `bench` need to send traffic: the started simulators and the targets.
pub struct Deployment {
    pub targets: Vec<Arc<Target>>,
    pub sims: Vec<SimHandle>,
    pub client: StreamClient,
    pub tokens: Arc<TokenModel>,
    /// For each target, the index of its embedded simulator in `sims`.
    pub sim_of: Vec<Option<usize>>,
    /// For each target, the index of its entry in the config's `targets`.
    pub config_index: Vec<usize>,
}

/// A configured target that could not be started or resolved (its model lookup failed, its key
/// or TLS files could not be read), kept aside so the others run.
#[derive(Debug, Clone)]
pub struct TargetFailure {
    /// Its index in the config's `targets`.
    pub config_index: usize,
    pub name: String,
    pub error: String,
}

impl Deployment {
    /// Starts the embedded simulators and resolves every target (model `auto`, API keys); an
    /// error if any target fails.
    pub async fn start(cfg: &Config, base_dir: &Path) -> Result<Deployment, TargetError> {
        let (deployment, failed) =
            Self::start_partial(cfg, base_dir, MODEL_LOOKUP_ATTEMPTS).await?;
        match failed.into_iter().next() {
            None => Ok(deployment),
            Some(f) => {
                deployment.stop().await;
                Err(TargetError::Target {
                    target: f.name,
                    message: f.error,
                })
            }
        }
    }

    /// Starts and resolves every target at once, each on its own (model `auto` asked at most
    /// `attempts` times): a target that fails is returned aside and never holds back or stops
    /// the others. An error only for what every target needs (the tokenizer, the client).
    pub async fn start_partial(
        cfg: &Config,
        base_dir: &Path,
        attempts: u32,
    ) -> Result<(Deployment, Vec<TargetFailure>), TargetError> {
        // Read once: `check`'s validation of a dataset read it already.
        let tokens = TokenModel::load_shared(
            cfg.tokenizer
                .as_ref()
                .map(|t| base_dir.join(t.as_str()))
                .as_deref(),
        )
        .map_err(|e| TargetError::Tokenizer(e.to_string()))?;
        let client = stream_client(cfg)?;
        let client = if tokens.is_exact() {
            client.with_token_counter(tokens.clone())
        } else {
            client
        };
        let started = futures_util::future::join_all(
            cfg.targets
                .iter()
                .map(|t| start_target_with(t, base_dir, &client, attempts)),
        )
        .await;
        let mut sims = Vec::new();
        let mut targets = Vec::new();
        let mut sim_of = Vec::new();
        let mut config_index = Vec::new();
        let mut failed = Vec::new();
        for (i, (t, result)) in cfg.targets.iter().zip(started).enumerate() {
            match result {
                Ok((target, sim)) => {
                    targets.push(target);
                    config_index.push(i);
                    sim_of.push(sim.map(|s| {
                        sims.push(s);
                        sims.len() - 1
                    }));
                }
                Err(e) => {
                    tracing::error!(target = %*t.name, error = %e, "target not started; the others run without it");
                    failed.push(TargetFailure {
                        config_index: i,
                        name: t.name.value.clone(),
                        error: e.to_string(),
                    });
                }
            }
        }
        let deployment = Deployment {
            targets,
            sims,
            client,
            tokens,
            sim_of,
            config_index,
        };
        Ok((deployment, failed))
    }

    /// How `run`, `bench` and `bench --search` put their sending together, one way: the runner
    /// over these targets with the traffic budget of `cfg`, and a recorder that hands every
    /// finished request and step to `sinks`, in this order. Every step then runs through a
    /// `Scheduler`, which admits it against that budget. Each run draws its own salt, so caches
    /// warmed by earlier runs cannot inflate hit ratios.
    pub fn assemble(&self, cfg: &Config, sinks: Vec<Arc<dyn Sink>>) -> Arc<Runner> {
        Arc::new(self.runner(cfg, Arc::new(Recorder::new(sinks)), rand::random()))
    }

    /// These targets with their servers' metrics endpoints (as configured, and the embedded
    /// simulators'), as a scheduler reads them.
    pub fn target_set(&self, cfg: &Config) -> TargetSet {
        let scrape = self
            .config_index
            .iter()
            .map(|&i| &cfg.targets[i])
            .zip(&self.targets)
            .filter_map(|(c, t)| ScrapeTarget::for_target(c, t.endpoint.url()))
            .collect();
        TargetSet {
            targets: self.targets.clone(),
            scrape,
        }
    }

    /// The step runner for `cfg` over these targets; `run_salt` keeps earlier runs' caches out.
    pub fn runner(&self, cfg: &Config, recorder: Arc<Recorder>, run_salt: u64) -> Runner {
        Runner {
            targets: self.targets.clone(),
            client: self.client.clone(),
            tokens: Arc::clone(&self.tokens),
            overhead: Arc::new(OverheadLearner::new()),
            recorder,
            seed: cfg.seed,
            run_salt,
            drain_grace: cfg.schedule.drain_grace.0,
            max_lag_p99: cfg.schedule.max_lag_p99.0,
            pairing: cfg.schedule.pairing,
            budget: Arc::new(crate::schedule::budget::Budget::of(cfg)),
            goodput: cfg.goodput.limits(),
            endpoints: Default::default(),
        }
    }

    /// Stops the embedded simulators.
    pub async fn stop(self) {
        for sim in self.sims {
            sim.shutdown().await;
        }
    }
}

/// Says, once at warn level, when `cfg`'s plan needs more file descriptors than the process
/// may open now (its soft limit, raised to the hard one at start), with `port` connections to
/// the process's own HTTP port.
pub fn warn_on_descriptors(cfg: &Config, port: u64) {
    let need = crate::schedule::cost::descriptors(cfg, port).total();
    if let Some(text) = crate::fds::shortfall(need, crate::fds::Limits::now().soft) {
        tracing::warn!("{text}");
    }
}

/// The measurement client of `cfg`: its timeouts and traffic marker (without a token counter).
pub fn stream_client(cfg: &Config) -> Result<StreamClient, TargetError> {
    Ok(StreamClient::new(ClientConfig {
        connect_timeout: cfg.client.connect_timeout.0,
        request_timeout: cfg.client.request_timeout.0,
        // Capped by the whole-request limit (`check` refuses a written one above it).
        first_token_timeout: cfg
            .client
            .first_token_timeout
            .0
            .min(cfg.client.request_timeout.0),
        stall_timeout: cfg.client.stall_timeout.0.min(cfg.client.request_timeout.0),
        max_event_bytes: *cfg.client.max_event_bytes as usize,
        pool_idle_timeout: cfg.client.pool_idle_timeout.0,
        marker: crate::client::Marker {
            // Validated with the config.
            header: cfg.client.marker().ok().flatten(),
            user: cfg.client.marker_user().map(str::to_owned),
        },
        ..ClientConfig::default()
    })?)
}

/// Where `t`'s requests go: its `url`, or its embedded simulator, started now on loopback.
pub async fn serve(t: &TargetConfig) -> Result<(String, Option<SimHandle>), TargetError> {
    let fail = |message: String| TargetError::of(t, message);
    match (&t.url, &t.simulated) {
        (Some(u), _) => Ok((u.value.clone(), None)),
        (None, Some(spec)) => {
            let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
            let sim = crate::sim::start(spec.value.clone(), t.serving_mode, loopback)
                .await
                .map_err(|e| fail(e.to_string()))?;
            tracing::info!(target = %*t.name, mode = t.serving_mode.as_str(), url = %sim.base_url(), "simulator started");
            Ok((sim.base_url(), Some(sim)))
        }
        (None, None) => Err(fail("no url".into())),
    }
}

/// Starts `t`'s embedded simulator (when it has one) and resolves it.
pub async fn start_target(
    t: &TargetConfig,
    base_dir: &Path,
    client: &StreamClient,
) -> Result<(Arc<Target>, Option<SimHandle>), TargetError> {
    start_target_with(t, base_dir, client, MODEL_LOOKUP_ATTEMPTS).await
}

/// [`start_target`], asking `/v1/models` at most `attempts` times.
pub async fn start_target_with(
    t: &TargetConfig,
    base_dir: &Path,
    client: &StreamClient,
    attempts: u32,
) -> Result<(Arc<Target>, Option<SimHandle>), TargetError> {
    let (url, sim) = serve(t).await?;
    match resolve_at(t, &url, base_dir, client, attempts).await {
        Ok(target) => Ok((Arc::new(target), sim)),
        Err(e) => {
            if let Some(sim) = sim {
                sim.shutdown().await;
            }
            Err(e)
        }
    }
}

/// A target with a `url` (configured or discovered) as the runner sees it: model `auto`
/// resolved, API key loaded.
pub async fn resolve_target(
    t: &TargetConfig,
    base_dir: &Path,
    client: &StreamClient,
) -> Result<Target, TargetError> {
    let url = t
        .url
        .as_ref()
        .map(|u| u.value.clone())
        .ok_or_else(|| TargetError::Target {
            target: t.name.value.clone(),
            message: "no url".into(),
        })?;
    resolve_at(t, &url, base_dir, client, MODEL_LOOKUP_ATTEMPTS).await
}

/// `GET /v1/models` attempts for model `auto` (2 s apart): a deployment still starting answers
/// within about half a minute.
pub const MODEL_LOOKUP_ATTEMPTS: u32 = 15;

/// Longest one `GET /v1/models` may take.
const MODEL_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A target at `url` as the runner sees it, asking `/v1/models` (for model `auto`) at most
/// `attempts` times: the preflight asks once, so a stopped target is reported at once.
pub async fn resolve_at(
    t: &TargetConfig,
    url: &str,
    base_dir: &Path,
    client: &StreamClient,
    attempts: u32,
) -> Result<Target, TargetError> {
    let fail = |message: String| TargetError::of(t, message);
    // The target's own TLS (private CA, client certificate), also for the model lookup.
    let tls = match &t.tls {
        Some(tls) => {
            let file = |f: &Option<crate::config::At<String>>| {
                f.as_ref().map(|f| base_dir.join(f.as_str()))
            };
            let files = crate::client::TlsFiles {
                ca_file: file(&tls.ca_file),
                cert_file: file(&tls.cert_file),
                key_file: file(&tls.key_file),
            };
            Some(crate::client::TargetTls::from_files(&files).map_err(|e| fail(e.to_string()))?)
        }
        None => None,
    };
    let key = api_key(t, base_dir)?;
    let lookup = ModelLookup {
        tls: tls.clone(),
        key: key.as_ref(),
        marker: &client.config().marker,
        attempts,
    };
    let frontend = match t.dialect {
        crate::config::Dialect::Dynamo => Some(frontend_gauges(t, url, &lookup).await),
        _ => None,
    };
    let (model, listed_context) = resolve_model(t, url, lookup).await?;
    let block_size = frontend.as_ref().and_then(|text| {
        gauge_of(text, "dynamo_frontend_model_kv_cache_block_size", &model)
            .and_then(|v| u32::try_from(v).ok())
    });
    // The frontend's gauge says it where its model list does not.
    let reported = listed_context.or_else(|| {
        frontend
            .as_ref()
            .and_then(|text| gauge_of(text, "dynamo_frontend_model_context_length", &model))
    });
    let max_context_tokens = context_bound(reported, t.max_input_tokens.as_ref().map(|m| **m));
    match max_context_tokens {
        Some(bound) => {
            tracing::info!(target = %*t.name, reported = ?reported, max_input_tokens = ?t.max_input_tokens.as_ref().map(|m| **m), bound, "requests above the context length are skipped");
        }
        None => {
            tracing::debug!(target = %*t.name, "no context length known; no request is bounded")
        }
    }
    let mut endpoint = Endpoint::new(url, t.api, model, t.dialect)?
        .with_length_control(t.length_control())
        .with_nvext(t.dialect.supports_nvext())
        .with_kv_block_size(block_size);
    if let Some(tls) = tls {
        endpoint = endpoint.with_tls(tls)?;
    }
    if let Some(key) = &key {
        endpoint = endpoint.with_api_key(key)?;
    }
    endpoint = endpoint.with_request(&t.request)?;
    // The model id is shown (`/api/v1/status`, the probe): a server that lists the key it was
    // sent as its model would have it shown.
    if t.model == "auto" && endpoint.secrets().found_in(endpoint.model()) {
        return Err(fail(format!(
            "{} lists a model id that holds the target's credentials; set `model:` on the target",
            crate::config::display_url_text(url)
        )));
    }
    Ok(Target {
        name: t.name.value.clone(),
        mode: t.serving_mode,
        endpoint,
        cost_per_hour_usd: t.cost_per_hour_usd.as_ref().map(|c| c.value),
        goodput: t.goodput.as_ref().map(|g| g.limits()),
        max_context_tokens,
        stream: t.request.stream.as_ref().is_none_or(|s| **s),
    })
}

/// Largest frontend `/metrics` answer read for its model gauges.
const FRONTEND_METRICS_MAX_BYTES: usize = 4 << 20;

/// The Dynamo frontend's `/metrics` text (its `dynamo_frontend_model_*` gauges say the engine's
/// KV block size and context length), or empty when it does not answer: the gauges refine
/// measurements, and a target without them still runs.
async fn frontend_gauges(t: &TargetConfig, base: &str, lookup: &ModelLookup<'_>) -> String {
    let url = format!("{}/metrics", base.trim_end_matches('/'));
    let mut builder = crate::client::http_client_builder();
    if let Some(tls) = &lookup.tls {
        builder = tls.reqwest_builder(builder);
    }
    let Ok(http) = builder.build() else {
        return String::new();
    };
    let mut request = http.get(&url).timeout(MODEL_LOOKUP_TIMEOUT);
    if let Some(value) = lookup.key.and_then(|key| key.authorization().ok()) {
        request = request.header(reqwest::header::AUTHORIZATION, value);
    }
    let mut text = Vec::new();
    match request.send().await {
        Ok(mut r) if r.status().is_success() => {
            while let Ok(Some(chunk)) = r.chunk().await {
                if text.len() + chunk.len() > FRONTEND_METRICS_MAX_BYTES {
                    break;
                }
                text.extend_from_slice(&chunk);
            }
        }
        Ok(r) => tracing::debug!(target = %*t.name, status = %r.status(), "no frontend /metrics"),
        Err(e) => tracing::debug!(target = %*t.name, error = %e, "no frontend /metrics"),
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// The value of gauge `name` for `model` in Prometheus text (else its first series: a frontend
/// serving one model under another name), as a whole positive number.
fn gauge_of(text: &str, name: &str, model: &str) -> Option<u64> {
    let label = format!("model=\"{model}\"");
    let mut any = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let value = rest.rsplit(' ').next()?.parse::<f64>().ok();
        let value = value.filter(|v| v.is_finite() && *v >= 1.0 && v.fract() == 0.0);
        let Some(value) = value.map(|v| v as u64) else {
            continue;
        };
        if rest.contains(&label) {
            return Some(value);
        }
        any.get_or_insert(value);
    }
    any
}

/// Largest `GET /v1/models` answer read when resolving model `auto`.
const MODEL_LIST_MAX_BYTES: usize = 1 << 20;
/// Longest model id accepted from a server.
const MODEL_ID_MAX_BYTES: usize = 512;

/// How `GET /v1/models` is asked: as the target's requests are (its TLS, its API key,
/// the canary's marker).
struct ModelLookup<'a> {
    tls: Option<std::sync::Arc<crate::client::TargetTls>>,
    key: Option<&'a ApiKey>,
    marker: &'a crate::client::Marker,
    attempts: u32,
}

/// The model to ask for (as configured, or the first id of `GET /v1/models` for `auto`) and
/// the context length the list reports for it. A named model asks the list once, and a server
/// that does not answer it (some have no `/v1/models`) only leaves the context length unknown.
async fn resolve_model(
    t: &TargetConfig,
    base: &str,
    lookup: ModelLookup<'_>,
) -> Result<(String, Option<u64>), TargetError> {
    let fail = |message: String| TargetError::of(t, message);
    if t.model != "auto" {
        let context = match list_models(t, base, &lookup, 1).await {
            Ok(body) => context_of(&body, &t.model),
            Err(e) => {
                tracing::debug!(target = %*t.name, error = %e, "no model list; the context length is not known");
                None
            }
        };
        return Ok((t.model.clone(), context));
    }
    let shown =
        crate::config::display_url_text(&format!("{}/v1/models", base.trim_end_matches('/')));
    let body = list_models(t, base, &lookup, lookup.attempts).await?;
    let id = body["data"][0]["id"]
        .as_str()
        .ok_or_else(|| fail(format!("{shown} lists no models; set `model:` on the target to the served model name instead of `auto`")))?;
    // The id goes into every request body and `/api/v1/status`: refuse what no real
    // model name looks like rather than carry it around.
    if id.is_empty() || id.len() > MODEL_ID_MAX_BYTES || id.chars().any(char::is_control) {
        return Err(fail(format!(
            "{shown} lists a model id that is empty, over {MODEL_ID_MAX_BYTES} bytes or has control characters; set `model:` on the target"
        )));
    }
    Ok((id.to_owned(), context_of(&body, id)))
}

/// The fields of a `/v1/models` entry that say its context length (prompt and output tokens
/// together): vLLM's `max_model_len`, Dynamo's frontend's `context_window`.
const CONTEXT_FIELDS: [&str; 2] = ["max_model_len", "context_window"];

/// The context length `GET /v1/models` (`body`) reports for `model`: its entry's, else the only
/// entry's (a server serving one model under another name); `None` when it says none.
fn context_of(body: &serde_json::Value, model: &str) -> Option<u64> {
    let data = body["data"].as_array()?;
    let entry = data
        .iter()
        .find(|m| m["id"].as_str() == Some(model))
        .or_else(|| (data.len() == 1).then(|| &data[0]))?;
    CONTEXT_FIELDS
        .iter()
        .find_map(|f| entry[*f].as_u64())
        .filter(|&n| n > 0)
}

/// The bound on a request's prompt plus output tokens at `t`: the smaller of the context length
/// its server reports and its `max_input_tokens`; `None` when neither says one.
pub fn context_bound(reported: Option<u64>, configured: Option<u32>) -> Option<u64> {
    match (reported, configured.map(u64::from)) {
        (Some(r), Some(c)) => Some(r.min(c)),
        (r, c) => r.or(c),
    }
}

/// `GET /v1/models` as JSON, asked at most `attempts` times.
async fn list_models(
    t: &TargetConfig,
    base: &str,
    lookup: &ModelLookup<'_>,
    attempts: u32,
) -> Result<serde_json::Value, TargetError> {
    let fail = |message: String| TargetError::of(t, message);
    let url = format!("{}/v1/models", base.trim_end_matches('/'));
    // What the messages show: the same URL without any credentials in it.
    let shown = crate::config::display_url_text(&url);
    let mut builder = crate::client::http_client_builder();
    if let Some(tls) = &lookup.tls {
        builder = tls.reqwest_builder(builder);
    }
    let http = builder.build().map_err(|e| fail(e.to_string()))?;
    // A deployment that is still starting answers after a while.
    let mut last = String::new();
    for attempt in 0..attempts.max(1) {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let mut request = http.get(&url).timeout(MODEL_LOOKUP_TIMEOUT);
        if let Some(key) = lookup.key {
            let value = key.authorization().map_err(|e| fail(e.to_string()))?;
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        if let Some((name, value)) = &lookup.marker.header {
            request = request.header(name.clone(), value.clone());
        }
        match request.send().await {
            Ok(mut r) if r.status().is_success() => {
                // The server decides the size: read at most MODEL_LIST_MAX_BYTES.
                let mut bytes = Vec::new();
                while let Some(chunk) = r
                    .chunk()
                    .await
                    .map_err(|e| fail(format!("{shown}: {}", crate::client::error_text(&e))))?
                {
                    if bytes.len() + chunk.len() > MODEL_LIST_MAX_BYTES {
                        return Err(fail(format!(
                            "{shown}: the model list is over {MODEL_LIST_MAX_BYTES} bytes; set `model:` on the target"
                        )));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                return serde_json::from_slice(&bytes).map_err(|e| {
                    fail(format!("{shown}: not JSON ({e}); set `model:` on the target to the served model name instead of `auto`"))
                });
            }
            // Up, but unable to list its models (`transformers serve` answers 500 when it serves
            // a model by path): waiting would not help. Only gateway and overload statuses of a
            // deployment still starting are retried.
            Ok(r) if !matches!(r.status().as_u16(), 429 | 502..=504) => {
                return Err(fail(format!(
                    "{shown} answered {}; set `model:` on the target to the served model name instead of `auto`",
                    r.status()
                )));
            }
            Ok(r) => last = format!("{shown} answered {}", r.status()),
            Err(e) => last = format!("{shown}: {}", crate::client::error_text(&e)),
        }
    }
    Err(fail(format!(
        "{last}; set `model:` on the target to skip the lookup"
    )))
}

fn api_key(t: &TargetConfig, base_dir: &Path) -> Result<Option<ApiKey>, TargetError> {
    if let Some(var) = &t.api_key_env {
        return std::env::var(var.as_str())
            .map(|k| Some(ApiKey::new(k.trim())))
            .map_err(|_| {
                TargetError::of(
                    t,
                    format!("environment variable `{}` (api_key_env) is not set", **var),
                )
            });
    }
    if let Some(file) = &t.api_key_file {
        let path = base_dir.join(file.as_str());
        return crate::files::read_text(&path, crate::files::MAX_SECRET_BYTES)
            .map(|k| Some(ApiKey::new(k.trim())))
            .map_err(|e| TargetError::of(t, format!("api_key_file {}: {e}", path.display())));
    }
    Ok(None)
}

/// With a real tokenizer the client counts the tokens of every chunk instead of assuming one.
impl crate::client::TokenCounter for TokenModel {
    fn count(&self, text: &str) -> usize {
        TokenModel::count(self, text)
    }
}

#[cfg(test)]
mod tests {
    use super::{context_bound, context_of, gauge_of};
    use serde_json::json;

    #[test]
    fn the_context_length_is_read_from_the_models_entry() {
        // vLLM reports `max_model_len` on each model object.
        let vllm = json!({"object": "list", "data": [
            {"id": "Qwen/Qwen3-0.6B", "object": "model", "max_model_len": 4096},
            {"id": "lora-a", "object": "model", "max_model_len": 2048}
        ]});
        assert_eq!(context_of(&vllm, "Qwen/Qwen3-0.6B"), Some(4096));
        assert_eq!(context_of(&vllm, "lora-a"), Some(2048));
        assert_eq!(context_of(&vllm, "served-as"), None, "not one of several");
        // Dynamo's frontend reports `context_window`, and leaves it out when unknown.
        let dynamo = json!({"object": "list", "data": [
            {"id": "tiny", "object": "model", "owned_by": "nvidia", "context_window": 32768}
        ]});
        assert_eq!(context_of(&dynamo, "tiny"), Some(32768));
        assert_eq!(context_of(&dynamo, "alias"), Some(32768), "the only entry");
        for body in [
            json!({"data": [{"id": "m"}]}),
            json!({"data": [{"id": "m", "max_model_len": 0}]}),
            json!({"data": [{"id": "m", "max_model_len": "4096"}]}),
            json!({"data": [{"id": "m", "max_model_len": -1}]}),
            json!({"data": []}),
            json!({"models": []}),
        ] {
            assert_eq!(context_of(&body, "m"), None, "{body}");
        }
    }

    #[test]
    fn the_bound_is_the_smaller_of_reported_and_configured() {
        assert_eq!(context_bound(None, None), None);
        assert_eq!(context_bound(Some(4096), None), Some(4096));
        assert_eq!(context_bound(None, Some(2048)), Some(2048));
        assert_eq!(context_bound(Some(4096), Some(2048)), Some(2048));
        assert_eq!(context_bound(Some(1024), Some(2048)), Some(1024));
    }

    #[test]
    fn the_frontends_model_gauges_are_read_for_the_model() {
        // As Dynamo 1.6.1's frontend writes them.
        let text = "# HELP dynamo_frontend_model_kv_cache_block_size KV cache block size\n\
                    # TYPE dynamo_frontend_model_kv_cache_block_size gauge\n\
                    dynamo_frontend_model_kv_cache_block_size{model=\"other\"} 16\n\
                    dynamo_frontend_model_kv_cache_block_size{model=\"tiny-qwen3\"} 64\n\
                    dynamo_frontend_model_kv_cache_block_size_total 3\n\
                    dynamo_frontend_model_context_length{model=\"tiny-qwen3\"} 32768\n";
        let block = "dynamo_frontend_model_kv_cache_block_size";
        assert_eq!(gauge_of(text, block, "tiny-qwen3"), Some(64));
        assert_eq!(
            gauge_of(text, block, "served-as"),
            Some(16),
            "the first series"
        );
        let context = "dynamo_frontend_model_context_length";
        assert_eq!(gauge_of(text, context, "tiny-qwen3"), Some(32768));
        assert_eq!(gauge_of("", block, "m"), None);
        assert_eq!(
            gauge_of(&format!("{block} 0\n{block} 2.5\n"), block, "m"),
            None
        );
    }
}
