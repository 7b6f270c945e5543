//! How long one request takes on a simulated deployment, from the simulator's own timing model,
//! before any traffic: what `check` holds `schedule.drain_grace` against (`setup`), so that a
//! drain shorter than the requests a step sends is said before it files them as `timeout`.

use std::time::Duration;

use super::SimSpec;
use super::profile::{DECODE_FLOOR_MS, Gpu, H200, H200_DECODE, H200_PREFILL};
use crate::config::ServingMode;
use crate::config::sim::{PoolSpec, TimingTable};

/// The requests of one step, as the estimate reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepShape {
    /// The longest prompt the step sends, in tokens.
    pub isl: u32,
    /// The longest output it asks for.
    pub osl: u32,
    /// Requests in flight at once on the target.
    pub streams: u32,
    /// Tokens one of them holds in KV on average (its prompt and half its output).
    pub held_tokens: u32,
}

/// One pool's hardware as the engine sees it.
struct Pool {
    gpu: Gpu,
    tp: u32,
    workers: u32,
    kv_tokens: f64,
}

/// The time from sending a request of `shape.isl` prompt and `shape.osl` output tokens to its
/// last token on `spec`'s deployment in `mode`, while `shape.streams` requests share it: the
/// prefill of the whole prompt (no cache hit, in passes of `max_batched_tokens`), the KV handoff
/// in disaggregated mode, and `osl − 1` decode passes at the KV usage the streams hold. Other
/// requests' prefills that share a pass (aggregated) and queueing are left out, so a loaded
/// deployment is slower than this, never faster; a `variability` counts at its slowest period.
/// `table` is the loaded `table_file`, where the
/// profile reads one; `None` without a table to read.
pub fn request_time(
    spec: &SimSpec,
    mode: ServingMode,
    shape: StepShape,
    table: Option<&TimingTable>,
) -> Option<Duration> {
    let tokens = |n: u32| f64::from(n.saturating_sub(1));
    match spec.profile.as_str() {
        "fast" => return Some(Duration::ZERO),
        "fixed" => return Some(spec.fixed_ttft + spec.fixed_itl.mul_f64(tokens(shape.osl))),
        _ => {}
    }
    let table = match spec.profile.as_str() {
        "table" => Some(spec.table.as_ref().or(table)?),
        _ => None,
    };
    let disaggregated = mode == ServingMode::Disaggregated;
    let (front, back) = if disaggregated {
        (
            pool(spec, &spec.prefill, spec.prefill_workers),
            pool(spec, &spec.decode, spec.decode_workers),
        )
    } else {
        let both = || pool(spec, &spec.aggregated, spec.workers);
        (both(), both())
    };
    let chunk = spec.max_batched_tokens.max(1);
    let mut prefill_ms = 0.0;
    let mut left = shape.isl;
    while left > 0 {
        let pass = left.min(chunk);
        prefill_ms += match table {
            Some(t) => t.prefill_ms(f64::from(pass)),
            None => H200_PREFILL.at(f64::from(pass)),
        };
        left -= pass;
    }
    prefill_ms *= front.gpu.prefill_scale(front.tp);
    let handoff = if disaggregated {
        let bytes = spec.model_shape().kv_bytes_per_token() as f64 * f64::from(shape.isl);
        spec.handoff_overhead.as_secs_f64() * 1e3 + bytes / (spec.link_gbps * 1e9) * 1e3
    } else {
        0.0
    };
    let per_worker = shape.streams.div_ceil(back.workers.max(1)).max(1);
    let held = f64::from(per_worker) * f64::from(shape.held_tokens);
    let decode_ms = match table {
        Some(t) => t.decode_ms(held, f64::from(shape.held_tokens)),
        None => {
            let usage = if back.kv_tokens > 0.0 {
                (held / back.kv_tokens).clamp(0.0, 1.0)
            } else {
                1.0
            };
            H200_DECODE.at(usage).max(DECODE_FLOOR_MS)
        }
    } * back.gpu.decode_scale(back.tp);
    // A variable deployment's slowest period stretches every pass (the handoff included).
    let slowest = spec.variability.as_ref().map_or(1.0, |v| v.slowest());
    let ms = (prefill_ms + handoff + tokens(shape.osl) * decode_ms) * slowest;
    Some(Duration::from_secs_f64(ms.max(0.0) / 1e3))
}

/// A pool of `workers` as `sim::cluster` resolves it: its GPU (the pool's, else the profile's,
/// else H200) and its KV capacity in tokens.
fn pool(spec: &SimSpec, p: &PoolSpec, workers: u32) -> Pool {
    let profile_gpu = Gpu::by_name(&spec.profile).unwrap_or(H200);
    let gpu = p
        .gpu
        .as_deref()
        .and_then(Gpu::by_name)
        .unwrap_or(profile_gpu);
    let blocks = p
        .kv_blocks
        .unwrap_or_else(|| spec.model_shape().kv_blocks(&gpu, p.tp, spec.block_size));
    Pool {
        gpu,
        tp: p.tp,
        workers,
        kv_tokens: blocks as f64 * f64::from(spec.block_size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(isl: u32, osl: u32, streams: u32) -> StepShape {
        StepShape {
            isl,
            osl,
            streams,
            held_tokens: isl + osl / 2,
        }
    }

    /// The embedded demo's disaggregated deployment: A100 × 4 prefill, L40S × 2 decode workers.
    fn demo_disaggregated() -> SimSpec {
        SimSpec {
            prefill_workers: 4,
            decode_workers: 4,
            ..SimSpec::source_document()
        }
    }

    #[test]
    fn the_estimate_follows_the_timing_model_and_its_hardware() {
        let disagg = demo_disaggregated();
        // The README's bench on this deployment: ITL 17.28 ms at concurrency 1 (8.89 s for 512
        // tokens), 20.05 ms at 64 (10.4 s).
        let alone = request_time(
            &disagg,
            ServingMode::Disaggregated,
            shape(1024, 512, 1),
            None,
        )
        .unwrap()
        .as_secs_f64();
        assert!((8.7..9.1).contains(&alone), "{alone}");
        let loaded = request_time(
            &disagg,
            ServingMode::Disaggregated,
            shape(1024, 512, 64),
            None,
        )
        .unwrap()
        .as_secs_f64();
        assert!((9.8..10.8).contains(&loaded), "{loaded}");
        // The plan's longest distribution request, 2,048 tokens at L40S speed beside 15 others
        // of the uniform distribution's mean length: over half a minute.
        let uniform = StepShape {
            isl: 4096,
            osl: 2048,
            streams: 16,
            held_tokens: (128 + 4096) / 2 + (64 + 2048) / 4,
        };
        let longest = request_time(&disagg, ServingMode::Disaggregated, uniform, None)
            .unwrap()
            .as_secs_f64();
        assert!((35.0..40.0).contains(&longest), "{longest}");
        // The aggregated A100 × 4 workers decode four times faster (ITL 3.89 ms at concurrency 1).
        let agg = SimSpec {
            workers: 4,
            ..SimSpec::source_document()
        };
        let alone = request_time(&agg, ServingMode::Aggregated, shape(1024, 512, 1), None)
            .unwrap()
            .as_secs_f64();
        assert!((1.95..2.1).contains(&alone), "{alone}");
        // A deployment whose slow periods run 1.5 × 1.1 × (1 ± 0.1) of the model: the estimate
        // holds the drain against the slowest.
        let variable = SimSpec {
            variability: Some(crate::config::sim::Variability {
                scale: 1.1,
                bimodal: Some(crate::config::sim::Bimodal {
                    probability: 0.2,
                    factor: 1.5,
                }),
                jitter: 0.1,
                ..Default::default()
            }),
            ..agg
        };
        let slowest = request_time(
            &variable,
            ServingMode::Aggregated,
            shape(1024, 512, 1),
            None,
        )
        .unwrap()
        .as_secs_f64();
        assert!(
            (slowest / alone - 1.1 * 1.5 * 1.1).abs() < 1e-6,
            "{slowest} vs {alone}"
        );
    }

    #[test]
    fn fixed_and_zero_delay_profiles_are_exact() {
        let fixed = SimSpec {
            profile: "fixed".into(),
            fixed_ttft: Duration::from_millis(100),
            fixed_itl: Duration::from_millis(10),
            ..SimSpec::default()
        };
        assert_eq!(
            request_time(&fixed, ServingMode::Aggregated, shape(64, 8, 4), None),
            Some(Duration::from_millis(170))
        );
        let fast = SimSpec {
            profile: "fast".into(),
            ..SimSpec::default()
        };
        assert_eq!(
            request_time(&fast, ServingMode::Disaggregated, shape(64, 8, 4), None),
            Some(Duration::ZERO)
        );
        // A table profile whose file could not be read has no estimate.
        let table = SimSpec {
            profile: "table".into(),
            ..SimSpec::default()
        };
        assert_eq!(
            request_time(&table, ServingMode::Aggregated, shape(64, 8, 4), None),
            None
        );
    }
}
