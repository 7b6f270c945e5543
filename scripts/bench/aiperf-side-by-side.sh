#!/usr/bin/env bash
# AIPerf and llm-canary side by side (documented, not part of CI): the same simulator process, the
# same workload, one run; prints both tools' TTFT/ITL errors, tokens/s and CPU-seconds per 1M
# tokens, and the ratios (docs/PERFORMANCE.md shows a run).
#
#   scripts/bench/aiperf-side-by-side.sh [OUT_DIR]        (default target/aiperf-side-by-side)
#
# Environment: STREAMS (accuracy levels, default "4 256"), OSL (32), DURATION seconds per run (20),
# TP_STREAMS (throughput concurrency, 64), TP_OSL (256).
#
# Accuracy: the simulator's `fixed` profile (TTFT 100 ms, ITL 10 ms); both tools send open-loop
# arrivals at N streams' worth (N / (0.1 + 0.01·(OSL−1)) requests/s); an error is a tool's TTFT −
# 100 ms and |ITL − 10 ms| (AIPerf's own timestamps cannot be joined with the simulator's, so the
# canary is judged the same way here; `cargo bench --bench client -- accuracy` without --addr also reports its
# error against the simulator's send instants). Throughput: the `fast` profile (zero delay),
# closed loop at TP_STREAMS. CPU: AIPerf's whole process tree (user + system, from /usr/bin/time's
# rusage of the reaped tree), the canary's own process (`/proc/self/stat`); the simulator runs in
# a process of its own and is not counted for either.
#
# AIPerf (PyPI `aiperf`) goes into a cached venv (~/.cache/llm-canary/aiperf-venv, shared with
# scripts/interop/side-by-side.sh). It needs a tokenizer for its synthetic prompts: the tiny Qwen3
# tokenizer that scripts/interop/build-models.py makes (no download from a model hub).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=$(realpath -m "${1:-target/aiperf-side-by-side}")
STREAMS=${STREAMS:-"4 256"}
OSL=${OSL:-32}
DURATION=${DURATION:-20}
TP_STREAMS=${TP_STREAMS:-64}
TP_OSL=${TP_OSL:-256}
AIPERF_VENV=${LLM_CANARY_AIPERF_VENV:-$HOME/.cache/llm-canary/aiperf-venv}
MODELS=${LLM_CANARY_INTEROP_MODELS:-$HOME/.cache/llm-canary/interop-models}
TOKENIZER=$MODELS/qwen3-tiny

if ! "$AIPERF_VENV/bin/aiperf" --version >/dev/null 2>&1; then
  python3 -m venv "$AIPERF_VENV"
  "$AIPERF_VENV/bin/pip" install -q --disable-pip-version-check aiperf
fi
if [[ ! -f $TOKENIZER/tokenizer.json ]]; then
  # build-models.py needs transformers; the vLLM venv has it (scripts/interop/install-vllm.sh).
  export LLM_CANARY_VLLM_VENV=${LLM_CANARY_VLLM_VENV:-$HOME/.cache/llm-canary/vllm-venv}
  scripts/interop/install-vllm.sh "$LLM_CANARY_VLLM_VENV"
  "$LLM_CANARY_VLLM_VENV/bin/python" scripts/interop/build-models.py "$MODELS"
fi
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)"; exit 1; }
# The client benchmark (benches/client.rs), built once; cargo names its binary with a hash.
BENCH=$(cargo bench --quiet --no-run --locked --bench client --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("target", {}).get("name") == "client" and m.get("executable"):
        print(m["executable"])')

rm -rf "$OUT"
mkdir -p "$OUT"
SIM_PID=
HOLD_PID=
stop_sim() {
  # The simulator exits when its stdin closes: end the process holding the pipe open.
  if [[ -n $HOLD_PID ]]; then kill "$HOLD_PID" 2>/dev/null || true; fi
  if [[ -n $SIM_PID ]]; then wait "$SIM_PID" 2>/dev/null || true; fi
  SIM_PID= HOLD_PID=
}
trap stop_sim EXIT
start_sim() {
  local profile=$1 fifo=$OUT/sim-stdin
  rm -f "$fifo" "$OUT/sim-addr"
  mkfifo "$fifo"
  "$BENCH" serve-sim "$profile" <"$fifo" >"$OUT/sim-addr" &
  SIM_PID=$!
  sleep 3600 >"$fifo" &
  HOLD_PID=$!
  for _ in $(seq 100); do [[ -s $OUT/sim-addr ]] && break; sleep 0.1; done
  ADDR=$(head -1 "$OUT/sim-addr")
  echo "simulator ($profile) at $ADDR"
}

# AIPerf's CPU: /usr/bin/time waits for the whole tree and reports its rusage.
run_aiperf() {
  local name=$1; shift
  /usr/bin/time -f '%U %S %e' -o "$OUT/$name.time" \
    "$AIPERF_VENV/bin/aiperf" profile --model sim --tokenizer "$TOKENIZER" --url "http://$ADDR" \
    --endpoint-type chat --streaming \
    --synthetic-input-tokens-mean 64 --synthetic-input-tokens-stddev 0 \
    --output-tokens-stddev 0 --extra-inputs ignore_eos:true \
    --benchmark-duration "$DURATION" --num-warmup-requests 4 --random-seed 12 \
    --ui-type none --export-level records --artifact-dir "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1 ||
    { echo "AIPerf failed, see $OUT/$name.log"; tail -20 "$OUT/$name.log"; }
}

start_sim fixed
for n in $STREAMS; do
  rate=$(python3 -c "print(round($n / (0.1 + 0.01 * ($OSL - 1)), 3))")
  echo "accuracy, $n streams ($rate requests/s): AIPerf"
  run_aiperf "aiperf-acc-$n" --request-rate "$rate" --arrival-pattern constant --output-tokens-mean "$OSL" \
    --extra-inputs "min_tokens:$OSL" --extra-inputs "max_tokens:$OSL"
  echo "accuracy, $n streams: llm-canary"
  "$BENCH" --bench accuracy --addr "$ADDR" --streams "$n" --secs "$DURATION" --osl "$OSL" --client-threads 2 \
    --json "$OUT/canary.jsonl" >"$OUT/canary-acc-$n.log" 2>&1
done
stop_sim

start_sim fast
echo "throughput, $TP_STREAMS streams: AIPerf"
run_aiperf aiperf-tp --concurrency "$TP_STREAMS" --output-tokens-mean "$TP_OSL" \
  --extra-inputs "min_tokens:$TP_OSL" --extra-inputs "max_tokens:$TP_OSL"
echo "throughput, $TP_STREAMS streams: llm-canary"
"$BENCH" --bench throughput --addr "$ADDR" --streams "$TP_STREAMS" --secs "$DURATION" --osl "$TP_OSL" \
  --json "$OUT/canary.jsonl" >"$OUT/canary-tp.log" 2>&1
stop_sim

python3 scripts/bench/compare-aiperf.py "$OUT" "$DURATION" "$OSL" $STREAMS | tee "$OUT/comparison.md"
