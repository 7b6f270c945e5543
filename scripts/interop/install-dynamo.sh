#!/usr/bin/env bash
# Installs NVIDIA Dynamo (PyPI `ai-dynamo`, frontend and mocker engine) into a cached virtual
# environment, reused when present. No GPU, torch, CUDA or vLLM is needed: the mocker simulates an
# engine, and the frontend is Dynamo's own Rust HTTP server inside `ai-dynamo-runtime`.
#
#   scripts/interop/install-dynamo.sh [VENV]    (default: $LLM_CANARY_DYNAMO_VENV or
#                                                ~/.cache/llm-canary/dynamo-venv)
#
# A plain `pip install ai-dynamo` fails: the wheel requires `aisimulate`, and the `aisimulate` on
# PyPI is a placeholder whose build downloads the real wheel from NVIDIA's own index, which this
# machine cannot reach ("metadata-generation-failed"). Only Dynamo's planner and the mocker's
# `--ais-perf-model` import it, lazily. So this installs the wheel's own requirements (markers
# evaluated for this machine, `aisimulate` left out; `ai-dynamo-runtime` is the 75 MB abi3 wheel with
# the Rust core), `tokenizers` (for scripts/interop/build-models.py --no-weights), then the
# `ai-dynamo` wheel itself with `--no-deps`. About a minute and 700 MB on a fresh 2-core machine.
# The venv counts as installed only once the marker file `.llm-canary-ready` exists, so an
# interrupted install is redone, not trusted.
set -euo pipefail

DYNAMO_VERSION=${DYNAMO_VERSION:-1.6.1}
VENV=${1:-${LLM_CANARY_DYNAMO_VENV:-$HOME/.cache/llm-canary/dynamo-venv}}
READY="$VENV/.llm-canary-ready"
CHECK='import dynamo.frontend, dynamo.mocker, dynamo._core, tokenizers, transformers'
# transformers without torch warns on every import; nothing here needs torch.
export TRANSFORMERS_NO_ADVISORY_WARNINGS=1

if [[ -f $READY ]] && [[ $(cat "$READY") == "ai-dynamo==$DYNAMO_VERSION" ]] \
  && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
  echo "Dynamo venv present: $VENV ($(cat "$READY"))"
  exit 0
fi

# shellcheck source=fresh-venv.sh
source "$(dirname "$0")/fresh-venv.sh"
fresh_venv "$VENV"
PIP=("$VENV/bin/pip" --disable-pip-version-check)
"${PIP[@]}" install -q packaging

WHEELS=$(mktemp -d)
trap 'rm -rf "$WHEELS"' EXIT
echo "downloading ai-dynamo==$DYNAMO_VERSION (wheel only)"
"${PIP[@]}" download -q --no-deps -d "$WHEELS" "ai-dynamo==$DYNAMO_VERSION"
WHEEL=$(ls "$WHEELS"/ai_dynamo-*.whl)

# The wheel's Requires-Dist lines that apply here (no extras), without the unreachable aisimulate.
"$VENV/bin/python" - "$WHEEL" > "$WHEELS/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "aisimulate":
        continue
    req.marker = None
    print(req)
PY
if ! grep -q '^ai-dynamo-runtime==' "$WHEELS/requirements.txt"; then
  echo "install-dynamo: the ai-dynamo wheel no longer pins ai-dynamo-runtime; check its metadata" >&2
  exit 1
fi
echo "installing ai-dynamo's requirements ($(paste -sd' ' "$WHEELS/requirements.txt")) and tokenizers"
"${PIP[@]}" install -q -r "$WHEELS/requirements.txt" tokenizers
echo "installing the ai-dynamo wheel (--no-deps)"
"${PIP[@]}" install -q --no-deps "$WHEEL"
"$VENV/bin/python" -c "$CHECK"
"$VENV/bin/python" -c 'from importlib.metadata import version as v; print("ai-dynamo", v("ai-dynamo"), "ai-dynamo-runtime", v("ai-dynamo-runtime"), "transformers", v("transformers"), "tokenizers", v("tokenizers"))'
echo "ai-dynamo==$DYNAMO_VERSION" > "$READY"
echo "Dynamo venv ready: $VENV ($(du -sh "$VENV" | cut -f1))"
