#!/usr/bin/env bash
# One short pass of llm-canary against `transformers serve --continuous-batching` on one GPU
# (issue #12's optional GPU run; figures in docs/INTEROP.md, "On a GPU"). Runs ON the GPU
# machine, which cannot download anything, from the repository root:
#
#   installs the carried wheels (.whl/) into /tmp/site; builds qwen3-moe-tiny with
#   scripts/interop/build-models.py; starts `transformers serve --continuous-batching` on
#   127.0.0.1:8765 (log in $OUT/server.log); polls GET /health; sends two warm-up requests; runs
#   `llm-canary bench --config examples/gpu-transformers.yaml` (tables in $OUT/bench.md, the
#   whole --out folder as $OUT/bench-out.tar.gz); stops the server.
#
# Prepared here, once, in the repository root (both folders are in .git/info/exclude):
#
#   echo /.whl/ >> .git/info/exclude; echo /.gpu/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl transformers==5.19.0 fastapi==0.136.3 \
#     starlette==1.10.0 uvicorn==0.54.0 pydantic==2.14.4 pydantic_core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
#     annotated-doc==0.0.7 openai==3.57.0 jiter==0.19.0 sniffio==1.3.1 httpx2==2.16.2 \
#     httpcore2==2.16.2 anyio==4.16.0 h11==0.16.0 idna==3.20 truststore==0.10.5 \
#     typer==0.29.2 click==8.5.1 regex==2026.11.19
#   cargo build --release && mkdir -p .gpu && strip -o .gpu/llm-canary target/release/llm-canary
#   cp -r /usr/share/common-licenses .gpu/   # tokenizer corpus, used only if the GPU machine lacks it
#
# Through the device tool (kind nvidia-h200, carry [".whl", ".gpu"], timeout_s 600); the whole
# command took 316 s on 2026-11-30:
#
#   bash scripts/interop/gpu-transformers.sh
#
# The server's defaults pick no CUDA graphs with SDPA attention (the machine has no flash-attn);
# docs/INTEROP.md compares both at half the plan's durations (about 170 s a pass), each with the
# engine's own log:
#
#   CB_LOG=DEBUG BENCH_ARGS="--time-scale 0.5" bash scripts/interop/gpu-transformers.sh
#   CB_LOG=DEBUG BENCH_ARGS="--time-scale 0.5" SERVE_ARGS=--cb-use-cuda-graph \
#     bash scripts/interop/gpu-transformers.sh
#
# At most 8 files come back from $OUT; one pass writes 8 (run.log, env.txt, server.log,
# warmup.txt, bench.md, bench.log, summary.json, bench-out.tar.gz): for two passes in one command
# give each its own OUT under /tmp and tar them into $OUT.
#
# Locally, as a dry run against the CPU (no wheels, the interop venv's python, a compressed plan):
#
#   OUT=/tmp/gpu-dry WHEELS=none PYTHON=~/.cache/llm-canary/vllm-venv/bin/python DEVICE=cpu \
#     CANARY=target/release/llm-canary BENCH_ARGS="--time-scale 0.15" \
#     scripts/interop/gpu-transformers.sh
#
# Settings (environment): OUT (results, default ./gpu-out), PYTHON (python3), WHEELS (.whl, or
# `none`), CANARY (.gpu/llm-canary), DEVICE (cuda), CB (1: --continuous-batching; 0: without),
# SERVE_ARGS (extra `transformers serve` arguments, e.g. --no-cb-use-cuda-graph), CB_LOG (a level,
# e.g. DEBUG: the continuous-batching engine's own log, which nothing shows by default, goes to
# server.log: cuda-graph decisions and captures, "Found a prefix match of N tokens for request
# <x-request-id>"), BENCH_ARGS (extra `llm-canary bench` arguments), BENCH_TIMEOUT (seconds, 450).
set -uo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-$PWD/gpu-out}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
CANARY=${CANARY:-.gpu/llm-canary}
DEVICE=${DEVICE:-cuda}
CB=${CB:-1}
SERVE_ARGS=${SERVE_ARGS:-}
CB_LOG=${CB_LOG:-}
BENCH_ARGS=${BENCH_ARGS:-}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-450}
CONFIG=examples/gpu-transformers.yaml
ROOT=/tmp/llm-canary-gpu            # the config's model path points here
MODEL=$ROOT/models/qwen3-moe-tiny
PORT=8765                           # the config's target url
BASE=http://127.0.0.1:$PORT
mkdir -p "$OUT" "$ROOT/hf-cache"
exec > >(tee "$OUT/run.log") 2>&1

# Multicast off (KINDS.md; one GPU does not use it, but every program started here inherits it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_UPDATE_CHECK=1 \
  HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_CACHE=$ROOT/hf-cache TOKENIZERS_PARALLELISM=false \
  PYTHONUNBUFFERED=1

log() { echo "[$(date -u +%H:%M:%S)] $*"; }
fail() { log "FAILED: $*"; exit 1; }

if [[ $WHEELS != none ]]; then
  log "installing $(ls "$WHEELS"/*.whl | wc -l) wheels into /tmp/site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || fail "pip install"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  uname -m
  "$PYTHON" - <<'EOF'
import importlib.metadata as md, sys
print("python", sys.version.split()[0])
for name in ["torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "accelerate",
             "fastapi", "starlette", "uvicorn", "pydantic", "openai", "kernels", "flash_attn"]:
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "-")
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0))
EOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$CANARY" --version
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# build-models.py trains its tokenizer on /usr/share/common-licenses and the repository's Markdown.
if [[ ! -d /usr/share/common-licenses && -d .gpu/common-licenses ]]; then
  log "no /usr/share/common-licenses here: using the carried copy"
  cp -r .gpu/common-licenses /usr/share/common-licenses
fi
log "building the model"
"$PYTHON" scripts/interop/build-models.py "$ROOT/models" || fail "build-models.py"
ls -la "$MODEL"
# The example names no tokenizer: `check` refuses a path that is not there, and this one exists
# only now. The run's copy of the config adds the model's.
RUN_CONFIG=$ROOT/gpu-transformers.yaml
{ cat "$CONFIG"; printf '\ntokenizer: %s/tokenizer.json\n' "$MODEL"; } >"$RUN_CONFIG"
"$CANARY" check --config "$RUN_CONFIG" >/dev/null || fail "check $RUN_CONFIG"

serve_args=(serve --host 127.0.0.1 --port "$PORT" --device "$DEVICE" --log-level info)
[[ $CB == 1 ]] && serve_args+=(--continuous-batching)
# shellcheck disable=SC2206
serve_args+=($SERVE_ARGS)
log "starting: transformers ${serve_args[*]} $MODEL${CB_LOG:+ (ContinuousBatchingLogger at $CB_LOG)}"
# The transformers CLI, with the continuous-batching logger (a plain `logging` logger without a
# handler) shown at CB_LOG when that is set.
# shellcheck disable=SC2016
serve_py='import logging, sys
level = sys.argv.pop(1)
if level:
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    cb = logging.getLogger("ContinuousBatchingLogger")
    cb.setLevel(level); cb.addHandler(h); cb.propagate = False
sys.argv[0] = "transformers"
from transformers.cli.transformers import main
main()'
# Its own process group, so that stopping it stops every child.
setsid "$PYTHON" -c "$serve_py" "$CB_LOG" "${serve_args[@]}" "$MODEL" \
  >"$OUT/server.log" 2>&1 </dev/null &
SERVER=$!
stop_server() {
  if kill -0 "$SERVER" 2>/dev/null; then
    log "stopping the server (process group $SERVER)"
    kill -TERM -- "-$SERVER" 2>/dev/null
    for _ in $(seq 20); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$SERVER" 2>/dev/null
  fi
}
trap stop_server EXIT

started=$(date +%s)
until curl -fsS -o /dev/null "$BASE/health" 2>/dev/null; do
  kill -0 "$SERVER" 2>/dev/null || { tail -40 "$OUT/server.log"; fail "the server exited before /health answered"; }
  (( $(date +%s) - started > 300 )) && { tail -40 "$OUT/server.log"; fail "no /health within 300 s"; }
  sleep 1
done
log "healthy after $(( $(date +%s) - started )) s"

# Warm-up: the first request initialises the continuous-batching manager (KV cache, graphs).
warm() {
  curl -sS -N --max-time 300 -H 'content-type: application/json' "$BASE/v1/chat/completions" \
    -d "{\"model\": \"$MODEL\", \"stream\": true, \"max_tokens\": $1,
         \"messages\": [{\"role\": \"user\", \"content\": \"the license terms of the software\"}]}"
}
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
t0=$(date +%s%N)
warm 16 >"$OUT/warmup.txt" 2>&1 || { tail -40 "$OUT/server.log"; fail "warm-up request"; }
log "warm-up 1: $(ms_since "$t0") ms, $(grep -c '^data:' "$OUT/warmup.txt") data lines"
tail -c 600 "$OUT/warmup.txt"; echo
t0=$(date +%s%N)
warm 16 >/dev/null 2>&1
log "warm-up 2: $(ms_since "$t0") ms"

log "bench: $CANARY bench --config $RUN_CONFIG --format markdown --out $ROOT/bench $BENCH_ARGS"
rm -rf "$ROOT/bench"
# SIGINT at the limit: the bench drains the running step and still writes the finished ones.
# shellcheck disable=SC2086
timeout -s INT -k 30 "$BENCH_TIMEOUT" "$CANARY" bench --config "$RUN_CONFIG" --format markdown --out "$ROOT/bench" \
  $BENCH_ARGS >"$OUT/bench.md" 2>"$OUT/bench.log"
rc=$?
log "bench exit $rc"
tail -25 "$OUT/bench.log"
command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=memory.used,memory.total,utilization.gpu --format=csv >>"$OUT/env.txt"
stop_server
cp "$ROOT/bench/summary.json" "$OUT/" 2>/dev/null
# One line per step: what docs/INTEROP.md records. The server reports no cached tokens; with
# CB_LOG=DEBUG its log names the prefix it reused per request (by x-request-id), summed here per
# step over the steady window ("server prefix hit" = reused / prompt tokens).
"$PYTHON" - "$OUT/summary.json" "$ROOT/bench/requests.jsonl" "$OUT/server.log" <<'EOF' || true
import collections, json, re, sys
summary, requests, server_log = sys.argv[1:]
reused = {}
for line in open(server_log, errors="replace"):
    m = re.search(r"Found a prefix match of (\d+) tokens for request (\S+)", line)
    if m:
        reused[m.group(2)] = int(m.group(1))
per_step = collections.defaultdict(lambda: [0, 0, 0])
for line in open(requests):
    r = json.loads(line)
    if r["phase"] != "steady" or not r["prompt_tokens"]:
        continue
    label = r["concurrency"] or r["distribution"] or r["prefix_ratio"] or ""
    key = (r["workload"], label)
    per_step[key][0] += r["prompt_tokens"]
    per_step[key][1] += reused.get(r["x_request_id"], 0)
    per_step[key][2] += r["x_request_id"] in reused
ms = lambda h, k: f"{h[k] * 1000:.1f}" if h else "-"
print("step | requests | outcomes | osl mismatches | TTFT p50/p99 ms | ITL p50/p99 ms | tok/s"
      " | cached tokens | server prefix hit (requests with a match)")
for s in json.load(open(summary))["steps"]:
    if "isl_bucket" in s["labels"] or "turn" in s["labels"]:
        continue  # per bucket and per turn; the step totals follow them
    label = next(iter(s["labels"].values()), "")
    prompt, hit, n = per_step.get((s["workload"], label), (0, 0, 0))
    server = f"{hit / prompt:.3f} ({n})" if prompt and reused else "-"
    print(" | ".join(map(str, [s["step"], s["requests"], s["outcomes"], s["osl_mismatches"],
        f"{ms(s['ttft'], 'p50')}/{ms(s['ttft'], 'p99')}", f"{ms(s['itl'], 'p50')}/{ms(s['itl'], 'p99')}",
        round(s["output_tokens_per_second"]), s["cached_tokens"], server])))
print("server log: cuda graphs", re.findall(r"Using cuda graphs for.*", open(server_log, errors="replace").read())[:1],
      "graph captures", sum("Creating graph" in l for l in open(server_log, errors="replace")),
      "prefix matches", len(reused))
EOF
tar -C "$ROOT" -czf "$OUT/bench-out.tar.gz" bench 2>/dev/null
grep -ciE "error|traceback" "$OUT/server.log" | sed 's/^/server log lines with error\/traceback: /'
exit "$rc"
