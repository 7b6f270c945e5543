#!/usr/bin/env bash
# The vLLM interop suite on its own: installs vLLM's CPU build into the cached venv (reused when
# present), builds the tiny models, and runs tests/interop_vllm.rs, whose tests start vLLM (and
# `transformers serve`) on loopback ports and stop them when done.
#
#   scripts/interop/run.sh [cargo test arguments after --, e.g. -- --nocapture]
#
# `scripts/test` (the README's test command, run by CI) does the same as part of every test.
set -euo pipefail
cd "$(dirname "$0")/../.."
export LLM_CANARY_VLLM_VENV=${LLM_CANARY_VLLM_VENV:-$HOME/.cache/llm-canary/vllm-venv}
export LLM_CANARY_INTEROP_MODELS=${LLM_CANARY_INTEROP_MODELS:-$HOME/.cache/llm-canary/interop-models}
scripts/interop/install-vllm.sh "$LLM_CANARY_VLLM_VENV"
"$LLM_CANARY_VLLM_VENV/bin/python" scripts/interop/build-models.py "$LLM_CANARY_INTEROP_MODELS"
cargo test --locked --test interop_vllm "$@"
