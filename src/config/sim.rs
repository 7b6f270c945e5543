//! The schema of a target's `simulated:` block: [`SimSpec`] (the simulated deployment, its
//! hardware, model shape and timing profile) and [`FaultSpec`] (what goes wrong on purpose), strict
//! serde structs with a `validate` that lists every problem. The simulator (`crate::sim`) runs
//! what these describe; they live here because they are part of the config file.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The GPUs a pool can pretend to be (`crate::sim::profile::GPUS` holds their figures).
pub const GPU_NAMES: [&str; 3] = ["h200", "a100", "l40s"];

/// Timing profile names accepted by [`SimSpec::profile`].
pub const PROFILES: [&str; 7] = ["default", "h200", "a100", "l40s", "fast", "fixed", "table"];

/// One simulated serving deployment. The serving mode comes from the target, not from here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSpec {
    /// `default` (the H200 formula), `h200`/`a100`/`l40s` (every pool on that GPU), `fast` (zero
    /// delay), `fixed` (TTFT `fixed_ttft`, ITL `fixed_itl`) or `table` (`table`/`table_file`).
    pub profile: String,
    /// Inline measured profile for `profile: table`.
    pub table: Option<TimingTable>,
    /// Measured profile in a JSON or YAML file for `profile: table`.
    pub table_file: Option<PathBuf>,
    #[serde(with = "duration_text")]
    pub fixed_ttft: Duration,
    #[serde(with = "duration_text")]
    pub fixed_itl: Duration,
    /// Workers of an aggregated deployment.
    pub workers: u32,
    pub prefill_workers: u32,
    pub decode_workers: u32,
    /// Hardware of the aggregated workers.
    pub aggregated: PoolSpec,
    /// Hardware of the prefill workers.
    pub prefill: PoolSpec,
    /// Hardware of the decode workers.
    pub decode: PoolSpec,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Token budget of one pass.
    pub max_batched_tokens: u32,
    /// Cap on sequences running at once per worker.
    pub max_running: u32,
    /// KV handoff fixed cost in disaggregated mode.
    #[serde(with = "duration_text")]
    pub handoff_overhead: Duration,
    /// Prefill → decode link bandwidth in gigabytes (not bits) per second.
    pub link_gbps: f64,
    /// Weight of the prefill blocks in the KV router's cost.
    pub overlap_weight: f64,
    /// Model id served on `/v1/models` and echoed in responses.
    pub model: String,
    /// The model's context length: reported as `max_model_len` on `/v1/models` (as vLLM does),
    /// and a completion whose prompt plus `max_tokens` is above it is answered 400 (as vLLM
    /// answers it); absent = unbounded and not reported.
    pub max_model_len: Option<u32>,
    /// KV footprint and weights; absent = the preset matching `model` (Qwen3-30B-A3B-FP8 if none).
    pub model_shape: Option<ModelShape>,
    pub cpu_tier: Option<TierSpec>,
    pub disk_tier: Option<TierSpec>,
    /// `tokenizer.json` (or its directory); absent = one token per word.
    pub tokenizer: Option<PathBuf>,
    /// Chance per output token of the simulated EOS once `min_tokens` are out (without
    /// `ignore_eos`).
    pub eos_probability: f64,
    /// Seed of every random choice (EOS positions, fault sampling).
    pub seed: u64,
    pub faults: FaultSpec,
    /// Run-to-run variability of the deployment's speed; absent = every pass as modelled.
    pub variability: Option<Variability>,
    /// Answer 400 to request fields the OpenAI API does not define (`min_tokens`, `ignore_eos`,
    /// `nvext`), as OpenAI's own API and strict gateways do.
    pub reject_unknown_fields: bool,
    /// Append one JSON line per completion request (its headers, `user` field and body without
    /// the prompt) to this file: what the serving side sees of the canary's traffic.
    pub request_log: Option<PathBuf>,
    /// Append one JSON line per finished completion to this file: its `x-request-id`, when the
    /// request arrived and when each token's chunk was handed to the connection, as
    /// CLOCK_MONOTONIC nanoseconds: the source of truth the product-path benchmark joins with the
    /// client's `requests.jsonl`.
    pub send_log: Option<PathBuf>,
    /// Hand every SSE event to the connection on its own (the role chunk, each token, the finish
    /// chunk, the usage chunk and `[DONE]`, each one HTTP chunk and one write), as vLLM's and
    /// Dynamo's frontends write them; by default the events already waiting share a write.
    pub write_per_event: bool,
    /// Stream the first this many output tokens of a chat completion as reasoning
    /// (`delta.reasoning_content`, as vLLM's reasoning parsers and Dynamo send a reasoning
    /// model's thinking), the rest as the answer (`delta.content`); 0 (the default) reasons none.
    pub reasoning_tokens: u32,
}

impl Default for SimSpec {
    fn default() -> Self {
        SimSpec {
            profile: "default".to_string(),
            table: None,
            table_file: None,
            fixed_ttft: Duration::from_millis(100),
            fixed_itl: Duration::from_millis(10),
            workers: 1,
            prefill_workers: 1,
            decode_workers: 1,
            aggregated: PoolSpec::default(),
            prefill: PoolSpec::default(),
            decode: PoolSpec::default(),
            block_size: 64,
            max_batched_tokens: 8192,
            max_running: 256,
            handoff_overhead: Duration::from_millis(5),
            link_gbps: 64.0,
            overlap_weight: 1.0,
            model: "Qwen/Qwen3-30B-A3B-FP8".to_string(),
            max_model_len: None,
            model_shape: None,
            cpu_tier: None,
            disk_tier: None,
            tokenizer: None,
            eos_probability: 0.002,
            seed: 0,
            faults: FaultSpec::default(),
            variability: None,
            reject_unknown_fields: false,
            request_log: None,
            send_log: None,
            write_per_event: false,
            reasoning_tokens: 0,
        }
    }
}

/// Hardware and price of one pool's workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolSpec {
    /// `h200`, `a100` or `l40s`; absent = the profile's GPU (H200 unless the profile names one).
    pub gpu: Option<String>,
    /// GPUs per worker (tensor parallel size).
    pub tp: u32,
    /// Price of one worker; absent = the GPU's list price × `tp`.
    pub cost_per_hour_usd: Option<f64>,
    /// KV capacity per worker in blocks; absent = derived from GPU memory minus weights.
    pub kv_blocks: Option<u64>,
}

impl Default for PoolSpec {
    fn default() -> Self {
        PoolSpec {
            gpu: None,
            tp: 1,
            cost_per_hour_usd: None,
            kv_blocks: None,
        }
    }
}

/// An offload tier below GPU memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierSpec {
    pub capacity_gb: f64,
    /// Transfer bandwidth to and from the GPU in gigabytes per second.
    pub bandwidth_gbps: f64,
}

impl SimSpec {
    /// The benchmark plan's deployments: aggregated = A100 × 4 (TP 4) workers; disaggregated =
    /// A100 × 4 prefill workers with L40S × 2 (TP 2) decode workers.
    pub fn source_document() -> Self {
        let pool = |gpu: &str, tp| PoolSpec {
            gpu: Some(gpu.to_string()),
            tp,
            ..PoolSpec::default()
        };
        SimSpec {
            aggregated: pool("a100", 4),
            prefill: pool("a100", 4),
            decode: pool("l40s", 2),
            ..SimSpec::default()
        }
    }

    /// The counts that must be at least 1 and are 0 (`max_model_len` where written).
    fn zero_counts(&self) -> Vec<String> {
        let counts = [
            ("max_batched_tokens", Some(self.max_batched_tokens)),
            ("max_running", Some(self.max_running)),
            ("max_model_len", self.max_model_len),
        ];
        counts
            .iter()
            .filter(|(_, n)| *n == Some(0))
            .map(|(key, _)| format!("{key} must be at least 1"))
            .collect()
    }

    /// Every problem with the spec, as sentences naming the field.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if !PROFILES.contains(&self.profile.as_str()) {
            errors.push(format!(
                "profile: unknown profile {:?}, expected one of {}",
                self.profile,
                PROFILES.join(", ")
            ));
        }
        if self.profile == "table" {
            match (&self.table, &self.table_file) {
                (None, None) => errors.push("profile: table needs `table` or `table_file`".into()),
                (Some(_), Some(_)) => {
                    errors.push("table and table_file: give one, not both".into())
                }
                (Some(t), None) => errors.extend(t.validate()),
                (None, Some(_)) => {}
            }
        } else if self.table.is_some() || self.table_file.is_some() {
            errors.push("table/table_file only apply with profile: table".into());
        }
        if self.profile == "fixed" && self.fixed_itl.is_zero() {
            errors.push("fixed_itl must be greater than zero".into());
        }
        for (name, n) in [
            ("workers", self.workers),
            ("prefill_workers", self.prefill_workers),
            ("decode_workers", self.decode_workers),
        ] {
            if n == 0 || n > 64 {
                errors.push(format!("{name} must be between 1 and 64, got {n}"));
            }
        }
        for (name, pool) in [
            ("aggregated", &self.aggregated),
            ("prefill", &self.prefill),
            ("decode", &self.decode),
        ] {
            if let Some(gpu) = &pool.gpu
                && !GPU_NAMES.iter().any(|g| g.eq_ignore_ascii_case(gpu))
            {
                errors.push(format!(
                    "{name}.gpu: unknown GPU {gpu:?}, expected h200, a100 or l40s"
                ));
            }
            if pool.tp == 0 || pool.tp > 16 {
                errors.push(format!(
                    "{name}.tp must be between 1 and 16, got {}",
                    pool.tp
                ));
            }
            if pool
                .cost_per_hour_usd
                .is_some_and(|c| !c.is_finite() || c < 0.0)
            {
                errors.push(format!(
                    "{name}.cost_per_hour_usd must be a non-negative number"
                ));
            }
            if pool.kv_blocks == Some(0) {
                errors.push(format!("{name}.kv_blocks must be at least 1"));
            }
        }
        if !(1..=4096).contains(&self.block_size) {
            errors.push(format!(
                "block_size must be between 1 and 4096, got {}",
                self.block_size
            ));
        }
        errors.extend(self.zero_counts());
        if !self.link_gbps.is_finite() || self.link_gbps <= 0.0 {
            errors.push(format!(
                "link_gbps must be positive, got {}",
                self.link_gbps
            ));
        }
        if !self.overlap_weight.is_finite() || self.overlap_weight < 0.0 {
            errors.push("overlap_weight must be a non-negative number".into());
        }
        if !(0.0..1.0).contains(&self.eos_probability) {
            errors.push(format!(
                "eos_probability must be in [0, 1), got {}",
                self.eos_probability
            ));
        }
        if self.model.trim().is_empty() {
            errors.push("model must not be empty".into());
        }
        for (name, tier) in [("cpu_tier", &self.cpu_tier), ("disk_tier", &self.disk_tier)] {
            if let Some(t) = tier
                && [t.capacity_gb, t.bandwidth_gbps]
                    .iter()
                    .any(|v| !v.is_finite() || *v <= 0.0)
            {
                errors.push(format!(
                    "{name}: capacity_gb and bandwidth_gbps must be positive"
                ));
            }
        }
        if let Some(shape) = &self.model_shape
            && shape.kv_bytes_per_token() == 0
        {
            errors.push(
                "model_shape: layers, kv_heads, head_dim and dtype_bytes must be positive".into(),
            );
        }
        errors.extend(
            self.faults
                .validate()
                .into_iter()
                .map(|e| format!("faults.{e}")),
        );
        errors.extend(self.variability_problems());
        errors
    }

    /// The problems of `variability`, which needs a profile that models its passes.
    fn variability_problems(&self) -> Vec<String> {
        let Some(v) = &self.variability else {
            return Vec::new();
        };
        let mut errors = Vec::new();
        if matches!(self.profile.as_str(), "fixed" | "fast") {
            errors.push(format!(
                "variability: scales the modelled pass times, which profile `{}` does not have; \
                 use default, h200, a100, l40s or table",
                self.profile
            ));
        }
        errors.extend(v.validate().into_iter().map(|e| format!("variability.{e}")));
        errors
    }

    /// The model's shape: explicit, else the preset matching `model`, else Qwen3-30B-A3B-FP8.
    pub fn model_shape(&self) -> ModelShape {
        self.model_shape
            .or_else(|| ModelShape::preset(&self.model))
            .unwrap_or(QWEN3_30B_A3B_FP8)
    }
}

/// Faults the simulated deployment injects. Each kind applies to a `rate` fraction of requests
/// (default all of them), sampled with the spec's seed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSpec {
    /// Answer with an HTTP error instead of serving.
    pub error: Option<ErrorFault>,
    /// Pause the stream after some tokens.
    pub stall: Option<StallFault>,
    /// End the stream without `data: [DONE]`.
    pub truncate: Option<TruncateFault>,
    /// Send one chunk that is not valid JSON.
    pub malformed_chunk: Option<AfterTokens>,
    /// Send an `event: error` frame and end the stream.
    pub error_event: Option<ErrorEventFault>,
    /// Delay the response headers.
    pub slow_first_byte: Option<SlowFirstByte>,
    /// Refuse new connections.
    pub refuse_connections: Option<RefuseMode>,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorFault {
    #[serde(default = "one")]
    pub rate: f64,
    /// 429, 500 or 503 (any 4xx/5xx is accepted).
    #[serde(default = "default_status")]
    pub status: u16,
}

fn default_status() -> u16 {
    500
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StallFault {
    #[serde(default = "one")]
    pub rate: f64,
    pub after_tokens: u32,
    #[serde(with = "duration_text")]
    pub duration: Duration,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TruncateFault {
    #[serde(default = "one")]
    pub rate: f64,
    pub after_tokens: u32,
    /// Reset the connection mid-body instead of ending the body cleanly without `[DONE]`.
    #[serde(default)]
    pub abrupt: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AfterTokens {
    #[serde(default = "one")]
    pub rate: f64,
    pub after_tokens: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorEventFault {
    #[serde(default = "one")]
    pub rate: f64,
    pub after_tokens: u32,
    #[serde(default = "default_error_message")]
    pub message: String,
}

fn default_error_message() -> String {
    "simulated engine failure".to_string()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlowFirstByte {
    #[serde(default = "one")]
    pub rate: f64,
    #[serde(with = "duration_text")]
    pub delay: Duration,
}

/// How connections are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefuseMode {
    /// Close the listening socket: connects fail with "connection refused", and open keep-alive
    /// connections close once their response is done (the server went away).
    StopAccepting,
    /// Accept, then close at once without a response.
    CloseImmediately,
    /// Accept, then never read nor answer: a hung server behind a live port (every request,
    /// `/v1/models` and `/metrics` alike, waits until the client gives up).
    BlackHole,
}

impl FaultSpec {
    /// Parses and validates `text`: a YAML mapping of this schema given outside a config file
    /// (`llm-canary sim --faults`), named `source` in messages. Every problem is reported, each
    /// with its line and column where it has one.
    pub fn parse(text: &str, source: &str) -> Result<FaultSpec, super::ConfigError> {
        parse_block(text, source, FAULTS_EXAMPLE, FaultSpec::validate)
    }

    /// True when no fault is configured.
    pub fn is_empty(&self) -> bool {
        *self == FaultSpec::default()
    }

    /// Every problem, as sentences naming the field.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let mut rate = |name: &str, r: f64| {
            if !(0.0..=1.0).contains(&r) {
                errors.push(format!("{name}.rate must be in [0, 1], got {r}"));
            }
        };
        if let Some(f) = &self.error {
            rate("error", f.rate);
        }
        if let Some(f) = &self.stall {
            rate("stall", f.rate);
        }
        if let Some(f) = &self.truncate {
            rate("truncate", f.rate);
        }
        if let Some(f) = &self.malformed_chunk {
            rate("malformed_chunk", f.rate);
        }
        if let Some(f) = &self.error_event {
            rate("error_event", f.rate);
        }
        if let Some(f) = &self.slow_first_byte {
            rate("slow_first_byte", f.rate);
        }
        if let Some(f) = &self.error
            && !(400..=599).contains(&f.status)
        {
            errors.push(format!(
                "error.status must be an HTTP error status (400-599), got {}",
                f.status
            ));
        }
        errors
    }
}

/// Every fault with a plausible value: a wrong value's hint shows the value here at its key.
const FAULTS_EXAMPLE: &str = "{ error: { status: 503, rate: 0.02 }, \
    stall: { after_tokens: 8, duration: 3s, rate: 0.01 }, \
    truncate: { after_tokens: 8, abrupt: true, rate: 0.01 }, \
    malformed_chunk: { after_tokens: 4, rate: 0.01 }, \
    error_event: { after_tokens: 4, message: overloaded, rate: 0.01 }, \
    slow_first_byte: { delay: 2s, rate: 0.1 }, refuse_connections: stop_accepting }";

/// Every key of [`Variability`] with a plausible value, as [`FAULTS_EXAMPLE`] is for faults.
const VARIABILITY_EXAMPLE: &str = "{ scale: 1.2, period: 2m, \
    bimodal: { probability: 0.4, factor: 1.4 }, jitter: 0.03, drift_per_hour: 0.01 }";

/// A YAML mapping of one of these schemas given outside a config file (`llm-canary sim
/// --faults`, `--variability`), named `source` in messages: parsed strictly, then validated,
/// every problem reported, each with its line and column where it has one (a wrong value with
/// its key path, and `example`'s value at that key as the hint).
fn parse_block<T: serde::de::DeserializeOwned>(
    text: &str,
    source: &str,
    example: &str,
    validate: fn(&T) -> Vec<String>,
) -> Result<T, super::ConfigError> {
    let invalid = |diagnostics| super::ConfigError::Invalid {
        file: source.to_owned(),
        diagnostics,
    };
    let spec: T = serde_saphyr::from_str(text)
        .map_err(|e| invalid(vec![super::error::from_yaml_error(&e, text, Some(example))]))?;
    let problems = validate(&spec);
    if !problems.is_empty() {
        let diagnostics = problems
            .into_iter()
            .map(|p| super::Diagnostic::new(None, p))
            .collect();
        return Err(invalid(diagnostics));
    }
    Ok(spec)
}

/// Run-to-run variability of a simulated deployment's speed (`simulated.variability`): every
/// pass's modelled time is multiplied by a factor that changes from one run to the next, as a
/// real deployment's speed does with its batch phases, cache states and neighbours, so the SLO
/// statistics meet the between-run variance they meet in production. Drawn from the spec's
/// `seed`, on tokio's clock (deterministic in paused time too); `crate::sim::variability` runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Variability {
    /// Every pass lasts `scale` times its modelled time: a uniformly slower (> 1) or faster
    /// deployment.
    pub scale: f64,
    /// One run: `bimodal` and `jitter` draw their factor once per period, periods counted from
    /// the simulator's start.
    #[serde(with = "duration_text")]
    pub period: Duration,
    /// A period is slow by `factor` with `probability` (a batch phase, a cold cache).
    pub bimodal: Option<Bimodal>,
    /// Each period's speed also varies uniformly within ±`jitter` (a fraction, e.g. 0.03).
    pub jitter: f64,
    /// A slow multiplicative drift: passes last (1 + `drift_per_hour`)^hours longer, hours
    /// counted from when this variability took effect (0.01: +1 % an hour).
    pub drift_per_hour: f64,
}

impl Default for Variability {
    fn default() -> Self {
        Variability {
            scale: 1.0,
            period: Duration::from_secs(300),
            bimodal: None,
            jitter: 0.0,
            drift_per_hour: 0.0,
        }
    }
}

/// The slow mode of a bimodal deployment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bimodal {
    /// Chance that a period is slow, in [0, 1].
    pub probability: f64,
    /// How much slower a slow period's passes are (1.4: 40 % longer).
    pub factor: f64,
}

/// The largest factor any part of [`Variability`] may apply: beyond it a simulated deployment
/// is down, which `faults` models.
pub const MAX_SPEED_FACTOR: f64 = 100.0;

impl Variability {
    /// How much slower than modelled its slowest period runs, drift left out: what
    /// `crate::sim::estimate` holds a drain grace against.
    pub fn slowest(&self) -> f64 {
        let slow = self.bimodal.map_or(1.0, |b| b.factor.max(1.0));
        (self.scale * slow * (1.0 + self.jitter)).clamp(1.0 / MAX_SPEED_FACTOR, MAX_SPEED_FACTOR)
    }

    /// Parses and validates a YAML mapping given outside a config file (`llm-canary sim
    /// --variability`), named `source` in messages.
    pub fn parse(text: &str, source: &str) -> Result<Variability, super::ConfigError> {
        parse_block(text, source, VARIABILITY_EXAMPLE, Variability::validate)
    }

    /// Every problem, as sentences naming the field.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let factor = |name: &str, f: f64, errors: &mut Vec<String>| {
            if !(f.is_finite() && f > 0.0 && f <= MAX_SPEED_FACTOR) {
                errors.push(format!(
                    "{name} must be a positive factor up to {MAX_SPEED_FACTOR}, got {f}"
                ));
            }
        };
        factor("scale", self.scale, &mut errors);
        if self.period < Duration::from_millis(1) {
            errors.push(format!(
                "period must be at least 1ms, got {}",
                duration_text::format(self.period)
            ));
        }
        if let Some(b) = &self.bimodal {
            if !(0.0..=1.0).contains(&b.probability) {
                errors.push(format!(
                    "bimodal.probability must be in [0, 1], got {}",
                    b.probability
                ));
            }
            factor("bimodal.factor", b.factor, &mut errors);
        }
        if !(0.0..1.0).contains(&self.jitter) {
            errors.push(format!("jitter must be in [0, 1), got {}", self.jitter));
        }
        if !(self.drift_per_hour > -1.0 && self.drift_per_hour <= 1.0) {
            errors.push(format!(
                "drift_per_hour must be in (-1, 1] (0.01 is +1 % an hour), got {}",
                self.drift_per_hour
            ));
        }
        errors
    }
}

/// A measured profile: prefill time by input length and decode time over (active KV tokens, mean
/// context length), interpolated linearly (bilinearly for decode) and clamped at the edges — the
/// shape Dynamo's profiler writes for its planner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimingTable {
    /// `[isl, ms]` points, sorted by `isl`.
    pub prefill: Vec<[f64; 2]>,
    pub decode: DecodeGrid,
}

/// Decode pass time on a grid: `ms[i][j]` at `kv_tokens[i]` and `context[j]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeGrid {
    pub kv_tokens: Vec<f64>,
    pub context: Vec<f64>,
    pub ms: Vec<Vec<f64>>,
}

impl TimingTable {
    /// Problems that make the table unusable, as sentences.
    pub fn validate(&self) -> Vec<String> {
        let mut errors = Vec::new();
        if self.prefill.is_empty() {
            errors.push("table.prefill needs at least one [isl, ms] point".to_string());
        }
        if !self.prefill.windows(2).all(|w| w[0][0] < w[1][0]) {
            errors.push("table.prefill must be sorted by strictly increasing isl".to_string());
        }
        let g = &self.decode;
        if g.kv_tokens.is_empty() || g.context.is_empty() {
            errors.push("table.decode needs at least one kv_tokens and one context value".into());
        }
        if !g.kv_tokens.windows(2).all(|w| w[0] < w[1])
            || !g.context.windows(2).all(|w| w[0] < w[1])
        {
            errors.push("table.decode axes must be strictly increasing".to_string());
        }
        if g.ms.len() != g.kv_tokens.len() || g.ms.iter().any(|row| row.len() != g.context.len()) {
            errors.push(format!(
                "table.decode.ms must be {} rows of {} values",
                g.kv_tokens.len(),
                g.context.len()
            ));
        }
        if self
            .prefill
            .iter()
            .map(|p| p[1])
            .chain(g.ms.iter().flatten().copied())
            .any(|ms| !ms.is_finite() || ms < 0.0)
        {
            errors.push("table times must be finite and non-negative".to_string());
        }
        errors
    }
}

/// Shape of the served model that decides the KV footprint and the weights' memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelShape {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Bytes per KV element (FP8 = 1, BF16 = 2).
    pub dtype_bytes: u32,
    /// Weights in GB, subtracted from GPU memory before sizing the KV pool.
    pub weights_gb: f64,
}

/// Qwen3-30B-A3B-FP8, the benchmark plan's model.
pub const QWEN3_30B_A3B_FP8: ModelShape = ModelShape {
    layers: 48,
    kv_heads: 4,
    head_dim: 128,
    dtype_bytes: 1,
    weights_gb: 31.0,
};

/// Llama-3.1-8B in BF16.
pub const LLAMA_31_8B: ModelShape = ModelShape {
    layers: 32,
    kv_heads: 8,
    head_dim: 128,
    dtype_bytes: 2,
    weights_gb: 16.1,
};

impl ModelShape {
    /// Preset by a loose name: anything mentioning Llama 3.1 8B, else the document's Qwen model.
    pub fn preset(name: &str) -> Option<ModelShape> {
        let n = name.to_ascii_lowercase();
        if n.contains("llama-3.1-8b") || n.contains("llama-3.1") {
            Some(LLAMA_31_8B)
        } else if n.contains("qwen3-30b-a3b") {
            Some(QWEN3_30B_A3B_FP8)
        } else {
            None
        }
    }

    /// KV bytes per token: layers × 2 (K and V) × kv heads × head dim × dtype bytes.
    pub fn kv_bytes_per_token(&self) -> u64 {
        u64::from(self.layers)
            * 2
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }
}

/// The serde adapter of the simulator's plain `Duration` fields, in the config's one duration
/// grammar (`super::duration`: `250ms`, `5s`, `2m`, `100us`).
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de};

    pub use super::super::duration::{DurationError, format, parse};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(|e| de::Error::custom(e.with_forms()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_contract() {
        let spec = SimSpec::default();
        assert!(spec.validate().is_empty(), "{:?}", spec.validate());
        assert_eq!(spec.block_size, 64);
        assert_eq!(spec.max_batched_tokens, 8192);
        assert_eq!(spec.max_running, 256);
        assert_eq!(spec.handoff_overhead, Duration::from_millis(5));
        assert_eq!(spec.link_gbps, 64.0);
        assert!(SimSpec::source_document().validate().is_empty());
    }

    #[test]
    fn parses_strictly_with_durations_and_faults() {
        let spec: SimSpec = serde_json::from_value(serde_json::json!({
            "profile": "fast",
            "prefill_workers": 2,
            "handoff_overhead": "2.5ms",
            "decode": {"gpu": "l40s", "tp": 2},
            "faults": {"error": {"rate": 0.5, "status": 503}, "stall": {"after_tokens": 3, "duration": "1s"},
                       "refuse_connections": "close_immediately"}
        }))
        .unwrap();
        assert_eq!(spec.handoff_overhead, Duration::from_micros(2500));
        assert_eq!(spec.faults.error.as_ref().unwrap().status, 503);
        assert_eq!(spec.faults.stall.as_ref().unwrap().rate, 1.0);
        assert!(spec.validate().is_empty());
        let unknown = serde_json::from_value::<SimSpec>(serde_json::json!({"wokers": 2}));
        assert!(unknown.unwrap_err().to_string().contains("wokers"));
    }

    #[test]
    fn embeds_in_yaml_as_the_config_writes_it() {
        let yaml = "profile: default\nprefill_workers: 2\ndecode_workers: 1\nhandoff_overhead: 5ms\n\
                    cpu_tier: { capacity_gb: 64, bandwidth_gbps: 25 }\n\
                    faults: { slow_first_byte: { delay: 2s, rate: 0.1 }, truncate: { after_tokens: 10 } }\n";
        let spec: SimSpec = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(spec.prefill_workers, 2);
        assert_eq!(spec.cpu_tier.unwrap().capacity_gb, 64.0);
        let slow = spec.faults.slow_first_byte.as_ref().unwrap();
        assert_eq!((slow.delay, slow.rate), (Duration::from_secs(2), 0.1));
        assert!(!spec.faults.truncate.as_ref().unwrap().abrupt);
        assert!(spec.validate().is_empty());
        assert!(serde_saphyr::from_str::<SimSpec>("faults: { stal: {} }").is_err());
    }

    #[test]
    fn validate_lists_every_problem() {
        let spec = SimSpec {
            profile: "gpu9000".into(),
            workers: 0,
            link_gbps: 0.0,
            faults: FaultSpec {
                error: Some(ErrorFault {
                    rate: 2.0,
                    status: 200,
                }),
                ..FaultSpec::default()
            },
            ..SimSpec::default()
        };
        let errors = spec.validate();
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(errors.iter().any(|e| e.starts_with("faults.error.status")));
    }

    #[test]
    fn variability_parses_strictly_and_names_every_bad_field() {
        let yaml = "variability: { period: 2m, bimodal: { probability: 0.4, factor: 1.4 }, \
                    drift_per_hour: 0.01 }\n";
        let spec: SimSpec = serde_saphyr::from_str(yaml).unwrap();
        let v = spec.variability.clone().unwrap();
        assert_eq!(v.period, Duration::from_secs(120));
        assert_eq!((v.scale, v.jitter), (1.0, 0.0));
        assert_eq!(v.bimodal.unwrap().factor, 1.4);
        assert!(spec.validate().is_empty(), "{:?}", spec.validate());
        assert!(SimSpec::default().variability.is_none());

        let bad = SimSpec {
            profile: "fixed".into(),
            variability: Some(Variability {
                scale: 0.0,
                bimodal: Some(Bimodal {
                    probability: 1.5,
                    factor: f64::NAN,
                }),
                jitter: 1.0,
                drift_per_hour: -1.0,
                period: Duration::ZERO,
            }),
            ..SimSpec::default()
        };
        let errors = bad.validate();
        assert_eq!(errors.len(), 7, "{errors:?}");
        assert!(errors[0].contains("profile `fixed`"), "{errors:?}");
        for field in [
            "scale",
            "period",
            "bimodal.probability",
            "bimodal.factor",
            "jitter",
        ] {
            let prefix = format!("variability.{field} ");
            assert!(
                errors.iter().any(|e| e.starts_with(&prefix)),
                "{field}: {errors:?}"
            );
        }
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("variability.drift_per_hour"))
        );

        let flag = Variability::parse("{ drift_per_hour: 0.02 }", "--variability").unwrap();
        assert_eq!(flag.drift_per_hour, 0.02);
        let typo = Variability::parse("{ bimodel: {} }", "--variability").unwrap_err();
        assert!(typo.to_string().contains("bimodel"), "{typo}");
    }

    #[test]
    fn the_examples_of_the_flags_are_valid_and_show_in_a_wrong_values_hint() {
        let faults = FaultSpec::parse(FAULTS_EXAMPLE, "example").unwrap();
        assert!(faults.refuse_connections.is_some() && faults.error_event.is_some());
        Variability::parse(VARIABILITY_EXAMPLE, "example").unwrap();
        let err = FaultSpec::parse("{ error: { status: x } }", "--faults").unwrap_err();
        assert_eq!(
            err.to_string(),
            "--faults:1:20: `error.status` must be a whole number from 0 to 65535, not `x` \
             (hint: e.g. `status: 503`)"
        );
    }

    #[test]
    fn durations_round_trip() {
        for text in ["5ms", "1500ms", "250us"] {
            let d = duration_text::parse(text).unwrap();
            assert_eq!(duration_text::parse(&duration_text::format(d)).unwrap(), d);
        }
        assert_eq!(
            duration_text::parse("2m").unwrap(),
            Duration::from_secs(120)
        );
        assert!(duration_text::parse("5 parsecs").is_err());
        // One grammar with the rest of the config: a bare number has no unit.
        let bare = serde_saphyr::from_str::<SimSpec>("handoff_overhead: 5\n").unwrap_err();
        assert!(bare.to_string().contains("`5` has no unit"), "{bare}");
    }
}
