#!/usr/bin/env bash
# The embedded simulator checked against NVIDIA Dynamo's own mocker (documented, not part of CI;
# docs/INTEROP.md shows a run). One short plan runs twice through `llm-canary bench`: against real
# Dynamo 1.6.1 stacks with mocker workers (aggregated: two workers; disaggregated: a prefill and a
# decode worker), and against two embedded simulators set to the mocker's timing (the same H200
# prefill and decode polynomials, its KV pool of 16,384 blocks of 64 tokens, its batch limits, and
# the handoff the mocker stacks measure). Then compare-sim-mocker.py prints the shapes side by side
# (TTFT against concurrency, disaggregated against aggregated at short prompts, TTFT against the
# prefix hit ratio) and the metric names the simulator exports that the real stacks lack.
#
#   scripts/interop/sim-vs-mocker.sh [OUT_DIR]      (default target/sim-vs-mocker)
#
# Environment: LLM_CANARY_DYNAMO_VENV (install-dynamo.sh's venv), PORT (base port, 18100; the
# disaggregated stack takes PORT+100, a lone simulator for the name check PORT+200), HANDOFF_MS (48: the mocker stacks' prefill → decode handoff
# as measured, docs/INTEROP.md), STEP (seconds per step, 20).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$(realpath -m "${1:-target/sim-vs-mocker}")
PORT=${PORT:-18100}
HANDOFF_MS=${HANDOFF_MS:-48}
STEP=${STEP:-20}
export LLM_CANARY_DYNAMO_VENV=${LLM_CANARY_DYNAMO_VENV:-$HOME/.cache/llm-canary/dynamo-venv}
MODEL_DIR=${DYNAMO_MODEL_DIR:-$HOME/.cache/llm-canary/dynamo-models/tiny-qwen3}

scripts/interop/install-dynamo.sh "$LLM_CANARY_DYNAMO_VENV"
cargo build --quiet --locked --release --bin llm-canary
rm -rf "$OUT"
mkdir -p "$OUT"
scripts/interop/dynamo-stack.sh start agg "$OUT/agg" "$PORT"
trap 'scripts/interop/dynamo-stack.sh stop "$OUT/agg" >/dev/null || true; scripts/interop/dynamo-stack.sh stop "$OUT/disagg" >/dev/null || true' EXIT
scripts/interop/dynamo-stack.sh start disagg "$OUT/disagg" "$((PORT + 100))"
url() { awk -v n="$2" '$1 == n { print $2 }' "$OUT/$1/urls"; }
metrics() { awk '$1 ~ /-metrics$/ { printf "%s\"%s\"", sep, $2; sep=", " }' "$OUT/$1/urls"; }

# The short plan both runs share.
PLAN="workloads:
  concurrency_sweep: { levels: [1, 4, 16], isl: 1024, osl: 64, step: ${STEP}s, warmup: 3s }
  sequence_distribution:
    distributions: [uniform]
    isl: { min: 128, max: 256 }
    osl: { min: 32, max: 32 }
    concurrency: 2
    step: ${STEP}s
    warmup: 3s
  prefix_cache: { hit_ratios: [0.0, 0.5, 1.0], isl: 2048, osl: 32, concurrency: 4, step: ${STEP}s, warmup: 3s, pool_size: 2 }
schedule: { cycle: [concurrency_sweep, sequence_distribution, prefix_cache], drain_grace: 30s, max_lag_p99: 5s }
tokenizer: $MODEL_DIR
export: { listen: 127.0.0.1:0 }"

cat >"$OUT/mocker.yaml" <<YAML
targets:
  - { name: agg, serving_mode: aggregated, url: "$(url agg frontend)", model: auto, dialect: dynamo, server_metrics: [$(metrics agg)] }
  - { name: disagg, serving_mode: disaggregated, url: "$(url disagg frontend)", model: auto, dialect: dynamo, server_metrics: [$(metrics disagg)] }
$PLAN
YAML

# The mocker's timing (docs/INTEROP.md, "The simulator against the mocker"): the default profile's
# H200 polynomials at scale 1 are the mocker's; a KV pool of 16,384 blocks of 64 tokens per
# worker; the tiny model's 57,344 KV bytes per token over the mocker's default 64 GB/s.
SIM="profile: default, block_size: 64, max_batched_tokens: 8192, max_running: 256, link_gbps: 64,
      handoff_overhead: ${HANDOFF_MS}ms, model: tiny-qwen3,
      model_shape: { layers: 28, kv_heads: 8, head_dim: 64, dtype_bytes: 2, weights_gb: 0 }"
cat >"$OUT/sim.yaml" <<YAML
targets:
  - name: agg
    serving_mode: aggregated
    simulated: { $SIM, workers: 2, aggregated: { gpu: h200, tp: 1, kv_blocks: 16384 } }
  - name: disagg
    serving_mode: disaggregated
    simulated: { $SIM, prefill: { gpu: h200, tp: 1, kv_blocks: 16384 }, decode: { gpu: h200, tp: 1, kv_blocks: 16384 } }
$PLAN
YAML

for run in mocker sim; do
  echo "bench against the $run"
  target/release/llm-canary bench --config "$OUT/$run.yaml" --format markdown --out "$OUT/$run" \
    >"$OUT/$run.md" 2>"$OUT/$run.log"
done

# Every name each side exposes, for the name check.
for m in $(awk '$1 ~ /-metrics$/ { print $2 }' "$OUT/agg/urls" "$OUT/disagg/urls"); do curl -sf "$m"; done \
  >"$OUT/mocker-metrics.txt"
SIM_URL=http://127.0.0.1:$((PORT + 200))
target/release/llm-canary sim --mode disaggregated --listen "${SIM_URL#http://}" >"$OUT/sim-serve.log" 2>&1 &
SIM_PID=$!
trap 'kill $SIM_PID 2>/dev/null || true; scripts/interop/dynamo-stack.sh stop "$OUT/agg" >/dev/null || true; scripts/interop/dynamo-stack.sh stop "$OUT/disagg" >/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "$SIM_URL/metrics" >/dev/null && break; sleep 0.2; done
curl -sf "$SIM_URL/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}' >/dev/null
curl -sf "$SIM_URL/metrics" >"$OUT/sim-metrics.txt"

"$LLM_CANARY_DYNAMO_VENV/bin/python" scripts/interop/compare-sim-mocker.py "$OUT" | tee "$OUT/comparison.md"
