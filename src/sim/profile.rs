//! Timing and hardware profiles of the simulator: how long a forward pass takes (formula, table,
//! zero-delay or fixed), the GPUs it can pretend to be, and the KV footprint of the served model.

use std::sync::Arc;
use std::time::Duration;

use crate::config::sim::{ModelShape, TimingTable};

/// A quadratic `a·x² + b·x + c` in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quadratic {
    pub a: f64,
    pub b: f64,
    pub c: f64,
}

impl Quadratic {
    pub fn at(&self, x: f64) -> f64 {
        self.a * x * x + self.b * x + self.c
    }
}

/// The published H200 / 8B FP8 prefill fit: `P(t)` ms for `t` uncached prompt tokens in a pass.
pub const H200_PREFILL: Quadratic = Quadratic {
    a: 4.21e-7,
    b: 1.518e-2,
    c: 16.5,
};

/// The published H200 / 8B FP8 decode fit: `D(u)` ms for KV block utilisation `u` in [0, 1].
pub const H200_DECODE: Quadratic = Quadratic {
    a: -25.74,
    b: 54.01,
    c: 5.74,
};

/// Floor of a decode pass, so a fit that dips never yields a free pass.
pub const DECODE_FLOOR_MS: f64 = 1.0;

impl TimingTable {
    pub fn prefill_ms(&self, isl: f64) -> f64 {
        let xs: Vec<f64> = self.prefill.iter().map(|p| p[0]).collect();
        let ys: Vec<f64> = self.prefill.iter().map(|p| p[1]).collect();
        interp(&xs, &ys, isl)
    }

    pub fn decode_ms(&self, kv_tokens: f64, context: f64) -> f64 {
        let g = &self.decode;
        let (i0, i1, fi) = bracket(&g.kv_tokens, kv_tokens);
        let (j0, j1, fj) = bracket(&g.context, context);
        let lo = g.ms[i0][j0] * (1.0 - fj) + g.ms[i0][j1] * fj;
        let hi = g.ms[i1][j0] * (1.0 - fj) + g.ms[i1][j1] * fj;
        lo * (1.0 - fi) + hi * fi
    }
}

/// Indices around `x` on a sorted axis and the fraction between them, clamped at the ends.
fn bracket(axis: &[f64], x: f64) -> (usize, usize, f64) {
    let n = axis.len();
    if n == 1 || x <= axis[0] {
        return (0, 0, 0.0);
    }
    if x >= axis[n - 1] {
        return (n - 1, n - 1, 0.0);
    }
    let hi = axis.partition_point(|v| *v <= x);
    let lo = hi - 1;
    (lo, hi, (x - axis[lo]) / (axis[hi] - axis[lo]))
}

fn interp(xs: &[f64], ys: &[f64], x: f64) -> f64 {
    let (i, j, f) = bracket(xs, x);
    ys[i] * (1.0 - f) + ys[j] * f
}

/// What a pass costs, independent of the hardware scaling applied on top.
#[derive(Debug, Clone)]
pub enum Timing {
    /// `P(t) + D(u)` from two quadratic fits.
    Formula {
        prefill: Quadratic,
        decode: Quadratic,
    },
    /// Interpolated from a measured table.
    Table(Arc<TimingTable>),
    /// Zero delay: measures the simulator's own overhead.
    Fast,
    /// Per-request clock, independent of batching: first token `ttft` after arrival, then one
    /// token every `itl`. For accuracy tests of the client.
    Fixed { ttft: Duration, itl: Duration },
}

/// The inputs of one pass's duration.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PassShape {
    /// Uncached prompt tokens computed in the pass.
    pub prefill_tokens: u64,
    /// Sequences that emit a non-first token in the pass.
    pub decode_seqs: u64,
    /// KV block utilisation after scheduling, in [0, 1].
    pub kv_usage: f64,
    /// KV tokens held by the decoding sequences.
    pub kv_tokens: u64,
}

impl Timing {
    /// Milliseconds of one pass on the reference GPU. The decode term is charged only when some
    /// sequence decodes in the pass: a pass that only prefills samples its first tokens as part of
    /// the prefill forward, which is what the `P(t)` fit measured.
    pub fn pass_ms(&self, shape: PassShape, prefill_scale: f64, decode_scale: f64) -> f64 {
        let prefill = if shape.prefill_tokens == 0 {
            0.0
        } else {
            match self {
                Timing::Formula { prefill, .. } => prefill.at(shape.prefill_tokens as f64),
                Timing::Table(t) => t.prefill_ms(shape.prefill_tokens as f64),
                Timing::Fast | Timing::Fixed { .. } => 0.0,
            }
        };
        let decode = if shape.decode_seqs == 0 {
            0.0
        } else {
            match self {
                Timing::Formula { decode, .. } => decode
                    .at(shape.kv_usage.clamp(0.0, 1.0))
                    .max(DECODE_FLOOR_MS),
                Timing::Table(t) => {
                    let context = shape.kv_tokens as f64 / shape.decode_seqs as f64;
                    t.decode_ms(shape.kv_tokens as f64, context)
                }
                Timing::Fast | Timing::Fixed { .. } => 0.0,
            }
        };
        prefill * prefill_scale + decode * decode_scale
    }
}

/// A GPU the simulator can pretend to be.
///
/// Only H200 is backed by a measurement (the default formula). A100 and L40S are **estimates**:
/// decode (memory-bound) is scaled by the ratio of HBM bandwidth to H200's, prefill
/// (compute-bound) by the ratio of dense BF16 tensor throughput, and tensor parallelism divides both
/// by `tp^0.9` (all-reduce costs keep it below linear).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpu {
    pub name: &'static str,
    pub memory_gb: f64,
    pub bandwidth_tb_s: f64,
    pub bf16_tflops: f64,
    /// On-demand price of one GPU, USD per hour (the hosting instance's price divided by its GPUs).
    pub cost_per_hour_usd: f64,
}

pub const H200: Gpu = Gpu {
    name: "h200",
    memory_gb: 141.0,
    bandwidth_tb_s: 4.8,
    bf16_tflops: 989.0,
    // p5en.48xlarge: 8 × H200.
    cost_per_hour_usd: 63.30 / 8.0,
};

pub const A100: Gpu = Gpu {
    name: "a100",
    memory_gb: 80.0,
    bandwidth_tb_s: 2.039,
    bf16_tflops: 312.0,
    // p4d.24xlarge: 8 × A100 80 GB (p4de list price; the benchmark plan's prefill node).
    cost_per_hour_usd: 32.77 / 8.0,
};

pub const L40S: Gpu = Gpu {
    name: "l40s",
    memory_gb: 48.0,
    bandwidth_tb_s: 0.864,
    bf16_tflops: 362.0,
    // g6e.12xlarge: 4 × L40S.
    cost_per_hour_usd: 10.49 / 4.0,
};

/// The GPUs known by name.
pub const GPUS: [Gpu; 3] = [H200, A100, L40S];

impl Gpu {
    pub fn by_name(name: &str) -> Option<Gpu> {
        GPUS.iter()
            .copied()
            .find(|g| g.name.eq_ignore_ascii_case(name))
    }

    fn tp_speedup(tp: u32) -> f64 {
        f64::from(tp.max(1)).powf(0.9)
    }

    /// Multiplier on the reference prefill time for `tp` of these GPUs.
    pub fn prefill_scale(&self, tp: u32) -> f64 {
        H200.bf16_tflops / self.bf16_tflops / Self::tp_speedup(tp)
    }

    /// Multiplier on the reference decode time for `tp` of these GPUs.
    pub fn decode_scale(&self, tp: u32) -> f64 {
        H200.bandwidth_tb_s / self.bandwidth_tb_s / Self::tp_speedup(tp)
    }
}

impl ModelShape {
    /// KV blocks that fit on `tp` GPUs after the weights, at vLLM's default 90 % memory share.
    pub fn kv_blocks(&self, gpu: &Gpu, tp: u32, block_size: u32) -> u64 {
        let usable_gb = gpu.memory_gb * f64::from(tp.max(1)) * 0.9 - self.weights_gb;
        let bytes_per_block = self.kv_bytes_per_token() as f64 * f64::from(block_size);
        if usable_gb <= 0.0 || bytes_per_block <= 0.0 {
            return 0;
        }
        (usable_gb * 1e9 / bytes_per_block) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::sim::{DecodeGrid, GPU_NAMES, LLAMA_31_8B, QWEN3_30B_A3B_FP8};

    fn formula() -> Timing {
        Timing::Formula {
            prefill: H200_PREFILL,
            decode: H200_DECODE,
        }
    }

    #[test]
    fn formula_matches_the_published_fit() {
        let p = |t| {
            formula().pass_ms(
                PassShape {
                    prefill_tokens: t,
                    ..PassShape::default()
                },
                1.0,
                1.0,
            )
        };
        assert!((p(4096) - 85.74).abs() < 0.05, "{}", p(4096));
        assert!((p(16384) - 378.2).abs() < 0.1, "{}", p(16384));
        assert_eq!(p(0), 0.0);
        let d = |u| {
            formula().pass_ms(
                PassShape {
                    decode_seqs: 1,
                    kv_usage: u,
                    ..PassShape::default()
                },
                1.0,
                1.0,
            )
        };
        assert!((d(0.0) - 5.74).abs() < 1e-9);
        assert!((d(1.0) - 34.01).abs() < 1e-9);
    }

    #[test]
    fn table_interpolates_and_clamps() {
        let table = TimingTable {
            prefill: vec![[1000.0, 20.0], [2000.0, 40.0]],
            decode: DecodeGrid {
                kv_tokens: vec![0.0, 1000.0],
                context: vec![100.0, 200.0],
                ms: vec![vec![5.0, 7.0], vec![9.0, 11.0]],
            },
        };
        assert!(table.validate().is_empty());
        assert_eq!(table.prefill_ms(1500.0), 30.0);
        assert_eq!(table.prefill_ms(10.0), 20.0);
        assert_eq!(table.prefill_ms(1e6), 40.0);
        assert_eq!(table.decode_ms(500.0, 150.0), 8.0);
        assert_eq!(table.decode_ms(5000.0, 0.0), 9.0);
    }

    #[test]
    fn every_gpu_name_the_config_accepts_has_figures() {
        let names: Vec<&str> = GPUS.iter().map(|g| g.name).collect();
        assert_eq!(names.len(), GPU_NAMES.len());
        for name in GPU_NAMES {
            assert!(Gpu::by_name(name).is_some(), "{name}");
        }
    }

    #[test]
    fn kv_footprints_of_the_two_models() {
        assert_eq!(QWEN3_30B_A3B_FP8.kv_bytes_per_token(), 48 * 2 * 4 * 128);
        assert_eq!(LLAMA_31_8B.kv_bytes_per_token(), 32 * 2 * 8 * 128 * 2);
        // A100 × 4 holds far more KV than L40S × 2 after the same weights.
        let a = QWEN3_30B_A3B_FP8.kv_blocks(&A100, 4, 64);
        let l = QWEN3_30B_A3B_FP8.kv_blocks(&L40S, 2, 64);
        assert!(a > 4 * l, "{a} vs {l}");
        assert!(A100.decode_scale(1) > 2.0 && L40S.decode_scale(1) > A100.decode_scale(1));
    }
}
