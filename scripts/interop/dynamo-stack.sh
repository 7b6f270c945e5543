#!/usr/bin/env bash
# Starts and stops a real NVIDIA Dynamo stack on loopback: Dynamo's OpenAI-compatible frontend (its
# Rust HTTP server and KV router) in front of Dynamo's mocker workers, simulated vLLM-style engines
# (scheduler, paged KV cache with prefix caching, chunked prefill, prefill/decode disaggregation,
# a timing model) that need no GPU and no weights. No etcd and no NATS: discovery is a folder of
# files under RUN_DIR, requests go over TCP, KV events over ZMQ.
#
#   scripts/interop/dynamo-stack.sh start agg|disagg RUN_DIR HTTP_PORT
#   scripts/interop/dynamo-stack.sh stop RUN_DIR
#
# agg:    the frontend on HTTP_PORT, two aggregated mockers (system ports HTTP_PORT+1, +2).
# disagg: the frontend on HTTP_PORT, one prefill mocker (system port HTTP_PORT+1, bootstrap port
#         HTTP_PORT+3) and one decode mocker (system port HTTP_PORT+2).
# Each worker serves GET /metrics and /health on its system port; the frontend serves the OpenAI
# API under /v1, /health and /metrics on HTTP_PORT. HTTP_PORT must lie in 1024..32764: Dynamo 1.6.1
# parses DYN_SYSTEM_PORT as a signed 16-bit number, so system ports must stay below 32768. Stacks
# on different ports (4 apart or more) and in different RUN_DIRs are independent and can run side
# by side, e.g. agg on 8000 and disagg on 8100 for paired comparisons.
#
# `start` records each process's PID in RUN_DIR/<name>.pid and its output in RUN_DIR/<name>.log,
# then waits (at most $DYNAMO_START_TIMEOUT s) until the stack is healthy: every worker's /health
# says "ready", the frontend's /v1/models lists the model and its /health lists every `generate`
# instance (two backend ones in agg; one backend and one prefill in disagg). About 1 s on an idle
# 2-core machine. On failure it prints the logs, stops what it started and exits 1. On success it
# prints the URLs and writes them to RUN_DIR/urls, one `NAME URL` per line: `frontend` (the base
# URL), `frontend-metrics`, then `worker-1-metrics` and `worker-2-metrics` (agg) or
# `prefill-metrics` and `decode-metrics` (disagg); RUN_DIR/stack holds MODE=, MODEL= and the ports.
# `stop` sends SIGTERM to exactly the recorded PIDs (checking that each is still the process this
# script started for RUN_DIR), waits for them to exit, SIGKILLs any left after
# $DYNAMO_STOP_TIMEOUT s, and removes the PID files. The logs stay.
#
# Environment (defaults in brackets):
#   LLM_CANARY_DYNAMO_VENV        [~/.cache/llm-canary/dynamo-venv] made by install-dynamo.sh
#   DYNAMO_MODEL_DIR              [~/.cache/llm-canary/dynamo-models/tiny-qwen3] built by
#                                 `build-models.py --no-weights` when it is the default and missing
#   DYNAMO_MODEL_NAME             [the folder's name] the served model name
#   DYNAMO_ROUTER_MODE            [kv] the frontend's --router-mode (kv, round-robin, random, ...)
#   DYNAMO_SPEEDUP_RATIO          [1.0] mocker --speedup-ratio (0: no simulated delays at all)
#   DYNAMO_DECODE_SPEEDUP_RATIO   [1.0] mocker --decode-speedup-ratio (decode steps only)
#   DYNAMO_KV_TRANSFER_BANDWIDTH  [unset: the mocker's default] mocker --kv-transfer-bandwidth,
#                                 GB/s, the simulated prefill-to-decode KV transfer (0: none)
#   DYNAMO_MAX_MODEL_LEN          [32768] mocker --max-model-len
#   DYNAMO_MOCKER_ARGS            [] more mocker arguments, split on spaces (e.g.
#                                 "--num-gpu-blocks-override 4096 --max-num-seqs 64")
#   DYNAMO_FRONTEND_ARGS          [] more frontend arguments, split on spaces
#   DYNAMO_START_TIMEOUT          [60] seconds `start` waits for health
#   DYNAMO_STOP_TIMEOUT           [15] seconds `stop` waits before SIGKILL
#
# Caveat: the HTTP, system and TCP request-plane servers bind 127.0.0.1, but in 1.6.1 the mockers'
# ZMQ event publishers (ephemeral ports) and the prefill bootstrap port bind 0.0.0.0 (hard-coded;
# DYN_EVENT_PLANE_HOST only sets the advertised address). All traffic still goes to 127.0.0.1.
set -euo pipefail

usage() {
  echo "usage: $0 start agg|disagg RUN_DIR HTTP_PORT" >&2
  echo "       $0 stop RUN_DIR" >&2
  exit 2
}

HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${LLM_CANARY_DYNAMO_VENV:-$HOME/.cache/llm-canary/dynamo-venv}
PY=$VENV/bin/python
DEFAULT_MODEL_DIR=$HOME/.cache/llm-canary/dynamo-models/tiny-qwen3
START_TIMEOUT=${DYNAMO_START_TIMEOUT:-60}
STOP_TIMEOUT=${DYNAMO_STOP_TIMEOUT:-15}

# True when PID is alive (not a zombie) and is a process this script started for RUN.
ours() {
  local pid=$1 run=$2 state
  [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/environ ]] || return 1
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Z]).*/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z && $state != X ]] || return 1
  { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "LLM_CANARY_DYNAMO_RUN=$run"
}

stop_stack() {
  local run=$1 f pid name live=() left
  shopt -s nullglob
  for f in "$run"/*.pid; do
    pid=$(cat "$f")
    name=$(basename "$f" .pid)
    if ours "$pid" "$run"; then
      kill -TERM "$pid" 2>/dev/null || true
      live+=("$pid:$name")
    else
      rm -f "$f"
    fi
  done
  shopt -u nullglob
  if [[ ${#live[@]} == 0 ]]; then
    echo "dynamo-stack: nothing running in $run"
    return 0
  fi
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while :; do
    left=()
    for entry in "${live[@]}"; do
      ours "${entry%%:*}" "$run" && left+=("$entry")
    done
    [[ ${#left[@]} == 0 ]] && break
    if ((SECONDS >= deadline)); then
      for entry in "${left[@]}"; do
        echo "dynamo-stack: ${entry#*:} (pid ${entry%%:*}) still running after ${STOP_TIMEOUT}s, SIGKILL" >&2
        kill -KILL "${entry%%:*}" 2>/dev/null || true
      done
      sleep 0.5
      break
    fi
    sleep 0.2
  done
  for entry in "${live[@]}"; do
    rm -f "$run/${entry#*:}.pid"
  done
  echo "dynamo-stack: stopped ${#live[@]} process(es) in $run"
}

# launch NAME SYSTEM_PORT COMMAND...: in its own session, output to RUN/NAME.log, PID to RUN/NAME.pid.
launch() {
  local name=$1 port=$2
  shift 2
  (
    unset DYN_SYSTEM_PORT
    [[ -n $port ]] && export DYN_SYSTEM_PORT=$port
    exec setsid "$@"
  ) >"$RUN/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
  NAMES+=("$name")
}

print_logs() {
  local name
  for name in "${NAMES[@]}"; do
    echo "----- $RUN/$name.log (last 40 lines)" >&2
    tail -n 40 "$RUN/$name.log" >&2 || true
  done
}

[[ $# -ge 1 ]] || usage
case $1 in
  stop)
    [[ $# == 2 ]] || usage
    stop_stack "$(realpath -m "$2")"
    exit 0
    ;;
  start)
    [[ $# == 4 ]] || usage
    MODE=$2
    RUN=$(realpath -m "$3")
    HTTP_PORT=$4
    ;;
  *) usage ;;
esac
[[ $MODE == agg || $MODE == disagg ]] || usage
if ! [[ $HTTP_PORT =~ ^[0-9]+$ ]] || ((HTTP_PORT < 1024 || HTTP_PORT > 32764)); then
  echo "dynamo-stack: HTTP_PORT must be in 1024..32764 (system ports HTTP_PORT+1.. must stay below 32768)" >&2
  exit 2
fi
if [[ ! -f $VENV/.llm-canary-ready ]]; then
  echo "dynamo-stack: no Dynamo venv at $VENV; run scripts/interop/install-dynamo.sh first" >&2
  exit 1
fi
MODEL_DIR=${DYNAMO_MODEL_DIR:-$DEFAULT_MODEL_DIR}
if [[ $MODEL_DIR == "$DEFAULT_MODEL_DIR" ]]; then
  TRANSFORMERS_NO_ADVISORY_WARNINGS=1 "$PY" "$HERE/build-models.py" --no-weights "$(dirname "$MODEL_DIR")" >/dev/null
fi
for f in config.json tokenizer.json tokenizer_config.json; do
  if [[ ! -f $MODEL_DIR/$f ]]; then
    echo "dynamo-stack: $MODEL_DIR has no $f (build it with scripts/interop/build-models.py --no-weights DIR)" >&2
    exit 1
  fi
done
MODEL_NAME=${DYNAMO_MODEL_NAME:-$(basename "$MODEL_DIR")}

mkdir -p "$RUN"
shopt -s nullglob
for f in "$RUN"/*.pid; do
  if ours "$(cat "$f")" "$RUN"; then
    echo "dynamo-stack: a stack is already running in $RUN ($(basename "$f" .pid), pid $(cat "$f")); stop it first" >&2
    exit 1
  fi
done
rm -rf "$RUN/discovery" "$RUN"/*.pid "$RUN"/*.log "$RUN/urls" "$RUN/stack"
shopt -u nullglob

SYS1=$((HTTP_PORT + 1))
SYS2=$((HTTP_PORT + 2))
BOOTSTRAP=$((HTTP_PORT + 3))
# Every fixed port must be free (an active listener there would make a process fail or, worse,
# health checks answer for another stack).
PORTS=("127.0.0.1:$HTTP_PORT" "127.0.0.1:$SYS1" "127.0.0.1:$SYS2")
[[ $MODE == disagg ]] && PORTS+=("0.0.0.0:$BOOTSTRAP")
"$PY" - "${PORTS[@]}" <<'PY'
import socket, sys
busy = []
for spec in sys.argv[1:]:
    host, port = spec.rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, int(port)))
    except OSError:
        busy.append(spec)
    finally:
        s.close()
if busy:
    sys.exit(f"dynamo-stack: port(s) in use: {' '.join(busy)}")
PY

export LLM_CANARY_DYNAMO_RUN=$RUN
export DYN_DISCOVERY_BACKEND=file DYN_FILE_KV=$RUN/discovery   # no etcd
export DYN_REQUEST_PLANE=tcp DYN_EVENT_PLANE=zmq                # no NATS
export DYN_TCP_RPC_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1
export DYN_EVENT_PLANE_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1
# Without this a worker's system /health reports "notready" forever, even while it serves. (Each
# process logs a WARN that the variable is deprecated and no longer used; in 1.6.1 it is used.)
export DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS='["generate"]'
export DYN_HEALTH_CHECK_ENABLED=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DYN_SDK_DISABLE_ANSI_LOGGING=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1   # plain logs

MOCKER=("$PY" -m dynamo.mocker
  --model-path "$MODEL_DIR" --model-name "$MODEL_NAME"
  --speedup-ratio "${DYNAMO_SPEEDUP_RATIO:-1.0}"
  --decode-speedup-ratio "${DYNAMO_DECODE_SPEEDUP_RATIO:-1.0}"
  --max-model-len "${DYNAMO_MAX_MODEL_LEN:-32768}")
if [[ -n ${DYNAMO_KV_TRANSFER_BANDWIDTH:-} ]]; then
  MOCKER+=(--kv-transfer-bandwidth "$DYNAMO_KV_TRANSFER_BANDWIDTH")
fi
read -r -a EXTRA_MOCKER <<<"${DYNAMO_MOCKER_ARGS:-}"
read -r -a EXTRA_FRONTEND <<<"${DYNAMO_FRONTEND_ARGS:-}"

NAMES=()
START=$EPOCHREALTIME
trap 'echo "dynamo-stack: start interrupted" >&2; stop_stack "$RUN" >&2; exit 1' INT TERM
launch frontend "" "$PY" -m dynamo.frontend --http-host 127.0.0.1 --http-port "$HTTP_PORT" \
  --router-mode "${DYNAMO_ROUTER_MODE:-kv}" "${EXTRA_FRONTEND[@]}"
if [[ $MODE == agg ]]; then
  launch worker-1 "$SYS1" "${MOCKER[@]}" "${EXTRA_MOCKER[@]}"
  launch worker-2 "$SYS2" "${MOCKER[@]}" "${EXTRA_MOCKER[@]}"
  WORKERS=("worker-1 $SYS1" "worker-2 $SYS2")
  EXPECT_BACKEND=2 EXPECT_PREFILL=0
else
  launch prefill "$SYS1" "${MOCKER[@]}" --disaggregation-mode prefill --bootstrap-ports "$BOOTSTRAP" "${EXTRA_MOCKER[@]}"
  launch decode "$SYS2" "${MOCKER[@]}" --disaggregation-mode decode "${EXTRA_MOCKER[@]}"
  WORKERS=("prefill $SYS1" "decode $SYS2")
  EXPECT_BACKEND=1 EXPECT_PREFILL=1
fi

PIDS=()
for name in "${NAMES[@]}"; do PIDS+=("$name=$(cat "$RUN/$name.pid")"); done
WORKER_PORTS=()
for w in "${WORKERS[@]}"; do WORKER_PORTS+=("${w% *}=${w#* }"); done

# Poll until healthy, a process exits, or the deadline; one Python process does all the polling.
if ! "$PY" - "$START_TIMEOUT" "$HTTP_PORT" "$MODEL_NAME" "$EXPECT_BACKEND" "$EXPECT_PREFILL" \
  "${PIDS[*]}" "${WORKER_PORTS[*]}" <<'PY'
import json, os, sys, time, urllib.request

timeout, http_port, model, want_backend, want_prefill = sys.argv[1:6]
pids = dict(p.split("=") for p in sys.argv[6].split())
workers = dict(w.split("=") for w in sys.argv[7].split())
deadline = time.monotonic() + float(timeout)
want = {"backend": int(want_backend), "prefill": int(want_prefill)}


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
        return json.load(r)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def missing():
    for name, port in workers.items():
        try:
            status = get(port, "/health").get("status")
        except Exception as e:
            return f"{name} /health on :{port}: {e}"
        if status != "ready":
            return f"{name} /health on :{port}: status {status!r}"
    try:
        ids = [m.get("id") for m in get(http_port, "/v1/models").get("data", [])]
    except Exception as e:
        return f"frontend /v1/models on :{http_port}: {e}"
    if model not in ids:
        return f"frontend /v1/models lists {ids}, not {model!r}"
    try:
        health = get(http_port, "/health")
    except Exception as e:
        return f"frontend /health on :{http_port}: {e}"
    have = {c: 0 for c in want}
    for inst in health.get("instances", []):
        if inst.get("endpoint") == "generate" and inst.get("component") in have:
            have[inst["component"]] += 1
    if have != want:
        return f"frontend /health: generate instances {have}, want {want}"
    return None


while True:
    dead = [f"{n} (pid {p})" for n, p in pids.items() if not alive(p)]
    if dead:
        sys.exit(f"dynamo-stack: exited during start: {', '.join(dead)}")
    why = missing()
    if why is None:
        sys.exit(0)
    if time.monotonic() > deadline:
        sys.exit(f"dynamo-stack: not healthy after {timeout} s: {why}")
    time.sleep(0.2)
PY
then
  print_logs
  stop_stack "$RUN" >&2
  exit 1
fi
trap - INT TERM
ELAPSED=$(awk -v a="$START" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')

BASE=http://127.0.0.1:$HTTP_PORT
{
  echo "frontend $BASE"
  echo "frontend-metrics $BASE/metrics"
  for w in "${WORKERS[@]}"; do echo "${w% *}-metrics http://127.0.0.1:${w#* }/metrics"; done
} >"$RUN/urls"
{
  echo "MODE=$MODE"
  echo "MODEL=$MODEL_NAME"
  echo "HTTP_PORT=$HTTP_PORT"
  for w in "${WORKERS[@]}"; do echo "$(echo "${w% *}" | tr 'a-z-' 'A-Z_')_SYSTEM_PORT=${w#* }"; done
  [[ $MODE == disagg ]] && echo "BOOTSTRAP_PORT=$BOOTSTRAP"
  true
} >"$RUN/stack"
printf 'dynamo-stack: %s stack healthy in %s s (model %s, router %s, run dir %s)\n' \
  "$MODE" "$ELAPSED" "$MODEL_NAME" "${DYNAMO_ROUTER_MODE:-kv}" "$RUN"
while read -r name url; do printf '  %-18s %s\n' "$name" "$url"; done <"$RUN/urls"
