//! Scraping the serving engines' own `/metrics` (vLLM `vllm:*`, Dynamo `dynamo_frontend_*` and
//! KVBM `kvbm_*`): what the server says about its prefix cache, KV usage, preemptions, GPU→host
//! offloads and TTFT, next to what the canary measured.
//!
//! [`ServerTotals::kv_offload_blocks`] is Dynamo KVBM's `kvbm_offload_blocks_d2h` (a Rust
//! `prometheus` crate counter, so without `_total`): the KV blocks copied from GPU to host memory.
//! It is not an eviction count: real KVBM offloads every newly computed block, evicted later or
//! not (the simulator offloads only on eviction), and vLLM has no eviction counter at all (only
//! sampled block-lifetime histograms behind `--kv-cache-metrics`, not read here). A target without
//! KVBM has none, and its offloads stay `None`.
//!
//! Every `export.server_metrics_interval` each target's endpoints are fetched (response size and
//! time bounded), parsed with [`crate::promtext`] and summed over their series into
//! [`ServerTotals`]. Counters are turned into rates between two scrapes (the
//! `llm_canary_server_*` families) and into per-step deltas: the scheduler takes a fresh scrape at
//! the start and the end of every step ([`ServerScraper::begin_step`], [`ServerScraper::end_step`])
//! so a step's server values cover exactly that step ([`ServerStep`]).
//!
//! Labels come only from the config (`target`); no label is ever made from a server-controlled
//! string. A dead endpoint counts in `llm_canary_server_scrape_errors_total{target}` and stops
//! nothing: a scrape that misses one endpoint of a target publishes nothing for that target, so
//! partial sums never look like counter resets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::TargetConfig;
use crate::model::{ServerSnapshot, ServerStep};

/// Largest `/metrics` body read; a vLLM engine with many LoRA adapters writes a few hundred KiB.
pub const MAX_SCRAPE_BYTES: usize = 8 << 20;
/// Longest one scrape of one endpoint may take, connect included.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the scrapes at a step's start and end wait for a target: every step waits for them,
/// so one slow `/metrics` would otherwise delay every target's steps by twice the scrape
/// timeout. A target later than this has no server values for that step.
pub const BOUNDARY_SCRAPE_WAIT: Duration = Duration::from_secs(1);

/// Errors of the server-metrics scrape.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("building the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("{url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: response larger than {MAX_SCRAPE_BYTES} bytes")]
    TooLarge { url: String },
    #[error("{url}: response is not UTF-8")]
    NotUtf8 { url: String },
}

/// A target whose server metrics are scraped: its name (the only label used) and its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrapeTarget {
    pub name: String,
    pub urls: Vec<String>,
}

impl ScrapeTarget {
    /// The endpoints of `target`: its configured `server_metrics`, and for an embedded simulator
    /// also the simulator's own `/metrics` on the host of `endpoint` (the URL requests go to).
    /// `None` when there is nothing to scrape.
    pub fn for_target(target: &TargetConfig, endpoint: &url::Url) -> Option<ScrapeTarget> {
        let mut urls: Vec<String> = target
            .server_metrics
            .iter()
            .map(|u| u.value.clone())
            .collect();
        if target.simulated.is_some()
            && let Ok(own) = endpoint.join("/metrics")
            && !urls.contains(&own.to_string())
        {
            urls.push(own.to_string());
        }
        (!urls.is_empty()).then(|| ScrapeTarget {
            name: target.name.value.clone(),
            urls,
        })
    }
}

/// What one scrape of all endpoints of a target says, summed over series (workers, models).
/// `None`: no endpoint exposed that series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerTotals {
    /// `vllm:prefix_cache_queries_total`: prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: Option<f64>,
    /// `vllm:prefix_cache_hits_total`: prompt tokens found there.
    pub prefix_cache_hits: Option<f64>,
    /// Mean of `vllm:kv_cache_usage_perc` (or the older `vllm:gpu_cache_usage_perc`) over
    /// workers, 0..1.
    pub kv_cache_usage_ratio: Option<f64>,
    /// `vllm:num_preemptions_total`.
    pub preemptions: Option<f64>,
    /// Requests the server saw cancelled by their client: Dynamo's workers'
    /// `dynamo_component_cancellation_total`, else its frontend's
    /// `dynamo_frontend_model_cancellation_total`.
    pub cancellations: Option<f64>,
    /// KVBM's `kvbm_offload_blocks_d2h`: KV blocks offloaded (copied) from GPU to host memory.
    /// Dynamo's KVBM offloads every block as it is computed, so this counts copies, evicted later
    /// or not; the simulator offloads a block only when it evicts it from the GPU. `None` without
    /// KVBM.
    pub kv_offload_blocks: Option<f64>,
    /// Dynamo's KV router: `dynamo_component_router_kv_selected_cached_prefix_tokens_total`,
    /// the prompt tokens already cached on the worker it chose, and
    /// `dynamo_component_router_input_sequence_tokens_sum`, the prompt tokens it routed, of one
    /// routing phase ([`RouterPhases::pick`]). Their increases give the server's prefix hit ratio
    /// where the engine exports no vLLM counters.
    pub router_cached_tokens: Option<f64>,
    pub router_input_tokens: Option<f64>,
    /// `dynamo_frontend_time_to_first_token_seconds_sum` and `_count`.
    pub ttft_sum_seconds: Option<f64>,
    pub ttft_count: Option<f64>,
    /// Mean of KVBM's `kvbm_host_cache_hit_rate` / `kvbm_disk_cache_hit_rate` gauges (0..1).
    pub kvbm_host_cache_hit_ratio: Option<f64>,
    pub kvbm_disk_cache_hit_ratio: Option<f64>,
}

/// Sum and count of one family's samples, for sums and means.
#[derive(Default, Clone, Copy)]
struct Acc {
    sum: f64,
    n: u32,
}

impl Acc {
    fn add(&mut self, v: f64) {
        if v.is_finite() {
            self.sum += v;
            self.n += 1;
        }
    }
    fn sum(self) -> Option<f64> {
        (self.n > 0).then_some(self.sum)
    }
    fn mean(self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / f64::from(self.n))
    }
}

/// The KV router's counters per routing `phase` label. A disaggregated frontend routes every
/// request twice, to a prefill and to a decode worker, and counts the prompt in both phases;
/// the prefix cache that saves work is the prefill worker's. So the prefill phase is read where
/// there is one, else the aggregated phase, else series without the label (older Dynamo), and
/// never the sum of phases.
#[derive(Default)]
struct RouterPhases {
    /// (phase, cached, input), phase "" for series without the label.
    phases: Vec<(String, Acc, Acc)>,
}

impl RouterPhases {
    fn entry(&mut self, phase: &str) -> &mut (String, Acc, Acc) {
        match self.phases.iter().position(|(p, _, _)| p == phase) {
            Some(i) => &mut self.phases[i],
            None => {
                self.phases
                    .push((phase.to_owned(), Acc::default(), Acc::default()));
                self.phases.last_mut().expect("just pushed")
            }
        }
    }

    /// (cached, input) of the phase that tells the prefix cache's effect.
    fn pick(&self) -> (Option<f64>, Option<f64>) {
        ["prefill", "aggregated", ""]
            .iter()
            .find_map(|want| self.phases.iter().find(|(p, _, _)| p == want))
            .map_or((None, None), |(_, cached, input)| {
                (cached.sum(), input.sum())
            })
    }
}

#[derive(Default)]
struct TotalsBuilder {
    queries: Acc,
    hits: Acc,
    kv_usage: Acc,
    preemptions: Acc,
    worker_cancellations: Acc,
    frontend_cancellations: Acc,
    kv_offload_blocks: Acc,
    router: RouterPhases,
    ttft_sum: Acc,
    ttft_count: Acc,
    kvbm_host: Acc,
    kvbm_disk: Acc,
}

impl TotalsBuilder {
    fn add_text(&mut self, text: &str) {
        for s in crate::promtext::parse(text).samples {
            let acc = match s.name {
                "dynamo_component_router_kv_selected_cached_prefix_tokens_total" => {
                    &mut self.router.entry(s.label("phase").unwrap_or("")).1
                }
                "dynamo_component_router_input_sequence_tokens_sum" => {
                    &mut self.router.entry(s.label("phase").unwrap_or("")).2
                }
                "vllm:prefix_cache_queries_total" => &mut self.queries,
                "vllm:prefix_cache_hits_total" => &mut self.hits,
                "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => &mut self.kv_usage,
                "vllm:num_preemptions_total" => &mut self.preemptions,
                "dynamo_component_cancellation_total" => &mut self.worker_cancellations,
                "dynamo_frontend_model_cancellation_total" => &mut self.frontend_cancellations,
                "kvbm_offload_blocks_d2h" => &mut self.kv_offload_blocks,
                "dynamo_frontend_time_to_first_token_seconds_sum" => &mut self.ttft_sum,
                "dynamo_frontend_time_to_first_token_seconds_count" => &mut self.ttft_count,
                "kvbm_host_cache_hit_rate" => &mut self.kvbm_host,
                "kvbm_disk_cache_hit_rate" => &mut self.kvbm_disk,
                _ => continue,
            };
            acc.add(s.value);
        }
    }

    fn build(self) -> ServerTotals {
        let (router_cached_tokens, router_input_tokens) = self.router.pick();
        ServerTotals {
            prefix_cache_queries: self.queries.sum(),
            prefix_cache_hits: self.hits.sum(),
            kv_cache_usage_ratio: self.kv_usage.mean(),
            preemptions: self.preemptions.sum(),
            // Each worker counts its own; the frontend's count stands in where no worker's
            // endpoint is scraped (never both: a request would count twice).
            cancellations: self
                .worker_cancellations
                .sum()
                .or(self.frontend_cancellations.sum()),
            kv_offload_blocks: self.kv_offload_blocks.sum(),
            router_cached_tokens,
            router_input_tokens,
            ttft_sum_seconds: self.ttft_sum.sum(),
            ttft_count: self.ttft_count.sum(),
            kvbm_host_cache_hit_ratio: self.kvbm_host.mean(),
            kvbm_disk_cache_hit_ratio: self.kvbm_disk.mean(),
        }
    }
}

impl ServerTotals {
    /// The totals of the expositions of all endpoints of one target.
    pub fn from_texts<'a>(texts: impl IntoIterator<Item = &'a str>) -> ServerTotals {
        let mut b = TotalsBuilder::default();
        for t in texts {
            b.add_text(t);
        }
        b.build()
    }
}

/// The increase of a counter from `before` to `after`; a decrease means the server restarted,
/// and then everything it counted since is the increase.
fn increase(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    let after = after?;
    Some(match before {
        Some(b) if after >= b => after - b,
        _ => after,
    })
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some((n / d).clamp(0.0, 1.0)),
        _ => None,
    }
}

/// The server's view of the interval between two scrapes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Interval {
    prefix_cache_hit_ratio: Option<f64>,
    ttft_mean_seconds: Option<f64>,
    preemptions: Option<f64>,
    cancellations: Option<f64>,
    kv_offload_blocks: Option<f64>,
}

fn interval(before: Option<&ServerTotals>, after: &ServerTotals) -> Interval {
    let hits = increase(
        before.and_then(|b| b.prefix_cache_hits),
        after.prefix_cache_hits,
    );
    let queries = increase(
        before.and_then(|b| b.prefix_cache_queries),
        after.prefix_cache_queries,
    );
    let ttft_sum = increase(
        before.and_then(|b| b.ttft_sum_seconds),
        after.ttft_sum_seconds,
    );
    let ttft_count = increase(before.and_then(|b| b.ttft_count), after.ttft_count);
    let router_cached = increase(
        before.and_then(|b| b.router_cached_tokens),
        after.router_cached_tokens,
    );
    let router_input = increase(
        before.and_then(|b| b.router_input_tokens),
        after.router_input_tokens,
    );
    Interval {
        // vLLM's own counters where the engine exports them, else Dynamo's KV router.
        prefix_cache_hit_ratio: ratio(hits, queries).or_else(|| ratio(router_cached, router_input)),
        ttft_mean_seconds: match (ttft_sum, ttft_count) {
            (Some(s), Some(c)) if c > 0.0 => Some(s / c),
            _ => None,
        },
        preemptions: increase(before.and_then(|b| b.preemptions), after.preemptions),
        cancellations: increase(before.and_then(|b| b.cancellations), after.cancellations),
        kv_offload_blocks: increase(
            before.and_then(|b| b.kv_offload_blocks),
            after.kv_offload_blocks,
        ),
    }
}

/// KV usage samples of the step in progress.
#[derive(Debug, Clone, Copy, Default)]
struct UsageWindow {
    sum: f64,
    max: f64,
    n: u32,
    scrapes: u32,
}

#[derive(Debug, Default)]
struct TargetState {
    last: Option<ServerTotals>,
    /// When the round that gave `last` started.
    last_at: Option<Instant>,
    window: UsageWindow,
}

/// The totals of every target at a step's start; consumed by [`ServerScraper::end_step`].
#[derive(Debug)]
pub struct StepMark {
    at: Instant,
    totals: HashMap<String, ServerTotals>,
}

/// Where the scraper publishes what it read (the Prometheus registry: `llm_canary_server_*`).
pub trait ServerMetricsSink: Send + Sync {
    /// The latest scrape of `target` (counter totals, gauges).
    fn set_server(&self, target: &str, snapshot: &ServerSnapshot);
    /// KVBM's host and disk cache hit rates of `target`, where it has KVBM.
    fn set_server_kvbm(&self, target: &str, host: Option<f64>, disk: Option<f64>);
    /// A failed scrape of one of `target`'s endpoints.
    fn record_server_scrape_error(&self, target: &str);
}

/// The HTTP client of scrapes: [`SCRAPE_TIMEOUT`] on connect and on the whole request; an idle
/// connection kept for `pool_idle_timeout` (`client.pool_idle_timeout`: a scrape often goes to
/// the same frontend, behind the same proxy, as the requests).
pub fn scrape_client(pool_idle_timeout: Duration) -> Result<reqwest::Client, ScrapeError> {
    crate::client::http_client_builder()
        .pool_idle_timeout(pool_idle_timeout)
        .timeout(SCRAPE_TIMEOUT)
        .connect_timeout(SCRAPE_TIMEOUT)
        .build()
        .map_err(ScrapeError::Client)
}

/// Fetches one `/metrics` endpoint with `http`, reading at most [`MAX_SCRAPE_BYTES`].
pub async fn fetch(http: &reqwest::Client, url: &str) -> Result<String, ScrapeError> {
    let err = |source| ScrapeError::Http {
        url: url.to_owned(),
        source,
    };
    let mut resp = http
        .get(url)
        .header("accept", "text/plain;version=0.0.4")
        .send()
        .await
        .map_err(err)?;
    if !resp.status().is_success() {
        return Err(ScrapeError::Status {
            url: url.to_owned(),
            status: resp.status().as_u16(),
        });
    }
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_SCRAPE_BYTES as u64)
    {
        return Err(ScrapeError::TooLarge {
            url: url.to_owned(),
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(err)? {
        if body.len() + chunk.len() > MAX_SCRAPE_BYTES {
            return Err(ScrapeError::TooLarge {
                url: url.to_owned(),
            });
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| ScrapeError::NotUtf8 {
        url: url.to_owned(),
    })
}

/// Scrapes every configured target's server metrics and publishes them.
pub struct ServerScraper {
    http: reqwest::Client,
    metrics: Arc<dyn ServerMetricsSink>,
    targets: Vec<ScrapeTarget>,
    /// Taken only to fold a round's results in (never across a fetch); each target keeps when
    /// its last folded round started, so rounds that overlap (the periodic one and a step
    /// boundary's) still compute every interval between consecutive scrapes.
    state: Mutex<HashMap<String, TargetState>>,
}

impl ServerScraper {
    pub fn new(
        targets: Vec<ScrapeTarget>,
        metrics: Arc<dyn ServerMetricsSink>,
        pool_idle_timeout: Duration,
    ) -> Result<Self, ScrapeError> {
        let http = scrape_client(pool_idle_timeout)?;
        Ok(ServerScraper {
            http,
            metrics,
            targets,
            state: Mutex::new(HashMap::new()),
        })
    }

    /// The targets scraped.
    pub fn targets(&self) -> &[ScrapeTarget] {
        &self.targets
    }

    /// Fetches one endpoint, reading at most [`MAX_SCRAPE_BYTES`].
    async fn fetch(&self, url: &str) -> Result<String, ScrapeError> {
        fetch(&self.http, url).await
    }

    /// Scrapes every endpoint of `target`; `None` (and an error counted per failed endpoint) when
    /// any of them failed.
    async fn scrape_target(&self, target: &ScrapeTarget) -> Option<ServerTotals> {
        let fetches = target.urls.iter().map(|u| self.fetch(u));
        let results = futures_util::future::join_all(fetches).await;
        let mut texts = Vec::with_capacity(results.len());
        let mut failed = false;
        for r in results {
            match r {
                Ok(t) => texts.push(t),
                Err(e) => {
                    failed = true;
                    self.metrics.record_server_scrape_error(&target.name);
                    tracing::debug!(target = %target.name, error = %e, "server metrics scrape failed");
                }
            }
        }
        (!failed).then(|| ServerTotals::from_texts(texts.iter().map(String::as_str)))
    }

    /// One scrape round over every target: publishes the `llm_canary_server_*` series and feeds
    /// the step in progress. Returns the totals of the targets that answered.
    pub async fn scrape_all(&self) -> HashMap<String, ServerTotals> {
        self.scrape_within(SCRAPE_TIMEOUT).await
    }

    /// One round over every target at once, each given at most `wait` (a target later than that
    /// counts a scrape error and is left out of the round). The targets' fetches run outside the
    /// state lock, so a slow `/metrics` delays nobody else's; a round's results are folded in
    /// under it, and a result older than one already folded for its target is not.
    async fn scrape_within(&self, wait: Duration) -> HashMap<String, ServerTotals> {
        let rounds = self.targets.iter().map(|t| async move {
            let started = Instant::now();
            let totals = match tokio::time::timeout(wait, self.scrape_target(t)).await {
                Ok(totals) => totals,
                Err(_) => {
                    self.metrics.record_server_scrape_error(&t.name);
                    tracing::debug!(target = %t.name, ?wait, "server metrics scrape too slow");
                    None
                }
            };
            (t.name.clone(), started, totals)
        });
        let results = futures_util::future::join_all(rounds).await;
        let mut state = self.state.lock().await;
        let mut out = HashMap::new();
        for (name, started, totals) in results {
            let Some(totals) = totals else { continue };
            let s = state.entry(name.clone()).or_default();
            if s.last_at.is_some_and(|at| at > started) {
                // A later round got here first: its values are the newer.
                out.insert(name, totals);
                continue;
            }
            s.last_at = Some(started);
            let iv = interval(s.last.as_ref(), &totals);
            self.metrics.set_server(
                &name,
                &ServerSnapshot {
                    prefix_cache_hit_ratio: iv.prefix_cache_hit_ratio,
                    kv_cache_usage_ratio: totals.kv_cache_usage_ratio,
                    preemptions_total: totals.preemptions,
                    cancellations_total: totals.cancellations,
                    kv_offload_blocks_total: totals.kv_offload_blocks,
                    ttft_mean_seconds: iv.ttft_mean_seconds,
                },
            );
            self.metrics.set_server_kvbm(
                &name,
                totals.kvbm_host_cache_hit_ratio,
                totals.kvbm_disk_cache_hit_ratio,
            );
            s.window.scrapes += 1;
            if let Some(u) = totals.kv_cache_usage_ratio {
                s.window.sum += u;
                s.window.max = s.window.max.max(u);
                s.window.n += 1;
            }
            s.last = Some(totals);
            out.insert(name, totals);
        }
        out
    }

    /// Scrapes every `interval` until `stop`. A scrape never takes more than [`SCRAPE_TIMEOUT`]
    /// per endpoint, and a late round is skipped rather than run in a burst.
    pub async fn run(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(10)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.scrape_all() => {}
            }
        }
    }

    /// Starts a step: a fresh scrape whose totals the step's deltas start from.
    pub async fn begin_step(&self) -> StepMark {
        let totals = self.scrape_within(BOUNDARY_SCRAPE_WAIT).await;
        let mut state = self.state.lock().await;
        for (name, s) in state.iter_mut() {
            // The usage window restarts with the start scrape's sample.
            s.window = UsageWindow::default();
            if let Some(t) = totals.get(name) {
                s.window.scrapes = 1;
                if let Some(u) = t.kv_cache_usage_ratio {
                    s.window = UsageWindow {
                        sum: u,
                        max: u,
                        n: 1,
                        scrapes: 1,
                    };
                }
            }
        }
        StepMark {
            at: Instant::now(),
            totals,
        }
    }

    /// Ends the step begun with `mark`: a fresh scrape, and each target's [`ServerStep`]. A target
    /// missing at either end gets no counter deltas, only what its window saw.
    pub async fn end_step(&self, mark: StepMark) -> HashMap<String, ServerStep> {
        let end = self.scrape_within(BOUNDARY_SCRAPE_WAIT).await;
        let secs = mark.at.elapsed().as_secs_f64();
        let mut state = self.state.lock().await;
        let mut out = HashMap::new();
        for t in &self.targets {
            let s = state.entry(t.name.clone()).or_default();
            let window = std::mem::take(&mut s.window);
            let (iv, last) = match (mark.totals.get(&t.name), end.get(&t.name)) {
                (Some(before), Some(after)) => (interval(Some(before), after), Some(after)),
                _ => (Interval::default(), None),
            };
            let per_second = |v: Option<f64>| v.filter(|_| secs > 0.0).map(|v| v / secs);
            out.insert(
                t.name.clone(),
                ServerStep {
                    prefix_cache_hit_ratio: iv.prefix_cache_hit_ratio,
                    kv_cache_usage_mean: (window.n > 0).then(|| window.sum / f64::from(window.n)),
                    kv_cache_usage_max: (window.n > 0).then_some(window.max),
                    preemptions: iv.preemptions,
                    preemptions_per_second: per_second(iv.preemptions),
                    cancellations: iv.cancellations,
                    kv_offload_blocks: iv.kv_offload_blocks,
                    kv_offload_blocks_per_second: per_second(iv.kv_offload_blocks),
                    ttft_mean_seconds: iv.ttft_mean_seconds,
                    kvbm_host_cache_hit_ratio: last.and_then(|l| l.kvbm_host_cache_hit_ratio),
                    kvbm_disk_cache_hit_ratio: last.and_then(|l| l.kvbm_disk_cache_hit_ratio),
                    scrapes: window.scrapes,
                },
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::metrics::Metrics;

    const WORKERS: &str = "\
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine=\"0\"} 1000
vllm:prefix_cache_queries_total{engine=\"1\"} 3000
vllm:prefix_cache_hits_total{engine=\"0\"} 500
vllm:prefix_cache_hits_total{engine=\"1\"} 1500
vllm:kv_cache_usage_perc{engine=\"0\"} 0.2
vllm:kv_cache_usage_perc{engine=\"1\"} 0.4
vllm:num_preemptions_total{engine=\"0\"} 3
unrelated_total{engine=\"1\"} 99
";
    /// KVBM's own endpoint: counters without `_total`, one series per worker.
    const KVBM: &str = "\
# TYPE kvbm_offload_blocks_d2h counter
kvbm_offload_blocks_d2h{engine=\"0\"} 5
kvbm_offload_blocks_d2h{engine=\"1\"} 2
kvbm_offload_blocks_h2d{engine=\"0\"} 40
";
    const FRONTEND: &str = "\
dynamo_frontend_time_to_first_token_seconds_bucket{le=\"+Inf\"} 10
dynamo_frontend_time_to_first_token_seconds_sum{model=\"m\"} 2.5
dynamo_frontend_time_to_first_token_seconds_count{model=\"m\"} 10
kvbm_host_cache_hit_rate 0.75
";

    #[test]
    fn cancellations_are_the_workers_sum_else_the_frontends_count() {
        let worker = |id: u32, n: u32| {
            format!(
                "dynamo_component_cancellation_total{{dynamo_component=\"backend\",worker=\"{id}\"}} {n}\n"
            )
        };
        let frontend = "dynamo_frontend_model_cancellation_total{model=\"m\"} 9\n";
        let (a, b) = (worker(1, 3), worker(2, 4));
        // Each worker counts its own; the frontend's count of the same requests is not added.
        let t = ServerTotals::from_texts([a.as_str(), b.as_str(), frontend]);
        assert_eq!(t.cancellations, Some(7.0));
        let t = ServerTotals::from_texts([frontend]);
        assert_eq!(t.cancellations, Some(9.0));
        assert_eq!(ServerTotals::from_texts([WORKERS]).cancellations, None);
    }

    #[test]
    fn totals_sum_counters_and_average_gauges_over_endpoints() {
        let t = ServerTotals::from_texts([WORKERS, FRONTEND, KVBM]);
        assert_eq!(t.prefix_cache_queries, Some(4000.0));
        assert_eq!(t.prefix_cache_hits, Some(2000.0));
        assert!((t.kv_cache_usage_ratio.unwrap() - 0.3).abs() < 1e-12);
        assert_eq!(t.preemptions, Some(3.0));
        assert_eq!(
            t.kv_offload_blocks,
            Some(7.0),
            "Σ kvbm_offload_blocks_d2h over workers"
        );
        assert_eq!(t.ttft_sum_seconds, Some(2.5));
        assert_eq!(t.ttft_count, Some(10.0));
        assert_eq!(t.kvbm_host_cache_hit_ratio, Some(0.75));
        assert_eq!(t.kvbm_disk_cache_hit_ratio, None);
        assert_eq!(
            ServerTotals::from_texts(["garbage\n"]),
            ServerTotals::default()
        );
        // vLLM without KVBM: no offload count at all, rather than zero.
        let vllm = ServerTotals::from_texts([WORKERS]);
        assert_eq!(vllm.kv_offload_blocks, None);
        assert_eq!(vllm.preemptions, Some(3.0));
    }

    /// Dynamo 1.6.1's disaggregated frontend after three requests with one 3,302-token prompt
    /// (the first cold): both routing phases count the prompt, only the prefill phase the hits.
    const DISAGG_ROUTER: &str = r#"
dynamo_component_router_input_sequence_tokens_sum{dynamo_component="backend",phase="decode",worker_id="d9"} 9906
dynamo_component_router_input_sequence_tokens_sum{dynamo_component="backend",phase="prefill",worker_id="d9"} 9906
dynamo_component_router_kv_selected_cached_prefix_tokens_total{dynamo_component="backend",phase="decode",worker_id="d9"} 0
dynamo_component_router_kv_selected_cached_prefix_tokens_total{dynamo_component="backend",phase="prefill",worker_id="d9"} 6528
"#;

    #[test]
    fn dynamo_router_hits_come_from_the_prefill_phase_never_the_sum_of_phases() {
        let disagg = ServerTotals::from_texts([DISAGG_ROUTER]);
        assert_eq!(
            (disagg.router_cached_tokens, disagg.router_input_tokens),
            (Some(6528.0), Some(9906.0))
        );
        let iv = interval(None, &disagg);
        assert!((iv.prefix_cache_hit_ratio.unwrap() - 6528.0 / 9906.0).abs() < 1e-12);
        // Aggregated: one phase; two workers add up.
        let agg = ServerTotals::from_texts([
            "dynamo_component_router_input_sequence_tokens_sum{phase=\"aggregated\",worker_id=\"a\"} 1000\n\
             dynamo_component_router_input_sequence_tokens_sum{phase=\"aggregated\",worker_id=\"b\"} 1000\n\
             dynamo_component_router_kv_selected_cached_prefix_tokens_total{phase=\"aggregated\",worker_id=\"b\"} 900\n",
        ]);
        assert_eq!(interval(None, &agg).prefix_cache_hit_ratio, Some(0.45));
        // vLLM's own counters win where the engine exports them.
        let both = ServerTotals::from_texts([
            DISAGG_ROUTER,
            "vllm:prefix_cache_queries_total 100\nvllm:prefix_cache_hits_total 25\n",
        ]);
        assert_eq!(interval(None, &both).prefix_cache_hit_ratio, Some(0.25));
    }

    #[test]
    fn intervals_use_deltas_and_survive_a_server_restart() {
        let before = ServerTotals {
            prefix_cache_queries: Some(1000.0),
            prefix_cache_hits: Some(100.0),
            ttft_sum_seconds: Some(10.0),
            ttft_count: Some(100.0),
            preemptions: Some(5.0),
            ..ServerTotals::default()
        };
        let after = ServerTotals {
            prefix_cache_queries: Some(3000.0),
            prefix_cache_hits: Some(1600.0),
            ttft_sum_seconds: Some(16.0),
            ttft_count: Some(110.0),
            preemptions: Some(9.0),
            ..ServerTotals::default()
        };
        let iv = interval(Some(&before), &after);
        assert_eq!(iv.prefix_cache_hit_ratio, Some(0.75));
        assert!((iv.ttft_mean_seconds.unwrap() - 0.6).abs() < 1e-12);
        assert_eq!(iv.preemptions, Some(4.0));
        // Neither scrape had KVBM: no offload delta rather than 0.
        assert_eq!(iv.kv_offload_blocks, None);
        let with_kvbm = |t: &ServerTotals, blocks: f64| ServerTotals {
            kv_offload_blocks: Some(blocks),
            ..*t
        };
        assert_eq!(
            interval(Some(&with_kvbm(&before, 5.0)), &with_kvbm(&after, 12.0)).kv_offload_blocks,
            Some(7.0)
        );
        // Restarted: the new totals are all increase.
        let restarted = ServerTotals {
            prefix_cache_queries: Some(200.0),
            prefix_cache_hits: Some(50.0),
            ..ServerTotals::default()
        };
        assert_eq!(
            interval(Some(&after), &restarted).prefix_cache_hit_ratio,
            Some(0.25)
        );
        // No lookups in between: no ratio rather than 0.
        assert_eq!(interval(Some(&after), &after).prefix_cache_hit_ratio, None);
    }

    #[tokio::test]
    async fn a_dead_endpoint_is_counted_and_publishes_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = format!("http://{}/metrics", listener.local_addr().unwrap());
        drop(listener);
        let metrics = Arc::new(Metrics::new(&[]));
        let scraper = ServerScraper::new(
            vec![ScrapeTarget {
                name: "agg".into(),
                urls: vec![dead],
            }],
            metrics.clone(),
            crate::client::DEFAULT_POOL_IDLE_TIMEOUT,
        )
        .unwrap();
        let mark = scraper.begin_step().await;
        assert!(mark.totals.is_empty());
        let steps = scraper.end_step(mark).await;
        assert_eq!(steps["agg"], ServerStep::default());
        let text = metrics.encode().unwrap();
        assert!(
            text.contains("llm_canary_server_scrape_errors_total{target=\"agg\"} 2"),
            "{text}"
        );
        assert!(!text.contains("llm_canary_server_kv_cache_usage_ratio{"));
    }
}
