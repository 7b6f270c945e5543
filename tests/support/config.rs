//! Config text shared by tests that run the same workloads.

/// All four workloads, short, at time scale 0.02 (OSL ≤ 32, so that even 2.4 s steps measure
/// dozens of requests per target), from `time_scale:` to `schedule:`: the sweep's `levels` and the
/// sequence distribution's `distributions` (YAML lists) are the caller's.
pub fn four_workloads(levels: &str, distributions: &str) -> String {
    format!(
        r#"time_scale: 0.02
workloads:
  concurrency_sweep: {{ levels: {levels}, isl: 256, osl: 24, step: 120s, warmup: 20s }}
  multi_turn: {{ turns: 3, conversations: 2, isl: 64, osl: 12, duration: 300s }}
  sequence_distribution:
    distributions: {distributions}
    isl: {{ min: 128, max: 1024 }}
    osl: {{ min: 8, max: 32 }}
    concurrency: 4
    step: 120s
    warmup: 20s
  prefix_cache: {{ hit_ratios: [0.0, 0.5, 1.0], isl: 2048, osl: 8, concurrency: 4, step: 120s, warmup: 20s, block_size: 64, pool_size: 2 }}
schedule: {{ drain_grace: 5s }}
"#
    )
}
