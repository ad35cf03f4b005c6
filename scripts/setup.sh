#!/usr/bin/env bash
# Creates .venv and installs qeebm with its test extras; a no-op when pyproject.toml and the extras
# are unchanged since the last successful install. Set QEEBM_VENV to use another location, and
# QEEBM_EXTRAS for other extras than "dev" (CI: dev,deepspeed, so the ZeRO-2 tests run there).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${QEEBM_VENV:-.venv}"
PY="${PYTHON:-python3}"
EXTRAS="${QEEBM_EXTRAS:-dev}"
stamp="$VENV/.qeebm-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) [$EXTRAS]"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi
echo "setup: installing qeebm into $VENV (about a minute)" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade "pip>=24"
# A bare torch requirement pulls a multi-GB CUDA build; keep a torch that is already there
# (e.g. a CUDA build installed by hand, see README) and otherwise take the pinned release.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    "$VENV/bin/python" -m pip install -q "${QEEBM_TORCH:-torch==2.13.0}"
fi
"$VENV/bin/python" -m pip install -q -e ".[$EXTRAS]"
echo "$want" > "$stamp"
