#!/usr/bin/env bash
# The main job on the embedded default: builds the tiny world if absent, trains, evaluates and
# prints the results table. Extra arguments go to `qeebm demo` (e.g. --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec "${QEEBM_VENV:-.venv}/bin/qeebm" demo "$@"
