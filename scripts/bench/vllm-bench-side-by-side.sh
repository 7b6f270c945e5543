#!/usr/bin/env bash
# vllm-bench (the Rust benchmark client of vllm-project/vllm-bench) and llm-canary side by side
# (documented, not part of CI): the same out-of-process simulator (`llm-canary sim`), the same
# workload, one run; prints both tools' TTFT/ITL errors against the simulator's own send instants,
# streamed tokens/s, CPU-seconds per 1M tokens and peak RSS, and the ratios.
#
#   scripts/bench/vllm-bench-side-by-side.sh VLLM_BENCH_SRC [OUT_DIR]   (default target/vllm-bench-side-by-side)
#   VLLM_BENCH_SRC=~/src/vllm-bench scripts/bench/vllm-bench-side-by-side.sh [OUT_DIR]
#
# VLLM_BENCH_SRC is a vllm-bench source checkout (a git clone, or an extracted archive, e.g.
# `git --git-dir=MIRROR archive HEAD | tar -x -C DIR`). It is built once, with
# `cargo build --release --locked -p vllm-bench` into a target dir of its own
# (~/.cache/llm-canary/vllm-bench/target), and the binary is kept as
# ~/.cache/llm-canary/vllm-bench/<KEY>/vllm-bench, KEY = the checkout's git commit (a clean git
# work tree) or `src-` + a hash of its Cargo.toml, Cargo.lock and src/ (anything else); later runs
# with the same KEY reuse it. VLLM_BENCH_BIN=PATH skips the build and uses that binary.
#
# Environment: STREAMS (paced levels, default "256 1024"), PER_EVENT_STREAMS (levels of the paced
# case against a simulator writing every SSE event on its own, default 1024), DURATION seconds per run (12),
# TP_STREAMS (zero-delay concurrency, 512), TP_SIM_THREADS (the zero-delay simulator's runtime
# threads, 1: the cheapest server, leaving the most of the shared cores to the client; the paced
# simulator keeps one thread per core, which answers a burst of requests sooner), OSL (paced output length, 32), TP_OSL (256), ISL (64),
# API (chat | completions, default chat: the canary's default API; vllm-bench then runs
# `--backend openai-chat`, with `completions` its `--backend openai`), TP_PROMPTS (vllm-bench's
# --num-prompts at zero delay; default: as many requests as the canary finished in its run, so
# both do the same work), LLM_CANARY_BIN (target/release/llm-canary, built if missing),
# LLM_CANARY_INTEROP_MODELS (~/.cache/llm-canary/interop-models: the tokenizer),
# LLM_CANARY_VLLM_BENCH_CACHE (~/.cache/llm-canary/vllm-bench).
#
# Cases, each with a fresh simulator per tool (`llm-canary sim --listen 127.0.0.1:PORT`), stopped
# with SIGINT and waited for, so its --send-log is flushed:
# - paced, at each of STREAMS: the `fixed` profile (TTFT 100 ms, ITL 10 ms), ISL 64, OSL 32, closed
#   loop at N streams for DURATION s. llm-canary: one concurrency_sweep step (levels [N], step
#   DURATION, warmup 0s). vllm-bench: `--max-concurrency N --request-rate inf` with
#   `--num-prompts` = N × DURATION / 0.41 s (the configured time of one request), so it runs
#   about as long.
# - paced-per-event, at each of PER_EVENT_STREAMS: the same against `llm-canary sim
#   --write-per-event`, which hands every SSE event (the role chunk, each token, the finish and
#   usage chunks, `[DONE]`) to the connection on its own, one HTTP chunk and one write each, as
#   vLLM's and Dynamo's frontends do (by default the simulator writes the events already waiting
#   together): more, smaller reads for the client.
# - zero-delay, at TP_STREAMS: the `fast` profile (no model delay), OSL TP_OSL, closed loop; the
#   canary for DURATION s, then vllm-bench over the same number of requests (TP_PROMPTS). No send
#   log here (recording every token's instant would cost the simulator CPU that both clients
#   share the 2 cores with).
#
# Figures (compare-vllm-bench.py; the same definitions for both tools):
# - TTFT error = the tool's TTFT of a request − the server's (its first token's send − the
#   request's arrival at the simulator's host, the kernel's receive stamp of its first segment,
#   from the simulator's --send-log; a simulator busy on the tools' cores reads a request late,
#   a slow server both tools see alike), joined on x-request-id. p50 / p99 over the
#   requests a tool started at least 2 s after its run's first request start (the canary: its
#   intended start; vllm-bench: its `start_times`), so the warmup, the connection storm, is left
#   out for both, and the p99 of those started in the first second ("first second", the storm)
#   on its own row.
# - ITL error = |the tool's mean ITL of the request − the server's mean ITL of its send instants|,
#   p99 over the same steady requests. The tool's mean ITL: the canary's `itl_ms`; vllm-bench's
#   (last content token − first content token) / (n − 1) from its own per-chunk stamps (`ttfts` +
#   `itls`), where n is the server's token count. vllm-bench also stamps the chunks that carry no
#   token (the chat role chunk, sent in the same frame as the first token, and the finish_reason
#   chunk), so the raw mean of its `itls` list, what it feeds its ITL percentiles with, is
#   shown on a row of its own ("as reported").
# - Streamed tokens/s (zero delay): the tokens of the successful requests (the server's usage
#   count, which both tools read) / the run's span. Canary: first request start → last request
#   end from requests.jsonl. vllm-bench: its own `duration` (benchmark start → last request done);
#   the zero-delay run is without --save-detailed, which would add every generated text to its
#   result JSON.
# - CPU-s per 1M tokens: the tool process's user + system time (/usr/bin/time's rusage, whole
#   process including start-up: vllm-bench loads the tokenizer and generates its prompts first)
#   ÷ all tokens streamed in that run. Peak RSS: /usr/bin/time's max RSS (shown for every case;
#   the paced top level and the zero-delay case are the ones to quote). vllm-bench generates
#   all --num-prompts prompts and spawns a task per request up front (its design with
#   --request-rate inf), and keeps every generated text, so its RSS grows with the request count.
# - A second table per case and tool: requests ok / failed / ok without a server record (the
#   join's misses), the TTFT samples, an approximate delivered load (requests started from 2 s ÷
#   what N streams at the configured request time send; closed loop), tokens, CPU-s and wall
#   time, and vllm-bench's own prompt generation time.
#
# vllm-bench mapping (read from its source, src/benchmark.rs, src/datasets/random.rs,
# src/output/json.rs, src/backends/): with `--request-id-prefix P` the random dataset's request i
# gets the id P<i> and sends it as `x-request-id`; every per-request array of the result JSON
# (`ttfts`, `itls`, `start_times`, `latencies`, `output_lens`, `errors`, written with
# --save-detailed) is in dataset order (the order the tasks were spawned, not the order they ran),
# so entry i is request P<i>. `start_times` are seconds since its benchmark start (monotonic),
# `ttfts`/`itls` seconds. It needs a tokenizer for the random dataset even against a simulator:
# --tokenizer takes a directory with tokenizer.json (or the file itself); the tiny Qwen3-MoE
# tokenizer that scripts/interop/build-models.py makes is used (no model hub). It asks the server's
# /tokenize to verify prompt lengths; the simulator answers 404 and it skips that. `--ignore-eos`
# goes into the body; the simulator streams exactly max_tokens either way. A failed request is
# retried by vllm-bench up to 3 times on connection errors (same id; the join takes the server's
# successful record).
#
# The machine's load average at start and its core count are printed with the table: both tools
# and the simulator share the cores, so run it on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The first argument is the checkout when it has a Cargo.toml; otherwise VLLM_BENCH_SRC is.
SRC=${VLLM_BENCH_SRC:-}
if [[ $# -ge 1 && -f $1/Cargo.toml ]]; then SRC=$1; shift; fi
if [[ -z ${VLLM_BENCH_BIN:-} && ( -z $SRC || ! -f $SRC/Cargo.toml ) ]]; then
  echo "usage: $0 VLLM_BENCH_SRC [OUT_DIR]   (or VLLM_BENCH_SRC=DIR, or VLLM_BENCH_BIN=PATH)" >&2
  exit 2
fi
OUT=$(realpath -m "${1:-target/vllm-bench-side-by-side}")
STREAMS=${STREAMS:-"256 1024"}
PER_EVENT_STREAMS=${PER_EVENT_STREAMS:-1024}
DURATION=${DURATION:-12}
TP_STREAMS=${TP_STREAMS:-512}
TP_SIM_THREADS=${TP_SIM_THREADS:-1}
ISL=${ISL:-64}
OSL=${OSL:-32}
TP_OSL=${TP_OSL:-256}
TP_PROMPTS=${TP_PROMPTS:-}
API=${API:-chat}
MODEL=Qwen/Qwen3-30B-A3B-FP8
CANARY=$(realpath -m "${LLM_CANARY_BIN:-target/release/llm-canary}")
MODELS=${LLM_CANARY_INTEROP_MODELS:-$HOME/.cache/llm-canary/interop-models}
TOKENIZER=$MODELS/qwen3-moe-tiny
CACHE=${LLM_CANARY_VLLM_BENCH_CACHE:-$HOME/.cache/llm-canary/vllm-bench}
case $API in
  chat) VB_BACKEND=openai-chat ;;
  completions) VB_BACKEND=openai ;;
  *) echo "API must be chat or completions" >&2; exit 2 ;;
esac
LOADAVG=$(cut -d' ' -f1-3 /proc/loadavg)
CORES=$(nproc)

command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)"; exit 1; }
[[ -x $CANARY ]] || cargo build --release --locked
if [[ ! -f $TOKENIZER/tokenizer.json ]]; then
  # build-models.py needs transformers; the vLLM venv has it (scripts/interop/install-vllm.sh).
  export LLM_CANARY_VLLM_VENV=${LLM_CANARY_VLLM_VENV:-$HOME/.cache/llm-canary/vllm-venv}
  scripts/interop/install-vllm.sh "$LLM_CANARY_VLLM_VENV"
  "$LLM_CANARY_VLLM_VENV/bin/python" scripts/interop/build-models.py "$MODELS"
fi

# vllm-bench, built once per source version.
if [[ -n ${VLLM_BENCH_BIN:-} ]]; then
  VB=$(realpath "$VLLM_BENCH_BIN")
  VB_KEY=given
else
  SRC=$(realpath "$SRC")
  if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
    [[ -z $(git -C "$SRC" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    VB_KEY=$(git -C "$SRC" rev-parse HEAD)
  else
    VB_KEY=src-$(cd "$SRC" && find Cargo.toml Cargo.lock src -type f 2>/dev/null | LC_ALL=C sort |
      xargs sha256sum | sha256sum | cut -c1-16)
  fi
  VB=$CACHE/$VB_KEY/vllm-bench
  if [[ ! -x $VB ]]; then
    echo "building vllm-bench ($VB_KEY) from $SRC (once; a few minutes)"
    (cd "$SRC" && nice -n 10 cargo build --release --locked -p vllm-bench --target-dir "$CACHE/target")
    mkdir -p "$CACHE/$VB_KEY"
    cp "$CACHE/target/release/vllm-bench" "$VB.tmp"
    mv "$VB.tmp" "$VB"
  fi
fi
echo "vllm-bench: $VB ($("$VB" --version 2>/dev/null || echo '?'))"
echo "llm-canary: $CANARY ($("$CANARY" --version 2>/dev/null || echo '?'))"

# 1024 streams need more than 1024 descriptors in either client.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
rm -rf "$OUT"
mkdir -p "$OUT"

SIM_PID=
stop_sim() {
  # SIGINT: the simulator drains, flushes its send log and exits.
  if [[ -n $SIM_PID ]]; then
    kill -INT "$SIM_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$SIM_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$SIM_PID" 2>/dev/null; then
      echo "  simulator did not stop on SIGINT; its send log may be incomplete" >&2
      kill -TERM "$SIM_PID" 2>/dev/null || true
    fi
    wait "$SIM_PID" 2>/dev/null || true
  fi
  SIM_PID=
}
trap stop_sim EXIT
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# start_sim PROFILE DIR [send-log] [SIM FLAGS...]: a fresh simulator on a free port; sets PORT.
start_sim() {
  local profile=$1 dir=$2 extra=()
  shift 2
  if [[ ${1:-} == send-log ]]; then extra=(--send-log "$dir/send.jsonl"); shift; fi
  extra+=("$@")
  PORT=$(free_port)
  "$CANARY" sim --profile "$profile" --listen "127.0.0.1:$PORT" "${extra[@]}" >"$dir/sim.log" 2>&1 &
  SIM_PID=$!
  for _ in $(seq 500); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then return; fi
    sleep 0.01
  done
  echo "llm-canary sim did not listen on $PORT (see $dir/sim.log)" >&2
  exit 1
}
# timed DIR CMD...: runs CMD with its rusage in DIR/time (user s, system s, wall s, max RSS KiB).
timed() {
  local dir=$1; shift
  /usr/bin/time -f '%U %S %e %M' -o "$dir/time" "$@" >"$dir/log" 2>&1 ||
    { echo "  failed, see $dir/log"; tail -20 "$dir/log"; }
}
run_canary() {
  local dir=$1 streams=$2 osl=$3 api_line=
  if [[ $API == completions ]]; then api_line=", api: completions"; fi
  cat >"$dir/config.yaml" <<EOF
targets:
  - { name: sim, serving_mode: aggregated, url: 'http://127.0.0.1:$PORT', model: $MODEL$api_line }
time_scale: 1.0
workloads:
  concurrency_sweep: { levels: [$streams], isl: $ISL, osl: $osl, step: ${DURATION}s, warmup: 0s }
schedule:
  cycle: [concurrency_sweep]
EOF
  timed "$dir" "$CANARY" bench --config "$dir/config.yaml" --out "$dir/out"
}
# run_vllm_bench DIR STREAMS OSL PROMPTS ID_PREFIX [EXTRA...]
run_vllm_bench() {
  local dir=$1 streams=$2 osl=$3 prompts=$4 prefix=$5; shift 5
  timed "$dir" "$VB" --backend "$VB_BACKEND" --base-url "http://127.0.0.1:$PORT" \
    --model "$MODEL" --tokenizer "$TOKENIZER" --dataset-name random \
    --random-input-len "$ISL" --random-output-len "$osl" --ignore-eos \
    --num-prompts "$prompts" --request-rate inf --max-concurrency "$streams" \
    --request-id-prefix "$prefix" --seed 12 --disable-tqdm \
    --save-result --result-dir "$dir" --result-filename result.json "$@"
}

# paced NAME STREAMS [SIM FLAGS...]: the paced case NAME-STREAMS, both tools.
paced() {
  local name=$1 n=$2 prompts case
  shift 2
  prompts=$(python3 -c "print(max($n, round($n * $DURATION / (0.1 + 0.01 * ($OSL - 1)))))")
  case=$OUT/$name-$n
  mkdir -p "$case/canary" "$case/vllm-bench"
  echo "$name, $n streams, ${DURATION} s: llm-canary"
  start_sim fixed "$case/canary" send-log "$@"
  run_canary "$case/canary" "$n" "$OSL"
  stop_sim
  echo "$name, $n streams, $prompts requests: vllm-bench"
  start_sim fixed "$case/vllm-bench" send-log "$@"
  run_vllm_bench "$case/vllm-bench" "$n" "$OSL" "$prompts" "vb-$name$n-" --save-detailed
  stop_sim
}
for n in $STREAMS; do paced paced "$n"; done
for n in $PER_EVENT_STREAMS; do paced paced-per-event "$n" --write-per-event; done

case=$OUT/zero-delay-$TP_STREAMS
mkdir -p "$case/canary" "$case/vllm-bench"
echo "zero-delay, $TP_STREAMS streams, ${DURATION} s: llm-canary"
start_sim fast "$case/canary" --threads "$TP_SIM_THREADS"
run_canary "$case/canary" "$TP_STREAMS" "$TP_OSL"
stop_sim
if [[ -z $TP_PROMPTS ]]; then
  TP_PROMPTS=$(python3 -c 'import json, sys
n = sum(1 for l in open(sys.argv[1]) if json.loads(l).get("outcome") == "ok")
print(max(n, 2 * int(sys.argv[2])))' "$case/canary/out/requests.jsonl" "$TP_STREAMS" 2>/dev/null ||
    echo $((TP_STREAMS * 20)))
fi
echo "zero-delay, $TP_STREAMS streams, $TP_PROMPTS requests: vllm-bench"
start_sim fast "$case/vllm-bench" --threads "$TP_SIM_THREADS"
run_vllm_bench "$case/vllm-bench" "$TP_STREAMS" "$TP_OSL" "$TP_PROMPTS" "vb-tp$TP_STREAMS-"
stop_sim

python3 - "$OUT/params.json" <<EOF
import json, sys
json.dump({"streams": [int(s) for s in "$STREAMS".split()],
           "per_event_streams": [int(s) for s in "$PER_EVENT_STREAMS".split()], "tp_streams": $TP_STREAMS,
           "duration": $DURATION, "isl": $ISL, "osl": $OSL, "tp_osl": $TP_OSL, "api": "$API",
           "tp_prompts": int("$TP_PROMPTS"), "tp_sim_threads": $TP_SIM_THREADS, "loadavg": "$LOADAVG", "cores": $CORES,
           "vllm_bench": "$VB_KEY"}, open(sys.argv[1], "w"), indent=1)
EOF
python3 scripts/bench/compare-vllm-bench.py "$OUT" | tee "$OUT/comparison.md"
