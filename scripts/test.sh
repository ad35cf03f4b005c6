#!/usr/bin/env bash
# The test suite, offline, as CI runs it. Extra arguments go to pytest (e.g. -k config).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "${QEEBM_VENV:-.venv}/bin/python" -m pytest -q tests "$@"
