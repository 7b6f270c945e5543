//! The simulator's `/metrics`: Dynamo frontend names (`dynamo_frontend_*`), vLLM engine names
//! (`vllm:*`) per worker, and Dynamo KVBM's offload/onboard counters (`kvbm_*`, without `_total`)
//! when tiers are on, in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use super::cluster::Cluster;
use super::engine::WorkerSnapshot;

/// Latency buckets (seconds) of the frontend histograms: fine below 100 ms where ITL lives, then
/// roughly ×2.5 steps up to the longest request.
const LATENCY_BUCKETS: [f64; 22] = [
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Token-count buckets of the sequence-length histograms (powers of two).
const TOKEN_BUCKETS: [f64; 15] = [
    0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
    65536.0, 131072.0,
];

#[derive(Debug, Clone)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        if i < self.counts.len() {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[derive(Debug)]
struct Frontend {
    ttft: Histogram,
    itl: Histogram,
    duration: Histogram,
    isl: Histogram,
    osl: Histogram,
    cached: Histogram,
    /// (endpoint, request_type, status) → count.
    requests: BTreeMap<(&'static str, &'static str, &'static str), u64>,
    inflight: i64,
    queued: i64,
}

/// Frontend-side request metrics, updated by the HTTP handlers.
#[derive(Debug)]
pub struct FrontendMetrics {
    inner: Mutex<Frontend>,
}

impl Default for FrontendMetrics {
    fn default() -> Self {
        FrontendMetrics {
            inner: Mutex::new(Frontend {
                ttft: Histogram::new(&LATENCY_BUCKETS),
                itl: Histogram::new(&LATENCY_BUCKETS),
                duration: Histogram::new(&LATENCY_BUCKETS),
                isl: Histogram::new(&TOKEN_BUCKETS),
                osl: Histogram::new(&TOKEN_BUCKETS),
                cached: Histogram::new(&TOKEN_BUCKETS),
                requests: BTreeMap::new(),
                inflight: 0,
                queued: 0,
            }),
        }
    }
}

/// Where a finished request ended, for `dynamo_frontend_requests_total`.
#[derive(Debug, Clone, Copy)]
pub struct RequestOutcome {
    pub endpoint: &'static str,
    pub request_type: &'static str,
    pub success: bool,
}

impl FrontendMetrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Frontend> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn request_started(&self) {
        let mut f = self.lock();
        f.inflight += 1;
        f.queued += 1;
    }

    /// The first token left (or the request ended before one did).
    pub fn dequeued(&self, ttft: Option<Duration>) {
        let mut f = self.lock();
        f.queued -= 1;
        if let Some(t) = ttft {
            f.ttft.observe(t.as_secs_f64());
        }
    }

    pub fn request_finished(
        &self,
        outcome: RequestOutcome,
        duration: Duration,
        tokens: Option<(u32, u32, u32, Option<Duration>)>,
    ) {
        let mut f = self.lock();
        f.inflight -= 1;
        let status = if outcome.success { "success" } else { "error" };
        *f.requests
            .entry((outcome.endpoint, outcome.request_type, status))
            .or_default() += 1;
        f.duration.observe(duration.as_secs_f64());
        if let Some((isl, osl, cached, itl)) = tokens {
            f.isl.observe(f64::from(isl));
            f.osl.observe(f64::from(osl));
            f.cached.observe(f64::from(cached));
            if let Some(itl) = itl {
                f.itl.observe(itl.as_secs_f64());
            }
        }
    }

    /// A request rejected before it reached the engine (faults, bad input).
    pub fn request_rejected(&self, endpoint: &'static str, request_type: &'static str) {
        let mut f = self.lock();
        *f.requests
            .entry((endpoint, request_type, "error"))
            .or_default() += 1;
    }
}

fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    crate::promtext::escape_into(&mut out, v);
    out
}

/// Renders every metric family.
pub fn render(model: &str, frontend: &FrontendMetrics, cluster: &Cluster) -> String {
    let mut out = String::with_capacity(16 * 1024);
    let model = escape(model);
    render_frontend(&mut out, frontend, &model);
    let workers = cluster.snapshots();
    let mut families = WorkerFamilies {
        out: &mut out,
        workers: &workers,
        model: &model,
    };
    families.engine();
    // vLLM exports no eviction counter (only sampled block-lifetime histograms behind
    // `--kv-cache-metrics`). The simulator offloads a GPU block to a lower tier only when it evicts
    // it, so its `kvbm_offload_blocks_d2h` counts evictions into the CPU tier; real KVBM copies
    // every newly computed block to host memory, evicted later or not, so there it counts copies.
    // KVBM's counters are registered with the Rust `prometheus` crate, which adds no `_total`;
    // like Dynamo, there is no tier occupancy gauge.
    if workers.iter().any(|w| w.tiers_enabled) {
        families.kvbm();
    }
    out
}

/// The frontend's families (`dynamo_frontend_*`) of the model named `model` (escaped).
fn render_frontend(out: &mut String, frontend: &FrontendMetrics, model: &str) {
    let ml = format!("model=\"{model}\"");
    let f = frontend.lock();
    f.ttft.render(
        out,
        "dynamo_frontend_time_to_first_token_seconds",
        "Time to first token in seconds.",
        &ml,
    );
    f.itl.render(
        out,
        "dynamo_frontend_inter_token_latency_seconds",
        "Mean inter-token latency of a request in seconds.",
        &ml,
    );
    f.duration.render(
        out,
        "dynamo_frontend_request_duration_seconds",
        "Request duration in seconds.",
        &ml,
    );
    f.isl.render(
        out,
        "dynamo_frontend_input_sequence_tokens",
        "Input sequence length in tokens.",
        &ml,
    );
    f.osl.render(
        out,
        "dynamo_frontend_output_sequence_tokens",
        "Output sequence length in tokens.",
        &ml,
    );
    f.cached.render(
        out,
        "dynamo_frontend_cached_tokens",
        "Prompt tokens served from the prefix cache.",
        &ml,
    );
    out.push_str("# HELP dynamo_frontend_requests_total Requests by endpoint, type and status.\n# TYPE dynamo_frontend_requests_total counter\n");
    for ((endpoint, request_type, status), n) in &f.requests {
        let _ = writeln!(
            out,
            "dynamo_frontend_requests_total{{{ml},endpoint=\"{endpoint}\",request_type=\"{request_type}\",status=\"{status}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP dynamo_frontend_inflight_requests Requests being served.\n# TYPE dynamo_frontend_inflight_requests gauge\ndynamo_frontend_inflight_requests{{{ml}}} {}",
        f.inflight
    );
    let _ = writeln!(
        out,
        "# HELP dynamo_frontend_queued_requests Requests waiting for their first token.\n# TYPE dynamo_frontend_queued_requests gauge\ndynamo_frontend_queued_requests{{{ml}}} {}",
        f.queued
    );
}

/// The per-worker families: one sample per worker, labelled with the model, the worker and its
/// role.
struct WorkerFamilies<'a> {
    out: &'a mut String,
    workers: &'a [WorkerSnapshot],
    /// The model's name, escaped.
    model: &'a str,
}

impl WorkerFamilies<'_> {
    fn family(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        value: &dyn Fn(&WorkerSnapshot) -> String,
    ) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for w in self.workers {
            let _ = writeln!(
                self.out,
                "{name}{{model_name=\"{}\",engine=\"{}\",worker_role=\"{}\"}} {}",
                self.model,
                w.worker_id,
                w.role.as_str(),
                value(w)
            );
        }
    }

    /// The engine's families (vLLM's names, and Dynamo's cancellation counter).
    fn engine(&mut self) {
        self.family(
            "vllm:num_requests_running",
            "gauge",
            "Requests in the running batch.",
            &|w| w.running.to_string(),
        );
        self.family(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests waiting to be scheduled.",
            &|w| w.waiting.to_string(),
        );
        self.family(
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV block usage, 1 = full.",
            &|w| w.kv_usage.to_string(),
        );
        self.family(
            "vllm:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            &|w| w.kv.prefix_queries_tokens.to_string(),
        );
        self.family(
            "vllm:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            &|w| w.kv.prefix_hit_tokens.to_string(),
        );
        self.family(
            "vllm:num_preemptions_total",
            "counter",
            "Preemptions (recompute).",
            &|w| w.engine.preemptions.to_string(),
        );
        // Dynamo's worker counter of requests whose client went away (the mocker and the engines
        // export it on each worker's system port).
        self.family(
            "dynamo_component_cancellation_total",
            "counter",
            "Requests cancelled by the client.",
            &|w| w.engine.cancelled_requests.to_string(),
        );
        self.family(
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens computed.",
            &|w| w.engine.prompt_tokens_computed.to_string(),
        );
        self.family(
            "vllm:generation_tokens_total",
            "counter",
            "Tokens generated.",
            &|w| w.engine.generation_tokens.to_string(),
        );
    }

    /// KVBM's offload and onboard counters.
    fn kvbm(&mut self) {
        self.family(
            "kvbm_offload_blocks_d2h",
            "counter",
            "The number of offload blocks from device to host.",
            &|w| w.kv.offload_d2h_blocks.to_string(),
        );
        self.family(
            "kvbm_offload_blocks_h2d",
            "counter",
            "The number of offload blocks from host to disk.",
            &|w| w.kv.offload_h2d_blocks.to_string(),
        );
        self.family(
            "kvbm_offload_blocks_d2d",
            "counter",
            "The number of offload blocks from device to disk (bypassing host memory).",
            &|w| w.kv.offload_d2d_blocks.to_string(),
        );
        self.family(
            "kvbm_onboard_blocks_h2d",
            "counter",
            "The number of onboard blocks from host to device.",
            &|w| w.kv.onboard_h2d_blocks.to_string(),
        );
        self.family(
            "kvbm_onboard_blocks_d2d",
            "counter",
            "The number of onboard blocks from disk to device.",
            &|w| w.kv.onboard_d2d_blocks.to_string(),
        );
        self.family(
            "kvbm_matched_tokens",
            "counter",
            "The number of matched tokens.",
            &|w| w.kv.matched_tokens.to_string(),
        );
    }
}
