#!/usr/bin/env bash
# The test suite, offline, as CI runs it: ruff, then every test (tests/unit, tests/integration,
# tests/e2e) on two pytest-xdist workers, a test file per worker at a time (QEEBM_TEST_WORKERS: how
# many; 0 runs them in this process). `--fast`: the unit tests alone, in one process (under a
# minute). Other arguments go to pytest (e.g. -k config).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
py="${QEEBM_VENV:-.venv}/bin/python"
"$py" -m ruff check qeebm tests scripts
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec "$py" -m pytest -q tests/unit "$@"
fi
workers="${QEEBM_TEST_WORKERS:-2}"
parallel=()
[[ "$workers" == 0 ]] || parallel=(-n "$workers" --dist loadfile)
exec "$py" -m pytest -q "${parallel[@]}" tests "$@"
