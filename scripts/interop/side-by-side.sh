#!/usr/bin/env bash
# Side by side (documented, not part of CI): the same short concurrency sweep measured by AIPerf
# and by llm-canary against one server, then both tools' TTFT/ITL per step and their agreement as
# a Markdown table (docs/INTEROP.md shows runs). The tools alternate level by level, and the
# server's own TTFT/ITL histograms, read before and after each tool's run, give the server's view
# of the same requests as a reference for both.
#
#   scripts/interop/side-by-side.sh [OUT_DIR]        (default target/side-by-side[-ENGINE])
#
# ENGINE=vllm (default): one vLLM CPU server (scripts/interop/install-vllm.sh, serve-vllm.sh);
#   the reference is vLLM's vllm:time_to_first_token_seconds / vllm:inter_token_latency_seconds.
# ENGINE=dynamo: a real NVIDIA Dynamo 1.6.1 stack with mocker workers (install-dynamo.sh,
#   dynamo-stack.sh; DYNAMO_MODE=agg (default) or disagg); the reference is the frontend's
#   dynamo_frontend_time_to_first_token_seconds / dynamo_frontend_inter_token_latency_seconds.
#
# Environment: LEVELS (default "1 2"), ISL (256), OSL (32), DURATION seconds per step (20).
# AIPerf (PyPI `aiperf`) goes into its own cached venv (~/.cache/llm-canary/aiperf-venv). It uses
# the model folder's tokenizer by path and the server's token counts (--use-server-token-count);
# HF_HUB_OFFLINE is deliberately not set (AIPerf's tokenizer loader treats a local path as such).
# Both tools send the same length recipe (ignore_eos and min_tokens at the body root).
set -euo pipefail
cd "$(dirname "$0")/../.."
ENGINE=${ENGINE:-vllm}
OUT=$(realpath -m "${1:-target/side-by-side-$ENGINE}")
LEVELS=${LEVELS:-"1 2"}
ISL=${ISL:-256}
OSL=${OSL:-32}
DURATION=${DURATION:-20}
AIPERF_VENV=${LLM_CANARY_AIPERF_VENV:-$HOME/.cache/llm-canary/aiperf-venv}

if ! "$AIPERF_VENV/bin/aiperf" --version >/dev/null 2>&1; then
  python3 -m venv "$AIPERF_VENV"
  "$AIPERF_VENV/bin/pip" install -q --disable-pip-version-check aiperf
fi
cargo build --quiet --locked --release --bin llm-canary
rm -rf "$OUT"
mkdir -p "$OUT"

case $ENGINE in
  vllm)
    export LLM_CANARY_VLLM_VENV=${LLM_CANARY_VLLM_VENV:-$HOME/.cache/llm-canary/vllm-venv}
    MODELS=${LLM_CANARY_INTEROP_MODELS:-$HOME/.cache/llm-canary/interop-models}
    MODEL_DIR=$MODELS/qwen3-tiny
    MODEL=qwen3-tiny
    PY=$LLM_CANARY_VLLM_VENV/bin/python
    scripts/interop/install-vllm.sh "$LLM_CANARY_VLLM_VENV"
    "$PY" scripts/interop/build-models.py "$MODELS"
    PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    URL=http://127.0.0.1:$PORT
    METRICS=$URL/metrics
    setsid scripts/interop/serve-vllm.sh "$MODEL_DIR" "$PORT" >"$OUT/vllm.log" 2>&1 &
    VLLM_PID=$!
    trap 'kill -TERM -- -$VLLM_PID 2>/dev/null || true; wait $VLLM_PID 2>/dev/null || true' EXIT
    for _ in $(seq 600); do
      curl -sf "$URL/health" >/dev/null && break
      kill -0 "$VLLM_PID" 2>/dev/null || { tail -30 "$OUT/vllm.log"; exit 1; }
      sleep 1
    done
    curl -sf "$URL/health" >/dev/null
    echo "vLLM healthy at $URL"
    ;;
  dynamo)
    export LLM_CANARY_DYNAMO_VENV=${LLM_CANARY_DYNAMO_VENV:-$HOME/.cache/llm-canary/dynamo-venv}
    scripts/interop/install-dynamo.sh "$LLM_CANARY_DYNAMO_VENV"
    PY=$LLM_CANARY_DYNAMO_VENV/bin/python
    PORT=${DYNAMO_PORT:-18000}
    scripts/interop/dynamo-stack.sh start "${DYNAMO_MODE:-agg}" "$OUT/stack" "$PORT"
    trap 'scripts/interop/dynamo-stack.sh stop "$OUT/stack" >/dev/null || true' EXIT
    # shellcheck disable=SC1091
    source "$OUT/stack/stack"
    MODEL_DIR=${DYNAMO_MODEL_DIR:-$HOME/.cache/llm-canary/dynamo-models/tiny-qwen3}
    URL=$(awk '$1 == "frontend" { print $2 }' "$OUT/stack/urls")
    METRICS=$(awk '$1 == "frontend-metrics" { print $2 }' "$OUT/stack/urls")
    ;;
  *) echo "ENGINE must be vllm or dynamo" >&2; exit 2 ;;
esac

# The server's own histograms before and after each run (its view of that run's requests).
snap() { curl -sf "$METRICS" >"$OUT/metrics-$1.txt"; }

# The canary's ISL is the prompt as the server counts it, chat template included; AIPerf's is the
# synthetic content before the template. One AIPerf request tells the template's size, so both
# tools send prompts of the same server-side length.
canary_isl=$ISL
for c in $LEVELS; do
  echo "AIPerf, concurrency $c"
  snap "aiperf-c$c-before"
  "$AIPERF_VENV/bin/aiperf" profile \
    --model "$MODEL" --tokenizer "$MODEL_DIR" --url "$URL" \
    --endpoint-type chat --streaming --concurrency "$c" \
    --synthetic-input-tokens-mean "$ISL" --synthetic-input-tokens-stddev 0 \
    --output-tokens-mean "$OSL" --output-tokens-stddev 0 \
    --extra-inputs ignore_eos:true --extra-inputs "min_tokens:$OSL" \
    --use-server-token-count --benchmark-duration "$DURATION" --num-warmup-requests 2 \
    --random-seed 12 --ui-type none --export-level records \
    --artifact-dir "$OUT/aiperf-c$c" >"$OUT/aiperf-c$c.log" 2>&1
  snap "aiperf-c$c-after"
  if [ "$canary_isl" = "$ISL" ]; then
    canary_isl=$("$PY" scripts/interop/compare-side-by-side.py \
      --aiperf-prompt-tokens "$OUT" "$c")
  fi

  cat >"$OUT/canary-c$c.yaml" <<YAML
targets:
  - { name: $ENGINE, serving_mode: aggregated, url: "$URL", model: auto, dialect: $ENGINE, server_metrics: ["$METRICS"] }
tokenizer: $MODEL_DIR/tokenizer.json
workloads:
  concurrency_sweep: { levels: [$c], isl: $canary_isl, osl: $OSL, step: ${DURATION}s, warmup: 2s }
schedule: { cycle: [concurrency_sweep], drain_grace: 30s, max_lag_p99: 5s }
YAML
  echo "llm-canary, concurrency $c (ISL $canary_isl)"
  snap "canary-c$c-before"
  target/release/llm-canary bench --config "$OUT/canary-c$c.yaml" --workload concurrency_sweep \
    --format markdown --out "$OUT/canary-c$c" >"$OUT/canary-c$c.log" 2>&1
  snap "canary-c$c-after"
done

"$PY" scripts/interop/compare-side-by-side.py "$OUT" $LEVELS | tee "$OUT/comparison.md"
